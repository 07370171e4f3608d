"""The configuration schema: frozen, validated pydantic objects.

A preset is validated once (``autopilot.loader``) into these objects; after that nothing
re-reads or mutates configuration. Loading, merging and errors live in ``loader``;
``{placeholder}`` templates in ``templates``. The tables live in modules of their own,
re-exported here, one module of this package each: ``matrix`` (tasks, arms),
``harness`` (harness, watchdog), ``grade`` (grader, trust), ``run`` (run, notify,
preflight, gateway, publish, backend), ``endpoint`` and ``measure`` (budget, cost,
baseline, comparators), on the shared ``base``; a cell's watchdog limits resolved in
``limits``. Every option's docstring is its description (``autopilot
schema``, docs/reference.md).
"""

from __future__ import annotations

import json
from typing import Any

from pydantic import Field, PrivateAttr, field_validator, model_validator

from autopilot.config.base import NAME_RE as NAME_RE
from autopilot.config.base import EnvRef as EnvRef
from autopilot.config.base import Frozen as _Frozen
from autopilot.config.endpoint import ENGINE_MODELS as ENGINE_MODELS
from autopilot.config.endpoint import BuiltinEndpoint as BuiltinEndpoint
from autopilot.config.endpoint import DockerFields as DockerFields
from autopilot.config.endpoint import EndpointCommon as EndpointCommon
from autopilot.config.endpoint import EndpointConfig as EndpointConfig
from autopilot.config.endpoint import LlamaCppEndpoint as LlamaCppEndpoint
from autopilot.config.endpoint import NoEndpoint as NoEndpoint
from autopilot.config.endpoint import ProviderEndpoint as ProviderEndpoint
from autopilot.config.endpoint import VllmEndpoint as VllmEndpoint
from autopilot.config.grade import DEFAULT_VERDICTS as DEFAULT_VERDICTS
from autopilot.config.grade import GRADE_REASONS as GRADE_REASONS
from autopilot.config.grade import INVALID_REASONS as INVALID_REASONS
from autopilot.config.grade import ArmCheck as ArmCheck
from autopilot.config.grade import Extract as Extract
from autopilot.config.grade import FinishCheck as FinishCheck
from autopilot.config.grade import Grader as Grader
from autopilot.config.grade import TokenCheck as TokenCheck
from autopilot.config.grade import Trust as Trust
from autopilot.config.grade import VerdictRule as VerdictRule
from autopilot.config.harness import Harness as Harness
from autopilot.config.harness import TerminalRow as TerminalRow
from autopilot.config.harness import Watchdog as Watchdog
from autopilot.config.matrix import Argv as Argv
from autopilot.config.matrix import Arm as Arm
from autopilot.config.matrix import ArmEndpoint as ArmEndpoint
from autopilot.config.matrix import Route as Route
from autopilot.config.matrix import Task as Task
from autopilot.config.matrix import label_tokens as label_tokens
from autopilot.config.measure import Baseline as Baseline
from autopilot.config.measure import Budget as Budget
from autopilot.config.measure import Comparator as Comparator
from autopilot.config.measure import Cost as Cost
from autopilot.config.measure import Rate as Rate
from autopilot.config.run import RAY_ADDRESS_RE as RAY_ADDRESS_RE
from autopilot.config.run import Backend as Backend
from autopilot.config.run import Gateway as Gateway
from autopilot.config.run import Notify as Notify
from autopilot.config.run import Preflight as Preflight
from autopilot.config.run import Publish as Publish
from autopilot.config.run import Run as Run

PRESETS_ENV = "AUTOPILOT_PRESETS_DIR"

# Placeholders the supervisor fills for every cell; preset, task and arm vars add more.
BUILTIN_PLACEHOLDERS = frozenset({
    "cell", "task", "arm", "mode", "n", "attempt", "port", "host", "base_url", "model",
    "served_model", "output_dir", "state_dir", "python", "grade_file", "scratch_dir",
    "transcript", "deadline", "endpoint_host", "endpoint_port", "endpoint_base_url",
    "api_key", "last_try"})


class Preset(_Frozen):
    """A preset: one benchmark run's whole configuration (``presets/NAME.toml``; another
    preset may be its base through ``extends``)."""

    name: str = ""
    """The preset's name (default: its file's stem); ``{preset}`` in publish paths."""
    description: str = ""
    """One line on what the preset runs (``autopilot presets`` lists it)."""
    model: str
    """The model the cells ask the endpoint for (``{model}``)."""
    vars: dict[str, str] = Field(default_factory=dict)
    """The preset's own placeholders, for every template of every cell."""
    endpoint: EndpointConfig
    """The model endpoint the run owns or attaches to; ``engine`` picks its kind."""
    harness: Harness
    """The program each cell runs."""
    grader: Grader
    """The program that grades each cell."""
    tasks: list[Task] = Field(min_length=1)
    """The tasks of the matrix (``[[tasks]]``)."""
    arms: list[Arm] = Field(min_length=1)
    """The arms of the matrix (``[[arms]]``)."""
    run: Run = Field(default_factory=Run)
    """The run's size and pace."""
    budget: Budget = Field(default_factory=Budget)
    """Spend limits."""
    cost: Cost = Field(default_factory=Cost)
    """Local energy sampling and its price."""
    watchdog: Watchdog = Field(default_factory=Watchdog)
    """The stall tiers that watch every attempt."""
    trust: Trust = Field(default_factory=Trust)
    """What a cell's evidence must show to be counted."""
    notify: Notify = Field(default_factory=Notify)
    """Milestones pushed to a phone."""
    preflight: Preflight = Field(default_factory=Preflight)
    """Fail-closed checks before anything is launched."""
    publish: Publish = Field(default_factory=Publish)
    """Where results are committed."""
    baseline: Baseline | None = None
    """The pass counts an arm is held against (the report's flips and trend)."""
    comparators: dict[str, Comparator] = Field(default_factory=dict)
    """Other models' published results, by name, in their own unit."""
    rate_card: dict[str, Rate] = Field(default_factory=dict)
    """A model -> its price per million tokens: ``[in, out]``, or by bucket ``{ input,
    output, cache_read, cache_write }`` (an arm with a route is priced by its route's
    model id)."""
    backend: Backend = Field(default_factory=Backend)
    """Where cells run: this machine or a Ray cluster."""
    gateway: Gateway = Field(default_factory=Gateway)
    """The model gateway every request of a cell goes through."""

    def rate_for(self, arm: str | None = None) -> Rate | None:
        """The rate card's price of what an arm's cells are billed for: its route's model
        where it has one, else its own or the preset's model."""
        spec = self.arm(arm) if arm is not None else None
        model = (spec.route.model if spec and spec.route
                 else (spec.model if spec and spec.model else None)) or self.model
        return self.rate_card.get(model)

    @property
    def uses_gateway(self) -> bool:
        """Some arm's requests can go through the gateway: the endpoint is one it serves,
        or an arm has a route of its own."""
        return self.endpoint.through_gateway or any(spec.route for spec in self.arms)

    @property
    def samples_power(self) -> bool:
        """The endpoint's GPUs are this host's (the local backend serving a local
        engine), and sampling is not off (autopilot.run.power)."""
        return (self.cost.power == "auto" and self.backend.kind == "local"
                and self.endpoint.serves_here)

    @field_validator("comparators", mode="before")
    @classmethod
    def _comparator_units(cls, v: Any) -> Any:
        for name, value in (v.items() if isinstance(v, dict) else ()):
            if isinstance(value, int | float):
                raise ValueError(
                    f"{name!r} = {value}: a bare number has no unit; write "
                    "{ passes = P, of = N } (passes of the cells it ran) or "
                    "{ families = F, families_of = T } (task families at >= 2/3)")
        return v

    @field_validator("gateway", mode="before")
    @classmethod
    def _gateway_switch(cls, v: Any) -> Any:
        return {"enabled": v} if isinstance(v, bool) else v  # `gateway = false`

    @model_validator(mode="after")
    def _cross_checks(self) -> Preset:
        seen: dict[str, str] = {}
        for task in self.tasks:
            if task.id.lower() in seen:
                raise ValueError(f"task id {task.id!r} appears twice")
            seen[task.id.lower()] = task.id
        labels: dict[str, Arm] = {}
        for arm in self.arms:
            key = arm.label.lower()
            # With the mode token required in every label (Arm._mode_in_label), unique
            # labels mean two arms of different modes can never share a run name.
            if key in labels:
                raise ValueError(
                    f"arms {labels[key].label!r} and {arm.label!r} collide: "
                    "labels key the run and must differ (e.g. in their mode)"
                )
            labels[key] = arm
        # A cell's id is "{task}_{arm}_v{n}", and ids and labels may hold "_": two
        # (task, arm) pairs joined the same way would be one cell (one pair never run,
        # the other counted twice). The "_v{n}" suffix cannot collide (digits follow the
        # last "_v"), so refusing equal joins makes ids injective, and every existing
        # state dir keeps its ids.
        joined: dict[str, tuple[str, str]] = {}
        for task in self.tasks:
            for arm in self.arms:
                key = f"{task.id}_{arm.label}".lower()
                if key in joined:
                    other_task, other_arm = joined[key]
                    raise ValueError(
                        f"task {other_task!r} with arm {other_arm!r} and task {task.id!r} with arm "
                        f"{arm.label!r} make the same cell ids ({task.id}_{arm.label}_v1): rename "
                        "a task or an arm")
                joined[key] = (task.id, arm.label)
        if self.baseline and self.baseline.arm not in {arm.label for arm in self.arms}:
            raise ValueError(f"baseline.arm {self.baseline.arm!r} is not an arm of this preset")
        replicas = self.endpoint.replicas
        if len(self.endpoint.replica_env) > replicas:
            raise ValueError(f"endpoint.replica_env has {len(self.endpoint.replica_env)} "
                             f"entries for {replicas} replica(s)")
        for arm in self.arms:
            bad = [i for i in arm.replicas or [] if not 0 <= i < replicas]
            if bad:
                raise ValueError(f"arm {arm.label!r}: replicas {bad} outside 0..{replicas - 1}")
        if replicas > 1 and not self._arms_share_endpoint():
            raise ValueError("endpoint.replicas > 1 needs every arm on the same endpoint "
                             "settings (arms that restart the endpoint run one group at a "
                             "time); pin arms to replicas instead")
        requested = [arm.label for arm in self.arms if arm.requests_settings]
        routed = [arm.label for arm in self.arms if arm.route]
        if routed and not self.gateway.enabled:
            raise ValueError(f"arm(s) {', '.join(routed)}: a route of their own needs the "
                             "gateway (gateway = true): it holds the route's key")
        if requested and not (self.gateway.enabled and self.uses_gateway):
            raise ValueError(f"arm(s) {', '.join(requested)}: request settings need the "
                             f"gateway (gateway = true, and an endpoint it serves: engine "
                             f"{self.endpoint.engine!r} has none)" if self.gateway.enabled
                             else f"arm(s) {', '.join(requested)}: request settings need "
                             "the gateway (gateway = true)")
        self._check_backend()
        return self

    def _arms_share_endpoint(self) -> bool:
        """Every arm runs against the same endpoint settings (no restart between arms)."""
        return len({json.dumps(arm.endpoint.model_dump(mode="json"), sort_keys=True)
                    for arm in self.arms}) <= 1

    def _check_backend(self) -> None:
        backend, replicas = self.backend, self.endpoint.replicas
        if backend.kind != "ray":
            if backend.resources:
                raise ValueError("backend.resources is for backend.kind = 'ray'")
            return
        if len(backend.resources) not in (0, 1, replicas):
            raise ValueError(f"backend.resources has {len(backend.resources)} entries for "
                             f"{replicas} replica(s): give one per replica, or one for all")
        if not self._arms_share_endpoint():
            raise ValueError("backend.kind = 'ray' needs every arm on the same endpoint "
                             "settings; pin arms to replicas instead")
        if self.grader.mode != "per-cell":
            raise ValueError("backend.kind = 'ray' grades on the node: grader.mode must "
                             "be 'per-cell'")
        if self.harness.compose_projects:
            raise ValueError("backend.kind = 'ray' does not sweep Compose projects on the "
                             "nodes yet: leave harness.compose_projects unset")

    _env_refs: tuple[EnvRef, ...] = PrivateAttr(default=())

    def set_env_refs(self, refs: tuple[EnvRef, ...]) -> None:
        self._env_refs = refs

    def env_refs(self) -> tuple[EnvRef, ...]:
        """Every ``${VAR}`` expansion made while loading (autopilot.state.resolved)."""
        return self._env_refs

    def defaulted_env(self) -> list[str]:
        """The ``${VAR:-default}`` expansions whose VAR was unset, in words (a resume from
        a shell without the run's variables computes another plan: say which)."""
        return list(dict.fromkeys(ref.describe() for ref in self._env_refs if ref.defaulted))

    def env_source(self, value: str) -> str:
        """Which ``${VAR}`` put (part of) ``value`` here, in words; "" when none did."""
        found = [ref for ref in self._env_refs if ref.value and ref.value in value]
        return "; ".join(dict.fromkeys(ref.describe() for ref in found))

    def env_of(self, key: str) -> EnvRef | None:
        """The ``${VAR}`` a key's value was expanded from, if one was."""
        return next((ref for ref in self._env_refs if ref.key == key), None)

    def arm(self, label: str) -> Arm:
        return next(spec for spec in self.arms if spec.label == label)

    def task(self, task_id: str) -> Task:
        return next(spec for spec in self.tasks if spec.id == task_id)
