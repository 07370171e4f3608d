"""The configuration schema: frozen, validated pydantic objects.

A preset is validated once (``autopilot.loader``) into these objects; after that nothing
re-reads or mutates configuration. Loading, merging and errors live in ``loader``;
``{placeholder}`` templates in ``templates``.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Literal

from pydantic import Field, PrivateAttr, field_validator, model_validator

from autopilot.configbase import NAME_RE as NAME_RE
from autopilot.configbase import EnvRef as EnvRef
from autopilot.configbase import Frozen as _Frozen
from autopilot.configbase import check_name as _check_name
from autopilot.endpointconfig import ENGINE_MODELS as ENGINE_MODELS
from autopilot.endpointconfig import BuiltinEndpoint as BuiltinEndpoint
from autopilot.endpointconfig import DockerFields as DockerFields
from autopilot.endpointconfig import EndpointCommon as EndpointCommon
from autopilot.endpointconfig import EndpointConfig as EndpointConfig
from autopilot.endpointconfig import LlamaCppEndpoint as LlamaCppEndpoint
from autopilot.endpointconfig import NoEndpoint as NoEndpoint
from autopilot.endpointconfig import ProviderEndpoint as ProviderEndpoint
from autopilot.endpointconfig import VllmEndpoint as VllmEndpoint
from autopilot.measureconfig import Baseline as Baseline
from autopilot.measureconfig import Budget as Budget
from autopilot.measureconfig import Comparator as Comparator
from autopilot.measureconfig import Cost as Cost

PRESETS_ENV = "AUTOPILOT_PRESETS_DIR"

# Placeholders the supervisor fills for every cell; preset, task and arm vars add more.
BUILTIN_PLACEHOLDERS = frozenset({
    "cell", "task", "arm", "mode", "n", "attempt", "port", "host", "base_url", "model",
    "served_model", "output_dir", "state_dir", "python", "grade_file", "scratch_dir",
    "transcript", "deadline", "endpoint_host", "endpoint_port", "endpoint_base_url",
    "api_key", "last_try"})

Argv = list[str | list[str]]


class Task(_Frozen):
    id: str
    vars: dict[str, str] = Field(default_factory=dict)
    stuck_secs: float | None = Field(default=None, gt=0)
    wall_budget_secs: float | None = Field(default=None, gt=0)
    # This task's own grader command line, where it differs from [grader].argv (the
    # origin's three p1 tasks share `phase1_grade.py <kind> <workspace> <baseline>`).
    grader_argv: Argv | None = None
    # What the grader needs beyond itself (a helper script, a baseline dir): checked by
    # preflight and before every grading; missing, the task's cells cannot be graded.
    grader_requires: list[str] = Field(default_factory=list)

    @field_validator("id")
    @classmethod
    def _id(cls, v: str) -> str:
        return _check_name(v, "task id")


class ArmEndpoint(_Frozen):
    """Where an arm's mode acts when the harness has no switch for it: the endpoint's
    own settings (llama-server `--reasoning-budget 0`, vLLM's default chat-template
    kwargs). Arms whose settings differ run against differently started endpoints."""

    args: list[str] = Field(default_factory=list)
    env: dict[str, str] = Field(default_factory=dict)


class Arm(_Frozen):
    label: str
    mode: str
    model: str | None = None
    replicas: list[int] | None = None  # pin to these endpoint replicas (default: any)
    vars: dict[str, str] = Field(default_factory=dict)
    endpoint: ArmEndpoint = Field(default_factory=ArmEndpoint)
    # Deep-merged into each of this arm's generation requests by the gateway (e.g.
    # chat_template_kwargs): arms that differ only here share one loaded model.
    request: dict[str, Any] = Field(default_factory=dict)

    @field_validator("label")
    @classmethod
    def _label(cls, v: str) -> str:
        return _check_name(v, "arm label")

    @model_validator(mode="after")
    def _mode_in_label(self) -> Arm:
        # Origin doc 004: run names are keyed by label only, so an arm whose label does
        # not carry its mode is silently skipped as "already complete". Refuse it here.
        if self.mode not in label_tokens(self.label):
            raise ValueError(
                f"arm label {self.label!r} does not encode its mode {self.mode!r} "
                f"(e.g. '{self.label}-{self.mode}')"
            )
        return self


def label_tokens(label: str) -> list[str]:
    return [t for t in re.split(r"[-_.]", label) if t]


class Extract(_Frozen):
    archive: str
    into: str = "{scratch_dir}"


class VerdictRule(_Frozen):
    verdict: Literal["PASS", "FAIL", "INVALID"]
    reason: str | None = None
    caveat: str | None = None
    # Counts towards the harness-break streak (origin: three MISSING_OUTPUT /
    # GRADER_FAILED in a row mean the harness or grader broke, not the model).
    streak: bool = False

    @model_validator(mode="after")
    def _reason(self) -> VerdictRule:
        if self.verdict == "INVALID" and not self.reason:
            raise ValueError("an INVALID verdict word needs a reason")
        if self.reason is not None and self.reason not in INVALID_REASONS:
            raise ValueError(f"reason {self.reason!r} is not one of {sorted(INVALID_REASONS)}")
        return self


INVALID_REASONS = frozenset({
    "stall", "deadline", "harness_crash", "missing_output", "grader_failed",
    "malformed_grade", "zero_tokens", "arm_mismatch", "endpoint_down", "api_error",
    "grader_unavailable", "malformed_summary", "rate_limited", "disk_full", "unmetered",
    "config", "datapath_lost", "unscored", "sample_errors"})
# Reasons that lie with grading, not with the harness's run: the outputs stand, so the
# grader is re-run on them; the harness never is (an hour of GPU work is not re-spent).
# "unscored": the grader's own word that the sample has no score (Inspect's NaN).
# ("sample_errors": some of a cell's samples errored; the harness re-runs only those.)
GRADE_REASONS = frozenset({"grader_failed", "malformed_grade", "grader_unavailable",
                           "unscored"})

DEFAULT_VERDICTS: dict[str, VerdictRule] = {
    "PASS": VerdictRule(verdict="PASS"),
    "FAIL": VerdictRule(verdict="FAIL"),
    # Origin: a lone MISSING_OUTPUT is the model's failure; a streak is a harness break.
    "MISSING_OUTPUT": VerdictRule(verdict="FAIL", caveat="no deliverable", streak=True),
    "GRADER_FAILED": VerdictRule(verdict="INVALID", reason="grader_failed", streak=True),
    "INVALID_JSON": VerdictRule(verdict="FAIL", caveat="deliverable unparsable"),
    "STRUCTURAL_PASS": VerdictRule(verdict="PASS", caveat="structural check only"),
    "STRUCTURAL_FAIL": VerdictRule(verdict="FAIL", caveat="structural check only"),
}


class TerminalRow(_Frozen):
    """A transcript row that says the harness's work is done (e.g. ``finish_reason``
    = ``stop``): with the process still alive after the grace, a hung teardown."""

    field: str
    values: list[str]


class Harness(_Frozen):
    argv: Argv
    cwd: str | None = None
    env: dict[str, str] = Field(default_factory=dict)
    # Env vars withheld from children by default (credential-like names, the autopilot's
    # own notify config: see autopilot.cell.childenv) that this process does need.
    pass_env: list[str] = Field(default_factory=list)
    output_dir: str = "{state_dir}/cells/{cell}"
    transcript: str = "{output_dir}/transcript.jsonl"
    completion: list[str] = Field(default_factory=lambda: ["{output_dir}/summary.json"])
    summary: str = "{output_dir}/summary.json"
    wall_budget_secs: float = Field(default=3000, gt=0)
    sandbox_container: str = ""
    scratch_dirs: list[str] = Field(default_factory=list)
    # An image with find and rm on the sandboxes' Docker daemon: a scratch dir holding
    # files the autopilot cannot remove (a root-owned sandbox's) is emptied by a
    # throwaway container of it that mounts exactly that dir (never sudo). "": not tried.
    scratch_remove_image: str = ""
    # A file (template) where the harness lists the Docker Compose projects it started,
    # one per line (Inspect's sandboxes: autopilot.harnesses.inspect_run writes it). At
    # an attempt's end, at start-up and in `cleanup`, their containers and networks
    # (Compose's com.docker.compose.project label) are removed: only listed names that
    # match the pattern (default: the names Inspect gives its projects).
    compose_projects: str = ""
    compose_project_pattern: str = r"^inspect-[a-z\d\-_]*-i[a-z\d]{6,}$"
    terminal_row: TerminalRow | None = None
    # The most a request of the harness may ask for, prompt + max_tokens (0: unknown):
    # preflight refuses an endpoint that cannot serve it (vLLM's max_model_len).
    max_context: int = Field(default=0, ge=0)
    # Who a harness (and its grader) runs as: "cell", a uid of its own per live cell from
    # ``uids`` (gid = uid; needs root); "same", the supervisor's user; "auto", "cell"
    # wherever it can be had here, else "same", saying why (autopilot.cell.users).
    user: Literal["auto", "same", "cell"] = "auto"
    uids: tuple[int, int] = (61184, 65519)  # systemd's DynamicUser= range
    groups: tuple[str, ...] = ()  # a cell harness's only groups, e.g. ["docker"]

    @field_validator("uids")
    @classmethod
    def _uids(cls, v: tuple[int, int]) -> tuple[int, int]:
        lo, hi = v
        if not 1000 <= lo <= hi < 2**31 - 1:
            raise ValueError("expected [first, last] with 1000 <= first <= last")
        return v

    @field_validator("argv")
    @classmethod
    def _argv(cls, v: Argv) -> Argv:
        if not v or not isinstance(v[0], str):
            raise ValueError("argv must start with the program (a string)")
        return v

    @field_validator("compose_project_pattern")
    @classmethod
    def _pattern(cls, v: str) -> str:
        try:
            re.compile(v)
        except re.error as e:
            raise ValueError(f"not a regular expression ({e})") from None
        if not v or re.fullmatch(v, ""):  # "" or ".*" would take any project listed
            raise ValueError("must not match every name (an empty name included)")
        return v


class Grader(_Frozen):
    argv: Argv
    cwd: str | None = None
    # Env vars withheld from children by default (credential-like names, the autopilot's
    # own notify config: see autopilot.cell.childenv) that this process does need.
    pass_env: list[str] = Field(default_factory=list)
    timeout_secs: float = Field(default=600, gt=0)
    grade_file: str = "{output_dir}/grade.json"
    verdict_field: str = "verdict"
    mode: Literal["per-cell", "per-arm"] = "per-cell"
    retries: int = Field(default=2, ge=0)  # re-runs of the grader on the same outputs
    # A task whose grader_requires are missing: "refuse" the run at preflight, or
    # "record" its cells as INVALID(grader_unavailable) after one harness run each.
    on_unavailable: Literal["refuse", "record"] = "refuse"
    extract: Extract | None = None
    verdicts: dict[str, VerdictRule] = Field(default_factory=lambda: dict(DEFAULT_VERDICTS))
    # model-graded scoring: the grader gets a gateway listener of its own ({base_url},
    # a key of its own as OPENAI_API_KEY), metered as grading, apart from the cell's spend
    model_access: bool = False

    @field_validator("verdicts", mode="before")
    @classmethod
    def _short_verdicts(cls, v: Any) -> Any:
        # `PASS = "PASS"` is shorthand for `PASS = { verdict = "PASS" }`.
        if isinstance(v, Mapping):
            return {k: {"verdict": r} if isinstance(r, str) else r for k, r in v.items()}
        return v


class Watchdog(_Frozen):
    poll_secs: float = Field(default=2.0, gt=0)
    warn_secs: float = Field(default=90, gt=0)
    probe_secs: float = Field(default=180, gt=0)
    kill_secs: float = Field(default=300, gt=0)
    stuck_secs: float = Field(default=1200, gt=0)
    teardown_grace_secs: float = Field(default=10, ge=0)
    kill_grace_secs: float = Field(default=5, ge=0)
    deadline_overhead_secs: float = Field(default=600, ge=0)
    deadline_cap_secs: float = Field(default=3600, gt=0)
    # substance checks over the transcript (liveness is not progress)
    substance: bool = False
    substance_kill: bool = False
    scroll_loop_streak: int = Field(default=30, ge=2)
    runaway_secs: float = Field(default=0, ge=0)  # 0 = off
    tool_field: str = "tool_calls"
    role_field: str = "role"
    # The rows' shape: "openai" (role / tool_calls messages) or "mmbt" (the MMBT harness's
    # {"type": "model"} and {"type": "tool", "args": {"command": ...}} rows).
    transcript_schema: Literal["openai", "mmbt"] = "openai"
    # The endpoint decoding tokens (llama-server /slots, vLLM /metrics) is progress.
    endpoint_progress: bool = True

    @model_validator(mode="after")
    def _tiers(self) -> Watchdog:
        if not self.warn_secs <= self.probe_secs <= self.kill_secs:
            raise ValueError("expected warn_secs <= probe_secs <= kill_secs")
        return self


class TokenCheck(_Frozen):
    file: str = "{output_dir}/summary.json"
    field: str = "total_completion_tokens"


class ArmCheck(_Frozen):
    file: str
    field: str
    expect: str


class FinishCheck(_Frozen):
    """A harness's own record of why it stopped; an endpoint error there means the run
    broke (INVALID(api_error)), whatever the grader later finds in the workspace."""

    file: str = "{output_dir}/summary.json"
    field: str = "finish_reason"
    invalid_prefixes: list[str] = Field(default_factory=lambda: ["api_error"])
    # The harness gave up because the provider kept answering 429: INVALID(rate_limited),
    # retried without counting towards quarantine (the provider's state, not the model's).
    rate_limited_prefixes: list[str] = Field(default_factory=lambda: ["rate_limited"])


class Trust(_Frozen):
    infra_retries: int = Field(default=2, ge=0)
    anomaly_streak: int = Field(default=3, ge=1)
    # "pause": stop launching once the harness-break streak fires (rather than burn the
    # night on a broken harness); running cells finish, the run ends INCOMPLETE.
    on_anomaly: Literal["alert", "pause"] = "alert"
    tokens: TokenCheck | None = None
    finish: FinishCheck | None = None
    arm_checks: list[ArmCheck] = Field(default_factory=list)
    # How a killed or broken attempt counts (autopilot.cell.validity.count_by_evidence):
    # "evidence" — the model's own failure (a deadline while the endpoint answered, a
    # loop, a context it outgrew) is a FAIL with its caveat; "invalid" — every such
    # attempt INVALID, retried (the counting before the gateway).
    count: Literal["evidence", "invalid"] = "evidence"


class Run(_Frozen):
    target_n: int | None = Field(default=None, ge=1)
    concurrency: int = Field(default=2, ge=1)
    max_passes: int = Field(default=6, ge=1)
    status_debounce_secs: float = Field(default=0.5, ge=0)
    # Free space under the run's roots below this pauses launching and makes an INVALID
    # attempt INVALID(disk_full), not counted towards quarantine (autopilot.state.
    # diskspace); never above preflight.min_free_gb; 0 switches it off.
    disk_floor_mb: float = Field(default=200, ge=0)
    disk_check_secs: float = Field(default=2, gt=0)


class Notify(_Frozen):
    urls: list[str] = Field(default_factory=list)
    cooldown_secs: float = Field(default=600, ge=0)
    timeout_secs: float = Field(default=20, gt=0)


class Preflight(_Frozen):
    """Fail-closed checks before anything is launched or spent (autopilot.run.preflight)."""

    env: list[str] = Field(default_factory=list)  # env var NAMES that must be set
    secrets: list[str] = Field(default_factory=list)  # env var NAMES whose values are redacted
    files: list[str] = Field(default_factory=list)  # templates of files that must exist
    pins: dict[str, str] = Field(default_factory=dict)  # file template -> sha256
    pin: Literal["warn", "strict"] = "warn"
    # The benchmark itself (harness, prompts, graders, ground truths, input dirs), per
    # task: their sha256 (a tree hash for a dir) joins the plan's identity at the first
    # launch (plan.json); a resume on changed files is refused (autopilot.run.drift).
    # An optional [group] drops out where a placeholder in it is empty.
    benchmark_files: Argv = Field(default_factory=list)
    min_free_gb: float = Field(default=1.0, ge=0)
    docker: bool = False  # require a reachable Docker engine even if nothing else says so
    # llama-server: the smallest context per slot (-c / --parallel) cells may get
    min_slot_ctx: int = Field(default=0, ge=0)
    # Programs that must exit 0 before launch (argv templates, the first cell's values;
    # every task's id and vars in $AUTOPILOT_PLAN_TASKS as JSON): a framework's own check
    # that its tasks load. A failure refuses the run with the program's last words.
    commands: list[Argv] = Field(default_factory=list)
    command_timeout_secs: float = Field(default=120, gt=0)


GATEWAY_ENGINES = ("builtin", "llamacpp", "vllm", "provider")


class Gateway(_Frozen):
    """The model gateway (autopilot.gateway): every model request of a cell through us."""
    enabled: bool = True  # false: harnesses talk to the endpoint directly, as before
    max_request_mb: float = Field(default=64, gt=0)
    max_records: int = Field(default=5000, ge=0)  # request lines per attempt's log
    # the harness's own token count may differ from the gateway's by this share of the
    # larger total before the cell is flagged (cost basis self_reported_mismatch)
    tolerance: float = Field(default=0.02, ge=0)
    # outputs from a harness that sent no request through the gateway: INVALID(unmetered)
    require_metering: bool = False
    # a 429 is held and retried at the gateway for up to this long (0: the harness sees
    # it); either way the launch throttle backs off
    hold_429_secs: float = Field(default=0, ge=0)
    # a request body not received in full within this: 408 (a harness that stalls
    # mid-upload holds a connection, not the gateway)
    body_timeout_secs: float = Field(default=300, gt=0)
    # the upstream silent this long mid-request: the request is cut and recorded so
    # (generous: a long non-streamed generation sends nothing until it is done)
    upstream_read_secs: float = Field(default=1800, gt=0)


class Publish(_Frozen):
    results_repo: str = ""  # default: the git repo of the working directory
    path: str = "bench-results/{preset}"  # where scorecard.md and findings.md go in it


# A Ray cluster address: a host name or IP (IPv6 in brackets), and a port.
RAY_ADDRESS_RE = re.compile(r"(?:[A-Za-z0-9](?:[A-Za-z0-9.-]{0,252})|\[[0-9A-Fa-f:.]+\]):\d{1,5}")


class Backend(_Frozen):
    """Where cells run: this machine (``local``), or the nodes of a Ray cluster (``ray``:
    ``pip install 'bench-autopilot[ray]'``; autopilot.backends.ray.head). With Ray, a named actor on
    a node owns each endpoint replica and runs that replica's cells with the same local
    machinery; the supervisor on the head decides and journals."""

    kind: Literal["local", "ray"] = "local"
    address: str = "auto"  # the cluster (``ray start --head`` prints it), e.g. HEAD:6379
    namespace: str = "bench-autopilot"
    placement: Literal["spread", "pack", "strict_spread", "strict_pack"] = "spread"
    # Ray resources of each replica's bundle, e.g. {GPU = 1}, or a custom resource a
    # node was started with ({gpu_box_a = 1}); one entry per replica, or one for all.
    resources: list[dict[str, float]] = Field(default_factory=list)
    # The state dir is on storage every node mounts at the same path (NFS, or one host):
    # cells' outputs, transcripts and logs land there directly. Without it, each node
    # keeps a private mirror under ``node_dir`` and ships every attempt's output dir and
    # logs back with its verdict (autopilot.backends.ray.shipping).
    shared_state_dir: bool = False
    node_dir: str = "/tmp/bench-autopilot-node"
    start_timeout_secs: float = Field(default=120, gt=0)  # placement + actors ready
    poll_secs: float = Field(default=0.25, gt=0)  # how often actors' events are drained

    @field_validator("address")
    @classmethod
    def _address(cls, v: str) -> str:
        if v != "auto" and not RAY_ADDRESS_RE.fullmatch(v):
            raise ValueError(f"{v!r} is not 'auto' or HOST:PORT "
                             "(e.g. 10.0.0.5:6379, head.lan:6379, [fd00::1]:6379)")
        return v

    @model_validator(mode="after")
    def _node_dir(self) -> Backend:
        if not Path(self.node_dir).is_absolute():
            raise ValueError(f"backend.node_dir {self.node_dir!r} must be an absolute path")
        for i, res in enumerate(self.resources):
            bad = {k: v for k, v in res.items() if not v > 0 or not k}
            if bad:
                raise ValueError(f"backend.resources[{i}]: amounts must be positive "
                                 f"(got {bad})")
        return self


class Preset(_Frozen):
    name: str = ""
    description: str = ""
    model: str
    vars: dict[str, str] = Field(default_factory=dict)
    endpoint: EndpointConfig
    harness: Harness
    grader: Grader
    tasks: list[Task] = Field(min_length=1)
    arms: list[Arm] = Field(min_length=1)
    run: Run = Field(default_factory=Run)
    budget: Budget = Field(default_factory=Budget)
    cost: Cost = Field(default_factory=Cost)
    watchdog: Watchdog = Field(default_factory=Watchdog)
    trust: Trust = Field(default_factory=Trust)
    notify: Notify = Field(default_factory=Notify)
    preflight: Preflight = Field(default_factory=Preflight)
    publish: Publish = Field(default_factory=Publish)
    baseline: Baseline | None = None
    comparators: dict[str, Comparator] = Field(default_factory=dict)
    rate_card: dict[str, tuple[float, float]] = Field(default_factory=dict)
    backend: Backend = Field(default_factory=Backend)
    gateway: Gateway = Field(default_factory=Gateway)

    @property
    def samples_power(self) -> bool:
        """The endpoint's GPUs are this host's (the local backend serving a local
        engine), and sampling is not off (autopilot.run.power)."""
        return (self.cost.power == "auto" and self.backend.kind == "local"
                and self.endpoint.engine in ("llamacpp", "vllm"))

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
        for t in self.tasks:
            if t.id.lower() in seen:
                raise ValueError(f"task id {t.id!r} appears twice")
            seen[t.id.lower()] = t.id
        labels: dict[str, Arm] = {}
        for a in self.arms:
            key = a.label.lower()
            # With the mode token required in every label (Arm._mode_in_label), unique
            # labels mean two arms of different modes can never share a run name.
            if key in labels:
                raise ValueError(
                    f"arms {labels[key].label!r} and {a.label!r} collide: "
                    "labels key the run and must differ (e.g. in their mode)"
                )
            labels[key] = a
        # A cell's id is "{task}_{arm}_v{n}", and ids and labels may hold "_": two
        # (task, arm) pairs joined the same way would be one cell (one pair never run,
        # the other counted twice). The "_v{n}" suffix cannot collide (digits follow the
        # last "_v"), so refusing equal joins makes ids injective, and every existing
        # state dir keeps its ids.
        joined: dict[str, tuple[str, str]] = {}
        for t in self.tasks:
            for a in self.arms:
                key = f"{t.id}_{a.label}".lower()
                if key in joined:
                    ot, oa = joined[key]
                    raise ValueError(
                        f"task {ot!r} with arm {oa!r} and task {t.id!r} with arm "
                        f"{a.label!r} make the same cell ids ({t.id}_{a.label}_v1): rename "
                        "a task or an arm")
                joined[key] = (t.id, a.label)
        if self.baseline and self.baseline.arm not in {a.label for a in self.arms}:
            raise ValueError(f"baseline.arm {self.baseline.arm!r} is not an arm of this preset")
        r = self.endpoint.replicas
        if len(self.endpoint.replica_env) > r:
            raise ValueError(f"endpoint.replica_env has {len(self.endpoint.replica_env)} "
                             f"entries for {r} replica(s)")
        for a in self.arms:
            bad = [i for i in a.replicas or [] if not 0 <= i < r]
            if bad:
                raise ValueError(f"arm {a.label!r}: replicas {bad} outside 0..{r - 1}")
        if r > 1 and not self._arms_share_endpoint():
            raise ValueError("endpoint.replicas > 1 needs every arm on the same endpoint "
                             "settings (arms that restart the endpoint run one group at a "
                             "time); pin arms to replicas instead")
        requested = [a.label for a in self.arms if a.request]
        if requested and not (self.gateway.enabled and self.endpoint.engine in GATEWAY_ENGINES):
            raise ValueError(f"arm(s) {', '.join(requested)}: request settings need the "
                             f"gateway (gateway = true, engine one of {GATEWAY_ENGINES})")
        self._check_backend()
        return self

    def _arms_share_endpoint(self) -> bool:
        """Every arm runs against the same endpoint settings (no restart between arms)."""
        return len({json.dumps(a.endpoint.model_dump(mode="json"), sort_keys=True)
                    for a in self.arms}) <= 1

    def _check_backend(self) -> None:
        b, r = self.backend, self.endpoint.replicas
        if b.kind != "ray":
            if b.resources:
                raise ValueError("backend.resources is for backend.kind = 'ray'")
            return
        if len(b.resources) not in (0, 1, r):
            raise ValueError(f"backend.resources has {len(b.resources)} entries for {r} "
                             "replica(s): give one per replica, or one for all")
        if not self._arms_share_endpoint():
            raise ValueError("backend.kind = 'ray' needs every arm on the same endpoint "
                             "settings; pin arms to replicas instead")
        if self.grader.mode != "per-cell":
            raise ValueError("backend.kind = 'ray' grades on the node: grader.mode must "
                             "be 'per-cell'")
        if self.harness.sandbox_container or getattr(self.endpoint, "mode", "") == "docker":
            raise ValueError("backend.kind = 'ray' runs endpoints and harnesses as processes "
                             "on the nodes (Docker on nodes is not built yet): leave "
                             "harness.sandbox_container unset and endpoint.mode = 'process'")

    _env_refs: tuple[EnvRef, ...] = PrivateAttr(default=())

    def set_env_refs(self, refs: tuple[EnvRef, ...]) -> None:
        self._env_refs = refs

    def env_refs(self) -> tuple[EnvRef, ...]:
        """Every ``${VAR}`` expansion made while loading (autopilot.state.resolved)."""
        return self._env_refs

    def defaulted_env(self) -> list[str]:
        """The ``${VAR:-default}`` expansions whose VAR was unset, in words (a resume from
        a shell without the run's variables computes another plan: say which)."""
        return list(dict.fromkeys(r.describe() for r in self._env_refs if r.defaulted))

    def env_source(self, value: str) -> str:
        """Which ``${VAR}`` put (part of) ``value`` here, in words; "" when none did."""
        found = [r for r in self._env_refs if r.value and r.value in value]
        return "; ".join(dict.fromkeys(r.describe() for r in found))

    def env_of(self, key: str) -> EnvRef | None:
        """The ``${VAR}`` a key's value was expanded from, if one was."""
        return next((r for r in self._env_refs if r.key == key), None)

    def arm(self, label: str) -> Arm:
        return next(a for a in self.arms if a.label == label)

    def task(self, task_id: str) -> Task:
        return next(t for t in self.tasks if t.id == task_id)
