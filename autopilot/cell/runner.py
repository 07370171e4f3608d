"""Run one cell attempt: spawn, spool, watch, kill, grade, classify, clean.

The harness is someone else's program. It runs from an argv list (never a shell
string) in its own session, with stdout+stderr spooled to a per-cell launcher log, and
with ``AUTOPILOT_CELL_ID`` / ``AUTOPILOT_CELL_DEADLINE`` (epoch seconds) in its
environment so it can wrap up in time. Each poll tick feeds cheap ``os.stat``
observations to the pure ``watchdog.decide``; a KILL is carried out on the exact process
tree (``procs``). A previous attempt's outputs are moved aside, never deleted, so the
evidence of an INVALID attempt survives its retry.
"""

from __future__ import annotations

import contextlib
import json
import subprocess
import time
import uuid
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any, Protocol
from urllib.parse import urlsplit

import anyio
import psutil

from autopilot.cell.cgroups import Containment, group_name
from autopilot.cell.grading import judge_cell
from autopilot.cell.procs import OWNED, TOKEN_ENV, Tracker, child_exited, identify, kill_tree, spawn
from autopilot.cell.substance import SubstanceState, check_substance
from autopilot.cell.validity import (
    Classification,
    Evidence,
    Killed,
    RunOutcome,
    count_by_evidence,
    lookup,
    served_as,
    unmetered,
)
from autopilot.cell.watchdog import Limits, Observation, WatchState, cell_deadline, decide
from autopilot.config import Preset
from autopilot.logsetup import bind_contextvars, get_logger, unbind_contextvars
from autopilot.plan import Cell, cell_context
from autopilot.state.diskspace import DiskWatch
from autopilot.state.fsguard import UnsafePath, move_tree, remove_or_clear
from autopilot.state.fsutil import log_tail
from autopilot.state.statedir import open_append
from autopilot.state.untrusted import read_tail
from autopilot.templates import render, render_argv

log = get_logger(__name__)
# Engines whose responses name the model exactly as we serve it (llama-server: its
# --alias, whatever the request said; vLLM: --served-model-name; the demo simulator).
SERVED_BY_US = frozenset({"llamacpp", "vllm", "builtin"})

Emit = Callable[..., dict[str, Any]]


class Gatekeeper(Protocol):
    """The model gateway as a cell sees it (autopilot.gateway.proxy.Gateway): a listener
    of the attempt's own, whose ``port`` and ``meter`` the runner reads."""

    def attempt(self, cell: str, attempt: int, settings: dict[str, Any],
                upstream: Callable[[], list[tuple[str, str]]], log_path: Path
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
    env_overrides: dict[str, str] = field(default_factory=dict)
    redact: Callable[[str], str] = lambda s: s
    scrub_file: Callable[[Path], bool] = lambda p: False  # logsetup.Redactor.scrub_file
    # Docker hooks (None when no sandbox is configured or Docker is not in use)
    remove_sandbox: Callable[[str], Awaitable[Any]] | None = None
    sandbox_activity: Callable[[dict[str, str]], Awaitable[int | None]] | None = None
    # empties a scratch dir through Docker (files this user cannot remove), else None
    clear_dir: Callable[[str], Awaitable[str | None]] | None = None
    # removes the Compose projects a harness listed in this file (sandbox.remove_projects)
    remove_projects: Callable[[str], Awaitable[Any]] | None = None
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


def template_context(
    preset: Preset, cell: Cell, attempt: int, state_dir: Path, keeper: Served
) -> dict[str, str]:
    ep = keeper.ep
    ctx = cell_context(preset, cell, attempt, state_dir, ep.port, ep.host, ep.api_base)
    ctx["served_model"] = ep.served_model
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


REMEMBER_SECS = 5.0  # how often the descendants of a running cell are recorded

_KILLED: dict[str, Killed] = {
    "stall": "stall", "substance": "stall", "deadline": "deadline", "teardown": "teardown"}


def _size(path: Path) -> int | None:
    try:
        return path.stat().st_size
    except OSError:
        return None


class CellRun:
    def __init__(self, cx: CellContext, cell: Cell, attempt: int) -> None:
        self.cx = cx
        self.cell = cell
        self.attempt = attempt
        self.p = cx.preset
        self.ctx = template_context(cx.preset, cell, attempt, cx.state_dir, cx.keeper)
        self.output_dir = Path(self.ctx["output_dir"])
        self.transcript = Path(self.ctx["transcript"])
        self.spool = cx.state_dir / "logs" / f"{cell.id}.launcher.log"
        self.grade_log = cx.state_dir / "logs" / f"{cell.id}.grade.log"
        self.completion = [Path(render(c, self.ctx)) for c in self.p.harness.completion]
        template = self.p.harness.sandbox_container
        # The exact name of this attempt's sandbox container, where Docker is wired.
        self.sandbox = render(template, self.ctx) if template and cx.remove_sandbox else None
        self.token = uuid.uuid4().hex
        self.tracker: Tracker | None = None
        self.group: Path | None = None  # the attempt's cgroup, where there is one
        self.abandoned = False
        # When the harness was spawned, wall clock: comparable across the nodes of a
        # cluster (the harness-break streak is ordered by it; an order, not a duration).
        self.launched: float | None = None
        self.meter: Any = None  # the gateway's Meter of this attempt, while it runs

    # ------------------------------------------------------------------ helpers

    def _completion_present(self) -> bool:
        return all(p.exists() for p in self.completion)

    def _terminal_evidence(self) -> bool:
        """Completion artifacts, or the preset's terminal transcript row as last row."""
        if self._completion_present():
            return True
        spec = self.p.harness.terminal_row
        if spec is None:
            return False
        try:
            lines = read_tail(self.transcript, 8192)[0].splitlines()
            row = json.loads(lines[-1]) if lines else None
        except (OSError, ValueError):  # missing, refused (a FIFO, a symlink), torn
            return False
        return str(lookup(row, spec.field)) in spec.values

    def _limits(self, start_mono: float) -> Limits:
        w = self.p.watchdog
        task = self.p.task(self.cell.task)
        budget = task.wall_budget_secs or self.p.harness.wall_budget_secs
        env = self.cx.env_overrides
        return Limits(
            warn_secs=float(env.get("AUTOPILOT_STALL_WARN_S", w.warn_secs)),
            probe_secs=float(env.get("AUTOPILOT_STALL_PROBE_S", w.probe_secs)),
            kill_secs=float(env.get("AUTOPILOT_STALL_KILL_S", w.kill_secs)),
            stuck_secs=task.stuck_secs or w.stuck_secs,
            teardown_grace_secs=float(env.get("AUTOPILOT_STALL_GRACE_S", w.teardown_grace_secs)),
            deadline=cell_deadline(start_mono, budget, w.deadline_overhead_secs,
                                   w.deadline_cap_secs),
        )

    def _env(self, deadline_epoch: float) -> dict[str, str]:
        env = dict(self.cx.base_env)
        env.update({k: render(v, self.ctx) for k, v in self.p.harness.env.items()})
        env.update({
            "AUTOPILOT_CELL_ID": self.cell.id,
            "AUTOPILOT_CELL_ATTEMPT": str(self.attempt),
            "AUTOPILOT_CELL_DEADLINE": f"{deadline_epoch:.0f}",
            TOKEN_ENV: self.token,
        })
        return env

    def _probe(self, activity: int | None) -> dict[str, Any]:
        """What PROBE records: is the tree alive, what is it doing, the sandbox's CPU."""
        procs = self.tracker.collect() if self.tracker else {}
        states: dict[str, int] = {}
        cpu = 0.0
        for p in procs.values():
            try:
                states[p.status()] = states.get(p.status(), 0) + 1
                t = p.cpu_times()
                cpu += t.user + t.system
            except psutil.Error:
                continue
        return {"alive": bool(procs), "pids": len(procs), "states": states,
                "cpu_secs": round(cpu, 2), "sandbox_activity": activity}

    async def _end_group(self) -> None:
        """Kill what is left in the attempt's cgroup (a child that cleared its
        environment and double-forked is still in it) and remove the group."""
        if self.group is not None and self.cx.contain is not None:
            pids = await anyio.to_thread.run_sync(self.cx.contain.kill, self.group)
            if pids:
                log.info("cell_group_killed", pids=pids)
            self.group = None

    async def _kill(self, grace: float) -> list[int]:
        if self.tracker is None:
            return []
        return await anyio.to_thread.run_sync(kill_tree, self.tracker, grace)

    # ------------------------------------------------------------------ run

    async def execute(self) -> RunOutcome | None:
        """Run the harness to its end; None when abandoned by a shutdown."""
        bind_contextvars(cell=self.cell.id, attempt=self.attempt)
        try:
            if self.cx.gateway is None or not self.ctx["endpoint_base_url"]:
                return await self._execute()
            return await self._through_gateway(self.cx.gateway)
        finally:
            unbind_contextvars("cell", "attempt")
            if self.sandbox and self.cx.remove_sandbox is not None:
                with anyio.CancelScope(shield=True):
                    await self.cx.remove_sandbox(self.sandbox)
            listed = self.p.harness.compose_projects
            if listed and self.cx.remove_projects is not None:
                with anyio.CancelScope(shield=True):  # what a killed Inspect left running
                    await self.cx.remove_projects(render(listed, self.ctx))

    def _upstreams(self) -> list[tuple[str, str]]:
        """Where the gateway sends this cell's next request: its own replica (an empty
        origin while it is known to be down), then every other replica that is up and
        may serve the cell's arm (its pins), all serving the same model."""
        cx = self.cx
        allowed = self.p.arm(self.cell.arm).replicas

        def origin(k: Served) -> str:  # scheme://host:port; the harness sends the path
            if not getattr(k, "is_up", True):
                return ""
            u = urlsplit(str(k.ep.api_base))
            return f"{u.scheme}://{u.netloc}"

        out = [(str(cx.replica), origin(cx.keeper))]
        for i, k in enumerate(cx.peers()):
            if i != cx.replica and (allowed is None or i in allowed) and origin(k):
                out.append((str(i), origin(k)))
        return out

    async def _through_gateway(self, gateway: Gatekeeper) -> RunOutcome | None:
        """The attempt with its own gateway listener: ``{port}``, ``{host}`` and
        ``{base_url}`` name it while the harness runs; the grader, after, gets the
        endpoint's own address back. The attempt's totals are journaled (cell_metered)."""
        ep = self.cx.keeper.ep
        direct = {k: self.ctx[k] for k in ("port", "host", "base_url")}
        log_path = (self.cx.state_dir / "gateway" / self.cell.id
                    / f"attempt-{self.attempt}.jsonl")
        async with gateway.attempt(self.cell.id, self.attempt,
                                   self.p.arm(self.cell.arm).request,
                                   self._upstreams, log_path) as gw:
            path = urlsplit(ep.api_base).path
            self.ctx.update(port=str(gw.port), host="127.0.0.1",
                            base_url=f"http://127.0.0.1:{gw.port}{path}")
            self.meter = gw.meter
            try:
                return await self._execute()
            finally:
                self.ctx.update(direct)
                with contextlib.suppress(OSError, AssertionError):
                    self.cx.emit("cell_metered", cell=self.cell.id, attempt=self.attempt,
                                 **gw.meter.summary())

    async def _execute(self) -> RunOutcome | None:
        cx = self.cx
        # A killed predecessor's workspace copies would make the harness fail (the origin
        # removes a stale input copy with `sudo rm -rf`): every attempt starts clean.
        dirty = await self._clean_scratch()
        if dirty is not None:
            # Never started on a dirty workspace: the harness's own `rm -rf` of it would
            # crash the attempt anyway, and a stale tree could pass for this attempt's work.
            cx.emit("cell_started", cell=self.cell.id, attempt=self.attempt, pid=None,
                    create_time=None, token=self.token)
            cx.emit("cell_exited", cell=self.cell.id, attempt=self.attempt, code=None,
                    error=f"scratch dir not removed: {dirty}")
            return RunOutcome(exit_code=126)
        try:
            moved = move_aside(self.output_dir, cx.state_dir, self.cell.id, self.attempt - 1,
                               cx.roots)
        except UnsafePath as e:
            # Nothing is moved or deleted; the attempt cannot start on stale outputs.
            cx.emit("unsafe_path_refused", cell=self.cell.id, attempt=self.attempt,
                    action="move aside", why=str(e))
            cx.emit("cell_started", cell=self.cell.id, attempt=self.attempt, pid=None,
                    create_time=None, token=self.token)
            cx.emit("cell_exited", cell=self.cell.id, attempt=self.attempt, code=None,
                    error=f"output dir refused: {e}")
            return RunOutcome(exit_code=126)
        if moved:
            log.info("attempt_moved_aside", to=str(moved))
        self.output_dir.mkdir(parents=True, exist_ok=True)
        argv = render_argv(self.p.harness.argv, self.ctx)
        cwd = render(self.p.harness.cwd, self.ctx) if self.p.harness.cwd else None
        # A sandbox already under this attempt's name is stale (a killed predecessor's
        # harness whose `docker run` landed after the start-up sweep): left there, it
        # would make this attempt fail on a name conflict and cost it a retry.
        if self.sandbox and cx.remove_sandbox and await cx.remove_sandbox(self.sandbox):
            log.info("stale_sandbox_removed", container=self.sandbox)
        ep = cx.keeper.ep
        served_arms = ep.arm_group  # the arms the endpoint is configured for at launch
        start_mono = cx.clock()
        limits = self._limits(start_mono)
        deadline_epoch = time.time() + (limits.deadline - start_mono)
        with open_append(self.spool) as spool:
            spool.write(f"--- attempt {self.attempt} argv: {cx.redact(str(argv))}\n".encode())
            spool.flush()
            try:
                self.launched = time.time()
                run_argv = argv
                if cx.contain is not None:
                    self.group = cx.contain.group(group_name("cell", self.cell.id,
                                                             self.attempt))
                    run_argv = cx.contain.wrap(argv, self.group)
                # The intent, on disk before the spawn: a supervisor killed between the
                # two leaves a successor that knows this attempt (its number, marker and
                # group), so finished outputs are adopted as this attempt, not filed as
                # the one before.
                cx.emit("cell_spawning", cell=self.cell.id, attempt=self.attempt,
                        token=self.token, group=self.group.name if self.group else None)
                proc = await spawn(
                    run_argv, cwd=cwd, env=self._env(deadline_epoch), stdout=spool,
                    stderr=subprocess.STDOUT, start_new_session=True,
                )
            except OSError as e:
                cx.emit("cell_started", cell=self.cell.id, attempt=self.attempt, pid=None,
                        create_time=None, token=self.token)
                cx.emit("cell_exited", cell=self.cell.id, attempt=self.attempt, code=None,
                        error=f"spawn failed: {e.strerror}: {argv[0]}")
                return RunOutcome(exit_code=127)
        ident = identify(proc.pid)
        self.tracker = Tracker(ident, self.token) if ident else None
        cx.emit("cell_started", cell=self.cell.id, attempt=self.attempt, pid=proc.pid,
                create_time=ident.create_time if ident else None,
                start_ticks=ident.ticks if ident else None, token=self.token,
                endpoint_arms=list(ep.arm_group), replica=cx.replica)
        killed: Killed | None = None
        kill_reason: str | None = None
        state = WatchState.begin(start_mono)
        substance = SubstanceState()
        remembered = start_mono
        try:
            while proc.returncode is None:
                with anyio.move_on_after(self.p.watchdog.poll_secs):
                    await proc.wait()
                if proc.returncode is not None:
                    break
                if cx.stopping():
                    self.abandoned = True
                    grace = 0.0 if cx.forced() else self.p.watchdog.kill_grace_secs
                    await self._kill(grace)
                    break
                if cx.keeper.failed:
                    # The endpoint has failed for good: nothing this cell waits for will
                    # come. End it now (INVALID(endpoint_down): its outage never ended),
                    # not after stuck_secs of a frozen transcript.
                    kill_reason = f"endpoint failed for good: {cx.keeper.failed}"
                    pids = await self._kill(self.p.watchdog.kill_grace_secs)
                    cx.emit("cell_killed", cell=self.cell.id, attempt=self.attempt,
                            kind="endpoint_failed", reason=kill_reason, pids=pids)
                    break
                if self.tracker is not None and cx.clock() - remembered >= REMEMBER_SECS:
                    # A full /proc walk: not every tick, and not on the event loop.
                    remembered = cx.clock()
                    await anyio.to_thread.run_sync(self.tracker.remember)
                activity = await cx.sandbox_activity(self.ctx) if cx.sandbox_activity else None
                decoding = (await cx.keeper.decoding(self.p.watchdog.poll_secs / 2)
                            if self.p.watchdog.endpoint_progress else None)
                meter = self.meter
                if meter is not None and not meter.in_flight:
                    # Through the gateway the endpoint's decoding is this cell's progress
                    # only while this cell has a request in flight: a frozen cell beside
                    # a busy one is frozen.
                    decoding = None
                obs = Observation(
                    now=cx.clock(), transcript_size=_size(self.transcript),
                    spool_size=_size(self.spool) or 0, activity=activity,
                    completion=self._terminal_evidence(), alive=True, generating=decoding,
                    metered=meter.progress if meter is not None else None,
                )
                state, d = decide(state, obs, limits)
                if self.p.watchdog.substance and d.action != "KILL":
                    substance, sd = check_substance(substance, self.transcript, obs.now,
                                                    self.p.watchdog)
                    if sd is not None and sd.changed:
                        cx.emit("cell_watchdog", cell=self.cell.id, attempt=self.attempt,
                                tier=sd.action, reason=sd.reason)
                    if sd is not None and sd.action == "KILL":
                        d = sd
                cx.on_tick(self.cell.id, state, d.action)
                if d.changed and d.kind != "substance":
                    extra = {"probe": self._probe(activity)} if d.action == "PROBE" else {}
                    cx.emit("cell_watchdog", cell=self.cell.id, attempt=self.attempt,
                            tier=d.action, reason=d.reason, idle_secs=round(d.idle_secs, 1),
                            frozen_secs=round(d.frozen_secs, 1), **extra)
                if d.action == "KILL" and child_exited(proc.pid):
                    break  # it ended while we were not looking: its exit is the truth
                if d.action == "KILL":
                    # a substance kill is a stall with a reason: INVALID(stall)
                    killed = _KILLED.get(d.kind or "stall", "stall")
                    kill_reason = d.reason
                    pids = await self._kill(self.p.watchdog.kill_grace_secs)
                    cx.emit("cell_killed", cell=self.cell.id, attempt=self.attempt,
                            kind=d.kind, reason=d.reason, pids=pids)
                    break
            with anyio.CancelScope(shield=True):
                await proc.wait()
                # Whatever the root left behind (daemonised helpers) dies with the cell.
                if self.tracker is not None and bool(await anyio.to_thread.run_sync(
                        self.tracker.collect)):
                    leftover = await self._kill(1.0)
                    log.info("cell_leftovers_killed", pids=leftover)
                await self._end_group()
        except BaseException:
            # Cancelled, or an event could not be journaled (a full disk): the run is
            # ending, and the harness tree must not outlive that decision.
            with anyio.CancelScope(shield=True):
                await self._kill(0.5)
                await self._end_group()
            raise
        finally:
            OWNED.discard(proc.pid)
            with anyio.CancelScope(shield=True):
                await anyio.to_thread.run_sync(cx.scrub_file, self.spool)
        end_mono = cx.clock()
        arm_mismatch = None
        if served_arms and self.cell.arm not in served_arms:
            arm_mismatch = (f"endpoint configured for {', '.join(served_arms)}, not "
                            f"{self.cell.arm}")
        elif ep.arm_group != served_arms:
            arm_mismatch = f"endpoint reconfigured for {', '.join(ep.arm_group)} mid-cell"
        disk_low = False
        if cx.disk is not None:
            # Measured now, up to now: a harness that hit ENOSPC ends before the periodic
            # check sees the disk, and the disk is as full as the harness left it.
            await cx.disk.check()
            disk_low = cx.disk.overlaps(start_mono, cx.clock())
        outcome = RunOutcome(
            exit_code=proc.returncode, killed=killed, completion=self._completion_present(),
            endpoint_down=cx.keeper.outage_overlaps(start_mono, end_mono),
            kill_reason=kill_reason, arm_mismatch=arm_mismatch, disk_low=disk_low,
        )
        cx.emit("cell_exited", cell=self.cell.id, attempt=self.attempt, code=proc.returncode,
                elapsed_secs=round(end_mono - start_mono, 3), outcome=asdict(outcome))
        if self.abandoned:
            cx.emit("cell_abandoned", cell=self.cell.id, attempt=self.attempt,
                    why="supervisor stopping")
            return None
        return outcome

    async def judge(self, outcome: RunOutcome) -> Classification:
        """Checks, grader and classification of a finished attempt."""

        def retry(n: int, c: Classification) -> None:
            self.cx.emit("grade_retry", cell=self.cell.id, attempt=self.attempt, tried=n,
                         reason=c.reason, detail=c.detail)
            if self.cx.on_grade_failure is not None:
                self.cx.on_grade_failure(self.cell.id, c)

        try:
            c = await judge_cell(self.p, self.ctx, outcome, self.grade_log,
                                 base_env=self.cx.base_env, on_retry=retry,
                                 contain=self.cx.contain)
            if c.reason in ("harness_crash", "missing_output"):
                # Why it broke is in its own output: the last lines go with the verdict.
                tail = await anyio.to_thread.run_sync(log_tail, self.spool, 3)
                if tail:
                    c = replace(c, detail=f"{c.detail}; launcher log: {tail}")
            if c.launched is None:  # decided without a grader: the harness's evidence
                c = replace(c, launched=self.launched or time.time())
            m = self.meter
            if m is not None:
                c = unmetered(c, m.requests, self.p.gateway.require_metering)
                if self.p.endpoint.engine in SERVED_BY_US:  # a provider may add a version
                    c = served_as(c, m.models, self.ctx["served_model"])
                c = count_by_evidence(c, outcome, Evidence(
                    m.requests, m.answered, dict(m.errors), m.first_error or None),
                    self.p.trust.count)
            return c
        finally:
            with anyio.CancelScope(shield=True):
                await self._clean_scratch()
                await anyio.to_thread.run_sync(self.cx.scrub_file, self.grade_log)

    async def run(self) -> Classification | None:
        """Execute then judge (per-cell grading)."""
        outcome = await self.execute()
        if outcome is None:
            return None
        return await self.judge(outcome)

    async def _clean_scratch(self) -> str | None:
        """Remove the harness's scratch dirs (through Docker where a root-owned
        sandbox's files stay: fsguard.remove_or_clear); what is left is journaled, and
        returned as the reason (None: all clean)."""
        left = None
        for tmpl in self.p.harness.scratch_dirs:
            path = render(tmpl, self.ctx)  # exact path, never a glob
            why, how = await remove_or_clear(path, self.cx.roots, self.cx.state_dir,
                                             self.cx.clear_dir)
            if how == "cleared":
                self.cx.emit("scratch_removed_via_docker", cell=self.cell.id,
                             attempt=self.attempt, path=path)
            if why is None:
                continue
            if how == "not_removed":
                self.cx.emit("scratch_not_removed", cell=self.cell.id, attempt=self.attempt,
                             path=path, why=why)
            else:
                self.cx.emit("unsafe_path_refused", cell=self.cell.id, attempt=self.attempt,
                             action="remove scratch dir", why=why)
            left = left or why
        return left
