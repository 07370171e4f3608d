"""The Ray backend, supervisor side: where cells run when ``backend.kind = "ray"``.

The supervisor stays the one event loop that decides (ledger, passes, retries, which
replica gets a cell); this module only carries those decisions to the nodes and their
reports back. Each endpoint replica is a named, detached ``NodeAgent`` actor
(autopilot.backends.ray.node) in one bundle of a placement group (spread or pack). A
``RemoteKeeper`` mirrors that actor's keeper for the supervisor (up, down, failed,
restarts), draining the actor's buffered events into the journal as it polls.

Failure semantics:
- An actor or its node lost: every cell it was running is INVALID(node_lost), never
  FAIL, and goes back to the queue like any INVALID cell; the lease's processes are
  killed on that machine where a live node can reach it (``sweep_lease``); a new actor
  (the next incarnation, a new lease) is created in the bundle once Ray can place it.
- A result is accepted only from the lease that was asked for it; a late one is ignored.
- A supervisor SIGKILLed leaves its detached actors and placement group behind: the next
  one (the lock held) stops them first, so nothing a predecessor started runs on beside
  the re-queued cells, then creates its own.

Imported only when a preset asks for Ray (``pip install 'bench-autopilot[ray]'``).
"""

from __future__ import annotations

import time
import uuid
from pathlib import Path
from typing import TYPE_CHECKING, Any

import anyio

from autopilot.backends.base import Backend, Wiring, replica_lines
from autopilot.backends.ray.cluster import (
    STRATEGY,
    actor_name,
    actor_options,
    bundle_of,
    cleanup_cluster,
    connect,
    import_ray,
    placement_lines,
    short_error,
)
from autopilot.backends.ray.node import (
    GradeFailureReport,
    MilestoneReport,
    NodeAgent,
    Polled,
    lease_of,
    sweep_lease,
)
from autopilot.backends.ray.shipping import unpack
from autopilot.cell.context import move_aside
from autopilot.cell.validity import Classification
from autopilot.endpoints.keeper import KeeperBase
from autopilot.errors import EndpointError, EndpointFailed
from autopilot.logsetup import get_logger
from autopilot.plan import cell_context
from autopilot.state.cellevents import CellFilesReceived, UnsafePathRefused
from autopilot.state.fsguard import UnsafePath, run_roots
from autopilot.state.runevents import (
    LeaseSweepFailed,
    LeaseSweepUnreachable,
    LeaseSwept,
    RayActorReaped,
    RayReplicaStarted,
)

if TYPE_CHECKING:
    from autopilot.config import ArmEndpoint, Preset
    from autopilot.plan import Cell

log = get_logger(__name__)

class RemoteEndpoint:
    """What the supervisor touches of a replica's endpoint when it runs on a node."""

    attached = False

    def __init__(self, executor: RayBackend, replica: int, log_path: Path,
                 arm_group: tuple[str, ...]) -> None:
        self.executor = executor
        self.replica = replica
        self.log_path = log_path
        self.arm_group = arm_group

    # Where the node's endpoint answers (as its actor last reported): for templates of
    # work done here, e.g. grading centrally what a predecessor's cell left finished.
    @property
    def port(self) -> int:
        return int(self.executor.remote[self.replica].seen.get("port") or 0)

    @property
    def host(self) -> str:
        return str(self.executor.remote[self.replica].seen.get("host") or "127.0.0.1")

    @property
    def api_base(self) -> str:
        return str(self.executor.remote[self.replica].seen.get("api_base") or "")

    @property
    def served_model(self) -> str:
        return str(self.executor.remote[self.replica].seen.get("model") or "")

    async def stop(self) -> None:
        await self.executor.stop_replica(self.replica)

    async def aclose(self) -> None:
        return None

    def describe(self) -> dict[str, Any]:
        return {"engine": self.executor.w.preset.endpoint.engine, "replica": self.replica}


def peer_origin(api_base: str, up: bool, its_ip: str | None, here: str | None) -> str:
    """A replica's endpoint (``scheme://host:port``) as another node reaches it, or ""
    where it cannot: the replica is not up, or it listens on a loopback address of
    another machine."""
    import ipaddress
    from urllib.parse import urlsplit

    u = urlsplit(api_base)
    if not up or not u.netloc:
        return ""
    try:
        loopback = u.hostname == "localhost" or ipaddress.ip_address(u.hostname or "").is_loopback
    except ValueError:
        loopback = False  # a name: the node resolves it
    return f"{u.scheme}://{u.netloc}" if not loopback or its_ip == here else ""


class RemoteKeeper(KeeperBase):
    """The supervisor's view of a keeper that runs in a node's actor."""

    def __init__(self, executor: RayBackend, replica: int, endpoint: RemoteEndpoint) -> None:
        super().__init__()
        self.x = executor
        self.i = replica
        self.ep = endpoint
        self.lost_since: float | None = None
        self.seen: dict[str, Any] = {}  # the actor's keeper, as last polled
        self.where: dict[str, Any] = {}  # node, host, ip, devices of the live actor
        self.incarnation = 0
        self.restarts: list[float] = []  # recreations after a loss, on the monotonic clock

    def describe(self) -> dict[str, Any]:
        return {**self.seen, **self.ep.describe(), "state": self.state,
                "failed": self.failed,
                "restarts": len(self.restarts) + int(self.seen.get("restarts", 0)),
                "node": self.where.get("node", "")[:12], "host": self.where.get("host"),
                "ip": self.where.get("ip"), "devices": self.where.get("devices"),
                "lease": self.where.get("lease"), "backend": "ray"}

    async def start(self) -> None:
        await self.x.start_replica(self.i)

    async def wait_up(self) -> None:
        while not self.is_up:
            if self.failed:
                raise EndpointFailed(self.failed)
            await anyio.sleep(self.x.poll_secs)

    async def watch(self) -> None:
        await self.x.watch(self.i)


class RayBackend(Backend):
    """Runs each replica's cells in its node actor; see the module doc."""

    kind = "ray"

    @classmethod
    def dry_run_lines(cls, preset: Preset) -> list[str]:
        b = preset.backend
        return (placement_lines(b.resources, preset.endpoint.replicas, b.placement, b.address)
                + replica_lines(preset, "its Ray node"))

    @classmethod
    def cleanup(cls, preset: Preset, token: str, grace: float, endpoint: bool) -> list[str]:
        return cleanup_cluster(preset, token, grace, endpoint)

    # The endpoint starts on the nodes (each actor reports its own failure); here, only
    # that this machine can drive a cluster at all.
    endpoint_here = False

    @classmethod
    def preflight(cls, preset: Preset) -> list[str]:
        import importlib.util

        if importlib.util.find_spec("ray") is None:
            return ["backend.kind = 'ray' needs Ray here and on every node: "
                    "pip install 'bench-autopilot[ray]'"]
        return []

    @classmethod
    def load_problems(cls, preset: Preset) -> list[tuple[str, str]]:
        """Without shared storage, every output a node writes must be one it can ship."""
        if preset.backend.shared_state_dir:
            return []
        from autopilot.backends.ray.shipping import outside_problems

        return outside_problems(preset)

    def __init__(self, w: Wiring, setting: ArmEndpoint, group: tuple[str, ...]) -> None:
        # Ray serves one arm group (refused otherwise at load): its first, on every node.
        super().__init__(w, setting, group)
        self.cfg = w.preset.backend
        self.poll_secs = self.cfg.poll_secs
        self.ray = import_ray()
        self.n = w.preset.endpoint.replicas
        res = self.cfg.resources
        self.bundles = [bundle_of(res[i] if len(res) > 1 else (res[0] if res else {}))
                        for i in range(self.n)]
        from autopilot.plan import arm_groups

        group = arm_groups(w.preset)[0][1]
        self.remote = [RemoteKeeper(self, i, RemoteEndpoint(
            self, i, w.state_dir / (f"endpoint-{i}.log" if self.n > 1 else "endpoint.log"),
            group)) for i in range(self.n)]
        self.keepers = self.remote
        self.actors: list[Any] = [None] * self.n
        self.pg: Any = None
        self._ready = anyio.Lock()
        self._connected = False
        self._drain_locks = [anyio.Lock() for _ in range(self.n)]
        # Attempts sent to each replica's current lease and not answered yet.
        self.inflight: list[set[tuple[str, int]]] = [set() for _ in range(self.n)]
        self.revoked: list[list[tuple[str, int]]] = [[] for _ in range(self.n)]
        self._swept: dict[str, anyio.Event] = {}  # lease -> its sweep is done
        self.session = uuid.uuid4().hex[:8]  # this supervisor's leases are its own

    # ------------------------------------------------------------------ names

    def _name(self, what: str) -> str:
        return actor_name(self.w.run_token, what)

    def _lease(self, i: int) -> str:
        return lease_of(self.session, i, self.remote[i].incarnation)

    # ------------------------------------------------------------------ start-up

    async def ready(self) -> None:
        """Connect, stop what a dead predecessor left, place the bundles (once)."""
        async with self._ready:
            if self._connected:
                return
            await anyio.to_thread.run_sync(connect, self.cfg)
            await self._reap_predecessors()
            await anyio.to_thread.run_sync(self._place)
            self._connected = True

    async def _reap_predecessors(self) -> None:
        ray = self.ray
        for i in range(self.n):
            try:
                old = ray.get_actor(self._name(f"r{i}"), namespace=self.cfg.namespace)
            except ValueError:
                continue
            stopped: list[str] = []
            try:
                with anyio.fail_after(60):
                    stopped = await old.stop.remote()
            except Exception as e:  # dead or hung: killed below either way
                log.warning("ray_predecessor_stop_failed", replica=i, error=str(e))
            ray.kill(old, no_restart=True)
            self.w.port.emit(RayActorReaped(replica=i, killed_cells=stopped,
                          why="left by a supervisor that did not stop it"))
        try:
            pg = ray.util.get_placement_group(self._name("pg"))
        except ValueError:
            return
        ray.util.remove_placement_group(pg)

    def _place(self) -> None:
        ray = self.ray
        self.pg = ray.util.placement_group(
            self.bundles, strategy=STRATEGY[self.cfg.placement], name=self._name("pg"),
            lifetime="detached")
        try:
            ray.get(self.pg.ready(), timeout=self.cfg.start_timeout_secs)
        except ray.exceptions.GetTimeoutError:
            ray.util.remove_placement_group(self.pg)
            raise EndpointError(
                f"Ray could not place {self.n} replica bundle(s) {self.bundles} "
                f"({STRATEGY[self.cfg.placement]}) within {self.cfg.start_timeout_secs:g}s: "
                f"the cluster has {ray.cluster_resources()}") from None

    def _new_actor(self, i: int) -> Any:
        from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

        k = self.remote[i]
        k.incarnation += 1
        cls = self.ray.remote(NodeAgent)
        return cls.options(
            name=self._name(f"r{i}"), namespace=self.cfg.namespace, lifetime="detached",
            max_restarts=0, max_task_retries=0, max_concurrency=10_000,
            scheduling_strategy=PlacementGroupSchedulingStrategy(
                placement_group=self.pg, placement_group_bundle_index=i),
            **actor_options(self.bundles[i]),
        ).remote(self.w.preset, str(self.w.state_dir), i, self._lease(i),
                 self.w.run_token)

    async def start_replica(self, i: int) -> None:
        await self.ready()
        k = self.remote[i]
        actor = self._new_actor(i)
        self.actors[i] = actor
        try:
            with anyio.fail_after(self.cfg.start_timeout_secs
                                  + self.w.preset.endpoint.startup_timeout_secs):
                k.where = await actor.start.remote()
        except TimeoutError:
            self.ray.kill(actor, no_restart=True)
            raise EndpointError(f"replica {i}: its actor did not start in time") from None
        except self.ray.exceptions.RayError as e:
            await self._drain(i)  # the keeper's own account of why
            self.ray.kill(actor, no_restart=True)
            raise EndpointError(f"replica {i}: {short_error(e)}") from None
        k.state = "up"
        k.lost_since = None
        self.w.port.emit(RayReplicaStarted(replica=i,
                      **{**k.where, "node": k.where["node"][:12]}))
        await self._drain(i)

    # ------------------------------------------------------------------ the loop

    async def _drain(self, i: int) -> bool:
        """Journal what replica ``i``'s actor buffered; False when it is unreachable."""
        actor, inc = self.actors[i], self.remote[i].incarnation
        if actor is None:
            return False
        async with self._drain_locks[i]:
            revoked, self.revoked[i] = self.revoked[i], []
            try:
                got = await actor.poll.remote([list(r) for r in revoked],
                                              self.w.port.stopping(), self.w.port.forced(),
                                              self.origins(i))
            except self.ray.exceptions.RayActorError as e:
                self.revoked[i] = revoked + self.revoked[i]
                self._lost(i, inc, short_error(e))
                return False
            self._apply(i, got)
            return True

    def origins(self, asking: int) -> list[str]:
        """Where each replica's endpoint answers as replica ``asking``'s node reaches it:
        what that node's gateways may fail over to before a response begins."""
        here = self.remote[asking].where.get("ip")
        return [peer_origin(str(k.seen.get("api_base") or ""), k.is_up, k.where.get("ip"),
                            here) for k in self.remote]

    def _apply(self, i: int, got: Polled) -> None:
        port, k = self.w.port, self.remote[i]
        tag = {"replica": i, "node": k.where.get("node", "")[:12]}
        for r in got.reports:
            if isinstance(r, MilestoneReport):
                port.milestone(r.kind, **{**r.info, **tag})
            elif isinstance(r, GradeFailureReport):
                port.grade_failure(r.cell, r.classification)
            else:
                port.emit(r.event, **{**r.extra, **tag})
        for cid, t in got.ticks.items():
            port.tick(cid, t.frozen_secs, t.tier, t.last_signal)
        seen = got.keeper
        if seen is not None:
            k.seen = {key: seen[key] for key in ("port", "host", "api_base", "url", "engine",
                                                 "model", "down_secs", "down_since",
                                                 "restarts") if key in seen}
            if seen.get("failed"):
                k.failed = f"replica {i}: {seen['failed']}"
                k.state = "failed"
            elif k.state != "lost":
                k.state = seen.get("state", k.state)

    def _lost(self, i: int, incarnation: int, why: str) -> None:
        """Replica ``i``'s actor ``incarnation`` is gone. An error that arrives late, from
        an incarnation already replaced, says nothing about the one running now."""
        k = self.remote[i]
        if k.incarnation != incarnation or k.state in ("lost", "failed", "stopped"):
            return
        k.state = "lost"
        k.lost_since = time.monotonic()
        self.w.port.milestone("node_lost", replica=i, node=k.where.get("node", "")[:12],
                           host=k.where.get("host"), why=why,
                           running=sorted(f"{c}#{a}" for c, a in self.inflight[i]))

    async def watch(self, i: int) -> None:
        """Poll replica ``i`` for ever: journal its events, notice a lost actor, recreate
        it (a new lease) once Ray can place it, give up after the backend's timeout."""
        k = self.remote[i]
        while k.state not in ("failed", "stopped"):
            await anyio.sleep(self.poll_secs)
            if k.state == "lost":
                await self._recover(i)
            else:
                await self._drain(i)

    async def _recover(self, i: int) -> None:
        k = self.remote[i]
        lease = self._lease(i)
        await self._sweep(i, lease, k.where.get("ip"))
        old, self.actors[i] = self.actors[i], None
        if old is not None:  # merely unreachable, perhaps: it must not come back as i
            self.ray.kill(old, no_restart=True)
        assert k.lost_since is not None
        limit = self.cfg.start_timeout_secs + self.w.preset.endpoint.startup_timeout_secs
        try:
            with anyio.fail_after(max(1.0, limit - (time.monotonic() - k.lost_since))):
                await self.start_replica(i)
        except (EndpointError, TimeoutError) as e:
            k.failed = f"replica {i}: lost and not recreated: {e or 'no room in the cluster'}"
            k.state = "failed"
            self.w.port.milestone("endpoint_failed", replica=i, why=k.failed)
            return
        k.restarts.append(time.monotonic())
        self.w.port.milestone("endpoint_restart", replica=i, why="replica recreated after "
                           "its node was lost", node=k.where.get("node", "")[:12])

    async def _sweep(self, i: int, lease: str, ip: str | None) -> None:
        """Kill the lost lease's processes on its machine, from a live node there: once
        per lease, and every caller waits for it (a cell re-queued before its harness is
        dead could meet it writing into the same output dir)."""
        done = self._swept.get(lease)
        if done is not None:
            await done.wait()
            return
        self._swept[lease] = done = anyio.Event()
        try:
            await self._sweep_once(i, lease, ip)
        finally:
            done.set()

    async def _sweep_once(self, i: int, lease: str, ip: str | None) -> None:
        ray = self.ray
        nodes = [n for n in await anyio.to_thread.run_sync(ray.nodes)
                 if n.get("Alive") and n.get("NodeManagerAddress") == ip]
        if not nodes:
            self.w.port.emit(LeaseSweepUnreachable(replica=i, lease=lease, ip=ip,
                          why="no live node on that machine: its processes end with it"))
            return
        from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

        task = ray.remote(sweep_lease).options(
            num_cpus=0, max_retries=0,
            scheduling_strategy=NodeAffinitySchedulingStrategy(nodes[0]["NodeID"], soft=False))
        try:
            with anyio.fail_after(60):
                pids = await task.remote(self.w.run_token, lease,
                                         self.w.preset.watchdog.kill_grace_secs)
        except Exception as e:  # a sweep that failed is said, not fatal
            self.w.port.emit(LeaseSweepFailed(replica=i, lease=lease, error=short_error(e)))
            return
        self.w.port.emit(LeaseSwept(replica=i, lease=lease, pids=pids))

    # ------------------------------------------------------------------ cells

    async def run(self, cell: Cell, attempt: int, replica: int) -> Classification | None:
        """Run one attempt on the replica's actor; its verdict, INVALID(node_lost) when
        the actor or node went away, or None when it was abandoned (stopping)."""
        i, k = replica, self.remote[replica]
        actor, key = self.actors[i], (cell.id, attempt)
        if actor is None:  # lost between being picked and now
            return Classification("INVALID", reason="node_lost", launched=time.time(),
                                  detail=f"replica {i} lost before the cell could start")
        # The lease this attempt runs under: by the time an error arrives, the replica
        # may already be recreated under a new one, which must be left alone.
        inc, lease, where = k.incarnation, self._lease(i), dict(k.where)
        self.inflight[i].add(key)
        try:
            got: tuple[Classification | None, bytes | None] = await actor.run_cell.remote(
                cell, attempt)
        except self.ray.exceptions.RayActorError as e:
            self._lost(i, inc, short_error(e))
            self.revoked[i].append(key)  # if the actor was only unreachable, it kills it
            await self._sweep(i, lease, where.get("ip"))
            return Classification(
                "INVALID", reason="node_lost", launched=time.time(),
                detail=f"replica {i} on {where.get('host')} "
                       f"(node {where.get('node', '')[:12]}) lost: {short_error(e)}")
        finally:
            self.inflight[i].discard(key)
        c, files = got
        if files is not None:  # no shared storage: its files come back before its verdict
            await self._receive(cell, attempt, files)
        await self._drain(i)  # its events (started, exited, graded) before its verdict
        return c

    async def _receive(self, cell: Cell, attempt: int, files: bytes) -> None:
        """Unpack an attempt's shipped files into the state dir, the previous attempt's
        output moved aside first (as a local attempt does at its start)."""
        w = self.w
        ctx = cell_context(w.preset, cell, attempt, w.state_dir)
        out = Path(ctx["output_dir"])
        roots = run_roots(w.preset, w.state_dir)
        try:
            await anyio.to_thread.run_sync(move_aside, out, w.state_dir, cell.id,
                                           attempt - 1, roots)
        except UnsafePath as e:
            w.port.emit(UnsafePathRefused(cell=cell.id, path=str(out), why=str(e)))
        written, skipped = await anyio.to_thread.run_sync(unpack, files, w.state_dir)
        w.port.emit(CellFilesReceived(cell=cell.id, attempt=attempt, files=written,
                 bytes=len(files), skipped=skipped[:20]))

    async def stop_replica(self, i: int) -> None:
        k, actor = self.remote[i], self.actors[i]
        if actor is not None and k.state in ("lost", "failed"):
            # Not started (waiting for room in the cluster), or its lease swept already.
            self.ray.kill(actor, no_restart=True)
            self.actors[i] = None
        elif actor is not None:
            try:
                with anyio.fail_after(60):
                    await actor.stop.remote()
                await self._drain(i)
            except Exception as e:  # lost already: nothing to stop there
                log.warning("ray_replica_stop_failed", replica=i, error=short_error(e))
            self.ray.kill(actor, no_restart=True)
            self.actors[i] = None
        if k.state not in ("failed", "lost"):
            k.state = "stopped"

    async def release(self) -> None:
        """After every replica stopped: free the placement group, leave the cluster."""
        if self.pg is not None:
            self.ray.util.remove_placement_group(self.pg)
            self.pg = None
        await anyio.to_thread.run_sync(self.ray.shutdown)
