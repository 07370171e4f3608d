"""Pure statistics over verdict matrices: trend windows, flips, Wilson intervals,
Fisher's exact test. A matrix maps task -> replicate -> status string; only "PASS" and
"FAIL" (valid cells) ever enter a rate."""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

Matrix = Mapping[str, Mapping[int, str]]
WINDOWS = (3, 5, 10, 20)
MISLEADING_DELTA = 0.3  # a small-N rate this far from the full-N rate was misleading
VALID = ("PASS", "FAIL")


@dataclass(frozen=True)
class TrendRow:
    task: str
    windows: dict[int, tuple[int, int]]  # window -> (passes, valid) over v1..window
    misleading: bool


def _rate(passes: int, valid: int) -> float | None:
    return passes / valid if valid else None


def trend(matrix: Matrix, n_max: int, windows: Sequence[int] = WINDOWS) -> list[TrendRow]:
    wins = [window for window in windows if window <= n_max] or [n_max]
    if n_max not in wins:
        wins.append(n_max)
    rows = []
    for task, row in matrix.items():
        got: dict[int, tuple[int, int]] = {}
        for window in wins:
            vals = [verdict for replicate, verdict in row.items()
                    if replicate <= window and verdict in VALID]
            got[window] = (vals.count("PASS"), len(vals))
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


def flips(matrix: Matrix) -> list[FlipRow]:
    rows = []
    for task, row in matrix.items():
        valid = {replicate: verdict for replicate, verdict in row.items() if verdict in VALID}
        tally = Counter(valid.values())
        if not tally:
            rows.append(FlipRow(task, "none", [], 0))
            continue
        top = tally.most_common()
        if len(top) > 1 and top[0][1] == top[1][1]:
            rows.append(FlipRow(task, "tie", sorted(valid.items()), len(valid)))
            continue
        modal = top[0][0]
        rows.append(FlipRow(task, modal, sorted((replicate, v) for replicate, v in valid.items()
                                                if v != modal), len(valid)))
    return rows


def wilson(k: int, n: int, z: float = 1.959964) -> tuple[float, float] | None:
    """95% Wilson score interval for k successes out of n (None for n = 0)."""
    if n == 0:
        return None
    p = k / n
    denom = 1 + z * z / n
    centre = (p + z * z / (2 * n)) / denom
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / denom
    return max(0.0, centre - half), min(1.0, centre + half)


def fisher_exact(a: int, b: int, c: int, d: int) -> float:
    """Two-sided p-value of Fisher's exact test for [[a, b], [c, d]]."""
    n1, n2, k = a + b, c + d, a + c
    total = math.comb(n1 + n2, k)

    def prob(x: int) -> float:
        return math.comb(n1, x) * math.comb(n2, k - x) / total

    observed = prob(a)
    lo, hi = max(0, k - n2), min(k, n1)
    p = sum(prob(x) for x in range(lo, hi + 1) if prob(x) <= observed * (1 + 1e-9))
    return min(1.0, p)
