"""The journal's events of one cell's attempts: launched, watched, ended, graded.

Each is a frozen type with its kind as the discriminator (autopilot.state.events holds
them together and parses a line into one). Fields a later version adds are kept as
extras, so an older reader still folds a newer journal.
"""

from __future__ import annotations

from typing import Any, Literal, TypedDict

from pydantic import BaseModel, ConfigDict

from autopilot.state.eventbase import CellEventBase


class CellSpawning(CellEventBase):
    """An attempt's intent, journaled before its data path is spawned: a kill right
    after it charges nothing (the resume re-attaches to it, or abandons it uncharged)."""

    event: Literal["cell_spawning"] = "cell_spawning"
    token: str | None = None
    """The attempt's marker (``AUTOPILOT_CELL_TOKEN``) every process of it carries."""
    group: str | None = None
    """The attempt's cgroup, where it has one."""
    uid: int | None = None
    """The cell's own user, with ``harness.user = "cell"``."""


class CellStarted(CellEventBase):
    """The harness is running: its identity (pid + start time), for exact-pid kills."""

    event: Literal["cell_started"] = "cell_started"
    pid: int | None = None
    """The harness's pid."""
    create_time: float | None = None
    """Its start time (psutil's), checked before every signal: a recycled pid is never
    signalled."""
    start_ticks: int | None = None
    """Its start time in clock ticks (/proc/PID/stat)."""
    token: str | None = None
    """The attempt's marker."""
    replica: int | None = None
    """The endpoint replica serving it."""
    datapath_pid: int | None = None
    """The attempt's data path (its parent and reaper)."""
    endpoint_arms: list[str] | None = None
    """The arms the endpoint was configured for when it started."""


class CellReattached(CellEventBase):
    """A resume took over a running attempt through its data path."""

    event: Literal["cell_reattached"] = "cell_reattached"
    pid: int | None = None
    """The harness's pid."""
    datapath_pid: int | None = None
    """The data path re-attached to."""
    exited: bool | None = None
    """The harness had already ended."""


class Probe(BaseModel):
    """What the watchdog's PROBE saw of an attempt: is its process tree alive, what is
    it doing, is its sandbox busy."""

    model_config = ConfigDict(frozen=True, extra="allow", defer_build=True)

    alive: bool = False
    """Any process of the attempt's tree lives."""
    pids: int = 0
    """How many."""
    states: dict[str, int] = {}
    """How many in each state (running, sleeping, disk-sleep, zombie...)."""
    cpu_secs: float = 0.0
    """The tree's CPU time so far (user + system)."""
    sandbox_activity: int | None = None
    """The sandbox's CPU activity (its cgroup's usage), where it has one."""


class CellWatchdog(CellEventBase):
    """The watchdog's tier changed (OK, WARN, PROBE, KILL) or substance said so."""

    event: Literal["cell_watchdog"] = "cell_watchdog"
    tier: str = ""
    """The new tier."""
    reason: str = ""
    """Why, in words (``no progress 95s``)."""
    idle_secs: float | None = None
    """Seconds without progress."""
    frozen_secs: float | None = None
    """Seconds the transcript has not grown."""
    probe: Probe | None = None
    """At PROBE: the state of the attempt's process tree and sandbox then."""


class CellKilled(CellEventBase):
    """The attempt's process tree was killed, by exact pid."""

    event: Literal["cell_killed"] = "cell_killed"
    kind: str | None = None
    """What fired: stall, frozen, deadline, teardown, substance..."""
    reason: str = ""
    """Why, in words."""
    pids: list[int] | None = None
    """The pids signalled."""


class CellDeadline(CellEventBase):
    """A cell of many items said how many it holds, and its hard deadline follows
    (``harness.item_budget_secs`` per item still to run, within the cap)."""

    event: Literal["cell_deadline"] = "cell_deadline"
    deadline_secs: float = 0
    """From the attempt's start to its hard deadline, now."""
    total: int = 0
    """The items its harness holds."""
    reused: int = 0
    """Of those, finished by an earlier attempt (not run again)."""


class CellExited(CellEventBase):
    """The harness ended (its exit code, the outcome as the runner read it)."""

    event: Literal["cell_exited"] = "cell_exited"
    code: int | None = None
    """Its exit code (negative: the signal)."""
    elapsed_secs: float | None = None
    """Its run time."""
    outcome: Any = None
    """The outcome as recorded (exit code, completion, kill)."""
    error: str | None = None
    """A spawn error, when it never ran."""


class CellAdopted(CellEventBase):
    """An attempt that ended while no supervisor watched it, taken up with its data
    path's evidence."""

    event: Literal["cell_adopted"] = "cell_adopted"
    outcome: Any = None
    """Its outcome, as its data path recorded it."""
    metered: bool | None = None
    """The data path's gateway meter was read."""
    elapsed_secs: Any = None
    """Its whole wall, spawn to exit, as its data path recorded both."""
    why: str = ""
    """How it was found."""


class CellRan(CellEventBase):
    """The harness's run is over and its outputs wait for grading."""

    event: Literal["cell_ran"] = "cell_ran"
    outcome: Any = None
    """The run's outcome."""


class CellAbandoned(CellEventBase):
    """The attempt was given up without a verdict (a stop, a lost launch): it is re-run
    and no retry is spent."""

    event: Literal["cell_abandoned"] = "cell_abandoned"
    why: str = ""
    """Why, in words."""
    killed_pids: list[int] | None = None
    """What was killed of it."""
    never_started: bool = False
    """Its harness was never spawned (a supervisor killed between the intent and the
    spawn): the attempt number is used again, since the harness never touched it."""


class MeterSummary(TypedDict):
    """One attempt's gateway totals as a meter event carries them, and as a data path
    sends them (autopilot.gateway.evidence.Meter.summary)."""

    requests: int
    answered: int
    errors: dict[str, int]
    prompt_tokens: int
    completion_tokens: int
    reasoning_tokens: int
    tokens: dict[str, int]
    estimated: int
    malformed_usage: int
    failovers: int
    first_error: str | None
    last_error: str | None
    models: dict[str, int]
    unmetered: int
    unauthorized: int
    refused: int
    throttled_tail: int


class MeterEvent(CellEventBase):
    """What a gateway listener saw: requests, tokens, errors (the fields both meter
    events share)."""

    requests: Any = None
    """Requests through the gateway (counts here are shape-checked where they are
    summed: autopilot.state.budget)."""
    prompt_tokens: Any = None
    """Prompt tokens the endpoint reported."""
    completion_tokens: Any = None
    """Completion tokens the endpoint reported."""
    errors: Any = None
    """Failed requests, by kind."""
    unmetered: Any = None
    """Responses whose usage could not be read (spend of unknown size)."""
    tokens: Any = None
    """Tokens by bucket (input, cache_write, cache_read, output, reasoning; a bucket no
    response reported is absent, not 0: autopilot.state.tokens)."""
    throttled_tail: Any = None
    """Requests at the attempt's end the provider refused as throttled, none answered
    since."""
    answered: Any = None
    """Requests answered."""
    reasoning_tokens: Any = None
    """Reasoning tokens (within the completion tokens)."""
    estimated: Any = None
    """Responses whose completion count is an estimate (they reported no usage)."""
    malformed_usage: Any = None
    """Responses whose usage block could not be read as one."""
    failovers: Any = None
    """Requests sent to another replica than the cell's own."""
    first_error: Any = None
    """The first request's error kind ("" when it was fine)."""
    last_error: Any = None
    """The last error, in words."""
    models: Any = None
    """Who the responses say answered, by model (at most 8)."""
    unauthorized: Any = None
    """Requests refused for not carrying the attempt's key (401)."""
    refused: Any = None
    """The attempt's own requests refused for their route or model (403)."""


class CellMetered(MeterEvent):
    """What the attempt's gateway saw: requests, tokens, errors."""

    event: Literal["cell_metered"] = "cell_metered"


class CellGradeMetered(MeterEvent):
    """What a model-graded grading's own gateway listener saw (spend as grading)."""

    event: Literal["cell_grade_metered"] = "cell_grade_metered"


class CellVerdict(CellEventBase):
    """A verdict: PASS, FAIL, or INVALID with its reason (``ungraded`` when only the
    grading failed: the outputs stand)."""

    event: Literal["cell_verdict"] = "cell_verdict"
    verdict: str = ""
    """PASS, FAIL or INVALID."""
    reason: str | None = None
    """For INVALID: why (one of the INVALID reasons)."""
    word: str | None = None
    """The grader's own verdict word."""
    caveat: str | None = None
    """A caveat carried with it (``structural check only``)."""
    teardown_masked: bool = False
    """The harness's work was done but its teardown hung: killed, graded anyway."""
    detail: str | None = None
    """The evidence in words."""
    ungraded: bool = False
    """Only grading failed: the grader is re-run on the same outputs."""
    regrade: bool = False
    """A new grade of the same attempt (``autopilot regrade``): spends nothing."""
    spend: Any = None
    """[prompt, completion] tokens the attempt cost, by ``cost_basis`` (shape-checked
    where it is summed: autopilot.state.budget)."""
    cost_basis: str | None = None
    """Where the spend comes from: metered, self_reported, self_reported_mismatch..."""
    tokens: Any = None
    """The spend by bucket, where the gateway metered it (autopilot.state.tokens; a
    bucket no response reported is absent)."""
    self_reported: Any = None
    """The harness's own count, where it was not the basis."""
    gateway: Any = None
    """What the gateway saw of the attempt (requests, errors)."""
    unmetered: Any = None
    """Responses whose usage could not be read (a count; bounded where it is summed)."""
    items: Any = None
    """A many-sample cell's counts (pass, fail, errored, reused...; shape-checked by
    autopilot.state.items)."""
    finished: Any = None
    """INVALID(interrupted): how far the attempt got (total, done, reused, new; shape-
    checked by autopilot.cell.itemsprogress). One that finished new items spends no
    retry."""


class CellQuarantined(CellEventBase):
    """The cell ran out of retries: it is reported, never counted."""

    event: Literal["cell_quarantined"] = "cell_quarantined"
    attempts: int | None = None
    """Its attempts."""
    reasons: list[str] | None = None
    """Each INVALID attempt's reason."""


class GradeRetry(CellEventBase):
    """A grading failed and is tried again on the same outputs."""

    event: Literal["grade_retry"] = "grade_retry"
    reason: str | None = None
    """Why the grading failed."""
    detail: str | None = None
    """In words."""
    tried: int | None = None
    """Gradings tried so far."""


class RequestFailover(CellEventBase):
    """A request of the cell went to another replica (its own was down)."""

    event: Literal["request_failover"] = "request_failover"
    replica: int | None = None
    """The replica it was meant for."""
    to: int | None = None
    """The replica that served it."""
    why: str = ""
    """Why."""


class CellFilesReceived(CellEventBase):
    """A Ray node without shared storage shipped the attempt's files back."""

    event: Literal["cell_files_received"] = "cell_files_received"
    files: int | None = None
    """Files received."""
    bytes: int | None = None
    """Their size."""
    skipped: Any = None
    """What was refused (a symlink, a path outside the cell's)."""


class ScratchNotRemoved(CellEventBase):
    """A scratch dir could not be emptied before the attempt."""

    event: Literal["scratch_not_removed"] = "scratch_not_removed"
    path: str = ""
    """The dir."""
    why: str = ""
    """Why."""


class ScratchRemovedViaDocker(CellEventBase):
    """A scratch dir of a root-owned sandbox's files was emptied by a throwaway
    container (``harness.scratch_remove_image``)."""

    event: Literal["scratch_removed_via_docker"] = "scratch_removed_via_docker"
    path: str = ""
    """The dir."""


class UnsafePathRefused(CellEventBase):
    """A destructive path outside the run's roots was refused (nothing touched)."""

    event: Literal["unsafe_path_refused"] = "unsafe_path_refused"
    action: str = ""
    """What would have been done (remove, move)."""
    path: str = ""
    """The path refused."""
    why: str = ""
    """Why."""


class ForeignInCellGroup(CellEventBase):
    """A process in the cell's cgroup that is not the cell's: spared and said."""

    event: Literal["foreign_in_cell_group"] = "foreign_in_cell_group"
    cell: str | None = None  # type: ignore[assignment]
    """The cell whose group it is in (none: found at start-up, of no live cell)."""
    group: str = ""
    """The cgroup (its name under the run's)."""
    pid: int | None = None
    """The process spared."""
    why: str = ""
    """Why it is not the group's own."""


class ForeignOutputsMoved(CellEventBase):
    """Outputs found before a cell's first attempt, moved into its evidence."""

    event: Literal["foreign_outputs_moved"] = "foreign_outputs_moved"
    path: str = ""
    """Where they were."""
    to: str = ""
    """Where they are now."""
    why: str = ""
    """Why."""


class RegradeSkipped(CellEventBase):
    """``regrade`` left a cell alone (its outputs were written after its attempt)."""

    event: Literal["regrade_skipped"] = "regrade_skipped"
    why: str = ""
    """Why."""


class DatapathVersionMismatch(CellEventBase):
    """An attempt's data path is of another version: drained, watched by its files."""

    event: Literal["datapath_version_mismatch"] = "datapath_version_mismatch"
    version: Any = None
    """Its version."""
    ours: Any = None
    """This supervisor's."""
    why: str = ""
    """What is done instead."""


CELL_EVENTS = (CellSpawning, CellStarted, CellReattached, CellWatchdog, CellKilled,
               CellExited, CellAdopted, CellRan, CellAbandoned, CellMetered,
               CellGradeMetered, CellVerdict, CellQuarantined, GradeRetry, RequestFailover,
               CellFilesReceived, ScratchNotRemoved, ScratchRemovedViaDocker,
               UnsafePathRefused, ForeignInCellGroup, ForeignOutputsMoved, RegradeSkipped,
               DatapathVersionMismatch, CellDeadline)
