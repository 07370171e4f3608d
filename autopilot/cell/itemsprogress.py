"""A running cell of many items (an Inspect task's samples): how far its harness got,
and the time budget that follows from how many it has.

The harness keeps a small JSON file current (``harness.items``: ``{"total": 8,
"done": 4, "reused": 3}``: the items its eval holds, those finished so far, and of
those how many an earlier attempt had finished). The supervisor reads it as untrusted
input (shape-checked, a few KB at most, never through a link) for two decisions:

- **the deadline scales with the work**: with ``harness.item_budget_secs`` set and no
  budget of the task's own, a cell's wall budget is that many seconds for each item
  still to run (``total - reused``), never below the harness's ``wall_budget_secs``,
  and the hard deadline never past ``watchdog.deadline_cap_secs`` — a harness that
  claims a million items gains no more than the cap;
- **a cut is resumable work, not the model's FAIL**: an attempt of such a cell that
  ends unfinished (its deadline, a stall, a kill, an interrupted eval) with fewer items
  done than it holds is INVALID(interrupted); the items it finished stand and its next
  attempt resumes the rest. It spends no retry when it finished at least one new item
  (it made progress; the cell's items bound how often that can happen).

Both rules are pure functions of the file's content and the limits (tested as data).
"""

from __future__ import annotations

import os
from pathlib import Path

from autopilot.config.limits import TaskLimits
from autopilot.state import untrusted
from autopilot.state.cellevents import CellDeadline
from autopilot.state.items import ItemsProgress, progress_of

CAP = 4096


def read_progress(path: Path | None) -> ItemsProgress | None:
    """The harness's file now (None: none, unreadable or of another shape)."""
    if path is None:
        return None
    try:
        return progress_of(untrusted.read_json(path, cap=CAP))
    except (OSError, ValueError):
        return None


def deadline_secs(limits: TaskLimits, progress: ItemsProgress | None) -> float:
    """From an attempt's start to its hard deadline, given what the harness says it
    holds: the task's own limits where it sets a budget (``per_item_secs`` 0), where
    none per item is configured, or before the count is known."""
    per_item = limits.per_item_secs
    if per_item <= 0 or progress is None or progress.total < 2:
        return limits.deadline_secs
    budget = max(limits.wall_budget_secs, per_item * (progress.total - progress.reused))
    overhead = max(0.0, limits.deadline_secs - limits.wall_budget_secs)
    return max(limits.deadline_secs, min(budget + overhead, limits.deadline_cap_secs))


class ItemsWatch:
    """The file of one attempt, re-read only when it changed (a stat per watchdog tick)."""

    def __init__(self, path: Path | None) -> None:
        self.path = path
        self._seen: tuple[int, int] | None = None
        self.last: ItemsProgress | None = None

    def poll(self) -> bool:
        """Re-read the file if it changed; True when what it says changed."""
        if self.path is None:
            return False
        try:
            info = os.stat(self.path, follow_symlinks=False)
        except OSError:
            return False
        key = (info.st_mtime_ns, info.st_size)
        if key == self._seen:
            return False
        self._seen = key
        got = read_progress(self.path)
        changed = got is not None and got != self.last
        if got is not None:
            self.last = got
        return changed

    def rescale(self, origin: float, limits: TaskLimits, current: float, cell: str,
                attempt: int) -> tuple[float, CellDeadline] | None:
        """The attempt's new hard deadline (loop clock) and its journal record, when
        what the harness says moves it; None when it stays."""
        if not self.poll() or self.last is None:
            return None
        secs = deadline_secs(limits, self.last)
        if abs(origin + secs - current) < 1.0:
            return None
        return origin + secs, CellDeadline(cell=cell, attempt=attempt,
                                           deadline_secs=round(secs, 1),
                                           total=self.last.total, reused=self.last.reused)
