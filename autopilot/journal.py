"""The append-only journal: the one source of truth of a run.

Every cell transition is one JSON line, flushed and fsync'd before the supervisor acts
on it, so a ``kill -9`` at any moment loses at most the event being written. On start
the journal is replayed to rebuild all state. A torn last line (the process died inside
a write) is skipped with a warning, never fatal, and the next append starts on a fresh
line so the torn bytes can never glue onto a good record.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from autopilot.fsutil import iso
from autopilot.logsetup import get_logger

log = get_logger(__name__)


@dataclass
class ReplayResult:
    events: list[dict[str, Any]] = field(default_factory=list)
    torn_lines: list[int] = field(default_factory=list)


def read_events(path: Path) -> ReplayResult:
    """All well-formed events; malformed lines are reported, not raised."""
    result = ReplayResult()
    try:
        f = path.open("rb")
    except FileNotFoundError:
        return result
    with f:
        for lineno, raw in enumerate(f, start=1):
            if not raw.strip():
                continue
            try:
                ev = json.loads(raw)
            except ValueError:
                result.torn_lines.append(lineno)
                continue
            if isinstance(ev, dict) and "event" in ev:
                result.events.append(ev)
            else:
                result.torn_lines.append(lineno)
    return result


def iter_events(path: Path) -> Iterator[dict[str, Any]]:
    yield from read_events(path).events


class Journal:
    """Append-only writer. One instance per supervisor; appends are synchronous on
    purpose: an event must be on disk before the action it records is taken."""

    def __init__(self, path: Path, *, fsync: bool = True) -> None:
        self.path = path
        self._fsync = fsync
        path.parent.mkdir(parents=True, exist_ok=True)
        self._fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_CLOEXEC, 0o644)
        self._repair_tail()

    def _repair_tail(self) -> None:
        size = os.fstat(self._fd).st_size
        if size == 0:
            return
        with self.path.open("rb") as f:
            f.seek(size - 1)
            if f.read(1) != b"\n":
                log.warning("journal_torn_tail", path=str(self.path), size=size)
                os.write(self._fd, b"\n")

    def append(self, event: str, **fields: Any) -> dict[str, Any]:
        record = {"ts": iso(), "event": event, **fields}
        line = json.dumps(record, separators=(",", ":"), default=str) + "\n"
        os.write(self._fd, line.encode())
        if self._fsync:
            os.fsync(self._fd)
        return record

    def close(self) -> None:
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1
