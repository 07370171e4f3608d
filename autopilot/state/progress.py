"""Pure progress figures: ETA, durations, the one-line summary (shared by status.json,
systemd STATUS=, milestones and ``dashboard --oneline``; import-light on purpose)."""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # read only: this module stays import-light
    from autopilot.state.statusdoc import Status


def eta_secs(remaining: int, done_this_session: int, session_elapsed: float) -> float | None:
    """Remaining cells at this session's completion rate; None until one cell is done."""
    if remaining <= 0:
        return 0.0
    if done_this_session <= 0 or session_elapsed <= 0:
        return None
    return remaining * session_elapsed / done_this_session


def fmt_secs(secs: float | None) -> str:
    if secs is None or not math.isfinite(secs):  # (an infinity has no whole seconds)
        return "?"
    secs = round(secs)
    h, rem = divmod(secs, 3600)
    m, s = divmod(rem, 60)
    return f"{h}:{m:02d}:{s:02d}" if h else f"{m}:{s:02d}"


def oneline(status: Status) -> str:
    """``run:pass1 demo 14/24 done P9 F5 I0 | 2 running | eta 0:31``"""
    totals = status.totals
    masked = status.trust.get("teardown_masked_cells")
    parts = [
        f"{status.phase or '?'} {status.preset or '?'} {totals.done}/{totals.total} done "
        f"P{totals.pass_} F{totals.fail} I{totals.invalid}"
        + (f" Q{totals.quarantined}" if totals.quarantined else "")
        + (f" U{totals.ungraded}" if totals.ungraded else "")
        + (f" M{masked}" if type(masked) is int and masked else ""),
        f"{totals.running} running",
        f"eta {fmt_secs(status.eta_secs)}",
    ]
    live = status.liveness
    if live is not None and live.label:  # STALE / stopped: see autopilot.state.liveness
        parts[1] = f"{totals.running} running when last seen"
        parts.append(live.label)
    if status.released:
        parts.append(f"released {status.released}: its outputs may be another run's now; "
                     "its verdicts are as journaled")
    ep_state = status.endpoint.get("state")
    finished = status.phase in ("COMPLETE", "INCOMPLETE", "stopped")
    if ep_state not in (None, "up") and not finished:  # stopped at the end: expected
        parts.append(f"endpoint {ep_state}")
    thr = status.throttle
    if thr.throttled and thr.limit is not None:
        parts.append(f"provider throttling: {thr.limit}/{thr.ceiling} at once")
    disk = status.disk or {}
    if disk.get("low") is True and not finished:
        parts.append(f"disk low ({disk.get('free_mb')} MB free): launching paused")
    return " | ".join(parts)
