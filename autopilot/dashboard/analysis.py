"""Pure analysis over the verdict matrix: cell codes, trend windows, flips, sparkline.

Only valid cells (PASS / FAIL) enter a rate; INVALID, quarantined and unfinished cells
never do, and every view prints the trust counts next to the rates.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from autopilot.ledger import CellState

WINDOWS = (3, 5, 10, 20)
MISLEADING_DELTA = 0.3  # a small-N rate this far from the full-N rate was misleading
REASON_LETTER = {
    "stall": "s", "deadline": "d", "harness_crash": "c", "missing_output": "m",
    "grader_failed": "g", "malformed_grade": "j", "zero_tokens": "z", "arm_mismatch": "a",
    "endpoint_down": "e",
}
LEGEND = ("P pass  F fail  I<r> invalid (s stall, d deadline, c crash, m missing output, "
          "g grader failed, j malformed grade, z zero tokens, a arm mismatch, e endpoint "
          "down)  Q quarantined  R running  ~ awaiting grade  . pending  * teardown-masked")


def code(c: CellState | None, frozen_warn: float = 0) -> str:
    """A short, colour-independent code for one cell."""
    if c is None:
        return "."
    if c.status in ("PASS", "FAIL"):
        return c.status[0] + ("*" if c.teardown_masked else "")
    if c.status == "invalid":
        return "I" + REASON_LETTER.get(c.reason or "", "?")
    if c.status == "quarantined":
        return "Q"
    if c.status == "running":
        if frozen_warn and c.frozen_secs >= frozen_warn:
            return f"R{int(c.frozen_secs // 60)}m" if c.frozen_secs >= 60 else \
                f"R{int(c.frozen_secs)}s"
        return "R"
    if c.status == "ran":
        return "~"
    return "."


def kind(c: CellState | None) -> str:
    """The style class of a cell (shared by the terminal and HTML views)."""
    if c is None:
        return "pending"
    return {"PASS": "pass", "FAIL": "fail", "invalid": "invalid", "quarantined": "quarantined",
            "running": "running", "ran": "running"}.get(c.status, "pending") + (
        " masked" if c.teardown_masked and c.status in ("PASS", "FAIL") else "")


@dataclass(frozen=True)
class TrendRow:
    task: str
    windows: dict[int, tuple[int, int]]  # window -> (passes, valid) over v1..window
    misleading: bool


def _rate(p: int, v: int) -> float | None:
    return p / v if v else None


def trend(matrix: Mapping[str, Mapping[int, CellState]], n_max: int,
          windows: Sequence[int] = WINDOWS) -> list[TrendRow]:
    wins = [w for w in windows if w <= n_max] or [n_max]
    if n_max not in wins:
        wins.append(n_max)
    rows = []
    for task, row in matrix.items():
        got: dict[int, tuple[int, int]] = {}
        for w in wins:
            vals = [c.status for n, c in row.items() if n <= w and c.status in ("PASS", "FAIL")]
            got[w] = (vals.count("PASS"), len(vals))
        first, last = _rate(*got[wins[0]]), _rate(*got[wins[-1]])
        misleading = (first is not None and last is not None and len(wins) > 1
                      and abs(first - last) >= MISLEADING_DELTA)
        rows.append(TrendRow(task, got, misleading))
    return rows


@dataclass(frozen=True)
class FlipRow:
    task: str
    modal: str  # PASS / FAIL / tie / none
    flips: list[tuple[int, str]]  # (replicate, verdict) that differ from the modal one
    valid: int


def flips(matrix: Mapping[str, Mapping[int, CellState]]) -> list[FlipRow]:
    rows = []
    for task, row in matrix.items():
        valid = {n: c.status for n, c in row.items() if c.status in ("PASS", "FAIL")}
        tally = Counter(valid.values())
        if not tally:
            rows.append(FlipRow(task, "none", [], 0))
            continue
        top = tally.most_common()
        if len(top) > 1 and top[0][1] == top[1][1]:
            rows.append(FlipRow(task, "tie", sorted(valid.items()), len(valid)))
            continue
        modal = top[0][0]
        rows.append(FlipRow(task, modal, sorted((n, v) for n, v in valid.items() if v != modal),
                            len(valid)))
    return rows


BLOCKS = "▁▂▃▄▅▆▇█"


def bins(times: Sequence[float], n: int = 40) -> list[int]:
    """Completions per time bucket, ``n`` buckets spanning first..last completion."""
    if not times:
        return []
    lo, hi = min(times), max(times)
    width = (hi - lo) / n or 1.0
    out = [0] * n
    for t in times:
        out[min(n - 1, int((t - lo) / width))] += 1
    return out


def sparkline(counts: Sequence[int]) -> str:
    if not counts:
        return ""
    top = max(counts) or 1
    return "".join(BLOCKS[min(len(BLOCKS) - 1, round(c / top * (len(BLOCKS) - 1)))]
                   if c else " " for c in counts)
