"""Pure watchdog decisions: progress observations + thresholds + now -> an action.

The supervisor polls each running cell cheaply (``os.stat`` every ``poll_secs``; inotify
is no help because a freeze is the *absence* of events) and feeds what it saw here. This
module never touches a process or a file, so tests drive hours of stall with a fake clock.

Tiers, after the origin runbook (doc 000):
  * no-progress watch, where *any* signal counts as progress (transcript growth, spool
    growth, sandbox activity, a completion artifact appearing, the endpoint decoding):
    WARN at ``warn_secs``, PROBE at ``probe_secs``, KILL at ``kill_secs`` -> INVALID(stall);
  * transcript freeze: the transcript has not grown for ``stuck_secs`` -> KILL, even if
    the process keeps writing elsewhere (a harness spinning on its own log is not working);
    a slow cell whose transcript still grows is never stuck: this fires on freeze, not on
    wall time. A harness that does not stream writes nothing during one long model turn:
    while the endpoint reports tokens being decoded (llama-server ``/slots``, vLLM
    ``/metrics``), the model is working for it, and that counts as transcript progress
    (per endpoint, not per request: neither API names the client of a slot);
  * hard deadline (task wall budget + overhead, capped) -> KILL -> INVALID(deadline);
  * hung teardown: terminal evidence (completion artifacts) while the process is still
    alive after ``teardown_grace_secs`` -> KILL, grade from outputs, ``teardown_masked``.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Literal

from autopilot.config.limits import TaskLimits

Action = Literal["OK", "WARN", "PROBE", "KILL"]
KillKind = Literal["stall", "deadline", "teardown", "substance"]


@dataclass(frozen=True)
class Limits:
    warn_secs: float
    probe_secs: float
    kill_secs: float
    stuck_secs: float
    teardown_grace_secs: float
    deadline: float  # absolute, on the same clock as Observation.now

    @classmethod
    def starting(cls, task: TaskLimits, start: float) -> Limits:
        """A task's limits (autopilot.config.limits) for an attempt that starts at ``start``."""
        return cls(warn_secs=task.warn_secs, probe_secs=task.probe_secs,
                   kill_secs=task.kill_secs, stuck_secs=task.stuck_secs,
                   teardown_grace_secs=task.teardown_grace_secs,
                   deadline=start + task.deadline_secs)


@dataclass(frozen=True)
class Observation:
    now: float
    transcript_size: int | None  # None: not there (yet)
    spool_size: int
    activity: int | None = None  # e.g. sandbox container CPU counter; None: unknown
    completion: bool = False  # all completion artifacts present
    alive: bool = True
    generating: int | None = None  # the endpoint's decoded-token counter while busy
    metered: int | None = None  # the cell's gateway progress counter (autopilot.gateway)


@dataclass(frozen=True)
class WatchState:
    started: float
    last_progress: float
    last_transcript: float
    transcript_size: int | None = None
    spool_size: int = 0
    activity: int | None = None
    generating: int | None = None
    metered: int | None = None
    completion_since: float | None = None
    tier: Action = "OK"
    last_signal: str = "start"

    @classmethod
    def begin(cls, now: float) -> WatchState:
        return cls(started=now, last_progress=now, last_transcript=now)


@dataclass(frozen=True)
class Decision:
    action: Action
    reason: str
    kind: KillKind | None = None  # set when action == "KILL"
    changed: bool = False  # the tier differs from the previous decision's
    idle_secs: float = 0.0
    frozen_secs: float = 0.0


def observe(state: WatchState, obs: Observation) -> WatchState:
    """Fold one observation into the state (progress bookkeeping only)."""
    now = obs.now
    s = state
    if obs.transcript_size is not None and obs.transcript_size != s.transcript_size:
        if s.transcript_size is not None or obs.transcript_size > 0:
            s = replace(s, last_transcript=now, last_progress=now, last_signal="transcript")
        s = replace(s, transcript_size=obs.transcript_size)
    if obs.spool_size != s.spool_size:
        s = replace(s, spool_size=obs.spool_size, last_progress=now, last_signal="spool")
    if obs.activity is not None and obs.activity != s.activity:
        if s.activity is not None:
            s = replace(s, last_progress=now, last_signal="sandbox")
        s = replace(s, activity=obs.activity)
    if obs.generating is not None and obs.generating != s.generating:
        if s.generating is not None:
            # The model is decoding: the harness is waiting on it, not stuck.
            s = replace(s, last_transcript=now, last_progress=now, last_signal="endpoint")
        s = replace(s, generating=obs.generating)
    if obs.metered is not None and obs.metered != s.metered:
        if s.metered is not None:
            # A request of this cell's started, got bytes back or ended: the harness is
            # talking to the model (and the model to it), whatever its transcript says.
            s = replace(s, last_transcript=now, last_progress=now, last_signal="gateway")
        s = replace(s, metered=obs.metered)
    if obs.completion and s.completion_since is None:
        s = replace(s, completion_since=now, last_progress=now, last_signal="completion")
    return s


def decide(state: WatchState, obs: Observation, limits: Limits) -> tuple[WatchState, Decision]:
    """Observe, then choose. Returns the new state and the decision for this tick."""
    s = observe(state, obs)
    now = obs.now
    idle = now - s.last_progress
    frozen = now - s.last_transcript
    action: Action
    kind: KillKind | None = None
    if s.completion_since is not None:
        # Work is done; the only question is whether the process will exit by itself.
        lingering = now - s.completion_since
        if obs.alive and lingering >= limits.teardown_grace_secs:
            action, kind = "KILL", "teardown"
            reason = f"outputs complete but process alive {lingering:.0f}s (hung teardown)"
        else:
            action, reason = "OK", "completion artifacts present"
    elif now >= limits.deadline:
        action, kind = "KILL", "deadline"
        reason = f"hard deadline passed after {now - s.started:.0f}s"
    elif frozen >= limits.stuck_secs:
        action, kind = "KILL", "stall"
        reason = f"transcript frozen {frozen:.0f}s >= stuck_secs {limits.stuck_secs:.0f}"
    elif idle >= limits.kill_secs:
        action, kind = "KILL", "stall"
        reason = f"no progress {idle:.0f}s >= kill {limits.kill_secs:.0f}s"
    elif idle >= limits.probe_secs:
        action, reason = "PROBE", f"no progress {idle:.0f}s"
    elif idle >= limits.warn_secs:
        action, reason = "WARN", f"no progress {idle:.0f}s"
    else:
        action, reason = "OK", f"progress via {s.last_signal}"
    changed = action != s.tier
    s = replace(s, tier=action)
    return s, Decision(action, reason, kind, changed, idle, frozen)
