"""A user per cell (``[harness] user = "cell"``): the uids live cells run as.

With the supervisor as root, each attempt's harness and grader run as a uid of their
own, one no other live cell holds, taken from the preset's range. A uid is free when no
live cell of ours holds it, no account has it (``/etc/passwd``), and no process runs as
it: so every process of that uid is the cell's, and ending the cell ends exactly them.
The switch is ``setpriv`` (util-linux), run after the process has entered its cgroup as
root: ``--reuid/--regid/--clear-groups``, and ``--no-new-privs`` (no setuid program
takes it back). Its cgroup stays root's: it cannot move itself or anyone out or in.
"""

from __future__ import annotations

import os
import pwd
import shutil
import stat
import threading
from pathlib import Path

import psutil

SETPRIV = "setpriv"


class UidPool:
    """The uids of one range, handed to live cells (thread-safe: grading and kills run
    in worker threads)."""

    def __init__(self, first: int, last: int) -> None:
        self.first, self.last = first, last
        self._held: dict[int, str] = {}
        self._lock = threading.Lock()
        self._next = first

    def take(self, cell: str) -> int:
        """A free uid for ``cell``; raises LookupError when the range has none."""
        with self._lock:
            busy = _running_uids()
            span = self.last - self.first + 1
            for i in range(span):
                uid = self.first + (self._next - self.first + i) % span
                if uid in self._held or uid in busy or _has_account(uid):
                    continue
                self._held[uid] = cell
                self._next = uid + 1 if uid < self.last else self.first
                return uid
        raise LookupError(f"no free uid in {self.first}-{self.last} (every one held by a "
                          "live cell, an account or a running process)")

    def hold(self, uid: int, cell: str) -> None:
        """A uid a predecessor gave a cell that is still running (re-attached)."""
        with self._lock:
            self._held[uid] = cell

    def give(self, uid: int) -> None:
        with self._lock:
            self._held.pop(uid, None)

    def held(self) -> dict[int, str]:
        with self._lock:
            return dict(self._held)


def _running_uids() -> set[int]:
    out: set[int] = set()
    for p in psutil.process_iter(["uids"]):
        u = p.info.get("uids")
        if u is not None:
            out.add(u.real)
    return out


def _has_account(uid: int) -> bool:
    try:
        pwd.getpwuid(uid)
        return True
    except KeyError:
        return False


def as_user(argv: list[str], uid: int) -> list[str]:
    """``argv`` run as ``uid`` (gid the same, no supplementary group, no new privileges)."""
    return [shutil.which(SETPRIV) or SETPRIV, f"--reuid={uid}", f"--regid={uid}",
            "--clear-groups", "--no-new-privs", "--", *argv]


def processes_of(uid: int) -> list[psutil.Process]:
    """Every live process of ``uid`` (exact: a cell's uid is no one else's)."""
    out = []
    for p in psutil.process_iter(["uids"]):
        u = p.info.get("uids")
        if u is not None and u.real == uid:
            out.append(p)
    return out


def why_not(user: str) -> str | None:
    """Why ``[harness] user`` cannot be had here, or None."""
    if user != "cell":
        return None
    if os.geteuid() != 0:
        return "harness.user = \"cell\" needs the supervisor to run as root"
    if shutil.which(SETPRIV) is None:
        return "harness.user = \"cell\" needs setpriv (util-linux) on PATH"
    return None


def mode_line(user: str, uids: tuple[int, int]) -> str:
    """What --dry-run says of who harnesses run as."""
    me = pwd.getpwuid(os.geteuid()).pw_name if _has_account(os.geteuid()) else str(os.geteuid())
    if user == "cell":
        why = why_not(user)
        if why:
            return f"harness user: REFUSED: {why}"
        return (f"harness user: a uid of its own per live cell ({uids[0]}-{uids[1]}): it "
                "reaches only its output dir; the state dir, journal, run token and "
                "secrets are root's")
    return (f"harness user: the supervisor's ({me}; harness.user = \"same\"): a harness "
            "can read the run's token and files and rewrite its journal"
            + ("; harness.user = \"cell\" gives each cell a uid of its own"
               if os.geteuid() == 0 else ""))


def unreachable(state_dir: Path) -> str | None:
    """Why the cells' users could not reach their output dirs under ``state_dir``: an
    ancestor another user cannot search (the state dir itself is made searchable)."""
    for anc in state_dir.parents:
        try:
            mode = anc.stat().st_mode
        except OSError:
            continue
        if not mode & stat.S_IXOTH:
            return (f"{anc} is not searchable by other users (mode {stat.filemode(mode)}): "
                    "the cells' users could not reach their output dirs; chmod o+x it or "
                    "use another --state-dir")
    return None


def own_dirs(output_dir: Path, state_dir: Path, uid: int) -> None:
    """The cell's output dir is its user's (0700); the way to it through the state dir
    may be passed (o+x) but not read or written: the journal, run.token, every log and
    secret stay 0600 root's."""
    os.chown(output_dir, uid, uid)
    os.chmod(output_dir, 0o700)
    sd = state_dir.resolve()
    try:
        rel = output_dir.resolve().relative_to(sd)
    except ValueError:
        return  # outside the state dir: the preset's own dirs, as it made them
    d = sd
    for part in ("", *rel.parts[:-1]):
        d = d / part if part else d
        mode = stat.S_IMODE(d.stat().st_mode)
        want = (mode & ~0o066) | 0o011
        if mode != want:
            # search only (x): to pass through to its own dir; never list or write
            os.chmod(d, want)


_POOLS: dict[tuple[int, int], UidPool] = {}
_POOLS_LOCK = threading.Lock()


def pool_for(first: int, last: int) -> UidPool:
    """One pool per range and process: every backend context of a loop shares it."""
    with _POOLS_LOCK:
        return _POOLS.setdefault((first, last), UidPool(first, last))


__all__ = [
    "UidPool",
    "as_user",
    "mode_line",
    "own_dirs",
    "pool_for",
    "processes_of",
    "unreachable",
    "why_not",
]
