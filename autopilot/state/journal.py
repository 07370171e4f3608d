"""The append-only journal: the one source of truth of a run.

Every cell transition is one JSON line, written before the supervisor acts on it and
on disk before any effect that outlives the machine (see ``Journal``), so a ``kill -9``
at any moment loses at most the event being written. On start
the journal is replayed to rebuild all state. A torn last line (the process died inside
a write) is skipped with a warning, never fatal, and the next append starts on a fresh
line so the torn bytes can never glue onto a good record.
"""

from __future__ import annotations

import errno
import json
import os
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from autopilot.escape import bounded
from autopilot.logsetup import get_logger
from autopilot.state.eventbase import EventBase
from autopilot.state.events import mistyped, parse
from autopilot.state.fsutil import iso
from autopilot.state.statedir import ensure_private_dir, open_private

log = get_logger(__name__)


class ReplayResult:
    """A journal as read: iterating it streams its well-formed records from the file
    (memory bounded by one line, not by the journal: a view of a 1 GB journal holds what
    it folds, never the journal); ``events`` is the list, for a caller that needs one;
    ``torn_lines``, the malformed lines a whole pass found."""

    def __init__(self, path: Path | None = None, owner: int | None = None) -> None:
        self.path, self.owner = path, owner
        self._events: list[dict[str, Any]] | None = None
        self._torn: list[int] | None = None

    def __iter__(self) -> Iterator[dict[str, Any]]:
        if self._events is not None:
            yield from self._events
            return
        if self.path is None:
            return
        # Through autopilot.state.untrusted: a journal replaced by a FIFO or a symlink (in
        # a state dir a view is pointed at) reads as empty, never as a hang or another file.
        from autopilot.state.untrusted import lines

        torn: list[int] = []
        for lineno, raw in enumerate(lines(self.path, self.owner), start=1):
            if not raw.strip():
                continue
            try:
                event = json.loads(raw)
            except ValueError:
                torn.append(lineno)
                continue
            if isinstance(event, dict) and "event" in event:
                yield event
            else:
                torn.append(lineno)
        self._torn = torn

    @property
    def events(self) -> list[dict[str, Any]]:
        if self._events is None:
            self._events = list(self)
        return self._events

    @property
    def torn_lines(self) -> list[int]:
        if self._torn is None:
            for _ in self:
                pass
        return self._torn or []

    def typed(self) -> Iterator[EventBase]:
        """The events as their types (autopilot.state.events), streamed: what a view
        reads; a record that fits no type is left out, as a torn line is."""
        return (event for event in map(parse, self) if event is not None)


def read_events(path: Path, owner: int | None = None) -> ReplayResult:
    """All well-formed events (streamed as iterated); malformed lines are reported, not
    raised."""
    return ReplayResult(path, owner)


def iter_events(path: Path) -> Iterator[dict[str, Any]]:
    yield from read_events(path)


def began(path: Path) -> float | None:
    """When the run began: its journal's first event (None: no event yet)."""
    from autopilot.state.fsutil import parse_iso
    from autopilot.state.untrusted import lines

    try:
        for raw in lines(path):
            try:
                event = json.loads(raw)
            except ValueError:
                return None
            return parse_iso(event.get("ts")) if isinstance(event, dict) else None
    except OSError:
        return None
    return None


class Journal:
    """Append-only writer. One instance per supervisor. An append is written at once,
    in order (a ``kill -9`` of the supervisor loses nothing appended: the bytes are the
    kernel's), and made durable either at once (``fsync`` per append) or, with
    ``group``, by a commit thread that fsyncs whatever was appended meanwhile in one go,
    off the event loop.

    Why that keeps the write-ahead rule: fsync guards only against the machine's own
    crash, and that also ends every process the run started, so no spawn or kill the
    supervisor acts on can outlive an event it lost. What can outlive it is an effect
    outside the machine (a notification, a publish): ``durable()`` (and ``settled()``
    from the loop) waits for every event appended so far to be on disk, and is called
    before each such effect, and at close."""

    def __init__(self, path: Path, *, fsync: bool = True, group: bool = False) -> None:
        self.path = path
        self._fsync = fsync and not group  # per append; with ``group`` the thread's
        ensure_private_dir(path.parent)
        self._fd = open_private(path, os.O_RDWR | os.O_APPEND | os.O_CREAT)
        self._repair_tail()
        self._commit = _GroupCommit(self._fd, str(path)) if fsync and group else None

    def _repair_tail(self) -> None:
        size = os.fstat(self._fd).st_size
        self._end = size
        if size == 0:
            return
        if os.pread(self._fd, 1, size - 1) != b"\n":
            log.warning("journal_torn_tail", path=str(self.path), size=size)
            self._write_all(b"\n")

    def _write_all(self, data: bytes) -> None:
        """Append ``data`` whole, or not at all: ``os.write`` may write part of it (a
        full disk takes what fits), so loop over the rest; on any failure cut the file
        back to the last good offset, so the torn bytes can never glue onto the next
        record once space is freed."""
        if os.fstat(self._fd).st_size != self._end:
            os.ftruncate(self._fd, self._end)  # a failed append's bytes the cut missed
        view = memoryview(data)
        try:
            while view:
                written = os.write(self._fd, view)
                if written <= 0:
                    raise OSError(errno.EIO, "journal write made no progress", str(self.path))
                view = view[written:]
            if self._fsync:
                os.fsync(self._fd)
        except OSError:
            try:
                os.ftruncate(self._fd, self._end)
            except OSError:
                pass  # retried before the next append
            raise
        self._end += len(data)

    def append(self, event: str, **fields: Any) -> dict[str, Any]:
        """Journal one event (its values bounded: autopilot.escape.bounded) and return the
        record as written."""
        record = {"ts": iso(), "event": event, **{k: bounded(v) for k, v in fields.items()}}
        line = json.dumps(record, separators=(",", ":"), default=str) + "\n"
        if self._commit is not None:
            self._commit.check()  # a failed commit is this append's failure
        self._write_all(line.encode())
        if self._commit is not None:
            self._commit.written()
        why = mistyped(record)
        if why is not None:  # our own bug: said loudly, the record kept (it is the truth)
            log.error("journal_event_mistyped", why=why)
        return record

    def durable(self, timeout: float | None = None) -> None:
        """Return once every event appended so far is on disk (raises the commit's
        OSError, or TimeoutError)."""
        if self._commit is not None:
            self._commit.wait(timeout)

    async def settled(self) -> None:
        """``durable()`` from the event loop: at once when nothing waits to be
        committed, else awaited in a worker thread."""
        if self._commit is not None and not self._commit.idle():
            import anyio

            await anyio.to_thread.run_sync(self._commit.wait, None)

    def close(self) -> None:
        if self._fd >= 0:
            if self._commit is not None:
                try:
                    self._commit.stop()
                except OSError as e:  # the disk failed under the last commit: said
                    log.error("journal_commit_failed", path=str(self.path), error=str(e))
                self._commit = None
            os.close(self._fd)
            self._fd = -1


class _GroupCommit:
    """One thread that fsyncs the journal whenever something was appended since its
    last fsync: every append waiting meanwhile is made durable by one call."""

    def __init__(self, fd: int, path: str) -> None:
        self._fd, self._path = fd, path
        self._cond = threading.Condition()
        self._appended = self._synced = 0
        self._error: OSError | None = None
        self._closing = False
        self._thread = threading.Thread(target=self._run, name="journal-commit", daemon=True)
        self._thread.start()

    def written(self) -> None:
        with self._cond:
            self._appended += 1
            self._cond.notify_all()

    def idle(self) -> bool:
        with self._cond:
            return self._synced >= self._appended and self._error is None

    def check(self) -> None:
        with self._cond:
            if self._error is not None:
                raise self._error

    def wait(self, timeout: float | None) -> None:
        with self._cond:
            target = self._appended
            if not self._cond.wait_for(
                    lambda: self._synced >= target or self._error is not None, timeout):
                raise TimeoutError(f"journal not committed within {timeout}s: {self._path}")
            if self._error is not None:
                raise self._error

    def stop(self) -> None:
        """Commit what is left, then end the thread."""
        with self._cond:
            self._closing = True
            self._cond.notify_all()
        self._thread.join()
        self.check()

    def _run(self) -> None:
        while True:
            with self._cond:
                self._cond.wait_for(lambda: self._appended > self._synced or self._closing)
                if self._appended <= self._synced:
                    return  # closing, and nothing is left to commit
                target = self._appended
            try:
                os.fsync(self._fd)
            except OSError as e:
                with self._cond:
                    self._error = e
                    self._cond.notify_all()
                return
            with self._cond:
                self._synced = target
                self._cond.notify_all()


def state_events(state_dir: Path) -> ReplayResult:
    """A state dir's journal as a view reads it: owned by the state dir's owner."""
    from autopilot.state.untrusted import owner_of

    return read_events(state_dir / "journal.jsonl", owner_of(state_dir))
