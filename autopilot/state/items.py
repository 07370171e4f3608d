"""Cells that grade many items: an Inspect task's samples, a suite's test cases.

Such a cell's grade carries ``items`` (how many passed, were scored, were left unscored,
errored, and of those how many an earlier attempt had scored: ``reused``, an Inspect
resume's) beside its verdict, and the views count those, not the cell: a task of 24
samples at 17 passed is 17/24, not one FAIL. The counts travel with the cell's valid
verdict into the journal and are folded per task and arm by the ledger.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

ITEM_KINDS = ("passed", "scored", "unscored", "errored", "reused")
MAX_ITEMS = 10_000_000


def items_of(raw: Any) -> dict[str, int] | None:
    """A grade's (or the journal's) ``items`` — passed, scored, unscored, errored,
    reused — shape-checked, as untrusted input: counts in range, passed within scored,
    reused within the rest. None when there are none or they do not add up."""
    if not isinstance(raw, Mapping):
        return None
    out = {k: raw.get(k, 0) for k in ITEM_KINDS}
    if not all(type(v) is int and 0 <= v <= MAX_ITEMS for v in out.values()):
        return None
    if out["passed"] > out["scored"] or not any(out.values()):
        return None
    if out["reused"] > out["scored"] + out["unscored"] + out["errored"]:
        return None
    if not out["reused"]:
        del out["reused"]  # said only where a resume reused some
    return out


@dataclass(frozen=True)
class ItemsProgress:
    """How far a running cell of many items got, as its harness says (``harness.items``:
    autopilot.cell.itemsprogress): the items its eval holds, those finished, and of
    those how many an earlier attempt had finished."""

    total: int
    done: int
    reused: int = 0

    @property
    def new(self) -> int:
        """Items this attempt finished itself."""
        return self.done - self.reused

    @property
    def unfinished(self) -> bool:
        return self.done < self.total

    def as_dict(self) -> dict[str, int]:
        return {"total": self.total, "done": self.done, "reused": self.reused,
                "new": self.new}


def progress_of(raw: object) -> ItemsProgress | None:
    """A harness's (or the journal's) progress, shape-checked: whole counts in range,
    reused within done within total. None for anything else."""
    if not isinstance(raw, Mapping):
        return None
    got = [raw.get(k, 0) for k in ("total", "done", "reused")]
    if not all(type(v) is int and 0 <= v <= MAX_ITEMS for v in got):
        return None
    total, done, reused = got
    if not reused <= done <= total or total < 1:
        return None
    return ItemsProgress(total, done, reused)
