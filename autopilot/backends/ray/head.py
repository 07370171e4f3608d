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
- A supervisor SIGKILLed (or handing over) leaves its detached actors and placement
  group running: the next one (the lock held) asks each actor who it is (``survey``) and
  re-attaches to every one that proves to be this run's replica: its endpoint serves on
  (no model load again), each attempt it runs or finished is watched to its end as the
  same attempt, and the reports the dead head never journaled are journaled once (each
  carries its number; a poll acknowledges what is journaled). Only an actor that cannot
  prove it, or does not answer, is stopped (``ray_actor_reaped``), so nothing a
  predecessor started runs on beside the re-queued cells.

Imported only when a preset asks for Ray (``pip install 'bench-autopilot[ray]'``).
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Awaitable
from pathlib import Path
from typing import TYPE_CHECKING, Any

import anyio

from autopilot.backends.base import Backend, Port, Ran, Survivors, Wiring, replica_lines
from autopilot.backends.ray.cluster import (
    STRATEGY,
    actor_name,
    actor_options,
    bundle_of,
    cleanup_cluster,
    connect,
    endpoint_containers,
    import_ray,
    node_containers,
    placement_lines,
    short_error,
)
from autopilot.backends.ray.mirror import RemoteEndpoint, RemoteKeeper, peer_origin
from autopilot.backends.ray.node import (
    Containers,
    NodeAgent,
    Polled,
    Result,
    fence_check_secs,
    lease_of,
    sweep_lease,
)
from autopilot.backends.ray.reattach import RayAttempt, Survivor, apply_polled, survey
from autopilot.backends.ray.shipping import unpack
from autopilot.cell.context import move_aside
from autopilot.cell.validity import Classification
from autopilot.errors import EndpointError
from autopilot.logsetup import get_logger
from autopilot.plan import cell_context
from autopilot.state.cellevents import CellAbandoned, CellFilesReceived, UnsafePathRefused
from autopilot.state.fsguard import UnsafePath, run_roots
from autopilot.state.runevents import (
    LeaseFenced,
    LeaseSweepFailed,
    LeaseSweepUnreachable,
    LeaseSwept,
    RayActorReaped,
    RayActorReattached,
    RayReplicaStarted,
)
from autopilot.templates import render

if TYPE_CHECKING:
    from autopilot.config import ArmEndpoint, Preset
    from autopilot.plan import Cell
    from autopilot.state.ledger import Ledger

log = get_logger(__name__)


class RayBackend(Backend):
    """Runs each replica's cells in its node actor; see the module doc."""

    kind = "ray"

    @classmethod
    def dry_run_lines(cls, preset: Preset) -> list[str]:
        backend = preset.backend
        return (placement_lines(backend.resources, preset.endpoint.replicas, backend.placement,
                                backend.address)
                + replica_lines(preset, "its Ray node"))

    @classmethod
    def cleanup(cls, preset: Preset, token: str, grace: float, endpoint: bool,
                state_dir: Path | None = None, sandboxes: tuple[str, ...] = (),
                since: float | None = None) -> list[str]:
        return cleanup_cluster(preset, token, grace, endpoint, state_dir, sandboxes, since)

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

    @classmethod
    async def survey(cls, preset: Preset, run_token: str, state_dir: Path,
                     port: Port, ledger: Ledger) -> Survivors:
        """What a predecessor left on the nodes that proves this run's
        (autopilot.backends.ray.reattach.survey)."""
        return await survey(preset, run_token, state_dir, port, ledger)

    def __init__(self, wiring: Wiring, setting: ArmEndpoint, group: tuple[str, ...]) -> None:
        # Ray serves one arm group (refused otherwise at load): its first, on every node.
        super().__init__(wiring, setting, group)
        self.cfg = wiring.preset.backend
        self.poll_secs = self.cfg.poll_secs
        self.ray = import_ray()
        self.n = wiring.preset.endpoint.replicas
        res = self.cfg.resources
        self.bundles = [bundle_of(res[i] if len(res) > 1 else (res[0] if res else {}))
                        for i in range(self.n)]
        from autopilot.plan import arm_groups

        group = arm_groups(wiring.preset)[0][1]
        self.remote = [RemoteKeeper(self, i, RemoteEndpoint(
            self, i, wiring.state_dir / (f"endpoint-{i}.log" if self.n > 1 else "endpoint.log"),
            group)) for i in range(self.n)]
        self.keepers = self.remote
        self.actors: list[Any] = [None] * self.n
        self.pg: Any = None
        self._ready = anyio.Lock()
        self._connected = False
        self._drain_locks = [anyio.Lock() for _ in range(self.n)]
        # Attempts sent to each replica's current lease and not answered yet.
        self.inflight: list[set[tuple[str, int]]] = [set() for _ in range(self.n)]
        self.cells: dict[str, Cell] = {}  # by id, each cell sent to a node
        self.revoked: list[list[tuple[str, int]]] = [[] for _ in range(self.n)]
        # Attempts whose result the loop has journaled: the actor may forget them.
        self.taken: list[list[tuple[str, int]]] = [[] for _ in range(self.n)]
        # What a predecessor left that proved this run's (survey): re-attached at start.
        self.survivors: dict[int, Survivor] = dict(wiring.survivors or {})
        self._swept: dict[str, anyio.Event] = {}  # lease -> it is fenced (swept or expired)
        # lease -> when the head last heard its actor (monotonic): the actor fences itself
        # lease_secs after it last heard a head, which is no later than this
        self.heard: dict[str, float] = {}
        self.session = uuid.uuid4().hex[:8]  # this supervisor's leases are its own
        from autopilot.state.journal import began

        # the run's first launch: a node's sandboxes older than it are not the run's
        self.began = began(wiring.state_dir / "journal.jsonl")

    # ------------------------------------------------------------------ names

    def _name(self, what: str) -> str:
        return actor_name(self.w.run_token, what)

    def _lease(self, i: int) -> str:
        return self.remote[i].lease

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
        """Stop every actor of this run but the survivors (``survey``); free the old
        placement group unless a survivor lives in it (removing it would kill them)."""
        ray = self.ray
        for i in range(self.n):
            if i in self.survivors:
                continue
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
            group = ray.util.get_placement_group(self._name("pg"))
        except ValueError:
            return
        if self.survivors:
            self.pg = group  # theirs: the replicas recreated beside them go in it too
        else:
            ray.util.remove_placement_group(group)

    def _place(self) -> None:
        ray = self.ray
        if self.pg is not None:
            return
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
        k.lease, k.acked = lease_of(self.session, i, k.incarnation), 0
        cls = self.ray.remote(NodeAgent)
        return cls.options(
            name=self._name(f"r{i}"), namespace=self.cfg.namespace, lifetime="detached",
            max_restarts=0, max_task_retries=0, max_concurrency=10_000,
            scheduling_strategy=PlacementGroupSchedulingStrategy(
                placement_group=self.pg, placement_group_bundle_index=i),
            **actor_options(self.bundles[i]),
        ).remote(self.w.preset, str(self.w.state_dir), i, self._lease(i),
                 self.w.run_token, self.began)

    async def start_replica(self, i: int) -> None:
        await self.ready()
        k = self.remote[i]
        survivor = self.survivors.pop(i, None)
        if survivor is not None:
            return await self._reattach(i, survivor)
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
        self.heard[k.lease] = time.monotonic()
        self.w.port.emit(RayReplicaStarted(replica=i,
                      **{**k.where, "node": k.where["node"][:12]}))
        await self._drain(i)

    async def _reattach(self, i: int, survivor: Survivor) -> None:
        """Replica ``i`` is a predecessor's live actor: mirror it under its own lease."""
        k = self.remote[i]
        k.incarnation += 1
        k.lease, k.acked, k.where = survivor.hello.lease, survivor.acked, dict(survivor.hello.where)
        self.actors[i] = survivor.actor
        self.heard[k.lease] = time.monotonic()  # the survey's poll
        self.revoked[i] += survivor.revoked
        self.taken[i] += survivor.taken
        k.state, k.lost_since = "up", None
        self._apply_keeper(i, survivor.hello.keeper)
        self.w.port.emit(RayActorReattached(
            replica=i, lease=k.lease, node=str(k.where.get("node", ""))[:12],
            running=[f"{cid}#{attempt}" for cid, attempt in survivor.running],
            revoked=[f"{cid}#{attempt}" for cid, attempt in survivor.revoked],
            replayed=survivor.replayed))
        await self._drain(i)

    # ------------------------------------------------------------------ the loop

    async def _drain(self, i: int) -> bool:
        """Journal what replica ``i``'s actor buffered; False when it is unreachable."""
        actor, inc = self.actors[i], self.remote[i].incarnation
        if actor is None:
            return False
        port, k = self.w.port, self.remote[i]
        async with self._drain_locks[i]:
            revoked, self.revoked[i] = self.revoked[i], []
            taken, self.taken[i] = self.taken[i], []
            # A hand-over leaves the nodes' cells running for the successor.
            stopping = port.stopping() and not port.handing_over()
            try:
                got: Polled = await actor.poll.remote(
                    [list(revoke) for revoke in revoked], stopping, stopping and port.forced(),
                    self.origins(i), k.acked, [list(take) for take in taken])
            except self.ray.exceptions.RayActorError as e:
                self.revoked[i] = revoked + self.revoked[i]
                self.taken[i] = taken + self.taken[i]
                self._lost(i, inc, short_error(e))
                return False
            self.heard[k.lease] = time.monotonic()
            if k.incarnation == inc:  # not replaced meanwhile
                k.acked = apply_polled(port, i, str(k.where.get("node", "")), k.lease,
                                       k.acked, got)
                self._apply_keeper(i, got.keeper)
            return True

    def origins(self, asking: int) -> list[str]:
        """Where each replica's endpoint answers as replica ``asking``'s node reaches it:
        what that node's gateways may fail over to before a response begins."""
        here = self.remote[asking].where.get("ip")
        return [peer_origin(str(k.seen.get("api_base") or ""), k.is_up, k.where.get("ip"),
                            here) for k in self.remote]

    def _apply_keeper(self, i: int, seen: dict[str, Any] | None) -> None:
        k = self.remote[i]
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
                           running=sorted(f"{cid}#{attempt}" for cid, attempt in self.inflight[i]))

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
            seen = time.monotonic()
            swept = await self._sweep_once(i, lease, ip)
            if not swept:  # unreachable: until its actor has surely fenced itself
                await anyio.sleep(self._expiry(lease) - time.monotonic())
            self.w.port.emit(LeaseFenced(replica=i, lease=lease,
                                         how="swept" if swept else "expired",
                                         waited_secs=round(time.monotonic() - seen, 2)))
        finally:
            done.set()

    def _expiry(self, lease: str) -> float:
        """When a lost lease's actor has surely ended what it ran: lease_secs after the
        head last heard it, its check interval and the kill's grace on top."""
        lease_secs = self.cfg.lease_secs
        return (self.heard.get(lease, time.monotonic()) + lease_secs
                + fence_check_secs(lease_secs) + self.w.preset.watchdog.kill_grace_secs + 1.0)

    def _containers(self, i: int) -> Containers | None:
        """Replica ``i``'s containers on its node's daemon: its endpoint's, and the
        sandboxes of the cells it was running."""
        wiring = self.w
        template = wiring.preset.harness.sandbox_container
        mine = endpoint_containers(wiring.preset)[i:i + 1]
        boxes = tuple(render(template, cell_context(wiring.preset, self.cells[cid], attempt,
                                                    wiring.state_dir))
                      for cid, attempt in sorted(self.inflight[i]) if cid in self.cells
                      ) if template else ()
        host = self.remote[i].where.get("docker_host")
        return node_containers(wiring.preset, wiring.run_token, wiring.state_dir, endpoints=mine,
                               sandboxes=boxes, since=self.began,
                               docker_host=host if isinstance(host, str) else None)

    async def _sweep_once(self, i: int, lease: str, ip: str | None) -> bool:
        """Whether the lease's processes were killed on its machine."""
        ray = self.ray
        nodes = [node for node in await anyio.to_thread.run_sync(ray.nodes)
                 if node.get("Alive") and node.get("NodeManagerAddress") == ip]
        if not nodes:
            self.w.port.emit(LeaseSweepUnreachable(
                replica=i, lease=lease, ip=ip,
                why="no live node on that machine: its actor fences itself, its lease "
                    "guard ends the rest"))
            return False
        from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

        task = ray.remote(sweep_lease).options(
            num_cpus=0, max_retries=0,
            scheduling_strategy=NodeAffinitySchedulingStrategy(nodes[0]["NodeID"], soft=False))
        try:
            with anyio.fail_after(60):
                pids = await task.remote(self.w.run_token, lease,
                                         self.w.preset.watchdog.kill_grace_secs,
                                         self._containers(i))
        except Exception as e:  # a sweep that failed is said, not fatal
            self.w.port.emit(LeaseSweepFailed(replica=i, lease=lease, error=short_error(e)))
            return False
        self.w.port.emit(LeaseSwept(replica=i, lease=lease, pids=pids))
        return True

    # ------------------------------------------------------------------ cells

    async def run(self, cell: Cell, attempt: int, replica: int,
                  ran: Ran | None = None) -> Classification | None:
        """Run one attempt on the replica's actor; its verdict, INVALID(node_lost) when
        the actor or node went away, or None when it was abandoned (stopping). The node
        grades it in the same call, so its slot is held to the verdict (``ran`` unused)."""
        actor = self.actors[replica]
        if actor is None:  # lost between being picked and now
            return Classification("INVALID", reason="node_lost", launched=time.time(),
                                  detail=f"replica {replica} lost before the cell could start")
        return await self._follow(cell, attempt, replica, actor.run_cell.remote(cell, attempt))

    async def resume(self, cell: Cell, attempt: int, replica: int,
                     attached: Any, ran: Ran | None = None) -> Classification | None:
        """Follow an attempt a predecessor started on a node's actor (``survey``) to its
        end: the same attempt, its verdict as the node judged it."""
        i = attached.replica if isinstance(attached, RayAttempt) else replica
        actor = self.actors[i]
        if actor is None or self.remote[i].lease != getattr(attached, "lease", None):
            # lost (and perhaps recreated) since the survey: what it ran went with it
            return Classification(
                "INVALID", reason="node_lost", launched=time.time(),
                detail=f"replica {i} lost before its attempt could be re-attached to")
        return await self._follow(cell, attempt, i, self._attached(actor, cell, attempt))

    async def _attached(self, actor: Any, cell: Cell, attempt: int) -> Result | None:
        found, got = await actor.attach_cell.remote(cell.id, attempt)
        if not found:  # its actor was stopped and made again meanwhile, say
            self.w.port.emit(CellAbandoned(cell=cell.id, attempt=attempt,
                                           why="its node's actor no longer holds it"))
            return None
        return got  # type: ignore[no-any-return]

    async def _follow(self, cell: Cell, attempt: int, i: int,
                      call: Awaitable[Result | None]) -> Classification | None:
        """Wait for an attempt on replica ``i``'s actor: its result, journaled here
        with its files and events; INVALID(node_lost) if the actor goes; None when
        abandoned, or when the loop hands over (the attempt runs on for the successor)."""
        k, key = self.remote[i], (cell.id, attempt)
        # The lease this attempt runs under: by the time an error arrives, the replica
        # may already be recreated under a new one, which must be left alone.
        inc, lease, where = k.incarnation, self._lease(i), dict(k.where)
        self.inflight[i].add(key)
        self.cells[cell.id] = cell
        try:
            got = await self._unless_handover(call)
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
        self.heard[lease] = time.monotonic()
        if got is None:
            return None
        judged, files = got
        if files is not None:  # no shared storage: its files come back before its verdict
            await self._receive(cell, attempt, files)
        await self._drain(i)  # its events (started, exited, graded) before its verdict
        if k.incarnation == inc:
            # The loop journals the verdict as this returns, before any later poll: that
            # poll tells the actor it may forget the result. A head killed before it
            # leaves the result to its successor.
            self.taken[i].append(key)
        return judged

    async def _unless_handover(self, call: Awaitable[Result | None]) -> Result | None:
        """``call``'s result, or None once the loop hands over: the actor's attempt runs
        on (awaiting a Ray reference is only listening to it)."""
        got: list[Result | None] = []
        err: list[Exception] = []
        async with anyio.create_task_group() as tg:
            async def listen() -> None:
                try:
                    got.append(await call)
                except Exception as e:  # said outside the group, as itself
                    err.append(e)
                tg.cancel_scope.cancel()

            tg.start_soon(listen)
            while not self.w.port.handing_over():
                await anyio.sleep(self.poll_secs)
            tg.cancel_scope.cancel()
        if err:
            raise err[0]
        return got[0] if got else None

    async def _receive(self, cell: Cell, attempt: int, files: bytes) -> None:
        """Unpack an attempt's shipped files into the state dir, the previous attempt's
        output moved aside first (as a local attempt does at its start)."""
        wiring = self.w
        ctx = cell_context(wiring.preset, cell, attempt, wiring.state_dir)
        out = Path(ctx["output_dir"])
        roots = run_roots(wiring.preset, wiring.state_dir)
        try:
            await anyio.to_thread.run_sync(move_aside, out, wiring.state_dir, cell.id,
                                           attempt - 1, roots)
        except UnsafePath as e:
            wiring.port.emit(UnsafePathRefused(cell=cell.id, path=str(out), why=str(e)))
        written, skipped = await anyio.to_thread.run_sync(unpack, files, wiring.state_dir)
        wiring.port.emit(CellFilesReceived(cell=cell.id, attempt=attempt, files=written,
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

    async def release(self, keep: bool = False) -> None:
        """After every replica stopped: free the placement group, leave the cluster.
        Handing over (``keep``): the actors and their placement group stay for the
        successor (removing the group would end them)."""
        if self.pg is not None and not keep:
            self.ray.util.remove_placement_group(self.pg)
        self.pg = None
        await anyio.to_thread.run_sync(self.ray.shutdown)
