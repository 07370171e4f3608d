"""The journal's events of a run as a whole: its start and end, passes, the endpoint,
the disk, milestones, publishing, recovery, the Ray backend; and a campaign's own
journal (campaign.jsonl). autopilot.state.events holds them together with the cells'.
"""

from __future__ import annotations

from typing import Any, Literal, Protocol, get_args

from pydantic import Field

from autopilot.state.eventbase import EventBase

MilestoneKind = Literal[
    "run_started", "endpoint_restart", "endpoint_failed", "node_lost", "arm_complete",
    "run_complete", "run_incomplete", "harness_anomaly", "publish_failed", "budget_reached",
    "disk_low", "disk_ok", "campaign_entry_finished", "campaign_complete",
    "campaign_incomplete", "test"]
"""Every milestone a writer may push: mypy checks each call's kind against it (a
``Milestone`` read back keeps any string: a newer version's kind stays readable)."""
MILESTONE_KINDS: frozenset[str] = frozenset(get_args(MilestoneKind))


class MilestoneSink(Protocol):
    """Where a milestone goes (the loop journals and pushes it; a node buffers it)."""

    def __call__(self, kind: MilestoneKind, **info: Any) -> None: ...


class RunStarted(EventBase):
    """A launch of the run (a resume is one too)."""

    event: Literal["run_started"] = "run_started"
    pid: int | None = None
    """The supervisor's pid."""
    preset: str | None = None
    """The preset's name."""
    target_n: int | None = None
    """Replicates per task x arm this launch drives to."""
    identity: str | None = None
    """The plan identity."""
    dumpable: Any = None
    """Whether the supervisor's memory can be read by its user (a core dump, ptrace)."""
    containment: str | None = None
    """How cells are contained here (cgroups), in words."""
    elapsed_before: float | None = None
    """Run time of the launches before this one (the clock it carries on from)."""
    already_complete: bool = False
    """Every cell already had its valid verdict: nothing to do."""
    harness_user: dict[str, Any] | None = None
    """Who the harnesses run as, and why."""


class RunFinished(EventBase):
    """The run ended (this launch): COMPLETE, INCOMPLETE or stopped."""

    event: Literal["run_finished"] = "run_finished"
    outcome: str = ""
    """COMPLETE, INCOMPLETE, STOPPED..."""
    reason: str | None = None
    """Why it ended so, in words."""


class RunHandedOver(EventBase):
    """SIGUSR2: the supervisor left its running attempts and endpoint to a successor."""

    event: Literal["run_handed_over"] = "run_handed_over"
    running: list[str] | None = None
    """The cells left running."""


class LeftoversStopped(EventBase):
    """A stop signal came during start-up: what a predecessor left (its attempts, its
    endpoint) was ended, since no one else would."""

    event: Literal["leftovers_stopped"] = "leftovers_stopped"
    cleaned: list[dict[str, Any]] = Field(default_factory=list)
    """What was ended: cells' pids, the endpoint's, containers removed."""
    why: str | None = None
    """Why, in words."""


class PassStarted(EventBase):
    """A pass over the cells still pending."""

    event: Literal["pass_started"] = "pass_started"
    pass_no: int | None = Field(default=None, alias="pass")
    """Its number (``pass`` in the journal: a Python keyword here)."""
    pending: int | None = None
    """Cells it will run."""


class PlanChanged(EventBase):
    """The run was resumed on another plan (``--allow-plan-change``)."""

    event: Literal["plan_changed"] = "plan_changed"
    old: str | None = None
    """The plan identity before."""
    new: str | None = None
    """The plan identity now."""


class PresetChanged(EventBase):
    """Settings that do not change the plan differ from the last launch's."""

    event: Literal["preset_changed"] = "preset_changed"
    keys: list[str] | None = None
    """The keys that changed."""
    more: int | None = None
    """How many more."""


class BenchmarkDrift(EventBase):
    """The benchmark's files changed since the plan was recorded."""

    event: Literal["benchmark_drift"] = "benchmark_drift"
    files: Any = None
    """The files and how."""


class LaunchingPaused(EventBase):
    """Launching stopped (a harness-break streak, the budget): running cells finish."""

    event: Literal["launching_paused"] = "launching_paused"
    why: str = ""
    """Why."""


class LaunchThrottled(EventBase):
    """The provider throttles: fewer cells are launched at once."""

    event: Literal["launch_throttled"] = "launch_throttled"
    limit: int | None = None
    """Cells launched at once now."""
    ceiling: int | None = None
    """The configured concurrency."""


class ArmGrading(EventBase):
    """A per-arm grading of every finished cell of an arm."""

    event: Literal["arm_grading"] = "arm_grading"
    arm: str = ""
    """The arm."""
    cells: int | None = None
    """Its cells graded."""


class Milestone(EventBase):
    """A milestone (pushed to the phone when notifications are set)."""

    event: Literal["milestone"] = "milestone"
    kind: str = ""
    """What happened: run_started, arm_complete, endpoint_failed, disk_low..."""


class NotifyFailed(EventBase):
    """A milestone was not delivered to one of the notification URLs."""

    event: Literal["notify_failed"] = "notify_failed"
    kind: str | None = None
    """The milestone."""
    url: str | None = None
    """The service (redacted: a URL carries a token)."""
    why: str = ""
    """Why."""


class EndpointSpawned(EventBase):
    """An endpoint process (or container) of ours was started: its identity."""

    event: Literal["endpoint_spawned"] = "endpoint_spawned"
    pid: int | None = None
    """Its pid."""
    replica: int | None = None
    """Its replica."""


class EndpointStarted(EventBase):
    """The endpoint answers ready, as the model."""

    event: Literal["endpoint_started"] = "endpoint_started"
    readopted: bool = False
    """A predecessor's endpoint, proven ours and taken over."""
    readiness: dict[str, Any] | None = None
    """How long it took, and what it answered."""


class EndpointDown(EventBase):
    """A probe failed: the endpoint does not answer."""

    event: Literal["endpoint_down"] = "endpoint_down"
    why: str = ""
    """Why."""


class EndpointUp(EventBase):
    """The endpoint answers again."""

    event: Literal["endpoint_up"] = "endpoint_up"
    down_secs: float | None = None
    """How long it was down."""


class EndpointRestart(EventBase):
    """An endpoint of ours is restarted."""

    event: Literal["endpoint_restart"] = "endpoint_restart"
    down_secs: float | None = None
    """How long it had been down."""
    restarts: int | None = None
    """Restarts inside the window."""


class EndpointFailed(EventBase):
    """The keeper gave up on the endpoint: the run ends INCOMPLETE."""

    event: Literal["endpoint_failed"] = "endpoint_failed"
    why: str = ""
    """Why."""


class EndpointThrottled(EventBase):
    """The provider answered 429."""

    event: Literal["endpoint_throttled"] = "endpoint_throttled"
    why: str = ""
    """What it said."""


class EndpointReconfigure(EventBase):
    """The endpoint is restarted with another arm group's settings."""

    event: Literal["endpoint_reconfigure"] = "endpoint_reconfigure"
    arms: list[str] | None = None
    """The arms it serves next."""
    arm_args: list[str] | None = None
    """Their endpoint arguments."""
    previous: list[str] | None = None
    """The arms it served."""


class EndpointNotReadopted(EventBase):
    """A predecessor's endpoint could not be proven ours: killed by identity."""

    event: Literal["endpoint_not_readopted"] = "endpoint_not_readopted"
    pid: int | None = None
    """Its pid."""
    why: str = ""
    """Why."""


class OrphanKilled(EventBase):
    """What a dead predecessor left running was killed by identity."""

    event: Literal["orphan_killed"] = "orphan_killed"
    cell: str | None = None
    """Its cell, where it was one's."""
    pids: list[int] | None = None
    """The pids killed."""
    group: str | None = None
    """Its cgroup."""
    uid: int | None = None
    """Its cell user."""
    why: str = ""
    """How it was found."""


class JournalPidRefused(EventBase):
    """A pid the journal names is not the process it recorded: left alone."""

    event: Literal["journal_pid_refused"] = "journal_pid_refused"
    why: str = ""
    """Why."""


class ClaimDropped(EventBase):
    """A finished run's claim on output dirs was dropped (its state dir is gone)."""

    event: Literal["claim_dropped"] = "claim_dropped"
    why: str = ""
    """Why."""


class Published(EventBase):
    """The scorecard and findings were committed to the results repo."""

    event: Literal["published"] = "published"


class PublishFailed(EventBase):
    """Publishing failed (the results are safe in the state dir)."""

    event: Literal["publish_failed"] = "publish_failed"


class RayReplicaStarted(EventBase):
    """A Ray node's actor owns an endpoint replica."""

    event: Literal["ray_replica_started"] = "ray_replica_started"
    replica: int | None = None
    """The replica."""


class RayActorReattached(EventBase):
    """A predecessor's actor proved to be this run's (its run, its replica, a lease it
    journaled): re-attached to as it is, its endpoint and attempts with it."""

    event: Literal["ray_actor_reattached"] = "ray_actor_reattached"
    replica: int
    """The replica."""
    lease: str
    """The lease it runs under (a predecessor's: kept, never a new one)."""
    node: str = ""
    """Its Ray node (first 12 hex digits)."""
    running: list[str] = Field(default_factory=list)
    """The attempts it still runs or has finished, as ``cell#attempt``, re-attached to."""
    revoked: list[str] = Field(default_factory=list)
    """Attempts it runs that the journal does not know of: killed there."""
    replayed: int = 0
    """Its reports no head had journaled, journaled now."""


class RayActorReaped(EventBase):
    """A replica's actor that could not be proved this run's, or would not answer: it is
    stopped, and what it ran is abandoned or adopted."""

    event: Literal["ray_actor_reaped"] = "ray_actor_reaped"
    replica: int | None = None
    """The replica."""
    killed_cells: list[str] | None = None
    """Its cells killed."""
    why: str = ""
    """Why."""


class LeaseSwept(EventBase):
    """A node's processes of a lease of this run were killed at start-up."""

    event: Literal["lease_swept"] = "lease_swept"
    replica: int | None = None
    """The replica."""
    lease: str | None = None
    """The lease."""
    pids: list[int] | None = None
    """The pids killed."""


class LeaseSweepFailed(EventBase):
    """A lease sweep failed (said, not fatal)."""

    event: Literal["lease_sweep_failed"] = "lease_sweep_failed"
    replica: int | None = None
    """The replica."""
    lease: str | None = None
    """The lease."""
    error: str | None = None
    """What failed."""


class LeaseSweepUnreachable(EventBase):
    """A lease's node could not be reached to sweep it."""

    event: Literal["lease_sweep_unreachable"] = "lease_sweep_unreachable"
    replica: int | None = None
    """The replica."""
    lease: str | None = None
    """The lease."""
    ip: str | None = None
    """The node's address."""
    why: str = ""
    """Why."""


class LeaseFenced(EventBase):
    """A lost replica's lease can run nothing any more: its processes were swept on its
    machine, or its actor has surely fenced itself (no head for ``backend.lease_secs``).
    Only then are its cells run elsewhere."""

    event: Literal["lease_fenced"] = "lease_fenced"
    replica: int
    """The replica."""
    lease: str
    """The lease."""
    how: Literal["swept", "expired"]
    """Swept on its machine, or its lease expired (the node unreachable)."""
    waited_secs: float = 0.0
    """How long its cells waited for it, after the loss was seen."""


class CampaignStarted(EventBase):
    """A campaign began (campaign.jsonl)."""

    event: Literal["campaign_started"] = "campaign_started"
    roster: str | None = None
    """The roster file."""
    entries: list[str] | None = None
    """Its entries, in order."""


class CampaignFinished(EventBase):
    """A campaign ended."""

    event: Literal["campaign_finished"] = "campaign_finished"
    outcome: str | None = None
    """COMPLETE or INCOMPLETE."""
    complete: list[str] | None = None
    """Entries complete."""
    incomplete: list[str] | None = None
    """Entries not."""
    why: str | None = None
    """Why, when incomplete."""


class CampaignBlocked(EventBase):
    """A campaign cannot go on (a previous entry's endpoint still holds the GPU...)."""

    event: Literal["campaign_blocked"] = "campaign_blocked"
    why: str = ""
    """Why."""


class CampaignBudgetReached(EventBase):
    """The campaign's spend limit is reached: no further entry starts."""

    event: Literal["campaign_budget_reached"] = "campaign_budget_reached"
    why: str = ""
    """Why."""


class EntryStarted(EventBase):
    """A campaign entry's run was launched."""

    event: Literal["entry_started"] = "entry_started"
    entry: str = ""
    """The entry."""
    pid: int | None = None
    """Its supervisor's pid."""
    state_dir: str | None = None
    """Its state dir."""
    provider: str | None = None
    """Its provider's host (hosted entries)."""
    previous_endpoint_gone: Any = None
    """The previous entry's endpoint was seen gone first."""


class EntryFinished(EventBase):
    """A campaign entry's run ended."""

    event: Literal["entry_finished"] = "entry_finished"
    entry: str = ""
    """The entry."""
    code: int | None = None
    """Its exit code."""
    outcome: str | None = None
    """COMPLETE, INCOMPLETE..."""
    phase: str | None = None
    """Its status.json phase."""


class EntrySkipped(EventBase):
    """A campaign entry was not run."""

    event: Literal["entry_skipped"] = "entry_skipped"
    entry: str = ""
    """The entry."""
    why: str = ""
    """Why."""


RUN_EVENTS = (RunStarted, RunFinished, RunHandedOver, LeftoversStopped, PassStarted, PlanChanged,
              PresetChanged, BenchmarkDrift, LaunchingPaused, LaunchThrottled, ArmGrading,
              Milestone, NotifyFailed, EndpointSpawned, EndpointStarted,
              EndpointDown, EndpointUp, EndpointRestart, EndpointFailed, EndpointThrottled,
              EndpointReconfigure, EndpointNotReadopted, OrphanKilled, JournalPidRefused,
              ClaimDropped, Published, PublishFailed, RayReplicaStarted, RayActorReattached,
              RayActorReaped, LeaseSwept, LeaseSweepFailed, LeaseSweepUnreachable,
              LeaseFenced,
              CampaignStarted, CampaignFinished, CampaignBlocked, CampaignBudgetReached,
              EntryStarted, EntryFinished, EntrySkipped)
