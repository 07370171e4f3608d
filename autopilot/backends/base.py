"""What the loop asks of a backend, and the narrow port a backend reports through.

The loop (autopilot.run.supervisor) decides: the ledger, passes, retries, which replica
gets a cell, what a verdict means for the run. A backend acts: it owns the endpoint
replicas' keepers, runs one attempt of a cell against the replica it was given, grades
a finished attempt, and releases what it holds at the end. It reports back only through
a ``Port`` (events, milestones, watchdog ticks, grading tries that failed, throttling,
whether the run is stopping), so no backend imports the loop, and the loop knows no
backend but by the name in ``BACKENDS``.

A new backend (Slurm, say: one job per cell) is one module beside ``local.py`` with a
class of ``Backend``'s shape, one entry in ``BACKENDS``, and its kind in
``config.Backend.kind`` (with its own settings). The files it would touch:
``autopilot/backends/slurm.py`` (new), this module's ``BACKENDS`` table, and
``autopilot/config.py`` (the kind and its settings). The loop, the cli, preflight, the
loader and ``autopilot cleanup`` ask it through ``backend_class(kind)`` (its placement
lines, its cleanup, its preflight and load-time checks) and need no edit.
"""

from __future__ import annotations

import abc
import contextlib
import importlib
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import asdict, dataclass, field, replace
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar, Protocol, runtime_checkable

from autopilot.attemptspec import GatewaySpec
from autopilot.errors import EndpointError
from autopilot.state.cellevents import CellRan
from autopilot.state.eventbase import EventBase
from autopilot.state.runevents import MilestoneKind

if TYPE_CHECKING:  # the loader asks a backend kind's load checks: this module stays light
    from autopilot.cell.context import CellContext, Sandboxes
    from autopilot.cell.validity import Classification, RunOutcome
    from autopilot.config import ArmEndpoint, Preset
    from autopilot.gateway.settings import GatewaySettings
    from autopilot.logsetup import Redactor
    from autopilot.plan import Cell
    from autopilot.state.diskspace import DiskWatch

# Awaited by a backend once an attempt's harness has ended, before it is graded: the
# pass gives the cell's slot to the next cell (autopilot.run.passes).
Ran = Callable[[], Awaitable[None]]


@runtime_checkable
class Closable(Protocol):
    async def close(self) -> None: ...


class Port(Protocol):
    """How a backend reports to the loop (the loop implements it; a node buffers it)."""

    def emit(self, event: str | EventBase, **fields: Any) -> dict[str, Any]: ...
    def milestone(self, kind: MilestoneKind, **info: Any) -> None: ...
    def tick(self, cid: str, frozen_secs: float, tier: str, last_signal: Any) -> None: ...
    def grade_failure(self, cid: str, c: Classification) -> None: ...
    def throttled(self) -> None: ...
    def stopping(self) -> bool: ...
    def forced(self) -> bool: ...
    def handing_over(self) -> bool: ...


class Keeper(Protocol):
    """A replica's keeper as the loop sees it (endpoints.keeper.Keeper on this machine,
    ray.head.RemoteKeeper for one on a node; both on endpoints.keeper.KeeperBase)."""

    ep: Any
    state: str
    failed: str | None

    @property
    def is_up(self) -> bool: ...
    def describe(self) -> dict[str, Any]: ...
    async def start(self) -> None: ...
    async def wait_up(self) -> None: ...
    async def watch(self) -> None: ...
    async def decoding(self, max_age: float) -> int | None: ...
    def outage_overlaps(self, start: float, end: float) -> bool: ...


@dataclass(frozen=True)
class Survivors:
    """What a dead predecessor left running elsewhere than in this machine's data paths
    (a Ray node's actor, its endpoint and attempts) that the backend re-attaches to: the
    start-up sweep spares all of it, and the passes watch its attempts again."""

    attempts: tuple[tuple[str, int, Any], ...] = ()
    """(cell, attempt, handle): what ``Backend.resume`` is given (``handle.meta``: its
    replica)."""
    leases: frozenset[str] = frozenset()
    """Processes carrying one of these leases are a survivor's."""
    pids: frozenset[int] = frozenset()
    """Endpoint processes a survivor keeps."""
    groups: frozenset[str] = frozenset()
    """The run's cgroups a survivor's processes are in."""
    replicas: Mapping[int, Any] = field(default_factory=dict)
    """Replica -> the backend's own record of what it re-attaches to."""


@dataclass(frozen=True)
class Wiring:
    """What the loop hands a backend when it makes it."""

    preset: Preset
    state_dir: Path
    run_token: str
    port: Port
    redactor: Redactor
    clock: Callable[[], float]
    # the Docker side of the harness's sandbox (None without Docker)
    sandboxes: Sandboxes | None = None
    # the loop's watch of free space (it pauses launching); None: the context makes its
    # own, which only classifies (a Ray node's cells, on the node's disk)
    disk: DiskWatch | None = None
    # replica -> the endpoint_started record of an endpoint a predecessor left serving,
    # to re-adopt rather than reload (autopilot.run.recovery.live_endpoints)
    readopt: dict[int, dict[str, Any]] | None = None
    # replica -> what the backend found alive of a predecessor's elsewhere
    # (``Backend.survey``), to re-attach to rather than reap
    survivors: Mapping[int, Any] | None = None


class RunGateway:
    """The run's gateway as the loop holds it: its settings, from which each attempt's
    data path serves its listener, and a serving gateway of its own made on the first
    grading that asks a model (only then is the serving code, aiohttp with it, loaded
    into the supervisor)."""

    def __init__(self, settings: GatewaySettings) -> None:
        self.settings = settings
        self._serving: Any = None  # autopilot.gateway.proxy.Gateway, once made

    def datapath_spec(self, *args: Any, **kw: Any) -> GatewaySpec:
        return self.settings.datapath_spec(*args, **kw)

    def grading(self, cell: str, attempt: int, upstream: Callable[[], list[tuple[str, str]]],
                log_path: Path, model: str | None = None
                ) -> contextlib.AbstractAsyncContextManager[Any]:
        if self._serving is None:
            from autopilot.gateway.proxy import Gateway

            self._serving = Gateway.like(self.settings)
        served: contextlib.AbstractAsyncContextManager[Any] = self._serving.grading(
            cell, attempt, upstream, log_path, model=model)
        return served

    async def close(self) -> None:
        if self._serving is not None:
            await self._serving.close()


def cell_context(wiring: Wiring, keeper: Any, *, replica: int = 0,
                 extra_env: dict[str, str] | None = None, forks: bool = False,
                 forks_outlive: bool = True, forks_name: str = "forkserver") -> CellContext:
    """The one builder of what a cell run needs (here, and in a Ray node's actor, whose
    fork server ends with it: ``forks_outlive=False``)."""
    from autopilot.cell import cgroups, users
    from autopilot.cell.childenv import child_env, secret_values
    from autopilot.cell.context import CellContext
    from autopilot.cell.procs import RUN_TOKEN_ENV
    from autopilot.datapath.forks import ForkServer, Launcher
    from autopilot.gateway.policy import KEY_ENV, attempt_key
    from autopilot.gateway.settings import gateway_for
    from autopilot.logsetup import SPOOL_CAP
    from autopilot.state.diskspace import DiskWatch, floor_bytes
    from autopilot.state.fsguard import run_roots

    port, clock = wiring.port, wiring.clock
    # on this machine: a Ray node decides its own
    who = users.resolve(wiring.preset, wiring.state_dir)
    roots = run_roots(wiring.preset, wiring.state_dir)
    settings = gateway_for(wiring.preset, wiring.redactor.scrub, port.throttled, port.emit,
                           key=getattr(keeper.ep, "api_key", None),
                           secrets=tuple(secret_values(wiring.preset)))
    gateway = RunGateway(settings) if settings is not None else None
    endpoint = wiring.preset.endpoint
    # Through the gateway a provider's key stays here: the harness gets its attempt's
    # key instead (as OPENAI_API_KEY, and under the provider's and each arm route's
    # api_key_env), and the gateway puts the real one on an allowed request upstream.
    names = [endpoint.key_env(),
             *(arm.route.api_key_env for arm in wiring.preset.arms if arm.route)]
    key_env: tuple[str, ...] = (KEY_ENV,
                                *sorted({name for name in names if name and name != KEY_ENV}))
    disk = wiring.disk or DiskWatch(roots, floor_bytes(wiring.preset.run.disk_floor_mb,
                                                       wiring.preset.preflight.min_free_gb), clock)
    return CellContext(
        preset=wiring.preset, state_dir=wiring.state_dir, keeper=keeper, emit=port.emit,
        stopping=port.stopping, forced=port.forced, clock=clock,
        on_tick=lambda cid, s, tier: port.tick(cid, clock() - s.last_transcript, tier,
                                                s.last_signal),
        # A spooled log is redacted and capped when its attempt ends (logsetup.SPOOL_CAP).
        redact=wiring.redactor.scrub, scrub_file=partial(wiring.redactor.scrub_file, cap=SPOOL_CAP),
        sandboxes=wiring.sandboxes,
        on_grade_failure=port.grade_failure,
        roots=roots, disk=disk if disk.floor > 0 else None,
        base_env={**{k: v for k, v in child_env(wiring.preset, "harness").items()
                     if gateway is None or k not in key_env},
                  RUN_TOKEN_ENV: wiring.run_token, **(extra_env or {})},
        new_key=attempt_key, key_env=key_env if gateway is not None else (),
        users=users.pool_for(*wiring.preset.harness.uids, who.groups) if who.mode == "cell"
        else None,
        replica=replica, contain=cgroups.for_run(wiring.run_token)[0], gateway=gateway,
        # Data paths forked from one server per loop (its imports paid once), where the
        # backend asks for it; else each is a process of its own.
        launch=Launcher(ForkServer(wiring.state_dir, wiring.run_token, outlives=forks_outlive,
                                   name=forks_name) if forks else None),
        run_token=wiring.run_token,
        handing_over=port.handing_over,
        on_throttled=port.throttled,
    )


def replica_lines(preset: Preset, where: str) -> list[str]:
    """What --dry-run says of each replica: where it runs, its port, slots, env, pins."""
    endpoint = preset.endpoint
    per = endpoint.slots or -(-preset.run.concurrency // endpoint.replicas)
    lines = []
    for i in range(endpoint.replicas):
        env = endpoint.replica_env[i] if i < len(endpoint.replica_env) else {}
        port = endpoint.port + i if endpoint.port else "free port"
        pinned = [arm.label for arm in preset.arms if arm.replicas and i in arm.replicas]
        lines.append(f"replica {i}: {where}, port {port}, {per} slot(s), env "
                     f"{', '.join(f'{k}={v}' for k, v in env.items()) or '(shared)'}"
                     + (f", pinned arms {', '.join(pinned)}" if pinned else ""))
    return lines


class Backend(abc.ABC):
    """The shape every backend has; the shared parts (the cell context, grading a
    finished attempt here, stopping the replicas) are implemented once."""

    kind: ClassVar[str]

    def __init__(self, wiring: Wiring, setting: ArmEndpoint, group: tuple[str, ...]) -> None:
        """``setting``, ``group``: the endpoint settings and arms replica 0 starts with."""
        self.w = wiring
        self.keepers: Sequence[Keeper] = []
        self._cx: dict[int, CellContext] = {}

    # ------------------------------------------------------------------ what --dry-run
    # and `autopilot cleanup` ask of a backend kind, before any backend is made

    @classmethod
    def dry_run_lines(cls, preset: Preset) -> list[str]:
        return replica_lines(preset, "this machine") if preset.endpoint.replicas > 1 else []

    @classmethod
    def cleanup(cls, preset: Preset, token: str, grace: float, endpoint: bool,
                state_dir: Path | None = None, sandboxes: tuple[str, ...] = (),
                since: float | None = None) -> list[str]:
        """Blocking: what the backend leaves elsewhere than this machine, removed (the
        plan's ``sandboxes`` by exact name, when not older than ``since``)."""
        return []

    # Whether the endpoint starts on this machine (preflight then checks its binary,
    # model and port here); a backend that starts it elsewhere checks its own way.
    endpoint_here: ClassVar[bool] = True

    @classmethod
    def preflight(cls, preset: Preset) -> list[str]:
        """What must hold on this machine before the backend can run (fail closed)."""
        return []

    @classmethod
    def load_problems(cls, preset: Preset) -> list[tuple[str, str]]:
        """(key, why) for settings this backend cannot carry out, found at load."""
        return []

    # ------------------------------------------------------------------ the run

    def context(self, replica: int = 0) -> CellContext:
        # Built once per replica, at its first cell: by then the keepers and the Docker
        # hooks are set.
        if replica not in self._cx:
            # Every replica's keeper: a request of a cell may fail over to another.
            base = self._cx.get(0) or replace(cell_context(self.w, self.keepers[0],
                                                           forks=True),
                                              peers=lambda: list(self.keepers))
            self._cx[0] = base
            if replica:
                self._cx[replica] = replace(base, keeper=self.keepers[replica],
                                            replica=replica)
        return self._cx[replica]

    @abc.abstractmethod
    async def run(self, cell: Cell, attempt: int, replica: int,
                  ran: Ran | None = None) -> Classification | None:
        """Run one attempt of ``cell`` against replica ``replica``: its classification,
        or None (abandoned, or journaled as ``cell_ran`` to be graded with its arm).
        ``ran``: awaited once the harness has ended and before it is graded, where the
        grading may run beside the next cell's harness (``grades_beside``)."""

    async def reconfigure(self, setting: ArmEndpoint, arms: tuple[str, ...]) -> None:
        """Restart replica 0's endpoint for another arm group (no cell is running)."""
        raise EndpointError(f"the {self.kind} backend serves one arm group only")

    async def start(self) -> None:
        """Start every replica at once."""
        await self._start_replicas()

    async def warm(self) -> None:
        """Start the fork server of data paths (the loop runs this beside the endpoint's
        load): usually ready before the first launch, which waits for it otherwise."""
        if not self.reattaches:  # attempts run elsewhere (a Ray node forks its own)
            return
        await self.context().launch.warm()

    async def _start_replicas(self) -> None:
        """Raise EndpointError only when no replica could start (the others then serve:
        one replica down slows the run, it does not stop it)."""
        import anyio

        keepers = self.keepers
        if len(keepers) == 1:
            await keepers[0].start()
            return
        errors: dict[int, str] = {}

        async def one(i: int, k: Keeper) -> None:
            try:
                await k.start()
            except EndpointError as e:
                errors[i] = str(e)
                k.failed = f"replica {i}: {e}"

        async with anyio.create_task_group() as tg:
            for i, k in enumerate(keepers):
                tg.start_soon(one, i, k)
        if len(errors) == len(keepers):
            raise EndpointError("; ".join(f"replica {i}: {e}" for i, e in errors.items()))
        for i, why in errors.items():
            self.w.port.milestone("endpoint_failed", why=f"replica {i} did not start: {why}",
                                  replica=i)

    async def grade(self, cell: Cell, attempt: int, outcome: RunOutcome,
                    meter: Any = None) -> Classification:
        """Grade a finished attempt whose outputs are in the state dir (an arm graded at
        once, or an attempt a dead predecessor left finished, with the gateway's
        ``meter`` its data path recorded): here, centrally."""
        from autopilot.cell.runner import CellRun

        run = CellRun(self.context(), cell, attempt)
        run.meter = meter
        return await run.judge(outcome)

    # Whether attempts outlive the loop here (their data paths on this machine), so a
    # successor re-attaches to them (autopilot.run.recovery); else it abandons them.
    reattaches: ClassVar[bool] = False

    @classmethod
    async def survey(cls, preset: Preset, run_token: str, state_dir: Path,
                     port: Port, ledger: Any) -> Survivors:
        """Before the start-up sweep: what a dead predecessor left running elsewhere that
        proves to be this run's (``Survivors``); its unjournaled reports are journaled
        through ``port`` first, so ``ledger`` knows every attempt it started."""
        return Survivors()

    async def resume(self, cell: Cell, attempt: int, replica: int,
                     attached: Any, ran: Ran | None = None) -> Classification | None:
        """Watch an attempt a predecessor started (its data path, re-attached) to its
        end, then judge it as any other."""
        raise EndpointError(f"the {self.kind} backend does not re-attach to attempts")

    @property
    def grades_beside(self) -> bool:
        """Whether a finished harness's slot may go to the next cell while it is graded
        (per-cell grading here). Not where the grading uses the model (``[grader]
        model_access``: the endpoint's load is the cells' and their graders'), nor where a
        verdict may stop launching (a ``[budget]``: its spend must count first; ``[trust]
        on_anomaly = "pause"``: the streak's last break launches nothing after it), nor
        where a user per cell may run short of uids (a cell being graded keeps its uid,
        so twice the concurrency may hold one: a range narrower than that would refuse a
        launch, which costs a retry)."""
        preset = self.w.preset
        first, last = preset.harness.uids
        uids_short = (preset.harness.user != "same"
                      and last - first + 1 < 2 * preset.run.concurrency)
        return (preset.grader.mode == "per-cell" and not preset.grader.model_access
                and preset.budget.tokens is None and preset.budget.usd is None
                and preset.trust.on_anomaly != "pause" and not uids_short)

    async def conclude(self, run: Any, outcome: RunOutcome | None,
                       ran: Ran | None = None) -> Classification | None:
        """An attempt's run is over: judge it now (per-cell grading), or journal it as
        ``cell_ran`` to be graded with its arm (per-arm; one without outputs is INVALID
        at once: no grader could change that)."""
        from autopilot.cell.validity import classify

        if outcome is None:
            return None
        if self.w.preset.grader.mode == "per-cell":
            if ran is not None and self.grades_beside:
                await ran()  # its slot goes to the next cell while this one is graded
            return await run.judge(outcome)  # type: ignore[no-any-return]
        if not outcome.completion:
            return classify(outcome, None, self.w.preset.grader.verdicts)
        self.w.port.emit(CellRan(cell=run.cell.id, attempt=run.attempt,
                         outcome=asdict(outcome)))
        return None

    async def close(self, keep_endpoints: bool = False) -> None:
        """At the end of the run: stop every replica (not when handing over: the
        successor re-adopts them), then release what the backend holds. Shielded by
        the caller."""
        from autopilot.logsetup import SPOOL_CAP

        for k in [] if keep_endpoints else self.keepers:
            await k.ep.stop()
            await k.ep.aclose()
            with contextlib.suppress(OSError):
                self.w.redactor.scrub_file(k.ep.log_path, cap=SPOOL_CAP)
            if not k.ep.attached and k.state not in ("failed", "lost"):
                k.state = "stopped"
        for k in self.keepers if keep_endpoints else []:
            await k.ep.aclose()
        base = self._cx.get(0)
        if base is not None and isinstance(base.gateway, Closable):
            await base.gateway.close()
        if base is not None:  # the fork server ends (is left to a successor when handing
            await base.launch.aclose(keep=keep_endpoints)  # over); its data paths go on
        await self.release(keep=keep_endpoints)

    async def release(self, keep: bool = False) -> None:
        """Let go of what the backend holds (``keep``: handing over, the successor
        re-attaches to what runs elsewhere)."""
        return None


# name -> "module:Class"; imported on use, so that a run without Ray never loads it
BACKENDS: dict[str, str] = {
    "local": "autopilot.backends.local:LocalBackend",
    "ray": "autopilot.backends.ray.head:RayBackend",
}


def backend_class(kind: str) -> type[Backend]:
    module, _, name = BACKENDS[kind].partition(":")
    cls: type[Backend] = getattr(importlib.import_module(module), name)
    return cls


__all__ = ["BACKENDS", "Backend", "Keeper", "Port", "Ran", "Survivors", "Wiring", "backend_class",
           "cell_context", "replica_lines"]
