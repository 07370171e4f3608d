"""Pure progress figures: ETA, durations, the one-line summary (shared by status.json,
systemd STATUS=, milestones and ``dashboard --oneline``; import-light on purpose)."""

from __future__ import annotations

from typing import Any


def eta_secs(remaining: int, done_this_session: int, session_elapsed: float) -> float | None:
    """Remaining cells at this session's completion rate; None until one cell is done."""
    if remaining <= 0:
        return 0.0
    if done_this_session <= 0 or session_elapsed <= 0:
        return None
    return remaining * session_elapsed / done_this_session


def fmt_secs(secs: float | None) -> str:
    if secs is None:
        return "?"
    secs = round(secs)
    h, rem = divmod(secs, 3600)
    m, s = divmod(rem, 60)
    return f"{h}:{m:02d}:{s:02d}" if h else f"{m}:{s:02d}"


def oneline(status: dict[str, Any]) -> str:
    """``run:pass1 demo 14/24 done P9 F5 I0 | 2 running | eta 0:31``"""
    t = status.get("totals", {})
    trust = status.get("trust", {})
    parts = [
        f"{status.get('phase', '?')} {status.get('preset', '?')} "
        f"{t.get('done', 0)}/{t.get('total', 0)} done "
        f"P{t.get('pass', 0)} F{t.get('fail', 0)} I{t.get('invalid', 0)}"
        + (f" Q{t.get('quarantined')}" if t.get("quarantined") else "")
        + (f" U{t.get('ungraded')}" if t.get("ungraded") else "")
        + (f" M{trust.get('teardown_masked_cells')}" if trust.get("teardown_masked_cells")
           else ""),
        f"{t.get('running', 0)} running",
        f"eta {fmt_secs(status.get('eta_secs'))}",
    ]
    live = status.get("liveness") or {}
    if live.get("label"):  # STALE / stopped (supervisor gone): see autopilot.state.liveness
        parts[1] = f"{t.get('running', 0)} running when last seen"
        parts.append(str(live["label"]))
    if status.get("released"):
        parts.append(f"released {status['released']}: its outputs may be another run's now; "
                     "its verdicts are as journaled")
    ep = status.get("endpoint") or {}
    finished = status.get("phase") in ("COMPLETE", "INCOMPLETE", "stopped")
    if ep.get("state") not in (None, "up") and not finished:  # stopped at the end: expected
        parts.append(f"endpoint {ep.get('state')}")
    thr = status.get("throttle") or {}
    if isinstance(thr, dict) and thr.get("throttled"):
        parts.append(f"provider throttling: {thr.get('limit')}/{thr.get('ceiling')} at once")
    disk = status.get("disk") or {}
    if isinstance(disk, dict) and disk.get("low") is True and not finished:
        parts.append(f"disk low ({disk.get('free_mb')} MB free): launching paused")
    return " | ".join(parts)
