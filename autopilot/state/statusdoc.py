"""status.json's schema, typed: what ``autopilot.run.snapshot`` builds and every reader
(the dashboard, the one-line summary, the metrics) reads through.

A state file is untrusted input (another version, a hand edit, a hostile writer):
``read`` gives a ``Status`` whose every field is its declared type or its default, never
a value of another shape, and keeps fields a later version adds as extras
(``schema_version`` 1: fields are only ever added).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    ValidationError,
    ValidationInfo,
    field_validator,
)

SCHEMA_VERSION = 1


class _Part(BaseModel):
    # Lenient on purpose: a field of the wrong shape reads as its default (see _lenient),
    # and fields of a later version stay readable as extras.
    model_config = ConfigDict(frozen=True, extra="allow", use_attribute_docstrings=True)

    @field_validator("*", mode="wrap")
    @classmethod
    def _lenient(cls, value: Any, handler: Any, info: ValidationInfo) -> Any:
        try:
            return handler(value)
        except ValidationError:
            if info.context and info.context.get("strict"):
                raise  # the writer's own check (``check``): every field its type
            field = cls.model_fields[str(info.field_name)]
            return field.get_default(call_default_factory=True)


class Totals(_Part):
    """Cells by where they stand (``CellState.phase``), the fold every view counts by."""

    total: int = 0
    """Cells of the plan."""
    done: int = 0
    """Cells with a valid verdict (PASS or FAIL)."""
    pass_: int = Field(default=0, alias="pass")
    """PASS verdicts (``pass`` in the file)."""
    fail: int = 0
    """FAIL verdicts."""
    invalid: int = 0
    """Cells whose last attempt was INVALID (retried)."""
    quarantined: int = 0
    """Cells out of retries: reported, never counted."""
    ungraded: int = 0
    """Cells whose harness run stands but whose grading failed."""
    running: int = 0
    """Cells running now."""
    grading: int = 0
    """Cells whose harness ended, being graded."""
    pending: int = 0
    """Cells waiting for a pass."""
    items: dict[str, int] | None = None
    """What its many-sample cells scored (passed, failed, errored, reused...)."""


class Thresholds(_Part):
    """The watchdog limits in force (``AUTOPILOT_STALL_*`` included)."""

    warn_secs: float | None = None
    """No progress this long: WARN."""
    probe_secs: float | None = None
    """No progress this long: PROBE."""
    kill_secs: float | None = None
    """No progress this long: KILL."""
    stuck_secs: float | None = None
    """A frozen transcript this long: KILL."""
    tasks: dict[str, dict[str, float]] = Field(default_factory=dict)
    """Each task whose own ``stuck_secs`` / ``wall_budget_secs`` differ."""


class Running(_Part):
    """A cell running now."""

    cell: str = ""
    """Its id."""
    attempt: int | None = None
    """Its attempt."""
    pid: int | None = None
    """Its harness's pid."""
    frozen_secs: float = 0.0
    """Seconds its transcript has not grown."""
    tier: str = "OK"
    """Its watchdog tier."""
    last_signal: str | None = None
    """The last progress seen, and from where."""
    started_at: str | None = None
    """When it started."""


class Throttle(_Part):
    """The launch throttle (a throttling provider)."""

    limit: int | None = None
    """Cells launched at once now."""
    ceiling: int | None = None
    """The configured concurrency."""
    throttled: bool = False
    """Below the ceiling."""


class Seen(_Part):
    """The supervisor's liveness, as a reader judges it (autopilot.state.liveness)."""

    state: str = ""
    """live, stale, gone, handover, finished or unknown."""
    heartbeat_age_secs: float | None = None
    """The heartbeat's age."""
    label: str = ""
    """What a view prints ("" when live or finished)."""


class Status(_Part):
    """status.json."""

    schema_version: int = SCHEMA_VERSION
    """The schema's version (fields are only ever added)."""
    phase: str = ""
    """starting, run:pass<N>, COMPLETE, INCOMPLETE or stopped."""
    outcome_reason: str = ""
    """Why the run ended so."""
    preset: str = ""
    """The preset's name."""
    description: str = ""
    """The preset's description."""
    model: str = ""
    """The model."""
    engine: str = ""
    """The endpoint's engine."""
    target_n: int | None = None
    """Replicates per task x arm."""
    plan_identity: str = ""
    """The plan's identity."""
    pid: int | None = None
    """The supervisor's pid."""
    host: str = ""
    """The supervisor's host."""
    started_at: str | None = None
    """When this launch started."""
    updated_at: str | None = None
    """When this file was written."""
    elapsed_secs: float | None = None
    """The run's time, across its launches."""
    eta_secs: float | None = None
    """Seconds to done at this launch's pace (none: unknown)."""
    pass_no: int | None = Field(default=None, alias="pass")
    """The pass (``pass`` in the file)."""
    max_passes: int | None = None
    """Passes before the run ends INCOMPLETE."""
    concurrency: int | None = None
    """Cells at once."""
    totals: Totals = Field(default_factory=Totals)
    """Cells by where they stand."""
    trust: dict[str, Any] = Field(default_factory=dict)
    """What was excluded and why (valid, invalid, quarantined, teardown-masked cells)."""
    endpoint: dict[str, Any] = Field(default_factory=dict)
    """Replica 0's endpoint, as its keeper describes it."""
    endpoints: list[dict[str, Any]] | None = None
    """Every replica's."""
    thresholds: Thresholds = Field(default_factory=Thresholds)
    """The watchdog limits in force."""
    baseline: dict[str, Any] | None = None
    """The preset's baseline."""
    publish: dict[str, Any] | None = None
    """What ``--publish`` did."""
    spend: dict[str, Any] = Field(default_factory=dict)
    """Tokens spent (and USD where a rate card prices them)."""
    throttle: Throttle = Field(default_factory=Throttle)
    """The launch throttle."""
    disk: dict[str, Any] | None = None
    """The disk watch: low, floor, free, where (none without a floor)."""
    gateway: dict[str, Any] = Field(default_factory=dict)
    """The gateway's run-wide counters (failovers)."""
    arms: dict[str, Totals] = Field(default_factory=dict)
    """Totals per arm."""
    tasks: dict[str, dict[str, Totals]] = Field(default_factory=dict)
    """Totals per arm and task."""
    running: list[Running] = Field(default_factory=list)
    """The cells running now."""
    recent_cells: list[dict[str, Any]] = Field(default_factory=list)
    """The last verdicts."""
    fails: list[dict[str, Any]] = Field(default_factory=list)
    """The last verdicts that were not PASS."""
    anomaly: dict[str, Any] = Field(default_factory=dict)
    """The harness-break streak and the alarms raised."""
    orphans_cleaned: list[dict[str, Any]] = Field(default_factory=list)
    """What start-up killed of a predecessor's."""
    arms_order: list[str] = Field(default_factory=list)
    """The arms, in the preset's order."""
    tasks_order: list[str] = Field(default_factory=list)
    """The tasks, in the preset's order."""
    liveness: Seen | None = None
    """Added by a reader: whether the supervisor is alive (the heartbeat)."""
    phase_written: str | None = None
    """Added by a reader where the supervisor is not alive: the phase it last wrote."""
    released: str | None = None
    """Added by a reader: when the run's outputs were let go (``autopilot release``)."""


def read(doc: Any) -> Status:
    """A status.json document as its type (anything that is not a JSON object reads as
    an empty status)."""
    return Status.model_validate(doc if isinstance(doc, dict) else {})


def check(doc: Mapping[str, object]) -> str | None:
    """Why a document the snapshot built does not fit the schema (None: it does)."""
    try:
        Status.model_validate(doc, context={"strict": True})
    except ValidationError as e:
        err = e.errors()[0]
        return f"{'.'.join(map(str, err['loc']))}: {err['msg']}"
    return None


__all__ = ["SCHEMA_VERSION", "Running", "Seen", "Status", "Thresholds", "Throttle", "Totals",
           "check", "read"]
