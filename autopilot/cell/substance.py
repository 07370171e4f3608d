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
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import NamedTuple

from autopilot.cell.watchdog import Action, Decision
from autopilot.config import Watchdog

_DIGITS = re.compile(r"\d+")
_TAIL_BYTES = 256 * 1024


class Step(NamedTuple):
    """One transcript row as the substance checks read it (the row is the harness's,
    untrusted: read once, here, into this)."""
    call: str | None  # its tool call, digit runs as ``#`` (None: it calls no tool)
    model: bool  # a model's response: the origin's "model" row, an assistant's message


def call_signature(row: Mapping[str, object], tool_field: str) -> str | None:
    calls = row.get(tool_field)
    if not calls:
        return None
    return _DIGITS.sub("#", json.dumps(calls, sort_keys=True, default=str))


def command_template(row: Mapping[str, object]) -> str:
    """An MMBT tool row's command as the origin's check_substance.py compares it: digit
    runs replaced by ``#``, then its first 300 characters."""
    args = row.get("args")
    command = args.get("command") if isinstance(args, dict) else None
    return _DIGITS.sub("#", command if isinstance(command, str) else "")[:300]


def step_of(row: Mapping[str, object], cfg: Watchdog) -> Step:
    if cfg.transcript_schema == "mmbt":
        kind = row.get("type")
        return Step(command_template(row) if kind == "tool" else None, kind == "model")
    return Step(call_signature(row, cfg.tool_field), row.get(cfg.role_field) == "assistant")


def tail_streak(items: Sequence[object]) -> int:
    """How many items at the end equal the last one."""
    streak = 0
    for item in reversed(items):
        if item != items[-1]:
            break
        streak += 1
    return streak


def substance_decision(
    steps: Sequence[Step], stale_secs: float, cfg: Watchdog
) -> tuple[Action, str] | None:
    if not steps:
        return None
    act: Action = "KILL" if cfg.substance_kill else "WARN"
    if cfg.transcript_schema == "mmbt":
        # The MMBT shape: the streak runs over tool rows only (model rows between them
        # neither break nor make it).
        tools = [step.call for step in steps if step.call is not None]
        streak = tail_streak(tools) if len(tools) >= 2 else 0
        if streak >= cfg.scroll_loop_streak:
            return act, f"scroll loop: {streak} identical tool commands in a row"
    elif steps[-1].call is not None:
        streak = tail_streak([step.call for step in steps])
        if streak >= cfg.scroll_loop_streak:
            return act, f"scroll loop: {streak} identical tool calls in a row"
    last = steps[-1]
    if cfg.runaway_secs and stale_secs > cfg.runaway_secs and last.model and last.call is None:
        return act, f"runaway generation: stale {stale_secs:.0f}s after a model response"
    return None


@dataclass(frozen=True)
class SubstanceState:
    size: int = -1
    changed_at: float = 0.0
    steps: tuple[Step, ...] = ()
    tier: Action = "OK"


def _tail_steps(path: Path, limit: int, tail_bytes: int, cfg: Watchdog) -> tuple[Step, ...]:
    from autopilot.state.untrusted import read_tail

    try:
        data = read_tail(path, tail_bytes)[0]  # never a FIFO, a device or a symlink
    except OSError:
        return ()
    steps = []
    for line in data.splitlines()[-limit:]:
        try:
            row = json.loads(line)
        except ValueError:
            continue  # the first line of a tail cut, or a torn last line
        if isinstance(row, dict):
            steps.append(step_of(row, cfg))
    return tuple(steps)


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
                        steps=_tail_steps(transcript, limit, tail, cfg))
    found = substance_decision(state.steps, now - state.changed_at, cfg)
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
