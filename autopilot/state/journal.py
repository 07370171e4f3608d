"""The append-only journal: the one source of truth of a run.

Every cell transition is one JSON line, flushed and fsync'd before the supervisor acts
on it, so a ``kill -9`` at any moment loses at most the event being written. On start
the journal is replayed to rebuild all state. A torn last line (the process died inside
a write) is skipped with a warning, never fatal, and the next append starts on a fresh
line so the torn bytes can never glue onto a good record.
"""

from __future__ import annotations

import errno
import json
import os
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
                ev = json.loads(raw)
            except ValueError:
                torn.append(lineno)
                continue
            if isinstance(ev, dict) and "event" in ev:
                yield ev
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
        return (ev for ev in map(parse, self) if ev is not None)


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
                ev = json.loads(raw)
            except ValueError:
                return None
            return parse_iso(ev.get("ts")) if isinstance(ev, dict) else None
    except OSError:
        return None
    return None


class Journal:
    """Append-only writer. One instance per supervisor; appends are synchronous on
    purpose: an event must be on disk before the action it records is taken."""

    def __init__(self, path: Path, *, fsync: bool = True) -> None:
        self.path = path
        self._fsync = fsync
        ensure_private_dir(path.parent)
        self._fd = open_private(path, os.O_RDWR | os.O_APPEND | os.O_CREAT)
        self._repair_tail()

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
                n = os.write(self._fd, view)
                if n <= 0:
                    raise OSError(errno.EIO, "journal write made no progress", str(self.path))
                view = view[n:]
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
        self._write_all(line.encode())
        why = mistyped(record)
        if why is not None:  # our own bug: said loudly, the record kept (it is the truth)
            log.error("journal_event_mistyped", why=why)
        return record

    def close(self) -> None:
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1


def state_events(state_dir: Path) -> ReplayResult:
    """A state dir's journal as a view reads it: owned by the state dir's owner."""
    from autopilot.state.untrusted import owner_of

    return read_events(state_dir / "journal.jsonl", owner_of(state_dir))
