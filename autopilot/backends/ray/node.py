"""The node side of the Ray backend: one actor per endpoint replica.

``NodeAgent`` runs in a Ray worker process on the node its placement bundle landed on.
It owns that node's replica (the same ``Endpoint`` and ``Keeper`` as a local run: start,
probe, restart with backoff, give up) and runs the replica's cells with the same
``CellRun`` (exact-identity tree kill, transcript-freeze and stall watchdog, grading on
the node). It decides nothing about the run: every event it would journal is buffered,
and the supervisor drains the buffer (``poll``) and journals it, so the journal, status,
lock and notifications stay single and central.

Outliving the head: the actor and the attempts it runs are detached from the supervisor
that made them. A successor that holds the run's lock asks the actor who it is
(``hello``), re-attaches to each attempt it still runs or has finished (``attach_cell``:
the same attempt, its verdict and files kept until the head says it has them) and
replays the reports the dead head never acknowledged: each report carries a sequence
number, journaled with it, and a poll acknowledges what the head has journaled, so a
report is journaled once whichever head reads it.

Leases: the actor is created for one *incarnation* of its replica by one supervisor.
Every process it starts carries ``AUTOPILOT_RAY_LEASE=<session>-<replica>.<incarnation>``
beside the run's marker, so when a
node or actor is lost the supervisor can have exactly those processes killed on the
machine (``sweep_lease``), and a partitioned actor whose lease the supervisor revoked
(``poll(revoked=...)``) kills what it still runs instead of finishing it. An actor that
has not heard from any head for ``backend.lease_secs`` fences itself: it ends its cells,
its endpoint and its fork server, as ``stop`` does, and no successor re-attaches to it;
the head re-runs a lost node's cells elsewhere only after that time (``FENCE_CHECK_SECS``
and the kill grace included), unless a sweep on its machine ended them first.

Docker on a node: a Docker-mode endpoint and the cells' sandbox containers live on the
node's own daemon (the actor's ``DOCKER_HOST``), created, owned and removed there by the
same rules as on one machine (exact names, ``Owner``: a container of another run is never
removed); a lost lease's endpoint and sandboxes go with its sweep, and ``cleanup``
removes the run's containers from every live node's daemon.

Nothing here imports Ray: the supervisor side (autopilot.backends.ray.head) wraps these with
``ray.remote`` so that a run without the extra never needs it.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import socket
import subprocess
import sys
import time
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from autopilot.backends.base import Wiring, cell_context
from autopilot.backends.ray import shipping
from autopilot.cell.childenv import secret_values
from autopilot.cell.procs import LEASE_ENV, RUN_TOKEN_ENV, start_ticks
from autopilot.cell.runner import CellRun
from autopilot.cell.validity import Classification
from autopilot.config import Preset
from autopilot.endpoints import make_endpoint
from autopilot.endpoints.keeper import Keeper
from autopilot.logsetup import SPOOL_CAP, Redactor
from autopilot.plan import Cell, arm_groups
from autopilot.state.eventbase import EventBase, record_of
from autopilot.state.events import parse
from autopilot.state.runevents import MilestoneKind
from autopilot.state.statedir import check_trusted, ensure_private_dir


@dataclass(frozen=True)
class EventReport:
    """An event to journal, as its type (``extra``: fields given beside it)."""

    event: EventBase
    extra: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class MilestoneReport:
    """A milestone to journal and push: its kind and details."""

    kind: MilestoneKind
    info: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class GradeFailureReport:
    """A grading try that failed (for the harness-break streak)."""

    cell: str
    classification: Classification


Report = EventReport | MilestoneReport | GradeFailureReport
"""One thing a node reports, in the order it happened."""

Result = tuple[Classification | None, bytes | None]
"""An attempt's end on a node: its classification (None: abandoned) and, without shared
storage, its files packed for the head."""


@dataclass(frozen=True)
class PeerEndpoint:
    api_base: str  # scheme://host:port (the harness sends the path)


@dataclass(frozen=True)
class PeerReplica:
    """Another node's replica, as the head last saw it (``cell.context.Served``)."""

    ep: PeerEndpoint
    is_up: bool


@dataclass(frozen=True)
class Tick:
    """A running cell's latest watchdog tick."""

    frozen_secs: float
    tier: str
    last_signal: Any


@dataclass(frozen=True)
class Numbered:
    """A report and its number in the actor's life (1, 2, ...): the head journals the
    number with it and acknowledges up to it."""

    seq: int
    report: Report


@dataclass(frozen=True)
class Hello:
    """Who an actor is, for a successor deciding whether to re-attach to it."""

    run_token: str
    lease: str
    replica: int
    where: dict[str, Any]
    running: list[tuple[str, int]]  # attempts still running here
    finished: list[tuple[str, int]]  # attempts ended here whose verdict no head has taken
    keeper: dict[str, Any] | None  # its keeper's describe(), as a poll gives it
    endpoint_pid: int | None  # the endpoint process it keeps (the start-up sweep spares it)
    fenced: bool = False  # it ended everything (no head for lease_secs): not re-attached


@dataclass(frozen=True)
class Polled:
    """What a node's actor answers the head's poll."""

    reports: list[Numbered]
    ticks: dict[str, Tick]
    keeper: dict[str, Any] | None  # its keeper's describe(), with where it serves
    running: list[tuple[str, int]]


class NodePort:
    """The backend port on a node: everything is buffered until the head polls."""

    def __init__(self) -> None:
        self.reports: list[Numbered] = []  # not yet acknowledged by a head
        self.seq = 0
        self.ticks: dict[str, Tick] = {}
        self.stop = False  # the supervisor is stopping: abandon cells (SIGTERM/INT)
        self.force = False  # ... at once (a second signal)

    def emit(self, event: str | EventBase, **fields: Any) -> dict[str, Any]:
        kind, record = record_of(event, fields)
        if not isinstance(event, EventBase):  # an event by its name: typed here
            typed = parse({"event": kind, **record})
            if typed is None:
                raise TypeError(f"{kind} fits no event type: {sorted(record)}")
            event, fields = typed, {}
        self._add(EventReport(event, fields))
        return {"event": kind, **record}

    def _add(self, report: Report) -> None:
        self.seq += 1
        self.reports.append(Numbered(self.seq, report))

    def milestone(self, kind: MilestoneKind, **info: Any) -> None:
        self._add(MilestoneReport(kind, info))

    def tick(self, cid: str, frozen_secs: float, tier: str, last_signal: Any) -> None:
        self.ticks[cid] = Tick(frozen_secs, tier, last_signal)

    def grade_failure(self, cid: str, judged: Classification) -> None:
        self._add(GradeFailureReport(cid, judged))

    def throttled(self) -> None:
        return None  # the head's keeper mirror sees the node keeper's throttling

    def stopping(self) -> bool:
        return self.stop

    def handing_over(self) -> bool:
        # The node's own loop never hands over: its attempts run on in the actor, which
        # outlives a head that hands over (autopilot.backends.ray.reattach).
        return False

    def forced(self) -> bool:
        return self.force

    def drain(self, acked: int) -> tuple[list[Numbered], dict[str, Tick]]:
        """Every report after ``acked`` (the head journaled those up to it: they are
        dropped), kept until a later poll acknowledges them: a head killed between
        this answer and its journal leaves them to its successor."""
        self.reports = [note for note in self.reports if note.seq > acked]
        ticks, self.ticks = self.ticks, {}
        return list(self.reports), ticks


FENCE_CHECK_SECS = 1.0
"""At most this long between an actor's checks of its lease (less for a short lease)."""


def fence_check_secs(lease_secs: float) -> float:
    return min(FENCE_CHECK_SECS, lease_secs / 4)


def lease_of(session: str, replica: int, incarnation: int) -> str:
    """One supervisor session's ``incarnation``-th actor of ``replica``: never reused."""
    return f"{session}-{replica}.{incarnation}"


class NodeAgent:
    """One replica on one node (a named, detached Ray actor; see module doc)."""

    def __init__(self, preset: Preset, state_dir: str, replica: int, lease: str,
                 run_token: str, began: float | None = None) -> None:
        self.preset = preset
        self.began = began  # the run's first launch (sandboxes older are not its own)
        self.docker: Any = None  # this node's Docker client, when the preset needs one
        self.shared = preset.backend.shared_state_dir
        # Without shared storage: this node's private mirror of the state dir (its cells'
        # files are shipped back with each verdict, autopilot.backends.ray.shipping).
        self.state_dir = (Path(state_dir) if self.shared
                          else Path(preset.backend.node_dir) / run_token[:16])
        if not self.shared:
            ensure_private_dir(self.state_dir.parent)
            ensure_private_dir(self.state_dir)
            ensure_private_dir(self.state_dir / "logs")
            check_trusted(self.state_dir)  # as a state dir: a planted one is refused
        self.replica = replica
        self.lease = lease
        self.run_token = run_token
        # The node's own values of the preset's secret names: no secret travels through
        # Ray (actor arguments are kept by its control store).
        self.redactor = Redactor(secret_values(preset))
        self.port = NodePort()
        self.running: dict[tuple[str, int], asyncio.Task[Any]] = {}
        # Each attempt's result (verdict, shipped files) until a head has taken it: the
        # head that asked may have died meanwhile (``attach_cell``).
        self.results: dict[tuple[str, int], asyncio.Future[Result]] = {}
        self.keeper: Keeper | None = None
        self.origins: list[str] = []  # every replica's, as the head last said
        self._watch: asyncio.Task[Any] | None = None
        self.heard = time.monotonic()  # the last time a head spoke to it
        self.fenced = False
        self._fence: asyncio.Task[Any] | None = None
        # Every process this actor starts (endpoint, harness, grader) inherits the lease.
        os.environ[LEASE_ENV] = self.lease

    # ------------------------------------------------------------------ lifecycle

    async def start(self) -> dict[str, Any]:
        """Start this replica's endpoint and keeper; where it runs, for the journal."""
        preset = self.preset
        endpoint = make_endpoint(preset, self.state_dir, self.replica)
        endpoint.marker = self.run_token  # the head's run, wherever this node keeps its files
        endpoint.extra_env = {LEASE_ENV: self.lease}  # the lease guard's to end with the actor
        endpoint.arm_setting, endpoint.arm_group = arm_groups(preset)[0]
        self.keeper = Keeper(endpoint, self.port.emit, self.port.milestone)
        self._start_guard()
        self.heard = time.monotonic()
        self._fence = asyncio.ensure_future(self._fence_watch())
        await self.keeper.start()
        self._watch = asyncio.ensure_future(self.keeper.watch())
        wiring = Wiring(preset=preset, state_dir=self.state_dir, run_token=self.run_token,
                        port=self.port, redactor=self.redactor, clock=time.monotonic,
                        sandboxes=self._sandboxes())
        self.cx = replace(cell_context(wiring, self.keeper, replica=self.replica,
                                       extra_env={LEASE_ENV: self.lease}, forks=True,
                                       # its own: ends with the actor, and the nodes
                                       # may share the state dir
                                       forks_outlive=False,
                                       forks_name=f"forkserver-{self.lease}"),
                          peers=self.peers)
        return self.where()

    def _sandboxes(self) -> Any:
        """The cells' Docker side on this node's own daemon, when the preset has one."""
        harness = self.preset.harness
        if not (harness.sandbox_container or harness.scratch_remove_image):
            return None
        from autopilot.cell.sandbox import Docker, DockerSandboxes, Owner
        from autopilot.state.fsguard import run_roots

        self.docker = Docker()
        return DockerSandboxes(self.docker, self.preset, self.state_dir,
                               Owner(run_roots(self.preset, self.state_dir), self.began))

    async def _fence_watch(self) -> None:
        """End everything once no head has spoken for ``lease_secs``: a head that lost
        this node re-runs its cells elsewhere after that long."""
        lease = self.preset.backend.lease_secs
        while not self.fenced:
            await asyncio.sleep(fence_check_secs(lease))
            if time.monotonic() - self.heard > lease:
                self.fenced = True
                await self.stop()

    def peers(self) -> list[Any]:
        """Every replica, by number, as this node's gateways see it: its own keeper, and
        the others where the head last saw them answer."""
        return [self.keeper if i == self.replica
                else PeerReplica(PeerEndpoint(origin), bool(origin))
                for i, origin in enumerate(self.origins or [""] * (self.replica + 1))]

    def _start_guard(self) -> None:
        """The lease guard (autopilot.backends.ray.leaseguard): kills this lease's processes on this
        machine if this actor dies before it could (a worker crash, a raylet gone)."""
        env = {k: v for k, v in os.environ.items() if k not in (LEASE_ENV, RUN_TOKEN_ENV)}
        own_pid = os.getpid()
        self.guard = subprocess.Popen(
            [sys.executable, "-m", "autopilot.backends.ray.leaseguard", "--pid", str(own_pid),
             "--ticks", str(start_ticks(own_pid)), "--token", self.run_token, "--lease", self.lease,
             "--grace", str(self.preset.watchdog.kill_grace_secs)],
            env=env, start_new_session=True, stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)

    def where(self) -> dict[str, Any]:
        import ray  # present wherever this runs as an actor

        ctx = ray.get_runtime_context()
        return {"node": ctx.get_node_id(), "host": socket.gethostname(),
                "ip": ray.util.get_node_ip_address(),  # type: ignore[no-untyped-call]
                "actor_pid": os.getpid(),
                # the daemon its containers live on: a sweep from another node of this
                # machine removes them there
                "docker_host": os.environ.get("DOCKER_HOST"),
                "lease": self.lease,
                "devices": os.environ.get("CUDA_VISIBLE_DEVICES")}

    async def poll(self, revoked: list[list[Any]] | None = None, stopping: bool = False,
                   forced: bool = False, origins: list[str] | None = None, acked: int = 0,
                   taken: list[list[Any]] | None = None) -> Polled:
        """Drain the buffered events after ``acked``; kill the attempts whose lease the
        supervisor revoked (it re-queued them while this actor was unreachable); learn
        that the supervisor is stopping (its cells are then abandoned, as locally), and
        where every replica answers (``origins``: a request fails over to another
        node's replica before its response begins). ``taken``: attempts whose result
        the head has journaled (forgotten here)."""
        self.heard = time.monotonic()
        if origins is not None:
            self.origins = [str(origin) for origin in origins]
        for cid, attempt in taken or ():
            self.results.pop((str(cid), int(attempt)), None)
        self.port.stop = self.port.stop or stopping
        self.port.force = self.port.force or forced
        for cid, attempt in revoked or ():
            task = self.running.get((cid, attempt))
            if task is not None:
                task.cancel()  # CellRun kills the harness tree on cancellation
        reports, ticks = self.port.drain(acked)
        return Polled(reports, ticks, self._keeper_view(), list(self.running))

    def _keeper_view(self) -> dict[str, Any] | None:
        k = self.keeper
        return None if k is None else {
            **k.describe(), "port": k.ep.port, "host": k.ep.host, "api_base": k.ep.api_base}

    def hello(self) -> Hello:
        """Who this actor is and what it holds: a successor re-attaches to it (or not)."""
        self.heard = time.monotonic()
        view = self._keeper_view()
        pid = (view or {}).get("pid")
        return Hello(self.run_token, self.lease, self.replica, self.where(),
                     list(self.running),
                     [key for key, fut in self.results.items() if fut.done()],
                     view, pid if type(pid) is int else None, self.fenced)

    async def attach_cell(self, cid: str, attempt: int) -> tuple[bool, Result | None]:
        """A successor's wait for an attempt its predecessor started here: (True, its
        result) once it ends, or (False, None) when this actor holds no such attempt."""
        fut = self.results.get((cid, attempt))
        if fut is None:
            return False, None
        return True, await asyncio.shield(fut)

    async def run_cell(self, cell: Cell, attempt: int
                       ) -> tuple[Classification | None, bytes | None]:
        """Run and grade one attempt here; its classification, and (without shared
        storage) its output dir and logs packed for the head."""
        assert self.keeper is not None, "run_cell before start"
        key = (cell.id, attempt)
        fut: asyncio.Future[Result] = asyncio.get_running_loop().create_future()
        self.results[key] = fut
        try:
            got = await self._run(cell, attempt)
        except BaseException as e:
            if not fut.done():  # a successor waiting on it hears the same
                fut.set_exception(e if isinstance(e, Exception) else RuntimeError(repr(e)))
                fut.exception()  # retrieved: no "never retrieved" warning if none waits
            raise
        fut.set_result(got)
        return got

    async def _run(self, cell: Cell, attempt: int) -> Result:
        key = (cell.id, attempt)
        run = CellRun(self.cx, cell, attempt)
        task = asyncio.ensure_future(run.run())
        self.running[key] = task
        try:
            judged = await task
        finally:
            self.running.pop(key, None)
        if self.shared or judged is None:
            return judged, None
        files = shipping.cell_files(self.state_dir, cell.id, run.output_dir)
        return judged, await asyncio.to_thread(shipping.pack, self.state_dir, files)

    async def stop(self) -> list[str]:
        """Kill every cell this actor runs and stop its endpoint (a supervisor ending,
        or a successor reaping a predecessor's actor). What was running, by cell."""
        self.port.stop = self.port.force = True
        tasks = list(self.running.items())
        for _, task in tasks:
            task.cancel()
        for _, task in tasks:
            with contextlib.suppress(BaseException):  # cancelled or failed: gone
                await task
        self.results.clear()
        if self._watch is not None:
            self._watch.cancel()
        if self._fence is not None and not self.fenced:
            self._fence.cancel()
        if self.keeper is not None:
            await self.keeper.ep.stop()
            await self.keeper.ep.aclose()
            self.redactor.scrub_file(self.keeper.ep.log_path, cap=SPOOL_CAP)
        context = getattr(self, "cx", None)
        if context is not None:  # this node's fork server of data paths
            await context.launch.aclose()
        if self.docker is not None:
            await self.docker.close()
            self.docker = None
        return [f"{cid}#{attempt}" for (cid, attempt), _ in tasks]


def sweep_lease(run_token: str, lease: str, grace: float,
                containers: Containers | None = None) -> list[int]:
    """Kill, on the machine this runs on, every process of the run (its marker) that
    carries ``lease``: what a lost actor left behind. A Ray task placed on a live node of
    the lost node's machine (or the lease guard); exact identity, both markers. Then its
    containers on this machine's daemon (``containers``), by exact name and only ours."""
    from autopilot.cell.sweep import orphan_marked

    pids = [pid for found in orphan_marked(run_token, grace, lease=lease)
            for pid in found.pids]
    if containers is not None:
        asyncio.run(containers.remove())
    return pids


@dataclass(frozen=True)
class Containers:
    """A run's containers on one node's daemon, to remove by exact name: endpoint
    containers labelled with its state dir there, and sandboxes ``Owner`` says are its."""

    state_dir: str
    endpoints: tuple[str, ...] = ()
    sandboxes: tuple[str, ...] = ()
    roots: tuple[str, ...] = ()
    since: float | None = None
    docker_host: str | None = None  # the lost actor's daemon (its DOCKER_HOST), if it said

    async def remove(self) -> list[str]:
        from autopilot.cell.sandbox import Docker, Owner

        docker = Docker(self.docker_host)
        try:
            gone = [endpoint for endpoint in self.endpoints
                    if await docker.remove_endpoint(endpoint, self.state_dir)]
            return gone + await docker.remove_exact(
                self.sandboxes, Owner(tuple(Path(root) for root in self.roots), self.since))
        finally:
            await docker.close()


def sweep_run(run_token: str, grace: float, endpoint: bool,
              containers: Containers | None = None) -> list[dict[str, Any]]:
    """``autopilot cleanup`` on one node: kill whatever still carries the run's marker
    there (the lock is free, so nothing of it can be live), then remove the run's
    containers from its daemon. A Ray task per node."""
    from autopilot.cell.sweep import orphan_marked

    found: list[dict[str, Any]] = [{"cell": k.cell, "pids": k.pids}
                                   for k in orphan_marked(run_token, grace, endpoint=endpoint)]
    if containers is not None:
        found += [{"container": name} for name in asyncio.run(containers.remove())]
    return found


__all__ = ["LEASE_ENV", "Containers", "Hello", "NodeAgent", "Numbered", "Result", "lease_of",
           "sweep_lease", "sweep_run"]
