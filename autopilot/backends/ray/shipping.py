"""A cell's files from a node back to the head, for clusters without shared storage.

With ``backend.shared_state_dir = false`` a node's actor keeps a private mirror of the
state dir on its own disk (``backend.node_dir``), runs and grades the cell there, and
ships the attempt's files back with its verdict: the output dir (transcript, completion
artifacts, summary, grade) and the cell's launcher and grade logs. The head unpacks them
into the state dir before the verdict is journaled, so every view and report reads them
where a local run would have put them.

What comes back is untrusted (a harness wrote it): only regular files and directories,
with relative names that stay inside the state dir, through no symlink, are written;
anything else is skipped and said.
"""

from __future__ import annotations

import io
import os
import stat
import tarfile
from pathlib import Path, PurePosixPath

from autopilot.config import Preset


def _templates(preset: Preset) -> list[tuple[str, str]]:
    harness, grader = preset.harness, preset.grader
    out = [("harness.output_dir", harness.output_dir), ("harness.transcript", harness.transcript),
           ("harness.summary", harness.summary), ("grader.grade_file", grader.grade_file)]
    out += [(f"harness.completion[{i}]", template) for i, template in enumerate(harness.completion)]
    return [(k, template) for k, template in out if template]


def outside_problems(preset: Preset) -> list[tuple[str, str]]:
    """(config key, why) for each file the head needs that would land outside the state
    dir on a node: without shared storage only the state dir's files come back."""
    from autopilot.plan import Plan, cell_context
    from autopilot.state.fsguard import _LOAD_STATE_DIR  # the load-time stand-in
    from autopilot.templates import render

    problems: dict[str, str] = {}
    output_key = "harness.output_dir"
    for cell in Plan(preset, 1).cells:
        ctx = cell_context(preset, cell, 1, _LOAD_STATE_DIR)
        out_dir = Path(render(preset.harness.output_dir, ctx))
        if _LOAD_STATE_DIR not in out_dir.parents and output_key not in problems:
            problems[output_key] = (f"{preset.harness.output_dir!r} is outside {{state_dir}}: "
                                    "with backend.shared_state_dir = false only files "
                                    "under the state dir come back from a node")
        for key, template in _templates(preset)[1:]:
            path = Path(render(template, ctx))
            if out_dir not in path.parents and key not in problems:
                problems[key] = (f"{template!r} is outside harness.output_dir: with "
                                 "backend.shared_state_dir = false a node ships the output "
                                 "dir and the cell's logs back, nothing else")
    return list(problems.items())


def cell_files(state_dir: Path, cell_id: str, output_dir: Path) -> list[Path]:
    """What a node ships for one attempt: its output dir and its two logs."""
    logs = state_dir / "logs"
    return [output_dir, logs / f"{cell_id}.launcher.log", logs / f"{cell_id}.grade.log"]


def pack(state_dir: Path, paths: list[Path]) -> bytes:
    """A gzip tar of ``paths`` (those that exist), named relative to ``state_dir``.
    Symlinks are stored as links and refused on unpacking: never followed here."""
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w:gz", compresslevel=1) as tar:
        for path in paths:
            if path.is_symlink() or path.exists():
                tar.add(path, arcname=str(path.relative_to(state_dir)), recursive=True)
    return buf.getvalue()


def unpack(data: bytes, state_dir: Path) -> tuple[int, list[str]]:
    """Write what ``pack`` made into ``state_dir``: (files written, what was skipped and
    why). Regular files and directories only; a name that is absolute, climbs out, or
    passes through a symlink or a non-directory is skipped."""
    written, skipped = 0, []
    root = state_dir.resolve()
    with tarfile.open(fileobj=io.BytesIO(data), mode="r:gz") as tar:
        for member in tar:
            rel = PurePosixPath(member.name)
            if rel.is_absolute() or ".." in rel.parts or not rel.parts:
                skipped.append(f"{member.name!r}: not a plain relative name")
                continue
            if not (member.isfile() or member.isdir()):
                skipped.append(f"{member.name!r}: not a regular file or directory")
                continue
            target = root.joinpath(*rel.parts)
            if not _plain_parents(root, target):
                skipped.append(f"{member.name!r}: a parent is a symlink or not a directory")
                continue
            if member.isdir():
                target.mkdir(mode=0o700, exist_ok=True)
                continue
            src = tar.extractfile(member)
            if src is None:
                continue
            try:  # O_NOFOLLOW: a symlink planted at the name is refused, not followed
                fd = os.open(target, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW
                             | os.O_CLOEXEC, 0o600)
            except OSError as e:
                skipped.append(f"{member.name!r}: {e.strerror}")
                continue
            with os.fdopen(fd, "wb") as f:
                while chunk := src.read(1 << 20):
                    f.write(chunk)
            written += 1
    return written, skipped


def _plain_parents(root: Path, target: Path) -> bool:
    """Every directory between ``root`` and ``target`` is a real directory (created as
    one where missing); none is a symlink."""
    cur = root
    for part in target.relative_to(root).parts[:-1]:
        cur = cur / part
        try:
            info = os.lstat(cur)
        except FileNotFoundError:
            cur.mkdir(mode=0o700)
            continue
        if not stat.S_ISDIR(info.st_mode):
            return False
    return True
