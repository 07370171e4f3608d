"""One run per output root: a run claims the directories outside its state dir that it
writes into (the harness's output dirs, scratch dirs: ``fsguard.run_roots``).

The MMBT harness writes ``tooling/logs/<cell>/`` with nothing naming the run, so two
state dirs over one checkout silently overwrote each other's cells: the second moved the
first's outputs into its own attempts, and the first's ``validate`` then graded the
second's files. Each root gets a claim file, exclusively flocked for the whole
run (released by the kernel even on ``kill -9``) and naming the state dir that holds it,
next to the root (``.<root name>.autopilot-claim`` in its parent: the root itself, a
harness's own directory, stays as the harness leaves it); a second run with another
state dir meets the lock and exits 3 naming the holder.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import socket
from pathlib import Path

from autopilot.errors import LockHeld
from autopilot.state.fsutil import iso
from autopilot.state.statedir import open_private
from autopilot.state.untrusted import read_json

CLAIM_SUFFIX = ".autopilot-claim"


def claim_path(root: Path) -> Path:
    return root.parent / f".{root.name}{CLAIM_SUFFIX}"


def outside_roots(roots: tuple[Path, ...], state_dir: Path) -> list[Path]:
    """The roots a run writes into that are not its own state dir (nor inside it)."""
    mine = state_dir.absolute()
    return [r for r in roots if r != mine and mine not in r.parents]


class Claims:
    def __init__(self) -> None:
        self.fds: list[int] = []

    def take(self, roots: list[Path], state_dir: Path) -> None:
        """Claim every root (made if missing) or raise LockHeld naming the holder;
        nothing is kept when one is held."""
        for root in roots:
            path = claim_path(root)
            path.parent.mkdir(parents=True, exist_ok=True)
            fd = open_private(path, os.O_RDWR | os.O_CREAT)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                os.close(fd)
                self.release()
                held = read_json(path) or {}
                raise LockHeld(
                    f"{root} is the output root of another run: state dir "
                    f"{held.get('state_dir', '?')!s} (pid {held.get('pid', '?')} on "
                    f"{held.get('host', '?')}); give this run its own output dirs, or let "
                    "that one finish") from None
            os.ftruncate(fd, 0)
            os.pwrite(fd, (json.dumps({"state_dir": str(state_dir.absolute()),
                                       "pid": os.getpid(), "host": socket.gethostname(),
                                       "since": iso()}) + "\n").encode(), 0)
            self.fds.append(fd)

    def release(self) -> None:
        for fd in self.fds:
            with contextlib.suppress(OSError):
                os.close(fd)
        self.fds = []
