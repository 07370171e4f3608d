"""Substance checks: a live, writing harness is not necessarily making progress.

The origin operators checked this by hand. Two patterns over the transcript's rows:
  * scroll loop: the tail is a streak of >= ``scroll_loop_streak`` identical tool calls
    once digit runs are replaced by ``#`` (paging through the same file forever);
  * runaway generation: the transcript has been stale for > ``runaway_secs`` and its last
    row is a model response (the model is generating without end, no tool call pending).
Both WARN; with ``substance_kill`` they KILL, recorded as INVALID(stall) with the reason.
``transcript_schema = "mmbt"`` reads the MMBT harness's rows the way the origin's
``tooling/scripts/check_substance.py`` does (tool rows' ``args.command``, digit-stripped,
first 300 characters; a streak over tool rows only).
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


def command_template(row: dict[str, Any]) -> str:
    """An MMBT tool row's command as the origin's check_substance.py compares it: digit
    runs replaced by ``#``, then its first 300 characters."""
    args = row.get("args")
    command = args.get("command") if isinstance(args, dict) else None
    return _DIGITS.sub("#", command if isinstance(command, str) else "")[:300]


def tail_streak(items: list[Any]) -> int:
    """How many items at the end equal the last one."""
    n = 0
    for item in reversed(items):
        if item != items[-1]:
            break
        n += 1
    return n


def _mmbt_decision(rows: list[dict[str, Any]], stale_secs: float, cfg: Watchdog,
                   act: Action) -> tuple[Action, str] | None:
    """The MMBT shape: the streak runs over tool rows only (model rows between them
    neither break nor make it); runaway is a stale transcript ending in a model row."""
    tools = [command_template(r) for r in rows if r.get("type") == "tool"]
    if len(tools) >= 2:
        streak = tail_streak(tools)
        if streak >= cfg.scroll_loop_streak:
            return act, f"scroll loop: {streak} identical tool commands in a row"
    if cfg.runaway_secs and stale_secs > cfg.runaway_secs and rows[-1].get("type") == "model":
        return act, f"runaway generation: stale {stale_secs:.0f}s after a model response"
    return None


def substance_decision(
    rows: list[dict[str, Any]], stale_secs: float, cfg: Watchdog
) -> tuple[Action, str] | None:
    if not rows:
        return None
    act: Action = "KILL" if cfg.substance_kill else "WARN"
    if cfg.transcript_schema == "mmbt":
        return _mmbt_decision(rows, stale_secs, cfg, act)
    sigs = [call_signature(r, cfg.tool_field) for r in rows]
    last = sigs[-1]
    if last is not None:
        streak = tail_streak(sigs)
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


def _tail_rows(path: Path, limit: int, tail_bytes: int = _TAIL_BYTES
               ) -> tuple[dict[str, Any], ...]:
    from autopilot.state.untrusted import read_tail

    try:
        data = read_tail(path, tail_bytes)[0]  # never a FIFO, a device or a symlink
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
        tail = _TAIL_BYTES
        if cfg.transcript_schema == "mmbt":
            # Model and tool rows alternate, and a tool row carries its output: enough
            # rows, and bytes, for a streak of tool rows.
            limit, tail = 4 * limit, 8 * _TAIL_BYTES
        state = replace(state, size=size, changed_at=now,
                        rows=_tail_rows(transcript, limit, tail))
    found = substance_decision(list(state.rows), now - state.changed_at, cfg)
    action: Action = found[0] if found else "OK"
    changed = action != state.tier
    state = replace(state, tier=action)
    if found is None:
        return state, (Decision("OK", "substance ok", None, changed) if changed else None)
    return state, Decision(action, found[1], "substance" if action == "KILL" else None, changed)


def last_row_says(transcript: Path, field: str, values: list[str]) -> bool:
    """The transcript's last row holds one of ``values`` at ``field`` (a dotted path):
    the harness's own word that its work is done (``harness.terminal_row``)."""
    from autopilot.cell.validity import lookup
    from autopilot.state.untrusted import read_tail

    try:
        lines = read_tail(transcript, 8192)[0].splitlines()
        row = json.loads(lines[-1]) if lines else None
    except (OSError, ValueError):  # missing, refused (a FIFO, a symlink), torn
        return False
    return str(lookup(row, field)) in values
