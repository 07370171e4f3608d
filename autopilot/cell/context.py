"""What a cell attempt is handed by its backend: the context, and the small protocols
through which it sees the parts above it (the keeper of its replica, the gateway, the
attempt's data path). cell/ imports none of those parts; a backend wires them in.
"""

from __future__ import annotations

import contextlib
import os
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

from autopilot.attemptspec import AttemptSpec, GatewaySpec
from autopilot.cell.cgroups import Containment
from autopilot.cell.procs import ProcIdentity
from autopilot.cell.validity import Classification
from autopilot.cell.watchdog import WatchState
from autopilot.config import Arm, Preset, Route
from autopilot.plan import Cell, cell_context
from autopilot.state.cellevents import MeterSummary, RequestFailover
from autopilot.state.diskspace import DiskWatch
from autopilot.state.fsguard import move_tree

Emit = Callable[..., dict[str, Any]]


class LaunchFailed(Exception):
    """An attempt's data path could not be started (a spawn of ours that failed, not
    the harness's: the message says why)."""


class Meterish(Protocol):
    """The gateway's totals of one attempt (autopilot.gateway.evidence.Meter)."""

    requests: int
    answered: int
    in_flight: int
    progress: int
    errors: dict[str, int]
    first_error: str | None
    models: dict[str, int]

    def summary(self) -> MeterSummary: ...


class DataPathView(Protocol):
    """An attempt's data path as a cell sees it (autopilot.datapath.client.DataPath):
    the harness's parent, which outlives the loop. The runner asks it, never owns it."""

    pid: int
    harness_pid: int | None
    harness_ticks: int | None
    port: int | None
    meta: dict[str, Any]
    meter: Any
    code: int | None
    ended: float | None  # when the harness ended (epoch), as the data path recorded it
    spawn_error: str | None
    throttled: int
    failovers: list[dict[str, Any]]
    unjournaled: bool

    @property
    def exited(self) -> bool: ...
    @property
    def lost(self) -> str | None: ...
    @property
    def harness(self) -> ProcIdentity | None: ...
    async def wait(self, timeout: float, upstream: list[tuple[str, str]] | None = None
                   ) -> None: ...
    async def close(self) -> None: ...
    async def reap(self, wait: float = 5.0) -> None: ...


# (state_dir, cell, attempt, spec, *, listen, run_token, token) -> a started data path
class Sandboxes(Protocol):
    """The run's Docker side of its cells (autopilot.cell.sandbox.DockerSandboxes): what
    the preset asks for (``containers``: a sandbox container per attempt; ``clears``:
    scratch cleared through Docker; ``projects``: Compose projects a harness lists)."""

    containers: bool
    clears: bool
    projects: bool

    async def remove(self, name: str, launching: bool = False) -> bool: ...
    async def activity(self, name: str) -> int | None: ...
    async def clear_dir(self, path: str) -> str | None: ...
    async def remove_projects(self, listed: str) -> list[str]: ...


class Launch(Protocol):
    """What starts an attempt's data path (autopilot.datapath.client.Launcher), held by
    name: its fork server is warmed with the endpoint's load and closed at the end."""

    async def __call__(self, state_dir: Path, spec: AttemptSpec, *, listen: Any | None,
                       run_token: str, token: str) -> DataPathView: ...

    async def warm(self) -> None: ...

    async def aclose(self, keep: bool = False) -> None: ...


class _NoLaunch:
    async def __call__(self, *args: Any, **kwargs: Any) -> DataPathView:
        raise LaunchFailed("no data path launcher wired")

    async def warm(self) -> None:
        return None

    async def aclose(self, keep: bool = False) -> None:
        return None


_no_launch = _NoLaunch()


class Gatekeeper(Protocol):
    """The model gateway as a cell sees it (autopilot.gateway.proxy.Gateway): what an
    attempt's data path needs to run the attempt's own listener."""

    def datapath_spec(self, settings: Mapping[str, Any], upstream: list[tuple[str, str]],
                      log_path: Path, key: str = "", model: str | None = None, *,
                      route: Route | None = None, route_key: str = "",
                      dialect_settings: Mapping[Any, Mapping[str, Any]] | None = None
                      ) -> GatewaySpec: ...

    def grading(self, cell: str, attempt: int, upstream: Callable[[], list[tuple[str, str]]],
                log_path: Path, model: str | None = None
                ) -> contextlib.AbstractAsyncContextManager[Any]: ...


class Served(Protocol):
    """What a cell needs of the keeper of the replica it runs against (an
    endpoints.keeper.Keeper, or a Ray node's keeper mirrored on the head)."""

    failed: str | None  # why the endpoint failed for good, once it has

    @property
    def ep(self) -> Any: ...
    async def decoding(self, max_age: float) -> int | None: ...
    def outage_overlaps(self, start: float, end: float) -> bool: ...


@dataclass
class CellContext:
    """What a cell run needs from the supervisor (and nothing more)."""

    preset: Preset
    state_dir: Path
    keeper: Served
    emit: Emit
    stopping: Callable[[], bool]
    forced: Callable[[], bool]
    clock: Callable[[], float] = time.monotonic
    on_tick: Callable[[str, WatchState, str], None] = lambda cid, s, tier: None
    redact: Callable[[str], str] = lambda s: s
    scrub_file: Callable[[Path], bool] = lambda p: False  # logsetup.Redactor.scrub_file
    # Docker hooks (None when no sandbox is configured or Docker is not in use)
    # the run's Docker side of a cell (sandbox containers, Compose projects, scratch
    # cleared through Docker); None without Docker
    sandboxes: Sandboxes | None = None
    # where this run may delete or move directories (fsguard.run_roots)
    roots: tuple[Path, ...] = ()
    # a grading try that failed and will be retried (feeds the harness-break streak)
    on_grade_failure: Callable[[str, Classification], None] | None = None
    # os.environ decoded once: copying it per cell is measurable at 8 cells in flight
    base_env: dict[str, str] = field(default_factory=dict)  # see childenv.child_env
    replica: int = 0  # the endpoint replica this context's cells run against
    # the run's cgroup subtree (autopilot.cell.cgroups), None: the fallback containment
    contain: Containment | None = None
    # free space under the run's roots (None: no floor): an attempt during a low period
    # is INVALID(disk_full), not the cell's fault
    disk: DiskWatch | None = None
    # the model gateway (None: harnesses talk to the endpoint directly)
    gateway: Gatekeeper | None = None
    # every replica's keeper by index (this machine's), where a request may fail over to
    peers: Callable[[], Sequence[Served]] = lambda: ()
    # starts an attempt's data path (autopilot.datapath.client.DataPath.launch)
    launch: Launch = _no_launch
    run_token: str = ""  # the run's marker, carried by the data path too
    # a fresh attempt key (autopilot.gateway.proxy.attempt_key), and the variables of
    # the harness's environment it goes into
    new_key: Callable[[], str] = lambda: ""
    key_env: tuple[str, ...] = ()
    # [harness] user = "cell": the uids live cells run as (autopilot.cell.users.UidPool)
    users: Any = None
    # the loop hands over to a successor: running attempts are left to their data paths
    handing_over: Callable[[], bool] = lambda: False
    # a 429 the attempt's gateway saw (the loop launches fewer cells at once)
    on_throttled: Callable[[], None] = lambda: None


def template_context(
    preset: Preset, cell: Cell, attempt: int, state_dir: Path, keeper: Served
) -> dict[str, str]:
    endpoint = keeper.ep
    ctx = cell_context(preset, cell, attempt, state_dir, endpoint.port, endpoint.host,
                       endpoint.api_base)
    ctx["served_model"] = endpoint.served_model
    return ctx


def move_aside(output_dir: Path, state_dir: Path, cell_id: str, attempt: int,
               roots: tuple[Path, ...]) -> Path | None:
    """Move a previous attempt's outputs to ``attempts/<cell>/attempt-<k>`` (through the
    guard: raises UnsafePath for an output dir outside the run's roots)."""
    if not output_dir.is_dir() or output_dir.is_symlink() or not any(output_dir.iterdir()):
        return None
    dest = state_dir / "attempts" / cell_id / f"attempt-{attempt}"
    k = 1
    while dest.exists():  # an earlier move of the same attempt number (interrupted run)
        dest = dest.with_name(f"attempt-{attempt}.{k}")
        k += 1
    move_tree(output_dir, dest, roots, state_dir)
    return dest


__all__ = [
    "CellContext",
    "DataPathView",
    "Gatekeeper",
    "Launch",
    "LaunchFailed",
    "Served",
    "move_aside",
    "template_context",
]


def whole_wall(launched: float | None, ended: float | None, watched: float) -> float:
    """An attempt's wall, spawn to exit, as its data path recorded both (a successor
    that re-attached watched only the end of it); the watched span where they are not
    known."""
    if launched is not None and ended is not None and ended >= launched:
        return round(ended - launched, 3)
    return round(watched, 3)


def gateway_news(context: CellContext, cell: str, attempt: int, datapath: DataPathView,
                 told: int) -> int:
    """Journal what an attempt's gateway saw since the last look: throttling (the loop
    launches fewer cells) and requests that failed over to another replica. Returns the
    429 count the loop has now been told of (``told``: the count before)."""
    for _ in range(datapath.throttled - told):
        context.on_throttled()
    for failover in datapath.failovers:
        context.emit(RequestFailover(cell=cell, attempt=attempt,
                                     replica=_replica(failover.get("replica")),
                                     to=_replica(failover.get("to")),
                                     why=context.redact(str(failover.get("why"))[:200])))
    datapath.failovers.clear()
    return datapath.throttled


def gateway_spec(gatekeeper: Gatekeeper, arm: Arm, upstream: list[tuple[str, str]], key: str,
                 model: str, log_path: Path) -> GatewaySpec:
    """What an attempt's data path needs for its gateway listener. An arm's route: its
    key is read here, at launch, and travels to the data path on its stdin only (never
    to the harness)."""
    route_key = (os.environ.get(arm.route.api_key_env, "")
                 if arm.route and arm.route.api_key_env else "")
    return gatekeeper.datapath_spec(arm.request, upstream, log_path, key=key, model=model,
                                    route=arm.route, route_key=route_key,
                                    dialect_settings=arm.request_by_dialect)


def _replica(said: Any) -> int | None:
    """A replica number as the data path says it ("1"), else nothing: its word is
    untrusted, and never a text where a number belongs."""
    if type(said) is int:
        return said
    return int(said) if isinstance(said, str) and said.isdigit() and len(said) < 6 else None


def upstreams(context: CellContext, arm: Arm) -> list[tuple[str, str]]:
    """Where the gateway sends a cell's next request: an arm's own route (no replica of
    the run's to fail over to); else its own replica (an empty origin while it is known
    to be down), then every other replica that is up and may serve the cell's arm (its
    pins), all serving the same model."""
    from urllib.parse import urlsplit

    def origin(k: Served) -> str:  # scheme://host:port; the harness sends the path
        if not getattr(k, "is_up", True):
            return ""
        parts = urlsplit(str(k.ep.api_base))
        return f"{parts.scheme}://{parts.netloc}"

    if arm.route is not None:
        return [("route", arm.route.origin())]
    allowed = arm.replicas
    out = [(str(context.replica), origin(context.keeper))]
    for i, k in enumerate(context.peers()):
        if i != context.replica and (allowed is None or i in allowed) and origin(k):
            out.append((str(i), origin(k)))
    return out


def harness_identity(datapath: DataPathView) -> ProcIdentity | None:
    """The harness's identity as its data path recorded it (pid + start ticks, read
    before the data path could reap it), with psutil's create_time while it lives."""
    if datapath.harness_pid is None:
        return None
    from autopilot.cell.procs import identify

    live = identify(datapath.harness_pid)
    if live is not None and live.ticks == datapath.harness_ticks:
        return live
    return datapath.harness  # gone already: an identity that matches nothing alive
