"""The supervisor: one anyio task group that drives a run to its target N.

Order of a start, chosen so that bad input and double drive touch nothing:
  1. validate the state dir and the plan identity (read-only);
  2. take the run lock (exit 3 if another supervisor holds it);
  3. replay the journal, sweep orphans a SIGKILLed predecessor left, start the endpoint;
  4. passes: each sweeps the pending cells in plan order, ``concurrency`` at a time.
Every state change goes through ``emit``: journal append (fsync'd) -> ledger.apply ->
log -> status mark. A resumed run and one that never stopped therefore cannot disagree.
"""

from __future__ import annotations

import contextlib
import errno
import json
import os
import signal
import socket
import sys
import time
from collections.abc import Awaitable, Callable, Iterator
from dataclasses import asdict, dataclass, replace
from functools import partial
from pathlib import Path
from typing import Any

import anyio

from autopilot import budget, logsetup, sdnotify, sweep
from autopilot.budget import Spend
from autopilot.cells import CellContext, CellRun
from autopilot.childenv import child_env
from autopilot.clock import TICK, RunClock
from autopilot.config import ArmEndpoint, Preset
from autopilot.endpoints import make_endpoint
from autopilot.endpoints.keeper import Keeper
from autopilot.errors import (
    EXIT_COMPLETE,
    EXIT_INCOMPLETE,
    EXIT_SIGINT,
    EXIT_SIGTERM,
    EndpointError,
    EndpointFailed,
    PlanChangedError,
)
from autopilot.escape import clean, term
from autopilot.executor import Executor, LocalExecutor
from autopilot.fsguard import remove_stale_temps, run_roots
from autopilot.fsutil import (
    atomic_write_json,
    atomic_write_text,
    iso,
    parse_iso,
    read_json,
    storage_error,
)
from autopilot.journal import Journal, read_events
from autopilot.ledger import Ledger, StreakState, should_quarantine, streak_step
from autopilot.lock import RunLock, beat_interval
from autopilot.logsetup import get_logger
from autopilot.notify import MILESTONES, Notifier, urls_from_env
from autopilot.placement import ReplicaView, choose_replica
from autopilot.plan import Plan, arm_groups, cell_context
from autopilot.preflight import needs_docker
from autopilot.procs import RUN_TOKEN_ENV, enable_subreaper, reap_adopted, run_token
from autopilot.statedir import open_append
from autopilot.status import SCHEMA_VERSION, StatusWriter, eta_secs, oneline
from autopilot.templates import render
from autopilot.throttle import Throttle, on_throttled, on_tick
from autopilot.validity import Classification, RunOutcome, attempt_outcomes

log = get_logger(__name__)



TICK_STATUS_SECS = 5.0


@dataclass(frozen=True)
class RunOptions:
    state_dir: Path
    allow_plan_change: bool = False
    notify_config: str | None = None
    console_log: bool = True
    preset_path: str | None = None
    config_path: str | None = None
    identity: dict[str, Any] | None = None  # preflight's per-launch identity record
    warnings: tuple[str, ...] = ()
    publish: bool = False
    results_repo: str | None = None
    resume_command: str = ""  # said on a stop signal: how to carry on
    live_view: bool = False  # a terminal: the progress panel (autopilot.liveview)
    metrics_textfile: Path | None = None  # node_exporter textfile, see autopilot.metrics


# Log levels that mean something: a warning is the run healing itself, an error is
# something a person must look at (shown on the console even with --quiet).
WARNING_EVENTS = frozenset({"cell_killed", "endpoint_down", "endpoint_restart",
                            "cell_quarantined", "unsafe_path_refused", "journal_pid_refused",
                            "notify_failed", "launching_paused"})
ERROR_EVENTS = frozenset({"endpoint_failed", "harness_anomaly", "publish_failed"})


def secret_values(preset: Preset) -> list[str]:
    """Values of the env vars the preset names as secret (never logged anywhere)."""
    names = list(preset.preflight.secrets)
    if preset.endpoint.engine == "provider" and preset.endpoint.api_key_env:
        names.append(preset.endpoint.api_key_env)
    # A notification URL is a credential too (an ntfy topic, a webhook path).
    return [os.environ[n] for n in names if os.environ.get(n)] + [
        *preset.notify.urls, *urls_from_env()]


def check_plan_identity(state_dir: Path, plan: Plan, allow_change: bool) -> dict[str, Any] | None:
    """Refuse a state dir made by another plan. Read-only."""
    recorded = read_json(state_dir / "plan.json")
    if not isinstance(recorded, dict):
        return None
    if recorded.get("identity") != plan.identity and not allow_change:
        raise PlanChangedError(
            f"{state_dir}: holds a run of preset {recorded.get('preset')!r} with plan "
            f"identity {recorded.get('identity')}, but this preset gives {plan.identity} "
            "(tasks, arms, model, harness or grader changed); use another --state-dir "
            "or pass --allow-plan-change"
        )
    return recorded


class Supervisor:
    def __init__(
        self,
        preset: Preset,
        plan: Plan,
        opts: RunOptions,
        *,
        clock: Callable[[], float] | None = None,
    ) -> None:
        self.preset = preset
        self.plan = plan
        self.opts = opts
        self.state_dir = opts.state_dir
        # The run clock (absence excluded) unless a test drives time itself.
        self.clock: Callable[[], float] = RunClock() if clock is None else clock
        clock = self.clock
        self.notifier = Notifier(
            [*preset.notify.urls, *urls_from_env()], opts.notify_config,
            cooldown_secs=preset.notify.cooldown_secs, timeout_secs=preset.notify.timeout_secs,
            on_failure=self._notify_failed, clock=clock,
        )
        self.ledger = Ledger(plan)
        self.journal: Journal | None = None
        self.lock = RunLock(self.state_dir)
        self.keeper: Keeper | None = None  # replica 0 (the only one, usually)
        # Keeper, or rayexec.RemoteKeeper (the same surface) under the Ray backend
        self.keepers: list[Any] = []
        # Where cells run (autopilot.executor): set with the keepers, in _make_keepers.
        self.executor: Executor | None = None
        self.replica_slots: list[anyio.Semaphore] = []
        self._cxs: dict[int, CellContext] = {}
        self.phase = "starting"
        self.outcome_reason = ""
        self.pass_no = 0
        self.started_at = iso()
        self.t0 = clock()
        self.done_this_session = 0
        self.streak = StreakState()
        self.anomaly_alarms = 0
        self.paused: str | None = None  # on_anomaly = "pause" fired: launch nothing more
        self.announced_arms: set[str] = set()
        self.orphans_cleaned: list[dict[str, Any]] = []
        self.adopted: list[tuple[str, int, RunOutcome]] = []
        self.stop_signal: int | None = None
        self.throttle = Throttle(preset.run.concurrency, preset.run.concurrency)
        self.forced = False
        self.status = StatusWriter(
            self.state_dir / "status.json", self.snapshot, preset.run.status_debounce_secs,
            also=self._write_metrics if opts.metrics_textfile else None,
        )
        self._last_status_line = ""
        self._grading = anyio.Lock()
        self._tick_marked = 0.0
        self._stop_scopes: set[anyio.CancelScope] = set()
        self._cx: CellContext | None = None
        self.run_token = run_token(self.state_dir)
        self.publish_state: dict[str, Any] | None = None
        self.redactor = logsetup.Redactor(secret_values(preset))
        self.remove_sandbox: Callable[[str], Awaitable[Any]] | None = None
        self.sandbox_activity: Callable[[dict[str, str]], Awaitable[int | None]] | None = None

    # ------------------------------------------------------------------ events

    def emit(self, event: str, **fields: Any) -> dict[str, Any]:
        assert self.journal is not None
        record = self.journal.append(event, **fields)
        self.ledger.apply(record)
        name = fields.get("kind") if event == "milestone" else event
        level = ("error" if name in ERROR_EVENTS else "warning" if name in WARNING_EVENTS
                 else "info")
        getattr(log, level)(event, **{k: v for k, v in fields.items() if k != "token"})
        self.status.mark()
        return record

    def milestone(self, kind: str, **info: Any) -> None:
        priority = MILESTONES.get(kind, ("", "normal"))[1]
        payload = {
            "kind": kind, "priority": priority, "preset": self.preset.name,
            "model": self.preset.model, "progress": self.progress_line(), **info,
        }
        self.emit("milestone", **payload)
        try:
            self.notifier.submit(kind, payload)
        except Exception as e:  # notifications must never break the run
            log.warning("notify_failed", kind=kind, error=str(e))

    def _notify_failed(self, kind: str, url: str, why: str) -> None:
        if self.journal is not None:
            self.emit("notify_failed", kind=kind, url=url, why=why)

    def progress_line(self) -> str:
        return oneline(self.snapshot(light=True))

    # ------------------------------------------------------------------ status

    def snapshot(self, light: bool = False) -> dict[str, Any]:
        led = self.ledger
        summary = led.summary()
        totals = summary.totals
        elapsed = self.clock() - self.t0
        remaining = (totals["total"] - totals["done"] - totals["quarantined"]
                     - totals["ungraded"])
        snap: dict[str, Any] = {
            "schema_version": SCHEMA_VERSION,
            "phase": self.phase,
            "outcome_reason": self.outcome_reason,
            "preset": self.preset.name,
            "description": self.preset.description,
            "model": self.preset.model,
            "engine": self.preset.endpoint.engine,
            "target_n": self.plan.target_n,
            "plan_identity": self.plan.identity,
            "pid": os.getpid(),
            "host": socket.gethostname(),
            "started_at": self.started_at,
            "updated_at": iso(),
            "elapsed_secs": round(elapsed, 1),
            "eta_secs": eta_secs(remaining, self.done_this_session, elapsed),
            "pass": self.pass_no,
            "max_passes": self.preset.run.max_passes,
            "concurrency": self.preset.run.concurrency,
            "totals": totals,
            "trust": summary.trust,
            "endpoint": self.keeper.describe() if self.keeper else {
                "engine": self.preset.endpoint.engine, "state": "not running"},
            "endpoints": [{**k.describe(), "slots": self._replica_slots,
                           "slots_used": self._replica_slots - self.replica_slots[i].value}
                          for i, k in enumerate(self.keepers)]
            if len(self.keepers) > 1 or self.executor else None,
            "thresholds": {"warn_secs": self.preset.watchdog.warn_secs,
                           "stuck_secs": self.preset.watchdog.stuck_secs},
            "baseline": self.preset.baseline.model_dump() if self.preset.baseline else None,
            "publish": self.publish_state,
            "spend": {"prompt_tokens": led.spend.prompt,
                      "completion_tokens": led.spend.completion,
                      "usd": led.spend.usd(self.preset.rate_card.get(self.preset.model))},
            "throttle": {"limit": self.throttle.limit, "ceiling": self.throttle.ceiling,
                         "throttled": self.throttle.throttled},
        }
        if light:
            return snap
        cells = list(led.cells.values())
        arms, tasks = [a.label for a in self.preset.arms], [t.id for t in self.preset.tasks]
        empty = led.counts([])
        snap["arms"] = {a: summary.arms.get(a, empty) for a in arms}
        snap["tasks"] = {a: {t: summary.tasks.get((a, t), empty) for t in tasks} for a in arms}
        snap["running"] = [
            {"cell": c.id, "attempt": c.attempts, "pid": c.pid,
             "frozen_secs": round(c.frozen_secs, 1), "tier": c.tier,
             "last_signal": c.last_signal, "started_at": c.started_ts}
            for c in cells if c.status == "running"
        ]
        snap["recent_cells"] = led.recent[-10:]
        snap["fails"] = led.fails[-20:]
        snap["anomaly"] = {"streak": self.streak.count, "alarms": self.anomaly_alarms}
        snap["orphans_cleaned"] = self.orphans_cleaned
        snap["arms_order"] = [a.label for a in self.preset.arms]
        snap["tasks_order"] = [t.id for t in self.preset.tasks]
        return snap

    def _write_metrics(self, snap: dict[str, Any]) -> None:
        """The node_exporter textfile (--metrics-textfile), from the same snapshot."""
        from autopilot import metrics
        from autopilot.liveness import FINAL_PHASES, Liveness

        assert self.opts.metrics_textfile is not None
        live = Liveness("finished" if self.phase in FINAL_PHASES else "live", 0.0, "")
        try:
            metrics.write_textfile(self.opts.metrics_textfile, self.ledger, snap, live)
        except OSError as e:  # monitoring must never end the run
            log.warning("metrics_textfile_failed", path=str(self.opts.metrics_textfile),
                        error=str(e))

    def _on_tick(self, cid: str, state: Any, tier: str) -> None:
        self.apply_tick(cid, self.clock() - state.last_transcript, tier, state.last_signal)

    def apply_tick(self, cid: str, frozen_secs: float, tier: str, last_signal: Any) -> None:
        """A running cell's watchdog tick (from here, or from a node's actor)."""
        cell = self.ledger.cells.get(cid)
        if cell is not None:
            cell.frozen_secs = frozen_secs
            changed = tier != cell.tier
            cell.tier = tier
            cell.last_signal = last_signal
            # frozen_secs moves on every tick; rewriting status.json for that alone is
            # only worth it every few seconds (a tier change is written at once).
            now = self.clock()
            if changed or now - self._tick_marked >= TICK_STATUS_SECS:
                self._tick_marked = now
                self.status.mark()

    # ------------------------------------------------------------------ start-up

    def _replay(self) -> None:
        result = read_events(self.state_dir / "journal.jsonl")
        if result.torn_lines:
            log.warning("journal_torn_lines_skipped", lines=result.torn_lines)
        for ev in result.events:
            self.ledger.apply(ev)
            if ev.get("event") == "milestone" and ev.get("kind") == "arm_complete":
                self.announced_arms.add(str(ev.get("arm")))

    async def _sweep_orphans(self) -> None:
        """Kill what a dead predecessor left running (in a worker thread: kills wait);
        its cells go back to pending (journaled from the loop)."""
        journal = self.state_dir / "journal.jsonl"
        cells = list(self.ledger.cells.values())
        grace = self.preset.watchdog.kill_grace_secs
        exited: dict[tuple[str, int], RunOutcome] | None = None
        refused: sweep.Refusals = []
        for cell, pids in await anyio.to_thread.run_sync(
                sweep.orphan_cells, cells, journal, grace, self.run_token, refused):
            self.orphans_cleaned.append({"cell": cell.id, "pids": pids})
            if exited is None:  # read only when a predecessor left cells running
                exited = attempt_outcomes(read_events(journal).events)
            outcome = self._finished_outcome(cell, exited, killed=cell.pid in pids)
            if outcome is not None:
                # The harness finished before its supervisor died: grade that work
                # rather than throw away (maybe) an hour of GPU time.
                self.adopted.append((cell.id, cell.attempts, outcome))
                self.emit("cell_adopted", cell=cell.id, attempt=cell.attempts,
                          why="harness finished before the supervisor died",
                          outcome=asdict(outcome))
                continue
            self.emit("cell_abandoned", cell=cell.id, attempt=cell.attempts,
                      why="supervisor restarted", killed_pids=pids)
        endpoint = await anyio.to_thread.run_sync(sweep.orphan_endpoint, journal,
                                                  self.run_token, refused)
        for r in refused:
            self.emit("journal_pid_refused", **r, why="named by the journal, but the process "
                      "carries neither this run's marker nor is our descendant: not signalled")
        if endpoint:
            self.orphans_cleaned.append(endpoint)
        # Last, what no journal line records (a spawn the predecessor died before writing).
        for found in await anyio.to_thread.run_sync(sweep.orphan_marked, self.run_token, grace):
            self.orphans_cleaned.append({**found, "unjournaled": True})
            self.emit("orphan_killed", cell=found["cell"], pids=found["pids"],
                      why="spawned by a predecessor killed before journaling it")

    def _finished_outcome(self, cell: Any, exited: dict[tuple[str, int], RunOutcome],
                          killed: bool) -> RunOutcome | None:
        """The outcome of a journaled-running attempt whose completion artifacts are all
        there and newer than its start; else None. A harness still alive then (``killed``
        by the sweep) had finished its work and hung in teardown: teardown-masked."""
        ctx = cell_context(self.preset, self.plan.by_id[cell.id], cell.attempts,
                           self.state_dir)
        started = parse_iso(cell.started_ts)
        for tmpl in self.preset.harness.completion:
            try:
                mtime = Path(render(tmpl, ctx)).stat().st_mtime
            except OSError:
                return None
            if started is None or mtime < started - 1.0:  # a stale file of another attempt
                return None
        if killed:
            return RunOutcome(exit_code=None, killed="teardown", completion=True)
        known = exited.get((cell.id, cell.attempts))
        return known if known is not None and known.completion else RunOutcome(
            exit_code=None, completion=True)

    async def _grade_adopted(self) -> None:
        for cid, attempt, outcome in self.adopted:
            run = CellRun(self._cell_context(), self.plan.by_id[cid], attempt)
            if self.preset.grader.mode == "per-arm":
                self.emit("cell_ran", cell=cid, attempt=attempt, outcome=asdict(outcome))
            else:
                self._record_verdict(cid, attempt, await run.judge(outcome))
        self.adopted.clear()

    def _record_plan(self) -> None:
        path = self.state_dir / "plan.json"
        recorded = read_json(path)
        if isinstance(recorded, dict) and recorded.get("identity") != self.plan.identity:
            self.emit("plan_changed", old=recorded.get("identity"), new=self.plan.identity)
        # Enough for read-only tools (validate, report, dashboard) to rebuild the plan.
        atomic_write_json(path, {
            "preset": self.preset.name, "preset_path": self.opts.preset_path,
            "config_path": self.opts.config_path, "target_n": self.plan.target_n,
            "identity": self.plan.identity,
            "tasks": [t.id for t in self.preset.tasks],
            "arms": [a.label for a in self.preset.arms], "recorded_at": iso(),
        })
        if self.opts.identity:
            with open_append(self.state_dir / "identity.jsonl", binary=False) as f:
                f.write(json.dumps(self.opts.identity) + "\n")
        for w in self.opts.warnings:
            log.warning("preflight_warning", warning=w)

    # ------------------------------------------------------------------ the run

    async def run(self) -> int:
        """Drive the run; returns the process exit code. The caller took care of config
        and state-dir validation; the lock is taken here (raises LockHeld)."""
        check_plan_identity(self.state_dir, self.plan, self.opts.allow_plan_change)
        self.lock.acquire()
        try:
            # Logging starts only once we own the run: a refused second supervisor
            # must not even append to the holder's autopilot.log.
            logsetup.configure(self.state_dir / "autopilot.log", console=self.opts.console_log,
                               secrets=secret_values(self.preset),
                               console_floor="warning" if self.opts.live_view else None)
            self.journal = Journal(self.state_dir / "journal.jsonl")
            self._replay()
            self._record_plan()
            enable_subreaper()
            self.lock.beat(self.phase)
            remove_stale_temps(self.state_dir)
            await self._sweep_orphans()
            return await self._drive()
        except BaseException as e:
            disk = storage_error(e)
            if disk is None:
                raise
            return self._disk_full(disk)
        finally:
            if self.journal is not None:
                self.journal.close()
            self.lock.release()

    def _disk_full(self, err: OSError) -> int:
        """ENOSPC / EIO / EDQUOT / EROFS anywhere: every cell task has been cancelled (and
        killed its tree) and the endpoint stopped on the way out; say so in one line and
        record what still fits. The journal holds only whole lines (Journal.append cuts a
        partial one back), so a resume after space is freed counts nothing twice."""
        where = err.filename or self.state_dir
        why = "disk full" if err.errno in (errno.ENOSPC, errno.EDQUOT) else (
            f"storage error ({errno.errorcode.get(err.errno or 0, err.errno)})")
        self.phase = "INCOMPLETE"
        self.outcome_reason = f"{why}: {where}"
        with contextlib.suppress(OSError, AssertionError):
            self.emit("run_finished", outcome="INCOMPLETE", reason=self.outcome_reason)
        with contextlib.suppress(OSError):
            self.phase_final_write()
        print(f"AUTOPILOT_INCOMPLETE {term(self.outcome_reason, 1000)}", flush=True)
        return EXIT_INCOMPLETE

    async def _docker_setup(self) -> Any:
        """Connect to Docker when the preset needs it, wire the sandbox hooks, and sweep
        containers a dead predecessor left: ours by label, harness sandboxes of this
        plan by their exact names."""
        if not needs_docker(self.preset):
            return None
        # aiodocker (and aiohttp) load only when a preset needs Docker: -0.1 s of start-up
        from autopilot.sandbox import Docker

        docker = Docker()
        template = self.preset.harness.sandbox_container
        if template:
            self.remove_sandbox = docker.remove

            async def activity(ctx: dict[str, str]) -> int | None:
                return await docker.activity(render(template, ctx))

            self.sandbox_activity = activity
            names = [render(template, self._static_ctx(c)) for c in self.plan.cells]
            for name in await docker.remove_exact(names):
                self.orphans_cleaned.append({"container": name})
        for name in await docker.remove_labelled(str(self.state_dir)):
            self.orphans_cleaned.append({"container": name})
        if self.orphans_cleaned:
            log.info("orphans_swept", cleaned=self.orphans_cleaned)
        return docker

    def _static_ctx(self, cell: Any) -> dict[str, str]:
        return cell_context(self.preset, cell, 1, self.state_dir)

    def _make_keepers(self) -> None:
        """One endpoint and keeper per replica (usually one). With several, every event a
        keeper journals names its replica."""
        n = self.preset.endpoint.replicas
        setting, group = self._pending_group()
        per = self._replica_slots
        if self.preset.backend.kind == "ray":
            from autopilot.rayexec import RayExecutor  # only with the [ray] extra

            self.executor = RayExecutor(self)
            self.keepers = list(self.executor.keepers)
            self.replica_slots = [anyio.Semaphore(per if n > 1 else self.preset.run.concurrency)
                                  for _ in range(n)]
            self.keeper = self.keepers[0]
            return
        self.executor = LocalExecutor(self)
        for i in range(n):
            ep = make_endpoint(self.preset, self.state_dir, i)
            ep.arm_setting, ep.arm_group = setting, group
            if n == 1:
                k = Keeper(ep, self.emit, self.milestone, self.clock)
            else:
                k = Keeper(ep, partial(self.emit, replica=i),
                           partial(self.milestone, replica=i), self.clock)
            k.on_throttled = self._throttled
            self.keepers.append(k)
            self.replica_slots.append(anyio.Semaphore(per if n > 1 else
                                                      self.preset.run.concurrency))
        self.keeper = self.keepers[0]

    @property
    def _replica_slots(self) -> int:
        """Cells at once per replica: ``[endpoint] slots``, else concurrency split evenly."""
        n = self.preset.endpoint.replicas
        return self.preset.endpoint.slots or -(-self.preset.run.concurrency // n)

    async def _start_replicas(self) -> None:
        """Start every replica at once; raise only when none could start (the others
        then serve: one replica down slows the run, it does not stop it)."""
        errors: dict[int, str] = {}

        async def one(i: int, k: Keeper) -> None:
            try:
                await k.start()
            except EndpointError as e:
                errors[i] = str(e)
                k.failed = f"replica {i}: {e}"

        if len(self.keepers) == 1:
            await self.keepers[0].start()
            return
        async with anyio.create_task_group() as tg:
            for i, k in enumerate(self.keepers):
                tg.start_soon(one, i, k)
        if len(errors) == len(self.keepers):
            raise EndpointError("; ".join(f"replica {i}: {e}" for i, e in errors.items()))
        for i, why in errors.items():
            self.milestone("endpoint_failed", why=f"replica {i} did not start: {why}",
                           replica=i)

    def _endpoint_failed(self) -> str | None:
        """Why no replica can serve any more, or None while one can."""
        fails: list[str | None] = [k.failed for k in self.keepers]
        if not fails or not all(fails):
            return None
        if len(fails) == 1:
            return fails[0]
        return "; ".join(f if f and f.startswith("replica ") else f"replica {i}: {f}"
                         for i, f in enumerate(fails))

    async def _drive(self) -> int:
        docker = await self._docker_setup()
        self._make_keepers()
        code = EXIT_INCOMPLETE
        try:
            async with anyio.create_task_group() as tg:
                tg.start_soon(self.status.run)
                tg.start_soon(self.notifier.run)
                tg.start_soon(self._signals, tg.cancel_scope)
                tg.start_soon(self._heartbeat)
                if self.opts.live_view:
                    from autopilot import liveview  # rich: only on a terminal

                    tg.start_soon(liveview.show, self.snapshot)
                if isinstance(self.clock, RunClock):
                    tg.start_soon(self._clock_ticker)
                await self.status.write_now()
                if self.ledger.complete():
                    # Nothing to run (e.g. a re-run with --publish): no endpoint needed.
                    self.emit("run_started", target_n=self.plan.target_n,
                              identity=self.plan.identity, pid=os.getpid(),
                              preset=self.preset.name, already_complete=True)
                    code = await self._finish()
                    await self.notifier.drain(self.preset.notify.timeout_secs + 1)
                    tg.cancel_scope.cancel()
                    return code
                try:
                    # A 397B load can take half an hour: a stop signal must not wait for it.
                    with self._interruptible() as scope:
                        await self._start_replicas()
                except EndpointError as e:
                    self.outcome_reason = f"endpoint failed to start: {e}"
                    self.milestone("endpoint_failed", why=str(e))
                else:
                    if scope.cancelled_caught:
                        code = await self._finish()
                        tg.cancel_scope.cancel()
                        return code
                    for k in self.keepers:
                        if not k.failed:
                            tg.start_soon(k.watch)
                    self.emit("run_started", target_n=self.plan.target_n,
                              identity=self.plan.identity, pid=os.getpid(),
                              preset=self.preset.name)
                    sdnotify.notify("READY=1")
                    self.milestone("run_started", target_n=self.plan.target_n,
                                   cells=len(self.plan.cells))
                    await self._passes()
                code = await self._finish()
                await self.notifier.drain(self.preset.notify.timeout_secs + 1)
                tg.cancel_scope.cancel()
        finally:
            with anyio.CancelScope(shield=True):
                sdnotify.notify("STOPPING=1")
                for k in self.keepers:
                    await k.ep.stop()
                    await k.ep.aclose()
                    with contextlib.suppress(OSError):
                        self.redactor.scrub_file(k.ep.log_path)
                    if not k.ep.attached and k.state not in ("failed", "lost"):
                        k.state = "stopped"
                if self.executor is not None:
                    await self.executor.close()
                if docker is not None:
                    await docker.close()
                self.phase_final_write()
        return code

    def phase_final_write(self) -> None:
        try:
            snap = self.snapshot()
            atomic_write_json(self.state_dir / "status.json", snap)
            if self.opts.metrics_textfile:
                self._write_metrics(snap)
            self.lock.beat(self.phase)
        except OSError as e:  # a full disk: the run is ending anyway; the journal decides
            log.error("final_status_write_failed", error=str(e))

    def _pending_group(self) -> tuple[ArmEndpoint, tuple[str, ...]]:
        """The first arm group (by endpoint settings) with cells to run."""
        groups = arm_groups(self.preset)
        pending = {c.arm for c in self.ledger.pending()}
        return next((g for g in groups if pending & set(g[1])), groups[0])

    async def _passes(self) -> None:
        await self._grade_adopted()
        if self.preset.grader.mode == "per-arm":
            await self._grade_ready_arms(force=True)  # ran before a restart, not graded
        assert self.keeper is not None
        groups = arm_groups(self.preset)
        for setting, arms in groups:
            if self.stop_signal or self.paused:
                return
            if not any(c.arm in arms for c in self.ledger.pending()):
                continue
            if len(groups) > 1 and self.keeper.ep.arm_group != arms:
                # The arm's mode is an endpoint setting: restart it configured for them.
                try:
                    with self._interruptible() as scope:
                        await self.keeper.reconfigure(setting, arms)
                except EndpointError as e:
                    self.outcome_reason = f"endpoint failed to start for {', '.join(arms)}: {e}"
                    self.milestone("endpoint_failed", why=self.outcome_reason)
                    return
                if scope.cancelled_caught:
                    return
            await self._group_passes(set(arms))
            if self._endpoint_failed():
                return

    async def _group_passes(self, arms: set[str]) -> None:
        for pass_no in range(1, self.preset.run.max_passes + 1):
            if self.stop_signal or self.paused or self.ledger.complete():
                return
            pending = [c for c in self.ledger.pending() if c.arm in arms]
            if not pending:
                return
            self.pass_no = pass_no
            self.phase = f"run:pass{pass_no}"
            self.emit("pass_started", **{"pass": pass_no, "pending": len(pending)})
            await self._run_pass(pending)
            failed = self._endpoint_failed()
            if failed:
                self.outcome_reason = failed
                return
            if self.preset.grader.mode == "per-arm" and not self.stop_signal:
                await self._grade_ready_arms(force=True)

    async def _run_pass(self, pending: list[Any]) -> None:
        assert self.keeper is not None
        slots = anyio.Semaphore(self.preset.run.concurrency)
        async with anyio.create_task_group() as tg:
            for cell_state in pending:
                await slots.acquire()
                self._check_budget()  # a resumed run may already be past it
                if self.stop_signal or self.paused:
                    slots.release()
                    break
                cell = self.plan.by_id[cell_state.id]
                replica: int | None = None
                try:
                    with self._interruptible():  # an outage must not hold up a stop
                        replica = await self._pick_replica(cell.arm)
                except EndpointFailed:
                    # Not raised through the task group (it would arrive wrapped in an
                    # ExceptionGroup): running cells finish, the pass ends, the run stops.
                    slots.release()
                    break
                if self.stop_signal or replica is None:  # stopped while waiting
                    if replica is not None:
                        self.replica_slots[replica].release()
                    slots.release()
                    break
                await self._throttle_gate(slots)
                tg.start_soon(self._run_cell, cell, cell_state.attempts + 1, slots, replica)

    async def _pick_replica(self, arm: str) -> int:
        """A replica that may serve ``arm`` (its pins), is up and has a free slot: the
        one with the most free slots. Raises EndpointFailed when none of them can ever
        serve again."""
        if len(self.keepers) == 1:
            await self.keepers[0].wait_up()  # raises EndpointFailed once given up
            self.replica_slots[0].acquire_nowait()  # sized to the concurrency: never waits
            return 0
        allowed = self.preset.arm(arm).replicas
        while True:
            choice = choose_replica([
                ReplicaView(up=k.is_up, failed=bool(k.failed), free=self.replica_slots[i].value)
                for i, k in enumerate(self.keepers)], allowed)
            if choice == "none":
                pool = allowed or list(range(len(self.keepers)))
                raise EndpointFailed(self._endpoint_failed()
                                     or f"no replica of {pool} can serve {arm}")
            if choice != "wait":
                self.replica_slots[choice].acquire_nowait()
                return choice
            await anyio.sleep(0.05)

    def _throttled(self) -> None:
        before = self.throttle.limit
        self.throttle = on_throttled(self.throttle, self.clock())
        if self.throttle.limit != before:
            self.emit("launch_throttled", limit=self.throttle.limit,
                      ceiling=self.throttle.ceiling)

    async def _throttle_gate(self, slots: anyio.Semaphore) -> None:
        """While the provider throttles, launch fewer cells at once (autopilot.throttle).
        Cells in flight = slots taken (this one's included): O(1), not a scan of a
        20,000-cell ledger per launch."""
        while True:
            before = self.throttle.limit
            self.throttle = on_tick(self.throttle, self.clock())
            if self.throttle.limit != before:
                self.emit("launch_throttled", limit=self.throttle.limit,
                          ceiling=self.throttle.ceiling)
            in_flight = self.preset.run.concurrency - slots.value - 1  # before this one
            if in_flight < self.throttle.limit or self.stop_signal:
                return
            await anyio.sleep(0.2)

    def _cell_context(self, replica: int = 0) -> CellContext:
        # Built once, at the first cell: the endpoint keeper and the Docker hooks are set
        # by then, and decoding os.environ for every cell is measurable at 200 cells.
        if self._cx is None:
            assert self.keeper is not None
            self._cx = CellContext(
                preset=self.preset, state_dir=self.state_dir, keeper=self.keeper,
                emit=self.emit, stopping=lambda: self.stop_signal is not None,
                forced=lambda: self.forced, clock=self.clock, on_tick=self._on_tick,
                env_overrides={k: v for k, v in os.environ.items()
                               if k.startswith("AUTOPILOT_STALL_")},
                redact=self.redactor.scrub, scrub_file=self.redactor.scrub_file,
                remove_sandbox=self.remove_sandbox,
                sandbox_activity=self.sandbox_activity,
                on_grade_failure=self._on_grade_failure,
                roots=run_roots(self.preset, self.state_dir),
                base_env={**child_env(self.preset, "harness"), RUN_TOKEN_ENV: self.run_token},
            )
        if replica == 0:
            return self._cx
        if replica not in self._cxs:  # the same context, bound to that replica's keeper
            self._cxs[replica] = replace(self._cx, keeper=self.keepers[replica],
                                         replica=replica)
        return self._cxs[replica]

    async def _run_cell(self, cell: Any, attempt: int, slots: anyio.Semaphore,
                        replica: int = 0) -> None:
        assert self.executor is not None
        try:
            try:
                result = await self.executor.run(cell, attempt, replica)
            except Exception as e:  # a bug in our own code must not take the run down
                if storage_error(e) is not None:
                    raise  # a full disk ends the run (Supervisor._disk_full), not the cell
                log.exception("cell_internal_error", cell=cell.id)
                self.emit("cell_abandoned", cell=cell.id, attempt=attempt,
                          why=f"internal error: {type(e).__name__}: {e}")
                return
            if result is not None:
                self._record_verdict(cell.id, attempt, result)
        finally:
            slots.release()
            if self.replica_slots:
                self.replica_slots[replica].release()
        if self.preset.grader.mode == "per-arm":
            await self._grade_ready_arms(force=False)

    async def _grade_ready_arms(self, force: bool) -> None:
        """Grade the ``ran`` cells of every arm with nothing left to run (or of every arm,
        with ``force``, at the end of a pass so retries can go in the next one)."""
        async with self._grading:
            for arm in self.preset.arms:
                cells = [c for c in self.ledger.cells.values() if c.arm == arm.label]
                ran = [c for c in cells if c.status == "ran"]
                if not ran:
                    continue
                busy = any(c.status in ("running", "pending", "invalid") for c in cells)
                if busy and not force:
                    continue
                self.emit("arm_grading", arm=arm.label, cells=len(ran))
                for c in ran:
                    run = CellRun(self._cell_context(), self.plan.by_id[c.id], c.attempts)
                    outcome = RunOutcome(**(c.ran_outcome or {}))
                    self._record_verdict(c.id, c.attempts, await run.judge(outcome))

    def _record_verdict(self, cid: str, attempt: int, c: Classification, *,
                        regrade: bool = False) -> None:
        extra: dict[str, Any] = {"ungraded": True} if c.grade_side else {}
        if regrade:
            extra["regrade"] = True
        else:
            spent = self._attempt_spend(cid)
            extra["spend"] = [spent.prompt, spent.completion]
        self.emit("cell_verdict", cell=cid, attempt=attempt, verdict=c.verdict, reason=c.reason,
                  word=c.word, caveat=c.caveat, teardown_masked=c.teardown_masked,
                  detail=c.detail, **extra)
        state = self.ledger.cells[cid]
        if c.reason == "rate_limited":
            self._throttled()  # the harness saw the provider throttle: launch fewer
        if c.verdict in ("PASS", "FAIL"):
            self.done_this_session += 1
        elif not c.grade_side and should_quarantine(state.invalid_attempts,
                                                    self.preset.trust.infra_retries):
            self.emit("cell_quarantined", cell=cid, attempts=state.attempts,
                      reasons=state.reasons)
        if not regrade:  # the streak is about fresh runs and fresh grades
            self._streak_step(cid, c)
            self._check_budget()
        self._maybe_arm_complete(state.arm)

    def _attempt_spend(self, cid: str) -> Spend:
        """What the attempt's summary says it used (its tokens; 0 without a summary)."""
        ctx = self._static_ctx(self.plan.by_id[cid])
        return budget.of_summary(read_json(Path(render(self.preset.harness.summary, ctx))))

    def _check_budget(self) -> None:
        b = self.preset.budget
        if self.paused or (b.tokens is None and b.usd is None):
            return
        why = budget.reached(b.tokens, b.usd, self.ledger.spend,
                             self.preset.rate_card.get(self.preset.model))
        if why:
            self.paused = f"{why}; launching stopped (raise [budget] to go on)"
            self.emit("launching_paused", why=self.paused)
            self.milestone("budget_reached", why=why)

    def _on_grade_failure(self, cid: str, c: Classification) -> None:
        self._streak_step(cid, c)

    def _streak_step(self, cid: str, c: Classification) -> None:
        launched = c.launched if c.launched is not None else time.time()
        self.streak, fire = streak_step(self.streak, c.streak_kind, launched,
                                        self.preset.trust.anomaly_streak)
        if not fire:
            return
        self.anomaly_alarms += 1
        pause = self.preset.trust.on_anomaly == "pause"
        self.milestone("harness_anomaly", alarm=self.anomaly_alarms,
                       streak=self.streak.count, last_cell=cid, reason=c.reason or c.word,
                       advice="harness or grader looks broken; check the launcher and "
                              "grade logs" + ("; launching paused" if pause else ""))
        if pause and not self.paused:
            self.paused = (f"paused after a harness-break streak of {self.streak.count} "
                           f"(last {cid}: {c.label()}{' ' + c.word if c.word else ''}); "
                           "fix the harness, then re-run the same command")
            self.emit("launching_paused", why=self.paused)

    def _maybe_arm_complete(self, arm: str) -> None:
        if arm not in self.announced_arms and all(
            x.valid for x in self.ledger.cells.values() if x.arm == arm
        ):
            self.announced_arms.add(arm)
            counts = self.ledger.counts([x for x in self.ledger.cells.values() if x.arm == arm])
            self._write_arm_summary(arm)
            self.milestone("arm_complete", arm=arm, passed=counts["pass"], valid=counts["done"])

    def _write_arm_summary(self, arm: str) -> None:
        """summary-<arm>.txt, the origin's PASS/FAIL table, when an arm finishes."""
        from autopilot import report

        try:
            # From the ledger (the journal's verdicts), not by re-reading every artifact:
            # the run knows its verdicts; `autopilot summarize` re-derives them from disk.
            facts = report.facts_from_cells(
                [c for c in self.ledger.cells.values() if c.arm == arm])
            atomic_write_text(self.state_dir / f"summary-{arm}.txt",
                              report.arm_summary(self.preset, facts, arm))
        except OSError as e:
            log.warning("summary_write_failed", arm=arm, error=str(e))

    async def _finish(self) -> int:
        if self.stop_signal:
            self.phase = "stopped"
            self.outcome_reason = f"stopped by {signal.Signals(self.stop_signal).name}"
            self.emit("run_finished", outcome="stopped", reason=self.outcome_reason)
            # One line for the person who pressed Ctrl-C: how far, and how to go on.
            resume = f"; resume with: {self.opts.resume_command}" if self.opts.resume_command \
                else ""
            print(f"AUTOPILOT_STOPPED by {signal.Signals(self.stop_signal).name}: "
                  f"{self.progress_line()}{resume}", file=sys.stderr, flush=True)
            return EXIT_SIGINT if self.stop_signal == signal.SIGINT else EXIT_SIGTERM
        if self.ledger.complete():
            self.phase = "COMPLETE"
            self.outcome_reason = ""
            self.emit("run_finished", outcome="COMPLETE")
            self.milestone("run_complete", trust=self.ledger.trust()["invalid_by_reason"])
            if self.opts.publish:
                await self._publish()
            print("AUTOPILOT_COMPLETE", flush=True)
            return EXIT_COMPLETE
        self.phase = "INCOMPLETE"
        trust = self.ledger.trust()
        if self.paused and not self.outcome_reason:
            self.outcome_reason = self.paused
        if not self.outcome_reason:
            q = [e["cell"] for e in trust["excluded"] if e["status"] == "quarantined"]
            ungraded = [c.id for c in self.ledger.cells.values()
                        if c.status == "ungraded" and not self.ledger.settled(c)]
            pending = self.ledger.pending()
            if q:
                self.outcome_reason = f"{len(q)} quarantined: {', '.join(q[:5])}"
            elif ungraded and not pending:
                self.outcome_reason = (
                    f"{len(ungraded)} ungraded (grading failed; their runs stand): "
                    f"{', '.join(ungraded[:5])}; fix the grader, then `autopilot regrade`")
            else:
                self.outcome_reason = f"max passes ({self.preset.run.max_passes}) reached"
        self.emit("run_finished", outcome="INCOMPLETE", reason=self.outcome_reason)
        self.milestone("run_incomplete", why=self.outcome_reason,
                       excluded=[e["cell"] for e in trust["excluded"]][:10])
        print(f"AUTOPILOT_INCOMPLETE {term(self.outcome_reason, 1000)}", flush=True)
        return EXIT_INCOMPLETE

    async def _publish(self) -> None:
        """scorecard.md + findings.md into the state dir, then a commit on the results
        branch. A failure (a git error, a hostile value in an artifact, a full disk) is
        logged as an error (on the console even with --quiet), journaled, shown in status
        and notified; the run stays
        COMPLETE and exits 0: a restart under Restart=on-failure would not fix it."""
        repo = str(self.opts.results_repo or self.preset.publish.results_repo or os.getcwd())
        try:
            res = await self._publish_now(Path(repo))
        except Exception as e:
            log.exception("publish_crashed")
            res = None
            self.publish_state = {"ok": False, "error": f"{type(e).__name__}: {clean(e)}"}
        else:
            self.publish_state = {"ok": res.ok, "repo": repo, "branch": res.branch,
                                  "commit": res.commit, "created": res.created,
                                  "error": res.error}
        if res is not None and res.ok:
            self.emit("published", **self.publish_state)
            return
        with contextlib.suppress(OSError):  # an error: on the console even with --quiet
            self.emit("publish_failed", **self.publish_state)
            self.milestone("publish_failed", why=self.publish_state["error"])

    async def _publish_now(self, repo: Path) -> Any:
        from autopilot import publish, report

        n = self.plan.target_n
        facts = await anyio.to_thread.run_sync(report.collect, self.preset, n, self.state_dir)
        card = report.scorecard(self.preset, facts, n)
        found = report.findings(self.preset, facts, n, report.plan_changes(self.state_dir))
        atomic_write_text(self.state_dir / "scorecard.md", card)
        atomic_write_text(self.state_dir / "findings.md", found)
        prefix = self.preset.publish.path.replace("{preset}", self.preset.name).strip("/")
        files = {f"{prefix}/scorecard.md": card, f"{prefix}/findings.md": found}
        msg = f"bench-autopilot: {self.preset.name} ({self.preset.model}) N={n} scorecard"
        return await anyio.to_thread.run_sync(publish.publish, repo, files, msg)

    # ------------------------------------------------------------------ background

    @contextlib.contextmanager
    def _interruptible(self) -> Iterator[anyio.CancelScope]:
        """A scope the first stop signal cancels (waits that are not cell work)."""
        scope = anyio.CancelScope()
        if self.stop_signal is not None:
            scope.cancel()
        self._stop_scopes.add(scope)
        try:
            with scope:
                yield scope
        finally:
            self._stop_scopes.discard(scope)

    async def _signals(self, scope: anyio.CancelScope) -> None:
        # Signals become events (uvicorn): the handler only records; the loop acts.
        with anyio.open_signal_receiver(signal.SIGINT, signal.SIGTERM) as signals:
            async for sig in signals:
                if self.stop_signal is None:
                    self.stop_signal = sig
                    for s in list(self._stop_scopes):
                        s.cancel()
                    log.warning("stop_requested", signal=signal.Signals(sig).name,
                                note="terminating running cells; a second signal forces")
                    self.status.mark()
                else:
                    self.forced = True
                    log.warning("stop_forced", signal=signal.Signals(sig).name)

    async def _clock_ticker(self) -> None:
        """Read the run clock every TICK seconds: a longer silence is then the
        supervisor's own absence (SIGSTOP), never the cells' (see autopilot.clock)."""
        assert isinstance(self.clock, RunClock)
        seen = self.clock.absent
        while True:
            self.clock()
            if self.clock.absent > seen:  # whichever reading noticed it first
                log.warning("supervisor_was_frozen", secs=round(self.clock.absent - seen, 1),
                            note="excluded from every watchdog and deadline")
                seen = self.clock.absent
            await anyio.sleep(TICK)

    async def _heartbeat(self) -> None:
        interval = beat_interval()
        while True:
            await anyio.to_thread.run_sync(self.lock.beat, self.phase)
            reap_adopted()  # zombies of orphans re-parented to us (we are the subreaper)
            sdnotify.notify("WATCHDOG=1")
            line = self.progress_line()
            if line != self._last_status_line:
                self._last_status_line = line
                sdnotify.notify(f"STATUS={line}")
            await anyio.sleep(interval)


def snapshot_once(preset: Preset, plan: Plan, state_dir: Path) -> dict[str, Any]:
    """``--once``: a status snapshot rebuilt from the journal, without driving anything."""
    sup = Supervisor(preset, plan, RunOptions(state_dir))
    sup._replay()
    sup.phase = "COMPLETE" if sup.ledger.complete() else "stopped"
    prior = read_json(state_dir / "status.json")
    if isinstance(prior, dict) and prior.get("started_at"):
        sup.started_at = prior["started_at"]
    return sup.snapshot()
