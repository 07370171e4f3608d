"""Run a cell's grader and read its grade file.

The grader is someone else's program: it gets an argv (never a shell string), a timeout,
and its output spooled to the cell's grade log. An optional ``extract`` step unpacks an
artifact (the origin's ``workspace_final.tar.gz``) into a scratch dir that is removed
afterwards, whatever happens. What the grade *means* is decided by ``validity``.
"""

from __future__ import annotations

import shutil
import subprocess
import tarfile
from collections.abc import Mapping
from pathlib import Path

import anyio

from autopilot.fsutil import read_json
from autopilot.procs import OWNED, Tracker, identify, kill_tree, spawn
from autopilot.validity import GradeOutcome


def _extract(archive: Path, into: Path) -> None:
    if into.exists():
        shutil.rmtree(into)
    into.mkdir(parents=True)
    with tarfile.open(archive) as tf:
        # 'data' refuses absolute paths, '..', devices and links out of the tree.
        tf.extractall(into, filter="data")


async def run_grader(
    argv: list[str],
    *,
    cwd: str | None,
    env: Mapping[str, str],
    timeout: float,
    grade_file: Path,
    log_path: Path,
    extract: tuple[Path, Path] | None = None,
) -> GradeOutcome:
    scratch = extract[1] if extract else None
    try:
        if extract is not None:
            archive, into = extract
            try:
                await anyio.to_thread.run_sync(_extract, archive, into)
            except (OSError, tarfile.TarError) as e:
                return GradeOutcome(False, f"extract {archive.name} failed: {e}")
        grade_file.unlink(missing_ok=True)  # a stale grade must never be read as fresh
        with log_path.open("ab") as log:
            try:
                proc = await spawn(
                    argv, cwd=cwd, env=dict(env), stdout=log, stderr=subprocess.STDOUT,
                    start_new_session=True,
                )
            except OSError as e:
                return GradeOutcome(False, f"grader could not start: {e.strerror}")
            try:
                with anyio.move_on_after(timeout) as scope:
                    code = await proc.wait()
                if scope.cancelled_caught:
                    ident = identify(proc.pid)
                    if ident is not None:
                        await anyio.to_thread.run_sync(kill_tree, Tracker(ident), 1.0)
                    with anyio.CancelScope(shield=True):
                        await proc.wait()
                    return GradeOutcome(False, f"grader timed out after {timeout:.0f}s")
            finally:
                OWNED.discard(proc.pid)
        if code != 0:
            return GradeOutcome(False, f"grader exit code {code}", read_json(grade_file))
        return GradeOutcome(True, "", read_json(grade_file))
    finally:
        if scratch is not None and scratch.exists():
            shutil.rmtree(scratch, ignore_errors=True)
