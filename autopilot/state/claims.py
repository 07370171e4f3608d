"""A run owns the output dirs it writes outside its state dir until it lets them go.

The MMBT harness writes ``tooling/logs/<cell>/`` with nothing naming the run, so two
state dirs over one checkout silently overwrote each other's cells: the second moved the
first's outputs into its own attempts, and the first's ``validate`` then graded the
second's files. Two records beside each output root (``fsguard.run_roots``), in its
parent (the root itself, a harness's own directory, stays as the harness leaves it):

- ``.<root>.autopilot-claim``: exclusively flocked for the whole life of a run (released
  by the kernel even on ``kill -9``) and naming it: one live run per root; a second
  meets the lock and exits 3 naming the holder.
- ``.<root>.autopilot-owners``: every run that wrote there and has not been released,
  with the output dirs its plan renders. It outlives the run: a later run whose output
  dirs meet a finished run's exits 3 naming it and how to let it go
  (``autopilot cleanup`` or ``autopilot release`` on that state dir). Runs whose cells
  are disjoint (two models of a campaign on one checkout) share a root, one at a time.
  A holder whose state dir is gone has nothing left to protect and is dropped.

Both files are read as untrusted input (anyone who can write the parent can plant
them): a malformed one is a refusal to guess, said in one line, never a crash.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import socket
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path

from autopilot.errors import LockHeld, OutputsOwned
from autopilot.state.fsutil import iso
from autopilot.state.statedir import open_private
from autopilot.state.untrusted import read_json

CLAIM_SUFFIX = ".autopilot-claim"
RELEASED = "released.json"  # in the state dir: when its output dirs were let go
OWNERS_SUFFIX = ".autopilot-owners"


def claim_path(root: Path) -> Path:
    return root.parent / f".{root.name}{CLAIM_SUFFIX}"


def owners_path(root: Path) -> Path:
    return root.parent / f".{root.name}{OWNERS_SUFFIX}"


def outside_roots(roots: tuple[Path, ...], state_dir: Path) -> list[Path]:
    """The roots a run writes into that are not its own state dir (nor inside it)."""
    mine = state_dir.absolute()
    return [root for root in roots if root != mine and mine not in root.parents]


def _same_dir(a: str, b: Path) -> bool:
    return os.path.realpath(a) == os.path.realpath(b)


@dataclass(frozen=True)
class Holder:
    """One run among a root's owners: its state dir and the output dirs it wrote there.
    ``record`` is the entry as read, rewritten as it was (with any field another version
    added)."""

    state_dir: str
    outputs: tuple[str, ...]
    record: dict[str, object]

    @classmethod
    def of(cls, raw: object) -> Holder | None:
        """An owners entry as read (untrusted); None when it is not one of this shape."""
        if not isinstance(raw, dict):
            return None
        state_dir, outputs = raw.get("state_dir"), raw.get("outputs")
        if not isinstance(state_dir, str) or not isinstance(outputs, list) \
                or not all(isinstance(output, str) for output in outputs):
            return None
        return cls(state_dir, tuple(outputs), raw)

    @classmethod
    def new(cls, state_dir: Path, outputs: list[str]) -> Holder:
        path = str(state_dir.absolute())
        return cls(path, tuple(outputs), {"state_dir": path, "outputs": outputs, "since": iso()})


Save = Callable[[list[Holder]], None]


@contextlib.contextmanager
def _owners(root: Path) -> Iterator[tuple[list[Holder], Save]]:
    """The owners record of ``root``, locked while the caller reads and rewrites it
    (briefly: never across a run)."""
    path = owners_path(root)
    fd = open_private(path, os.O_RDWR | os.O_CREAT)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        raw = read_json(path)
        listed = raw.get("holders") if isinstance(raw, dict) else None
        holders = [Holder.of(holder) for holder in listed] if isinstance(listed, list) else None
        if os.fstat(fd).st_size and (holders is None or None in holders):
            raise LockHeld(f"{path}: not an owners record this autopilot wrote (malformed); "
                           "remove it once no run writes under "
                           f"{root}") from None

        def save(new: list[Holder]) -> None:
            blob = (json.dumps({"holders": [holder.record for holder in new]}) + "\n").encode()
            os.ftruncate(fd, 0)
            os.pwrite(fd, blob, 0)
            os.fsync(fd)

        yield [holder for holder in holders or () if holder is not None], save
    finally:
        os.close(fd)


class Claims:
    def __init__(self) -> None:
        self.fds: list[int] = []
        self.dropped: list[dict[str, str]] = []  # holders whose state dir was gone

    def take(self, roots: list[Path], state_dir: Path,
             outputs: Iterable[Path] = ()) -> None:
        """Claim every root (made if missing) for this run's life, and record it among
        each root's owners with ``outputs`` (its cells' output dirs); raise LockHeld
        naming the holder when a live run holds a root, or a finished, unreleased one
        owns one of ``outputs``. Nothing is kept when one is refused."""
        mine = sorted({str(path) for path in outputs})
        try:
            for root in roots:
                self._lock(root, state_dir)
                self._own(root, state_dir,
                          [output for output in mine if Path(output).is_relative_to(root)])
        except BaseException:
            self.release()
            raise
        with contextlib.suppress(FileNotFoundError):  # its outputs are its own again
            (state_dir / RELEASED).unlink()

    def _lock(self, root: Path, state_dir: Path) -> None:
        path = claim_path(root)
        path.parent.mkdir(parents=True, exist_ok=True)
        fd = open_private(path, os.O_RDWR | os.O_CREAT)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
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

    def _own(self, root: Path, state_dir: Path, mine: list[str]) -> None:
        with _owners(root) as (holders, save):
            kept: list[Holder] = []
            for holder in holders:
                if _same_dir(holder.state_dir, state_dir):
                    continue  # ours, from an earlier launch: replaced below
                if not os.path.isdir(holder.state_dir):
                    self.dropped.append({"root": str(root), "state_dir": holder.state_dir})
                    continue
                both = sorted(set(holder.outputs) & set(mine))
                if both:
                    raise OutputsOwned(
                        f"{both[0]}{f' (and {len(both) - 1} more)' if len(both) > 1 else ''}"
                        f" belongs to the run in {holder.state_dir} (finished, not released): "
                        f"`autopilot release --state-dir {holder.state_dir}` (or `autopilot "
                        "cleanup` on it) lets it go, or give this run its own output dirs")
                kept.append(holder)
            save([*kept, Holder.new(state_dir, mine)])

    def release(self) -> None:
        """The live claims (the ownership stays until ``release_owned``)."""
        for fd in self.fds:
            with contextlib.suppress(OSError):
                os.close(fd)
        self.fds = []


def release_owned(roots: Iterable[Path], state_dir: Path) -> list[Path]:
    """Drop this run from every root's owners (cleanup, ``autopilot release``): its
    output dirs may then be another run's. Returns the roots it owned."""
    released = []
    for root in roots:
        if not owners_path(root).is_file():
            continue
        with _owners(root) as (holders, save):
            rest = [holder for holder in holders if not _same_dir(holder.state_dir, state_dir)]
            if len(rest) != len(holders):
                save(rest)
                released.append(root)
    return released


def mark_released(state_dir: Path, roots: list[Path]) -> None:
    """Say in the state dir that its outputs were let go: its verdicts stand in its
    journal, and its views say "released" rather than judge outputs a next run may have
    moved or rewritten. A run that takes the roots again removes it (``Claims.take``)."""
    from autopilot.state.fsutil import atomic_write_json

    atomic_write_json(state_dir / RELEASED, {"ts": iso(), "roots": [str(root) for root in roots]})


def released_at(state_dir: Path) -> str | None:
    """When the state dir's outputs were released (None: they are its own)."""
    doc = read_json(state_dir / RELEASED)
    ts = doc.get("ts") if isinstance(doc, dict) else None
    return ts[:40] if isinstance(ts, str) else None
