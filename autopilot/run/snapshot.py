"""status.json, built from plain data (pure).

The loop gathers what it knows into a ``RunView`` (the ledger, its phase, the replicas'
descriptions, the throttle) and ``build`` turns it into the snapshot every reader sees:
status.json, the heartbeat's progress line, the live panel, the metrics textfile and
``--once``. Nothing here reads a clock or a file, so ``--once`` (rebuilt from the
journal) and a live supervisor cannot disagree on what a ledger means.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from autopilot.config import Preset
from autopilot.config.limits import limits_for
from autopilot.plan import Plan
from autopilot.run.throttle import Throttle
from autopilot.state.ledger import Ledger
from autopilot.state.progress import eta_secs

SCHEMA_VERSION = 1  # fields are only ever added (autopilot.state.status lists them)


@dataclass(frozen=True)
class RunView:
    preset: Preset
    plan: Plan
    ledger: Ledger
    phase: str
    outcome_reason: str
    pass_no: int
    started_at: str
    updated_at: str
    elapsed: float
    done_this_session: int
    throttle: Throttle
    pid: int
    host: str
    endpoint: dict[str, Any] | None = None  # replica 0, as its keeper describes it
    endpoints: list[dict[str, Any]] | None = None  # every replica, once there are keepers
    streak: int = 0
    alarms: int = 0
    orphans_cleaned: list[dict[str, Any]] = field(default_factory=list)
    publish: dict[str, Any] | None = None
    disk: dict[str, Any] | None = None  # the disk watch (autopilot.state.diskspace)
    elapsed_before: float = 0.0  # the run's earlier launches (prior_elapsed)


def prior_elapsed(status: Any) -> float:
    """How long the run had already run before this launch: the last status.json's
    ``elapsed_secs`` (a state file: shape-checked; anything odd counts as 0)."""
    v = status.get("elapsed_secs") if isinstance(status, dict) else None
    if not isinstance(v, int | float) or isinstance(v, bool) or not 0 <= v < 10 * 365 * 86400:
        return 0.0
    return float(v)


def build(v: RunView, light: bool = False) -> dict[str, Any]:
    """The snapshot; ``light``: without the per-cell parts (progress lines, milestones)."""
    led, preset = v.ledger, v.preset
    summary = led.summary()
    totals = summary.totals
    remaining = totals.total - totals.done - totals.quarantined - totals.ungraded
    snap: dict[str, Any] = {
        "schema_version": SCHEMA_VERSION,
        "phase": v.phase,
        "outcome_reason": v.outcome_reason,
        "preset": preset.name,
        "description": preset.description,
        "model": preset.model,
        "engine": preset.endpoint.engine,
        "target_n": v.plan.target_n,
        "plan_identity": v.plan.identity,
        "pid": v.pid,
        "host": v.host,
        "started_at": v.started_at,
        "updated_at": v.updated_at,
        # The whole run's, across resumes; the ETA's rate is this launch's alone.
        "elapsed_secs": round(v.elapsed_before + v.elapsed, 1),
        "eta_secs": eta_secs(remaining, v.done_this_session, v.elapsed),
        "pass": v.pass_no,
        "max_passes": preset.run.max_passes,
        "concurrency": preset.run.concurrency,
        "totals": totals.as_json(),
        "trust": summary.trust.as_json(),
        "endpoint": v.endpoint if v.endpoint is not None else {
            "engine": preset.endpoint.engine, "state": "not running"},
        "endpoints": v.endpoints,
        "thresholds": thresholds(preset),
        "baseline": preset.baseline.model_dump() if preset.baseline else None,
        "publish": v.publish,
        "spend": {"prompt_tokens": led.spend.prompt,
                  "completion_tokens": led.spend.completion,
                  "usd": led.spend.usd(preset.rate_card.get(preset.model)),
                  **({"grading": {"prompt_tokens": led.grading.prompt,
                                  "completion_tokens": led.grading.completion}}
                     if led.grading.tokens else {}),
                  **({"unmetered": led.unmetered} if led.unmetered else {})},
        "throttle": {"limit": v.throttle.limit, "ceiling": v.throttle.ceiling,
                     "throttled": v.throttle.throttled},
        "disk": v.disk,
        "gateway": {"failovers": led.failovers},
    }
    if light:
        return snap
    cells = list(led.cells.values())
    arms, tasks = [arm.label for arm in preset.arms], [task.id for task in preset.tasks]
    empty = led.counts([])
    snap["arms"] = {arm: summary.arms.get(arm, empty).as_json() for arm in arms}
    snap["tasks"] = {arm: {task: summary.tasks.get((arm, task), empty).as_json() for task in tasks}
                     for arm in arms}
    snap["running"] = [
        {"cell": cell.id, "attempt": cell.attempts, "pid": cell.pid,
         "frozen_secs": round(cell.frozen_secs, 1), "tier": cell.tier,
         "last_signal": cell.last_signal, "started_at": cell.started_ts}
        for cell in cells if cell.status == "running"
    ]
    snap["recent_cells"] = led.recent[-10:]
    snap["fails"] = led.fails[-20:]
    snap["anomaly"] = {"streak": v.streak, "alarms": v.alarms}
    snap["orphans_cleaned"] = v.orphans_cleaned
    snap["arms_order"] = arms
    snap["tasks_order"] = tasks
    return snap


def thresholds(preset: Preset) -> dict[str, Any]:
    """The watchdog limits in force (the environment's overrides included: they are a
    loader layer), and each task whose own differ (``limits_for``)."""
    watchdog = preset.watchdog
    out: dict[str, Any] = {"warn_secs": watchdog.warn_secs, "probe_secs": watchdog.probe_secs,
                           "kill_secs": watchdog.kill_secs, "stuck_secs": watchdog.stuck_secs}
    by_task = {}
    for task in preset.tasks:
        limits = limits_for(preset, task.id)
        own = {**({"stuck_secs": limits.stuck_secs} if task.stuck_secs else {}),
               **({"wall_budget_secs": limits.wall_budget_secs} if task.wall_budget_secs else {})}
        if own:
            by_task[task.id] = own
    if by_task:
        out["tasks"] = by_task
    return out
