"""What the report says of cells that grade many items (an Inspect task's samples):
their counts, and for a cell cut and resumed, what each attempt finished itself."""

from __future__ import annotations

from typing import Any

from autopilot.escape import md
from autopilot.state.items import ITEM_KINDS, progress_of


def samples_text(got: list[dict[str, int] | None]) -> str:
    """Where valid cells grade many items, those are counted: passed of scored, and
    how many were left unscored, errored or reused."""
    counts = [i for i in got if i]
    if not counts:
        return ""
    tot = {k: sum(i.get(k, 0) for i in counts) for k in ITEM_KINDS}
    rest = ", ".join(f"{tot[k]} {k}" for k in ("unscored", "errored", "reused") if tot[k])
    return f"; samples {tot['passed']}/{tot['scored']}" + (f" ({rest})" if rest else "")


def finished_by(reason: str | None, finished: Any, items: dict[str, int] | None,
                regrade: bool = False) -> int | None:
    """The items an attempt finished itself (a verdict's): an interrupted one's word,
    or a valid verdict's counts less what it reused."""
    if reason == "interrupted":
        got = progress_of(finished)
        return got.new if got is not None else None
    if items is None or regrade:
        return None
    return items["scored"] + items["unscored"] + items["errored"] - items.get("reused", 0)


def per_attempt_line(cells: list[tuple[str, tuple[int, ...]]]) -> list[str]:
    """Cells of many items that took several attempts: what each attempt finished."""
    cut = [(cid, per) for cid, per in cells if len(per) > 1]
    if not cut:
        return []
    shown = "; ".join(f"{md(cid)} {' + '.join(map(str, per))}" for cid, per in cut[:20])
    more = f"; and {len(cut) - 20} more" if len(cut) > 20 else ""
    return ["- samples finished by each attempt (a cut attempt's samples stand; the next "
            f"resumes the rest): {shown}{more}"]
