"""Publish a complete run's scorecard and findings as a commit on a results branch.

Commits to ``bench-results-<YYYY-MM-DD>`` of the results repo without pushing and
without touching its checked-out branch, index or working tree: the commit is built
with plumbing (``hash-object``, a private ``GIT_INDEX_FILE``, ``write-tree``,
``commit-tree``, ``update-ref``), with the repo's hooks and fsmonitor disabled.
Idempotent: when the tree would not change, no commit is made. Every failure comes back
as a message, never as an exception: publishing must not turn a COMPLETE run into a crash.
"""

from __future__ import annotations

import os
import subprocess
import tempfile
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any

from autopilot.state.fsutil import atomic_write_text

if TYPE_CHECKING:
    from autopilot.config import Preset


@dataclass(frozen=True)
class PublishResult:
    ok: bool
    branch: str = ""
    commit: str = ""
    created: bool = False  # False: nothing changed (idempotent re-run) or failure
    error: str = ""


class _GitError(Exception):
    pass


# The results repo is someone's checkout: its hooks (reference-transaction on update-ref,
# post-index-change on update-index) and its fsmonitor command would run as us, maybe
# root. None of them runs: hooks point nowhere, fsmonitor is off, and no system config
# is read.
SAFE_GIT = ("-c", "core.hooksPath=/dev/null", "-c", "core.fsmonitor=false")


def _git(repo: Path, *args: str, env: dict[str, str] | None = None, input: bytes | None = None
         ) -> str:
    done = subprocess.run(["git", *SAFE_GIT, "-C", str(repo), *args], capture_output=True,
                          input=input, timeout=60,
                          env={**os.environ, "GIT_CONFIG_NOSYSTEM": "1", **(env or {})})
    if done.returncode != 0:
        msg = done.stderr.decode(errors="replace").strip().splitlines()
        raise _GitError(f"git {args[0]}: {msg[-1] if msg else f'exit {done.returncode}'}")
    return done.stdout.decode().strip()


def publish(repo: Path, files: dict[str, str], message: str, *, date: str | None = None
            ) -> PublishResult:
    """Commit ``files`` (repo-relative path -> text) on the day's results branch."""
    branch = f"bench-results-{date or datetime.now(UTC).strftime('%Y-%m-%d')}"
    try:
        top = Path(_git(repo, "rev-parse", "--show-toplevel"))
        ref = f"refs/heads/{branch}"
        try:
            parent = _git(top, "rev-parse", "--verify", "--quiet", f"{ref}^{{commit}}")
        except _GitError:
            parent = ""
        if not parent:
            try:
                parent = _git(top, "rev-parse", "--verify", "--quiet", "HEAD^{commit}")
            except _GitError:
                parent = ""  # an empty repository: the results branch starts the history
        with tempfile.TemporaryDirectory() as tmp:
            env = {"GIT_INDEX_FILE": str(Path(tmp) / "index")}
            if parent:
                _git(top, "read-tree", parent, env=env)
            for rel, text in sorted(files.items()):
                blob = _git(top, "hash-object", "-w", "--stdin", input=text.encode())
                _git(top, "update-index", "--add", "--cacheinfo", f"100644,{blob},{rel}", env=env)
            tree = _git(top, "write-tree", env=env)
        if parent and _git(top, "rev-parse", f"{parent}^{{tree}}") == tree:
            return PublishResult(True, branch, parent, created=False)
        ident = {"GIT_AUTHOR_NAME": os.environ.get("GIT_AUTHOR_NAME", "bench-autopilot"),
                 "GIT_AUTHOR_EMAIL": os.environ.get("GIT_AUTHOR_EMAIL", "autopilot@localhost"),
                 "GIT_COMMITTER_NAME": os.environ.get("GIT_COMMITTER_NAME", "bench-autopilot"),
                 "GIT_COMMITTER_EMAIL": os.environ.get("GIT_COMMITTER_EMAIL",
                                                       "autopilot@localhost")}
        commit = _git(top, "commit-tree", tree, *(["-p", parent] if parent else []), "-m",
                      message, env=ident)
        # old value guards against a concurrent update of the branch
        old = parent if _branch_exists(top, ref) else "0" * 40
        _git(top, "update-ref", ref, commit, old)
        return PublishResult(True, branch, commit, created=True)
    except (_GitError, OSError, subprocess.TimeoutExpired) as e:
        return PublishResult(False, branch, error=str(e))


def _branch_exists(top: Path, ref: str) -> bool:
    try:
        _git(top, "rev-parse", "--verify", "--quiet", ref)
        return True
    except _GitError:
        return False


def publish_run(preset: Preset, n: int, state_dir: Path, repo: Path) -> PublishResult:
    """A COMPLETE run's scorecard.md and findings.md, written into the state dir and
    committed to the results branch of ``repo`` (blocking: in a worker thread)."""
    from autopilot.cell.childenv import redactor
    from autopilot.views import report
    from autopilot.views.runrecord import isolation, plan_changes

    facts = report.collect(preset, n, state_dir)
    scrub = redactor(preset).scrub  # nothing secret reaches a commit
    card = scrub(report.scorecard(preset, facts, n))
    found = scrub(report.findings(preset, facts, n, plan_changes(state_dir),
                                  who=isolation(state_dir)))
    atomic_write_text(state_dir / "scorecard.md", card)
    atomic_write_text(state_dir / "findings.md", found)
    prefix = preset.publish.path.replace("{preset}", preset.name).strip("/")
    files = {f"{prefix}/scorecard.md": card, f"{prefix}/findings.md": found}
    msg = f"bench-autopilot: {preset.name} ({preset.model}) N={n} scorecard"
    return publish(repo, files, msg)


def publish_state(preset: Preset, n: int, state_dir: Path, repo: Path) -> dict[str, Any]:
    """``publish_run``, never raising: what status.json and the journal say of it
    (``ok`` False with the error for a git failure, a hostile value in an artifact, a
    full disk). Blocking: in a worker thread."""
    from autopilot.escape import clean
    from autopilot.logsetup import get_logger

    try:
        res = publish_run(preset, n, state_dir, repo)
    except Exception as e:
        get_logger(__name__).exception("publish_crashed")
        return {"ok": False, "error": f"{type(e).__name__}: {clean(e)}"}
    return {"ok": res.ok, "repo": str(repo), "branch": res.branch, "commit": res.commit,
            "created": res.created, "error": res.error}
