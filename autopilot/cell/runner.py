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
import socket
import time
import uuid
from dataclasses import asdict, replace
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import anyio

from autopilot.attemptspec import AttemptSpec, HarnessSpec
from autopilot.cell.cgroups import Spared, group_name
from autopilot.cell.context import (
    CellContext,
    DataPathView,
    Gatekeeper,
    LaunchFailed,
    gateway_news,
    gateway_spec,
    harness_identity,
    template_context,
    upstreams,
    whole_wall,
)
from autopilot.cell.grading import judge_cell, model_access
from autopilot.cell.itemsprogress import ItemsWatch
from autopilot.cell.procs import TOKEN_ENV, Tracker, kill_tree, probe
from autopilot.cell.scratch import clean_scratch
from autopilot.cell.substance import SubstanceState, check_substance, last_row_says
from autopilot.cell.users import as_user, disown
from autopilot.cell.validity import (
    Classification,
    Evidence,
    Killed,
    RunOutcome,
    by_gateway,
    served_as,
)
from autopilot.cell.watchdog import Limits, Observation, WatchState, decide
from autopilot.cell.workspace import prepare_workspace
from autopilot.config.limits import limits_for
from autopilot.logsetup import SPOOL_CAP, bind_contextvars, get_logger, unbind_contextvars
from autopilot.plan import Cell
from autopilot.state.cellevents import (
    CellAbandoned,
    CellExited,
    CellKilled,
    CellMetered,
    CellReattached,
    CellSpawning,
    CellStarted,
    CellWatchdog,
    ForeignInCellGroup,
    GradeRetry,
)
from autopilot.state.fsutil import cap_in_place, log_tail
from autopilot.state.statedir import open_append
from autopilot.templates import render, render_argv

log = get_logger(__name__)

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
        self.limits = limits_for(cx.preset, cell.task)
        self.ctx = template_context(cx.preset, cell, attempt, cx.state_dir, cx.keeper)
        self.output_dir = Path(self.ctx["output_dir"])
        self.transcript = Path(self.ctx["transcript"])
        self.spool = cx.state_dir / "logs" / f"{cell.id}.launcher.log"
        self.grade_log = cx.state_dir / "logs" / f"{cell.id}.grade.log"
        self.completion = [Path(render(done, self.ctx)) for done in self.p.harness.completion]
        template = self.p.harness.sandbox_container
        # The exact name of this attempt's sandbox container, where Docker is wired.
        self.sandbox = render(template, self.ctx) if template and cx.sandboxes else None
        self.token = uuid.uuid4().hex
        self.tracker: Tracker | None = None
        self.group: Path | None = None  # the attempt's cgroup, where there is one
        self.uid: int | None = None  # the cell's own user ([harness] user = "cell")
        self.abandoned = False
        self.working = False  # a request of it was open at the endpoint when it was killed
        # When the harness was spawned, wall clock: comparable across the nodes of a
        # cluster (the harness-break streak is ordered by it; an order, not a duration).
        self.launched: float | None = None
        self.meter: Any = None  # the gateway's Meter of this attempt, once it has run
        self.dp: DataPathView | None = None  # the attempt's data path
        self.detached = False  # handed over to a successor: the data path goes on
        self._throttled = 0  # the data path's 429 count, as already told to the loop
        # a harness of many items says how far it got (harness.items): its deadline and
        # how a cut is counted follow; ``_origin``: the attempt's start, loop clock
        items = self.p.harness.items
        self.items = ItemsWatch(Path(render(items, self.ctx)) if items else None)
        self._origin = 0.0

    # ------------------------------------------------------------------ helpers

    def _completion_present(self) -> bool:
        return all(path.exists() for path in self.completion)

    def _terminal_evidence(self) -> bool:
        """Completion artifacts, or the preset's terminal transcript row as last row."""
        spec = self.p.harness.terminal_row
        return self._completion_present() or (
            spec is not None and last_row_says(self.transcript, spec.field, spec.values))

    def _limits(self, start_mono: float) -> Limits:
        self._origin = start_mono
        return Limits.starting(self.limits, start_mono)

    def _scaled(self, limits: Limits) -> Limits:
        """The deadline of a cell of many items, once its harness said how many."""
        moved = self.items.rescale(self._origin, self.limits, limits.deadline, self.cell.id,
                                   self.attempt)
        if moved is None:
            return limits
        self.cx.emit(moved[1])
        return replace(limits, deadline=moved[0])

    def _env(self, deadline_epoch: float) -> dict[str, str]:
        env = dict(self.cx.base_env)
        env.update({key: render(value, self.ctx) for key, value in self.p.harness.env.items()})
        env.update({
            "AUTOPILOT_CELL_ID": self.cell.id,
            "AUTOPILOT_CELL_ATTEMPT": str(self.attempt),
            "AUTOPILOT_CELL_DEADLINE": f"{deadline_epoch:.0f}",
            TOKEN_ENV: self.token,
        })
        return env

    async def _end_group(self) -> None:
        """Kill what is left in the attempt's cgroup (a child that cleared its
        environment and double-forked is still in it) and remove the group."""
        if self.group is not None and self.cx.contain is not None:
            spared: list[Spared] = []
            pids = await anyio.to_thread.run_sync(self.cx.contain.kill, self.group, 5.0,
                                                  spared)
            if pids:
                log.info("cell_group_killed", pids=pids)
            for foreign in spared:  # moved into the cell's group by someone: never signalled
                self.cx.emit(ForeignInCellGroup(cell=self.cell.id, attempt=self.attempt,
                             group=foreign.group, pid=foreign.pid, why=foreign.why))
            self.group = None

    async def _kill(self, grace: float) -> list[int]:
        return [] if self.tracker is None else await anyio.to_thread.run_sync(
            kill_tree, self.tracker, grace)

    # ------------------------------------------------------------------ run

    async def execute(self, attached: DataPathView | None = None) -> RunOutcome | None:
        """Run the harness to its end (or watch ``attached``, an attempt a predecessor
        started, to its end); None when abandoned by a shutdown or handed over."""
        bind_contextvars(cell=self.cell.id, attempt=self.attempt)
        outcome: RunOutcome | None = None
        try:
            outcome = await self._execute(attached)
            return outcome
        finally:
            if outcome is None:
                self._release_user()  # no grading to come (a handed-over one keeps it)
            unbind_contextvars("cell", "attempt")
            if not self.detached:  # handed over: the harness and its sandbox go on
                boxes, listed = self.cx.sandboxes, self.p.harness.compose_projects
                with anyio.CancelScope(shield=True):
                    if self.sandbox and boxes is not None:
                        await boxes.remove(self.sandbox)
                    if listed and boxes is not None and boxes.projects:  # a killed Inspect's
                        await boxes.remove_projects(render(listed, self.ctx))

    def _upstreams(self) -> list[tuple[str, str]]:
        return upstreams(self.cx, self.p.arm(self.cell.arm))

    def _refused(self, why: str, code: int) -> RunOutcome:
        """An attempt that never started a harness: journaled as started and exited."""
        self.cx.emit(CellStarted(cell=self.cell.id, attempt=self.attempt, pid=None,
                                 create_time=None, token=self.token))
        self.cx.emit(CellExited(cell=self.cell.id, attempt=self.attempt, code=None,
                                error=why))
        return RunOutcome(exit_code=code)

    async def _clean_scratch(self) -> str | None:
        return await clean_scratch(self.cx, self.p, self.ctx, self.cell.id, self.attempt)

    async def _prepare(self) -> RunOutcome | None:
        """A clean workspace and the last attempt's outputs moved aside; an outcome
        when the attempt cannot start on them (autopilot.cell.workspace)."""
        refused, self.uid = await prepare_workspace(self.cx, self.ctx, self.cell.id,
                                                    self.attempt, self.output_dir,
                                                    self.sandbox)
        return None if refused is None else self._refused(*refused)

    def _release_user(self) -> None:
        if self.uid is not None and self.cx.users is not None and not self.detached:
            disown(self.output_dir)  # the uid's next holder must not reach this cell's files
            self.cx.users.give(self.uid)
            self.uid = None

    async def _launch(self, start_mono: float, limits: Limits) -> DataPathView | RunOutcome:
        """The attempt's data path, with its gateway listener bound here first (so the
        port the harness is told answers from its first request) and its harness
        spawned; or the outcome of a spawn that failed."""
        cx = self.cx
        arm = self.p.arm(self.cell.arm)
        gw: Gatekeeper | None = (cx.gateway if self.ctx["endpoint_base_url"] or arm.route
                                 else None)
        listen = None
        direct = {k: self.ctx[k] for k in ("port", "host", "base_url")}
        if gw is not None:
            listen = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            listen.bind(("127.0.0.1", 0))
            listen.listen(128)
            port = listen.getsockname()[1]
            # the harness is told the gateway's address with its upstream's own path
            path = arm.route.path() if arm.route else urlsplit(cx.keeper.ep.api_base).path
            self.ctx.update(port=str(port), host="127.0.0.1",
                            base_url=f"http://127.0.0.1:{port}{path}")
        key = cx.new_key() if gw is not None else ""
        # The attempt's own key: the harness's API key (the clients' usual variable, a
        # provider's api_key_env, {api_key} in its env); the gateway admits only it.
        self.ctx["api_key"] = key
        argv = render_argv(self.p.harness.argv, self.ctx)
        cwd = render(self.p.harness.cwd, self.ctx) if self.p.harness.cwd else None
        deadline_epoch = time.time() + (limits.deadline - start_mono)
        env = self._env(deadline_epoch)
        if key:
            env.update(dict.fromkeys(cx.key_env, key))
        if self.uid is not None:
            env["HOME"] = str(self.output_dir)  # its own; the supervisor's is not its
        # the grader, after, gets the endpoint's own address and no key
        self.ctx.update(direct, api_key="")
        with open_append(self.spool) as spool:
            spool.write(f"--- attempt {self.attempt} argv: {cx.redact(str(argv))}\n".encode())
        self.launched = time.time()
        run_argv = argv if self.uid is None else as_user(
            argv, self.uid, cx.users.groups if cx.users else ())
        if cx.contain is not None:
            self.group = cx.contain.group(group_name("cell", self.cell.id, self.attempt,
                                                     self.uid))
            run_argv = cx.contain.wrap(run_argv, self.group)
        # The intent, on disk before the spawn: a supervisor killed between the two
        # leaves a successor that knows this attempt (its number, marker and group), so
        # it is re-attached or abandoned as this attempt, never charged.
        cx.emit(CellSpawning(cell=self.cell.id, attempt=self.attempt, token=self.token,
                             group=self.group.name if self.group else None, uid=self.uid))
        spec = AttemptSpec(
            self.cell.id, self.attempt, HarnessSpec(tuple(run_argv), env, str(self.spool), cwd),
            meta={"token": self.token, "group": self.group.name if self.group else None,
                  "uid": self.uid, "replica": cx.replica, "deadline": deadline_epoch,
                  "launched": self.launched, "arms": list(cx.keeper.ep.arm_group)},
            gateway=gateway_spec(
                gw, arm, self._upstreams(), key, self.ctx["model"],
                cx.state_dir / "gateway" / self.cell.id / f"attempt-{self.attempt}.jsonl",
            ) if gw is not None else None)
        try:
            dp = await cx.launch(cx.state_dir, spec, listen=listen, run_token=cx.run_token,
                                 token=self.token)
        except (LaunchFailed, OSError) as e:
            # Ours, not the harness's (which never ran): infrastructure, no retry spent.
            why = f"data path failed: {e}"[:400]
            return replace(self._refused(why, 127), datapath_lost=why)
        if dp.spawn_error is not None:
            await dp.reap()
            return self._refused(f"{dp.spawn_error}", 127)
        return dp

    def _reattach(self, datapath: DataPathView) -> tuple[float, Limits]:
        """The watch of an attempt a predecessor started: its marker, group and deadline
        from what it recorded; its clocks from now (time the loop did not run is never
        charged to the cell)."""
        meta = datapath.meta
        self.token = str(meta.get("token") or self.token)
        if isinstance(meta.get("group"), str) and self.cx.contain is not None:
            self.group = self.cx.contain.base / meta["group"]
        uid = meta.get("uid")
        if type(uid) is int and self.cx.users is not None \
                and self.cx.users.first <= uid <= self.cx.users.last:
            self.uid = uid
            self.cx.users.hold(uid, self.cell.id)
        launched = meta.get("launched")
        self.launched = float(launched) if isinstance(launched, int | float) else None
        start_mono = self.cx.clock()
        limits = self._limits(start_mono)
        deadline = meta.get("deadline")
        if isinstance(deadline, int | float):
            limits = replace(limits, deadline=start_mono + (float(deadline) - time.time()))
            self._origin = limits.deadline - self.limits.deadline_secs
        self.cx.emit(CellReattached(cell=self.cell.id, attempt=self.attempt,
                                    datapath_pid=datapath.pid, pid=datapath.harness_pid,
                                    exited=datapath.exited))
        return start_mono, limits

    async def _execute(self, attached: DataPathView | None) -> RunOutcome | None:
        """The attempt's stages: begin (launch, or take over a running one), watch it to
        its end, then read what it came to."""
        begun = await self._begin(attached)
        if isinstance(begun, RunOutcome):
            return begun
        dp, start_mono, limits = begun
        # The arms the endpoint served when the attempt started (a re-attached one's, as
        # its data path recorded them).
        served_arms = (tuple(dp.meta.get("arms") or ()) if attached
                       else self.cx.keeper.ep.arm_group)
        self._track(dp, attached)
        watched = await self._supervise(dp, start_mono, limits)
        if watched is None:  # handed over: the data path goes on without us
            return None
        return await self._outcome(dp, start_mono, served_arms, *watched)

    async def _begin(self, attached: DataPathView | None
                     ) -> tuple[DataPathView, float, Limits] | RunOutcome:
        """A new attempt prepared and launched under its data path, or a running one
        taken over; an outcome when it never came to run."""
        if attached is not None:
            start_mono, limits = self._reattach(attached)
            self.dp = attached
            return attached, start_mono, limits
        early = await self._prepare()
        if early is not None:
            return early
        start_mono = self.cx.clock()
        limits = self._limits(start_mono)
        launched = await self._launch(start_mono, limits)
        if isinstance(launched, RunOutcome):
            return launched
        self.dp = launched
        return launched, start_mono, limits

    def _track(self, datapath: DataPathView, attached: DataPathView | None) -> None:
        """Know the harness by identity, and journal that it started."""
        cx, ident = self.cx, harness_identity(datapath)
        # The harness is the data path's child: its orphans re-parent there (a subreaper)
        # while it lives, here once it is gone; a re-attached one's went to init before
        # this loop was its ancestor, so its marker is looked for among every process.
        # (in a cgroup, the uid's processes are all in groups killed whole: no host walk)
        self.tracker = Tracker(ident, self.token, full_scan=attached is not None,
                               reaper=datapath.pid,
                               uid=None if cx.contain else self.uid) if ident else None
        if attached is None or attached.unjournaled:
            cx.emit(CellStarted(cell=self.cell.id, attempt=self.attempt, pid=datapath.harness_pid,
                                create_time=ident.create_time if ident else None,
                                start_ticks=ident.ticks if ident else None, token=self.token,
                                endpoint_arms=list(cx.keeper.ep.arm_group),
                                replica=cx.replica, datapath_pid=datapath.pid))

    async def _supervise(self, dp: DataPathView, start_mono: float, limits: Limits
                         ) -> tuple[Killed | None, str | None] | None:
        """Watch the attempt to its end and settle it (what the kill left, its group, its
        data path); None when it was handed over. Whatever ends this early (a stop, a
        full disk) kills the harness tree first: it must not outlive that decision."""
        cx, metered = self.cx, dp.port is not None
        try:
            killed, kill_reason = await self._watch(dp, start_mono, limits, metered)
            if self.detached:
                await dp.close()
                return None
            with anyio.CancelScope(shield=True):
                await self._settle(dp)
        except BaseException:
            if cx.handing_over():  # a full disk under the run: the data path goes on
                self.detached = True
                with anyio.CancelScope(shield=True):
                    await dp.close()
                raise
            with anyio.CancelScope(shield=True):
                await self._kill(0.5)
                await self._end_group()
                await dp.close()
                await dp.reap(3.0)  # nothing of the attempt outlives that decision
            raise
        finally:
            if not self.detached:
                with anyio.CancelScope(shield=True):
                    await anyio.to_thread.run_sync(cx.scrub_file, self.spool)
                    if metered:
                        self.meter = dp.meter
                        with contextlib.suppress(OSError, AssertionError):
                            cx.emit(CellMetered(cell=self.cell.id, attempt=self.attempt,
                                                **dp.meter.summary()))
        return killed, kill_reason

    async def _outcome(self, dp: DataPathView, start_mono: float,
                       served_arms: tuple[str, ...], killed: Killed | None,
                       kill_reason: str | None) -> RunOutcome | None:
        """What the attempt came to, journaled (``cell_exited``); None when it was
        abandoned by a stop."""
        cx = self.cx
        end_mono = cx.clock()
        arm_group = cx.keeper.ep.arm_group
        arm_mismatch = None
        if served_arms and self.cell.arm not in served_arms:
            arm_mismatch = (f"endpoint configured for {', '.join(served_arms)}, not "
                            f"{self.cell.arm}")
        elif arm_group != served_arms:
            arm_mismatch = f"endpoint reconfigured for {', '.join(arm_group)} mid-cell"
        disk_low = False
        if cx.disk is not None:
            # Measured now, up to now: a harness that hit ENOSPC ends before the periodic
            # check sees the disk, and the disk is as full as the harness left it.
            await cx.disk.check()
            disk_low = cx.disk.overlaps(start_mono, cx.clock())
        self.items.poll()
        outcome = RunOutcome(
            exit_code=dp.code, killed=killed, completion=self._completion_present(),
            endpoint_down=cx.keeper.outage_overlaps(start_mono, end_mono),
            kill_reason=kill_reason, arm_mismatch=arm_mismatch, disk_low=disk_low,
            datapath_lost=dp.lost, working=killed is not None and self.working,
            finished=self.items.last.as_dict() if self.items.last else None,
        )
        cx.emit(CellExited(cell=self.cell.id, attempt=self.attempt, code=dp.code,
                           elapsed_secs=whole_wall(self.launched, dp.ended,
                                                   end_mono - start_mono),
                           outcome=asdict(outcome)))
        if self.abandoned:
            cx.emit(CellAbandoned(cell=self.cell.id, attempt=self.attempt,
                                  why="supervisor stopping"))
            return None
        return outcome

    async def _watch(self, dp: DataPathView, start_mono: float, limits: Limits,
                     metered: bool) -> tuple[Killed | None, str | None]:
        """Until the harness ends (or is killed, or the loop stops or hands over): each
        tick asks the data path, then the pure watchdog."""
        cx = self.cx
        state = WatchState.begin(start_mono)
        substance = SubstanceState()
        remembered = start_mono
        while True:
            await dp.wait(self.p.watchdog.poll_secs, self._upstreams() if metered else None)
            self._throttled = gateway_news(self.cx, self.cell.id, self.attempt, dp,
                                           self._throttled)
            if dp.exited or dp.lost:
                return None, None
            if cx.handing_over():
                self.detached = True  # the data path goes on; a successor re-attaches
                return None, None
            if cx.stopping():
                self.abandoned = True
                await self._kill(0.0 if cx.forced() else self.limits.kill_grace_secs)
                return None, None
            if cx.keeper.failed:
                # The endpoint has failed for good: nothing this cell waits for will
                # come. End it now (INVALID(endpoint_down): its outage never ended),
                # not after stuck_secs of a frozen transcript.
                reason = f"endpoint failed for good: {cx.keeper.failed}"
                pids = await self._kill(self.limits.kill_grace_secs)
                cx.emit(CellKilled(cell=self.cell.id, attempt=self.attempt,
                                   kind="endpoint_failed", reason=reason, pids=pids))
                return None, reason
            if self.tracker is not None and cx.clock() - remembered >= REMEMBER_SECS:
                # A full /proc walk: not every tick, and not on the event loop.
                remembered = cx.clock()
                await anyio.to_thread.run_sync(self.tracker.remember)
            activity = (await cx.sandboxes.activity(self.sandbox)
                        if self.sandbox and cx.sandboxes else None)
            decoding = (await cx.keeper.decoding(self.p.watchdog.poll_secs / 2)
                        if self.p.watchdog.endpoint_progress else None)
            meter = dp.meter if metered else None
            if meter is not None and not meter.in_flight:
                # Through the gateway the endpoint's decoding is this cell's progress
                # only while this cell has a request in flight: a frozen cell beside
                # a busy one is frozen.
                decoding = None
            limits = self._scaled(limits)
            obs = Observation(
                now=cx.clock(), transcript_size=_size(self.transcript),
                spool_size=_size(self.spool) or 0, activity=activity,
                completion=self._terminal_evidence(), alive=True, generating=decoding,
                metered=meter.progress if meter is not None else None,
            )
            state, step = decide(state, obs, limits)
            if obs.spool_size > 2 * SPOOL_CAP:  # capped as it grows, not only at its end
                await anyio.to_thread.run_sync(cap_in_place, self.spool, SPOOL_CAP)
            if self.p.watchdog.substance and step.action != "KILL":
                substance, found = check_substance(substance, self.transcript, obs.now,
                                                   self.p.watchdog)
                if found is not None and found.changed:
                    cx.emit(CellWatchdog(cell=self.cell.id, attempt=self.attempt,
                                         tier=found.action, reason=found.reason or ""))
                if found is not None and found.action == "KILL":
                    step = found
            cx.on_tick(self.cell.id, state, step.action)
            if step.changed and step.kind != "substance":
                tier = CellWatchdog(cell=self.cell.id, attempt=self.attempt,
                                    tier=step.action, reason=step.reason or "",
                                    idle_secs=round(step.idle_secs, 1),
                                    frozen_secs=round(step.frozen_secs, 1))
                cx.emit(tier.model_copy(update={"probe": probe(self.tracker, activity)})
                        if step.action == "PROBE" else tier)  # only a PROBE says it
            if step.action == "KILL":
                await dp.wait(0)
                if dp.exited:
                    return None, None  # it ended while we were not looking: the truth
                # a substance kill is a stall with a reason: INVALID(stall)
                self.working = bool(meter is not None and meter.in_flight)
                pids = await self._kill(self.limits.kill_grace_secs)
                cx.emit(CellKilled(cell=self.cell.id, attempt=self.attempt,
                                   kind=step.kind, reason=step.reason or "", pids=pids))
                return _KILLED.get(step.kind or "stall", "stall"), step.reason

    async def _settle(self, datapath: DataPathView) -> None:
        """After the watch: the harness's end as its data path records it (a killed
        tree ends within the kill's grace), whatever it left behind killed, its group
        ended, the data path reaped. A data path that is gone without a record leaves
        a harness nobody reaps: it is killed by identity."""
        for _ in range(30):
            if datapath.exited or datapath.lost:
                break
            await datapath.wait(1.0)
        if not datapath.exited:
            await self._kill(0.5)
        # Whatever the root left behind (daemonised helpers) dies with the cell.
        if self.tracker is not None and bool(await anyio.to_thread.run_sync(
                self.tracker.collect)):
            leftover = await self._kill(1.0)
            log.info("cell_leftovers_killed", pids=leftover)
        await self._end_group()
        await datapath.close()
        await datapath.reap()

    async def judge(self, outcome: RunOutcome) -> Classification:
        """Checks, grader and classification of a finished attempt."""

        def retry(tries: int, judged: Classification) -> None:
            self.cx.emit(GradeRetry(cell=self.cell.id, attempt=self.attempt, tried=tries,
                                    reason=judged.reason, detail=judged.detail))
            if self.cx.on_grade_failure is not None:
                self.cx.on_grade_failure(self.cell.id, judged)

        try:
            async with model_access(self.cx, self.cell.id, self.attempt, self.ctx,
                                    self._upstreams) as (ctx, extra_env):
                judged = await judge_cell(self.p, ctx, outcome, self.grade_log,
                                          base_env=self.cx.base_env, on_retry=retry,
                                          contain=self.cx.contain, extra_env=extra_env,
                                          user=self.uid)
            if judged.reason in ("harness_crash", "missing_output", "interrupted"):
                # Why it broke is in its own output: the last lines go with the verdict.
                tail = await anyio.to_thread.run_sync(log_tail, self.spool, 3)
                if tail:
                    judged = replace(judged, detail=f"{judged.detail}; launcher log: {tail}")
            if judged.launched is None:  # decided without a grader: the harness's evidence
                judged = replace(judged, launched=self.launched or time.time())
            meter = self.meter
            if meter is not None:
                if self.p.endpoint.names_model_exactly and not self.p.arm(self.cell.arm).route:
                    # (a provider, a route's included, may add a version to the name)
                    judged = served_as(judged, meter.models, self.ctx["served_model"])
                judged = by_gateway(judged, outcome, Evidence(
                    meter.requests, meter.answered, dict(meter.errors),
                    meter.first_error or None, meter.throttled_tail),
                    unread=meter.unmetered, required=self.p.gateway.require_metering,
                    policy=self.p.trust.count)
            return judged
        finally:
            with anyio.CancelScope(shield=True):
                await self._clean_scratch()
                await anyio.to_thread.run_sync(self.cx.scrub_file, self.grade_log)
                if self.uid is not None and self.tracker is not None:
                    # the grader ran as the cell's uid too: whatever of it is left dies
                    # before the uid is free for another cell
                    left = await self._kill(0.5)
                    if left:
                        log.info("cell_leftovers_killed", pids=left)
                self._release_user()

    async def run(self) -> Classification | None:
        """Execute then judge (per-cell grading)."""
        outcome = await self.execute()
        if outcome is None:
            return None
        return await self.judge(outcome)
