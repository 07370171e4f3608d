"""Substance checks: a live, writing harness is not necessarily making progress.

The origin operators checked this by hand. Two patterns over the transcript's rows:
  * scroll loop: the tail is a streak of >= ``scroll_loop_streak`` identical tool calls
    once digit runs are replaced by ``#`` (paging through the same file forever);
  * runaway generation: the transcript has been stale for > ``runaway_secs`` and its last
    row is a model response (the model is generating without end, no tool call pending).
Both WARN; with ``substance_kill`` they KILL, recorded as INVALID(stall) with the reason.
``substance_decision`` is pure; ``check_substance`` only adds a cheap, cached tail read.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from autopilot.cell.watchdog import Action, Decision
from autopilot.config import Watchdog

_DIGITS = re.compile(r"\d+")
_TAIL_BYTES = 256 * 1024


def call_signature(row: dict[str, Any], tool_field: str) -> str | None:
    calls = row.get(tool_field)
    if not calls:
        return None
    return _DIGITS.sub("#", json.dumps(calls, sort_keys=True, default=str))


def substance_decision(
    rows: list[dict[str, Any]], stale_secs: float, cfg: Watchdog
) -> tuple[Action, str] | None:
    if not rows:
        return None
    act: Action = "KILL" if cfg.substance_kill else "WARN"
    sigs = [call_signature(r, cfg.tool_field) for r in rows]
    last = sigs[-1]
    if last is not None:
        streak = 0
        for s in reversed(sigs):
            if s != last:
                break
            streak += 1
        if streak >= cfg.scroll_loop_streak:
            return act, f"scroll loop: {streak} identical tool calls in a row"
    if cfg.runaway_secs and stale_secs > cfg.runaway_secs:
        row = rows[-1]
        if row.get(cfg.role_field) == "assistant" and last is None:
            return act, f"runaway generation: stale {stale_secs:.0f}s after a model response"
    return None


@dataclass(frozen=True)
class SubstanceState:
    size: int = -1
    changed_at: float = 0.0
    rows: tuple[dict[str, Any], ...] = ()
    tier: Action = "OK"


def _tail_rows(path: Path, limit: int) -> tuple[dict[str, Any], ...]:
    from autopilot.state.untrusted import read_tail

    try:
        data = read_tail(path, _TAIL_BYTES)[0]  # never a FIFO, a device or a symlink
    except OSError:
        return ()
    rows = []
    for line in data.splitlines()[-limit:]:
        try:
            row = json.loads(line)
        except ValueError:
            continue  # the first line of a tail cut, or a torn last line
        if isinstance(row, dict):
            rows.append(row)
    return tuple(rows)


def check_substance(
    state: SubstanceState, transcript: Path, now: float, cfg: Watchdog
) -> tuple[SubstanceState, Decision | None]:
    try:
        size = transcript.stat().st_size
    except OSError:
        return state, None
    if size != state.size:
        limit = max(cfg.scroll_loop_streak, 1) + 1
        state = replace(state, size=size, changed_at=now, rows=_tail_rows(transcript, limit))
    found = substance_decision(list(state.rows), now - state.changed_at, cfg)
    action: Action = found[0] if found else "OK"
    changed = action != state.tier
    state = replace(state, tier=action)
    if found is None:
        return state, (Decision("OK", "substance ok", None, changed) if changed else None)
    return state, Decision(action, found[1], "substance" if action == "KILL" else None, changed)
