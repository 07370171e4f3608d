"""Is the run a view shows alive? One function for every view (oneline, grid, json,
html, systemd STATUS readers, the served page and its metric).

status.json says what the supervisor last wrote; after a ``kill -9`` or a SIGSTOP it
keeps saying "run:pass1, 3 running, eta 0:06" forever. The heartbeat (rewritten every
``HEARTBEAT_SECS`` by a live supervisor, with its pid and exact start time) tells the
difference: a holder that is gone means "stopped (supervisor gone)" (or "handing over"
after a SIGUSR2, until the successor beats); a heartbeat older
than ``STALE_BEATS`` of its own beat interval means STALE (frozen, or dead on another
host). ``judge`` is pure; ``look`` reads the heartbeat and asks the kernel whether its
process is alive. Neither takes the lock (a shared flock probe would race a starting
supervisor).
"""

from __future__ import annotations

import socket
import time
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal, TypedDict

from autopilot.state.untrusted import state_json

HEARTBEAT_SECS = 10.0  # the supervisor's default beat (lock.beat_interval)
STALE_BEATS = 3  # missed beats before a view says STALE
FINAL_PHASES = frozenset({"COMPLETE", "INCOMPLETE", "stopped"})

State = Literal["live", "stale", "gone", "handover", "finished", "unknown"]
HANDOVER_LABEL = "handing over: attempts run on under their data paths; the next " \
    "supervisor re-attaches"


class LivenessJson(TypedDict):
    """``liveness`` as a view adds it to status.json (dashboard --json, the served page)."""

    state: State
    heartbeat_age_secs: float | None
    label: str


@dataclass(frozen=True)
class Liveness:
    state: State
    age_secs: float | None  # heartbeat age; None without a heartbeat
    label: str  # what a view prints ("" when live or finished)

    def to_json(self) -> LivenessJson:
        return {"state": self.state, "heartbeat_age_secs": None if self.age_secs is None
                else round(self.age_secs, 1), "label": self.label}


def judge(phase: object, heartbeat: Any, holder_alive: bool | None, now: float) -> Liveness:
    """``phase`` from status.json; ``heartbeat`` as read; ``holder_alive``: the
    heartbeat's process is alive with its exact start time (None: another host, cannot
    tell)."""
    phase = phase if isinstance(phase, str) else None  # (a list is not even hashable)
    beat = heartbeat if isinstance(heartbeat, dict) else None
    epoch = beat.get("epoch") if beat else None
    age = now - epoch if isinstance(epoch, int | float) and not isinstance(epoch, bool) \
        else None
    if phase in FINAL_PHASES:
        return Liveness("finished", age, "")
    if beat is None or age is None:
        return Liveness("unknown", None, "no heartbeat (supervisor not running?)")
    if holder_alive is False:
        # SIGUSR2 (`systemctl restart`): the gap until the successor beats is a hand-over,
        # not a stop; its attempts run normally meanwhile.
        if phase == "handed_over":
            return Liveness("handover", age, HANDOVER_LABEL)
        return Liveness("gone", age, "stopped (supervisor gone)")
    every = beat.get("interval_secs")
    every = every if isinstance(every, int | float) and not isinstance(every, bool) \
        and every > 0 else HEARTBEAT_SECS
    if age > STALE_BEATS * every:
        return Liveness("stale", age, f"STALE (heartbeat {fmt_age(age)} old)")
    return Liveness("live", age, "")


def fmt_age(secs: float) -> str:
    secs = max(0, round(secs))
    h, rem = divmod(secs, 3600)
    m, s = divmod(rem, 60)
    return f"{h}h{m:02d}m" if h else f"{m}m{s:02d}s" if m else f"{s}s"


def holder_alive(hb: Any) -> bool | None:
    """The heartbeat's process is alive (exact start time); None for another host."""
    if not isinstance(hb, dict):
        return False
    if hb.get("host") != socket.gethostname():
        return None
    import psutil

    try:
        proc = psutil.Process(int(hb["pid"]))
        return bool(proc.create_time() == float(hb["create_time"])
                    and proc.status() != psutil.STATUS_ZOMBIE)
    except (psutil.NoSuchProcess, psutil.AccessDenied, KeyError, ValueError, TypeError):
        return False


def look(state_dir: Path, phase: object, now: float | None = None) -> Liveness:
    """``phase``: status.json's, as read (untrusted: ``judge`` compares it only)."""
    beat = state_json(state_dir, "heartbeat.json")
    return judge(phase, beat, holder_alive(beat), time.time() if now is None else now)


def annotate(status: Mapping[str, object], live: Liveness) -> dict[str, object]:
    """status.json as a view should show it: the phase says STALE / stopped when the
    supervisor that wrote it is not alive, and ``liveness`` says why."""
    out = dict(status)
    out["liveness"] = live.to_json()
    if live.state in ("stale", "gone", "handover"):
        out["phase_written"] = status.get("phase")
        out["phase"] = {"stale": "STALE", "gone": "stopped"}.get(live.state, "handing over")
        out["eta_secs"] = None
    return out


def shown(state_dir: Path, status: Mapping[str, object]) -> dict[str, object]:
    """status.json as every view shows it: annotated with its liveness, and with
    ``released`` when the run's outputs were let go (autopilot.state.claims)."""
    from autopilot.state.claims import released_at

    out = annotate(status, look(state_dir, status.get("phase")))
    when = released_at(state_dir)
    if when:
        out["released"] = when
    return out
