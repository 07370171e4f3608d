"""How a run as a whole behaves: its pace (``[run]``), milestones (``[notify]``), the
checks before it (``[preflight]``), the model gateway (``[gateway]``), where results are
published (``[publish]``) and where cells run (``[backend]``).

Part of the configuration schema (autopilot.config re-exports every name).
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Literal

from pydantic import Field, field_validator, model_validator

from autopilot.config.base import Frozen as _Frozen
from autopilot.config.matrix import Argv


class Run(_Frozen):
    """The run's size and pace."""

    target_n: int | None = Field(default=None, ge=1)
    """Replicates per task x arm (``--target-n`` wins; a state dir remembers it)."""
    concurrency: int = Field(default=2, ge=1)
    """Cells running at once (``--concurrency``): their harnesses. A cell's grading runs
    beside the next cells' harnesses (as many graders at once at most), except where it
    uses the model (``[grader] model_access``), a verdict may stop launching (a
    ``[budget]``, ``on_anomaly = "pause"``), or a user per cell has fewer than twice this
    many ``uids``: there a cell keeps its slot until its verdict."""
    max_passes: int = Field(default=6, ge=1)
    """Passes over the matrix before the run ends INCOMPLETE (``--max-passes``)."""
    status_debounce_secs: float = Field(default=0.5, ge=0)
    """status.json is written at most this often (the last change is never lost)."""
    disk_floor_mb: float = Field(default=200, ge=0)
    """Free space under the run's roots below this pauses launching and makes an INVALID
    attempt INVALID(disk_full), not counted towards quarantine; never above
    ``preflight.min_free_gb``; 0 switches it off."""
    disk_check_secs: float = Field(default=2, gt=0)
    """How often free space under the run's roots is read."""


class Notify(_Frozen):
    """Milestones pushed to a phone (Apprise URLs; ``autopilot notify-test`` tries them)."""

    urls: list[str] = Field(default_factory=list)
    """Apprise URLs (``ntfy://``, ``tgram://``, ``mailto://``...); more come from
    ``AUTOPILOT_NOTIFY_URLS``. Never written anywhere: they carry tokens."""
    cooldown_secs: float = Field(default=600, ge=0)
    """The same milestone (its kind, for the same arm) is sent at most once in this long."""
    timeout_secs: float = Field(default=20, gt=0)
    """A send that takes longer is given up (the run never waits on a phone)."""


class Preflight(_Frozen):
    """Fail-closed checks before anything is launched or spent (autopilot.run.preflight)."""

    env: list[str] = Field(default_factory=list)
    """Names of environment variables that must be set (values are never printed)."""
    secrets: list[str] = Field(default_factory=list)
    """Names of environment variables whose values are redacted from every log."""
    files: list[str] = Field(default_factory=list)
    """Files that must exist (templates)."""
    pins: dict[str, str] = Field(default_factory=dict)
    """A file (template) -> its sha256: a drifted file is a warning, or a refusal with
    ``pin = "strict"``."""
    pin: Literal["warn", "strict"] = "warn"
    """What a drifted pin does: "warn" loudly, or "strict": refuse the run."""
    benchmark_files: Argv = Field(default_factory=list)
    """The benchmark itself (harness, prompts, graders, ground truths, input dirs), per
    task: their sha256 (a tree hash for a dir) joins the plan's identity at the first
    launch; a resume on changed files is refused. An inner list drops out where a
    placeholder in it is empty."""
    min_free_gb: float = Field(default=1.0, ge=0)
    """Free space (GB) the state dir must have for the run to start."""
    docker: bool = False
    """Require a reachable Docker engine even if nothing else says so."""
    min_slot_ctx: int = Field(default=0, ge=0)
    """llama-server: the smallest context per slot (-c / --parallel) cells may get."""
    commands: list[Argv] = Field(default_factory=list)
    """Programs that must exit 0 before launch (argv templates with the first cell's
    values; every task's id and vars in ``$AUTOPILOT_PLAN_TASKS`` as JSON): a framework's
    own check that its tasks load. A failure refuses the run with the program's last
    words."""
    command_timeout_secs: float = Field(default=120, gt=0)
    """Each of ``commands`` is killed, and the run refused, after this long."""


class Gateway(_Frozen):
    """The model gateway (autopilot.gateway): every model request of a cell through a
    listener of its own, metered and recorded (``gateway = false`` switches it off)."""

    enabled: bool = True
    """false: harnesses talk to the endpoint directly (no metering, no arm requests)."""
    max_request_mb: float = Field(default=64, gt=0)
    """A request body larger than this is refused (413)."""
    max_records: int = Field(default=5000, ge=0)
    """Request lines kept in each attempt's gateway log."""
    tolerance: float = Field(default=0.02, ge=0)
    """The harness's own token count may differ from the gateway's by this share of the
    larger total before the cell is flagged (cost basis self_reported_mismatch)."""
    require_metering: bool = False
    """Outputs from a harness that sent no request through the gateway are
    INVALID(unmetered)."""
    hold_429_secs: float = Field(default=0, ge=0)
    """A 429 is held and retried at the gateway for up to this long (0: the harness sees
    it); either way the launch throttle backs off."""
    body_timeout_secs: float = Field(default=300, gt=0)
    """A request body not received in full within this: 408 (a harness that stalls
    mid-upload holds a connection, not the gateway)."""
    upstream_read_secs: float = Field(default=1800, gt=0)
    """The upstream silent this long mid-request: the request is cut and recorded so
    (generous: a long non-streamed generation sends nothing until it is done)."""


class Publish(_Frozen):
    """Where ``autopilot publish`` commits the scorecard and findings."""

    results_repo: str = ""
    """The git repository to commit into (default: the working directory's)."""
    path: str = "bench-results/{preset}"
    """The folder in it for scorecard.md and findings.md (a template)."""


# A Ray cluster address: a host name or IP (IPv6 in brackets), and a port.
RAY_ADDRESS_RE = re.compile(r"(?:[A-Za-z0-9](?:[A-Za-z0-9.-]{0,252})|\[[0-9A-Fa-f:.]+\]):\d{1,5}")


class Backend(_Frozen):
    """Where cells run: this machine (``local``), or the nodes of a Ray cluster (``ray``:
    ``pip install 'bench-autopilot[ray]'``; autopilot.backends.ray.head). With Ray, a
    named actor on a node owns each endpoint replica and runs that replica's cells with
    the same local machinery; the supervisor on the head decides and journals."""

    kind: Literal["local", "ray"] = "local"
    """"local": this machine; "ray": the nodes of a Ray cluster."""
    address: str = "auto"
    """The cluster (``ray start --head`` prints it), e.g. ``HEAD:6379``."""
    namespace: str = "bench-autopilot"
    """The Ray namespace of the run's actors."""
    placement: Literal["spread", "pack", "strict_spread", "strict_pack"] = "spread"
    """The placement group strategy of the replicas' bundles."""
    resources: list[dict[str, float]] = Field(default_factory=list)
    """Ray resources of each replica's bundle, e.g. ``{GPU = 1}``, or a custom resource a
    node was started with (``{gpu_box_a = 1}``); one entry per replica, or one for all."""
    shared_state_dir: bool = False
    """The state dir is on storage every node mounts at the same path (NFS, or one host):
    cells' files land there directly. Without it, each node keeps a private mirror under
    ``node_dir`` and ships every attempt's output dir and logs back with its verdict."""
    node_dir: str = "/tmp/bench-autopilot-node"
    """A node's private mirror of the state dir (an absolute path)."""
    start_timeout_secs: float = Field(default=120, gt=0)
    """Placement and the actors ready within this, or the run stops."""
    poll_secs: float = Field(default=0.25, gt=0)
    """How often the actors' events are drained."""
    lease_secs: float = Field(default=60, gt=0)
    """A node's actor that has not heard from the head for this long ends what it runs
    and its endpoint (it is fenced: a partition may have cut it off); the head re-runs a
    lost node's cells elsewhere only once that has surely happened, unless a sweep on
    that machine ended them first. Longer than a supervisor's restart: its successor
    re-attaches to the actors within it."""

    @model_validator(mode="after")
    def _lease(self) -> Backend:
        if self.lease_secs < 4 * self.poll_secs:
            raise ValueError(f"lease_secs ({self.lease_secs:g}) must be at least 4 polls "
                             f"(poll_secs {self.poll_secs:g}): a node heard from every "
                             "poll must never fence itself")
        return self

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
