"""Pure restart policy for a down endpoint: wait, restart, or give up.

Restarts back off exponentially, and more than ``max_restarts`` inside
``restart_window_secs`` gives up (the run ends INCOMPLETE with ``endpoint_failed``)
instead of looping hot on an endpoint that will never come back.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Literal

from autopilot.config import EndpointCommon

RestartAction = Literal["ok", "wait", "restart", "give_up"]


def backoff_secs(restarts_in_window: int, base: float, cap: float) -> float:
    if restarts_in_window <= 0:
        return 0.0
    return float(min(cap, base * 2 ** (restarts_in_window - 1)))


def restart_action(
    down_since: float | None, now: float, restarts: Sequence[float], cfg: EndpointCommon
) -> RestartAction:
    if down_since is None:
        return "ok"
    if now - down_since < cfg.down_restart_secs:
        return "wait"
    recent = [when for when in restarts if now - when < cfg.restart_window_secs]
    if len(recent) >= cfg.max_restarts:
        return "give_up"
    wait = backoff_secs(len(recent), cfg.restart_backoff_secs, cfg.restart_backoff_max_secs)
    if recent and now - max(recent) < wait:
        return "wait"
    return "restart"
