"""Pure helpers of the dashboard views: cell codes and style classes, the sparkline.
Trend and flips live in ``autopilot.views.stats`` (the report uses them too)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from autopilot.state.ledger import CellState

REASON_LETTER = {
    "stall": "s", "deadline": "d", "harness_crash": "c", "missing_output": "m",
    "grader_failed": "g", "malformed_grade": "j", "zero_tokens": "z", "arm_mismatch": "a",
    "endpoint_down": "e", "api_error": "x", "grader_unavailable": "u",
    "malformed_summary": "y", "rate_limited": "l", "disk_full": "f",
    "unmetered": "n", "datapath_lost": "w", "unscored": "k",
    "sample_errors": "r", "interrupted": "i",
}
# A FAIL the evidence counts against the model, with the caveat every view flags.
CAVEAT_LETTER = {"timed out": "t", "looped": "l", "context exceeded": "o"}
LEGEND = ("P pass  F fail  I<r> invalid (s stall, d deadline, c crash, m missing output, "
          "g grader failed, j malformed grade, z zero tokens, a arm mismatch, e endpoint "
          "down, x api error, u grader unavailable, y malformed summary, l rate limited, "
          "f disk full, n unmetered, w data path lost, k unscored, r sample errors, "
          "i interrupted: resumed)  "
          "F<c> fail with a caveat (t timed out, l looped, o context exceeded, + other)  "
          "U<r> ungraded (run stands, grading failed)  Q quarantined  R running (R3s, R2m: "
          "transcript frozen that long)  "
          "~ awaiting grade  . pending  * teardown-masked")


def code(cell: CellState | None, frozen_warn: float = 0) -> str:
    """A short, colour-independent code for one cell."""
    if cell is None:
        return "."
    if cell.status in ("PASS", "FAIL"):
        mark = CAVEAT_LETTER.get(cell.caveat, "+") if cell.status == "FAIL" and cell.caveat else ""
        return cell.status[0] + mark + ("*" if cell.teardown_masked else "")
    if cell.status == "invalid":
        return "I" + REASON_LETTER.get(cell.reason or "", "?")
    if cell.status == "quarantined":
        return "Q"
    if cell.status == "ungraded":
        return "U" + REASON_LETTER.get(cell.reason or "", "?")
    if cell.status == "running":
        if frozen_warn and cell.frozen_secs >= frozen_warn:
            return f"R{int(cell.frozen_secs // 60)}m" if cell.frozen_secs >= 60 else \
                f"R{int(cell.frozen_secs)}s"
        return "R"
    if cell.status == "ran":
        return "~"
    return "."


COMPACT_LEGEND = ("one letter per replicate, in groups of 5: P pass  F fail  p/f teardown-"
                  "masked  s d c m g j z a e x u invalid or ungraded (reason as above)  "
                  "Q quarantined  "
                  "R running  ! running, frozen past warn  ~ awaiting grade  . pending")


def compact_code(cell: CellState | None, frozen_warn: float = 0) -> str:
    """``code`` squeezed into one character, for grids too wide for the terminal: an
    invalid cell is its reason letter, a teardown-masked verdict is lower case."""
    full = code(cell, frozen_warn)
    if full[0] in "PF":
        return full[0].lower() if full.endswith("*") else full[0]
    if full[0] in "IU":
        return full[1]
    if full[0] == "R":
        return "!" if len(full) > 1 else "R"
    return full


def kind(cell: CellState | None) -> str:
    """The style class of a cell (shared by the terminal and HTML views)."""
    if cell is None:
        return "pending"
    style = {"PASS": "pass", "FAIL": "fail", "invalid": "invalid", "quarantined": "quarantined",
             "ungraded": "invalid", "running": "running", "ran": "running"}
    return style.get(cell.status, "pending") + (
        " masked" if cell.teardown_masked and cell.status in ("PASS", "FAIL") else "")


BLOCKS = "▁▂▃▄▅▆▇█"


def bins(times: Sequence[float], buckets: int = 40) -> list[int]:
    """Completions per time bucket, ``n`` buckets spanning first..last completion."""
    if not times:
        return []
    first, last = min(times), max(times)
    width = (last - first) / buckets or 1.0
    out = [0] * buckets
    for when in times:
        out[min(buckets - 1, int((when - first) / width))] += 1
    return out


def sparkline(counts: Sequence[int]) -> str:
    if not counts:
        return ""
    top = max(counts) or 1
    return "".join(BLOCKS[min(len(BLOCKS) - 1, round(count / top * (len(BLOCKS) - 1)))]
                   if count else " " for count in counts)


def statuses(matrix: Mapping[str, Mapping[int, CellState]]) -> dict[str, dict[int, str]]:
    return {task: {replicate: cell.status for replicate, cell in row.items()}
            for task, row in matrix.items()}
