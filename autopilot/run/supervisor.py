"""The supervisor: one anyio task group that drives a run to its target N.

Order of a start, chosen so that bad input and double drive touch nothing:
  1. validate the state dir and the plan identity (read-only);
  2. take the run lock (exit 3 if another supervisor holds it);
  3. replay the journal, sweep orphans a SIGKILLed predecessor left (autopilot.run.recovery),
     start the endpoint replicas (through the backend);
  4. passes: each sweeps the pending cells in plan order, ``concurrency`` at a time
     (autopilot.run.passes).
Every state change goes through ``emit``: journal append (fsync'd) -> ledger.apply ->
log -> status mark. A resumed run and one that never stopped therefore cannot disagree.

The loop only records and applies: what a verdict, a grading failure or a budget tick
means for the run is decided by the pure run policy (autopilot.run.runbook), which answers
with effects the loop applies in order; status.json is built from plain data
(autopilot.run.snapshot). The supervisor is the backend's ``Port`` (emit, milestone,
tick, grade_failure, throttled, stopping, forced): a backend reports through those and
never sees the rest.
"""

from __future__ import annotations

import contextlib
import errno
import os
import signal
import socket
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import anyio

from autopilot import logsetup, sdnotify
from autopilot.backends.base import Backend, Keeper, Wiring, backend_class
from autopilot.cell.childenv import secret_values, urls_from_env
from autopilot.cell.procs import enable_subreaper, reap_adopted, run_token
from autopilot.cell.validity import Classification
from autopilot.config import Preset
from autopilot.errors import (
    EXIT_COMPLETE,
    EXIT_INCOMPLETE,
    EXIT_SIGINT,
    EXIT_SIGTERM,
    EndpointError,
)
from autopilot.escape import term
from autopilot.logsetup import get_logger
from autopilot.plan import Plan
from autopilot.run import recovery, runbook
from autopilot.run.clock import TICK, RunClock
from autopilot.run.notify import MILESTONES, Notifier
from autopilot.run.passes import Passes
from autopilot.run.snapshot import RunView, build
from autopilot.run.throttle import Throttle, on_throttled
from autopilot.state import budget
from autopilot.state.fsguard import remove_stale_temps
from autopilot.state.fsutil import atomic_write_json, atomic_write_text, iso, storage_error
from autopilot.state.journal import Journal
from autopilot.state.ledger import Ledger
from autopilot.state.lock import RunLock, beat_interval
from autopilot.state.progress import oneline
from autopilot.state.status import StatusWriter
from autopilot.templates import render

log = get_logger(__name__)

TICK_STATUS_SECS = 5.0

# Log levels that mean something: a warning is the run healing itself, an error is
# something a person must look at (shown on the console even with --quiet).
WARNING_EVENTS = frozenset({"cell_killed", "endpoint_down", "endpoint_restart",
                            "cell_quarantined", "unsafe_path_refused", "journal_pid_refused",
                            "notify_failed", "launching_paused"})
ERROR_EVENTS = frozenset({"endpoint_failed", "harness_anomaly", "publish_failed"})


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
    live_view: bool = False  # a terminal: the progress panel (autopilot.run.liveview)
    metrics_textfile: Path | None = None  # node_exporter textfile, see autopilot.views.metrics


class Supervisor:
    def __init__(self, preset: Preset, plan: Plan, opts: RunOptions, *,
                 clock: Callable[[], float] | None = None) -> None:
        self.preset = preset
        self.plan = plan
        self.opts = opts
        self.state_dir = opts.state_dir
        # The run clock (absence excluded) unless a test drives time itself.
        self.clock: Callable[[], float] = RunClock() if clock is None else clock
        self.notifier = Notifier(
            [*preset.notify.urls, *urls_from_env()], opts.notify_config,
            cooldown_secs=preset.notify.cooldown_secs, timeout_secs=preset.notify.timeout_secs,
            on_failure=self._notify_failed, clock=self.clock,
        )
        self.ledger = Ledger(plan)
        self.journal: Journal | None = None
        self.lock = RunLock(self.state_dir)
        self.backend: Backend | None = None  # where cells run: made in _drive
        self.rules = runbook.Rules.of(preset)
        self.policy = runbook.Policy()
        self.passes = Passes(self)
        self.phase = "starting"
        self.outcome_reason = ""
        self.started_at = iso()
        self.t0 = self.clock()
        self.done_this_session = 0
        self.swept = recovery.Swept()
        self.stop_signal: int | None = None
        self._forced = False
        self.throttle = Throttle(preset.run.concurrency, preset.run.concurrency)
        self.status = StatusWriter(
            self.state_dir / "status.json", self.snapshot, preset.run.status_debounce_secs,
            also=self._write_metrics if opts.metrics_textfile else None,
        )
        self._last_status_line = ""
        self._tick_marked = 0.0
        self._stop_scopes: set[anyio.CancelScope] = set()
        self.run_token = run_token(self.state_dir)
        self.publish_state: dict[str, Any] | None = None
        self.redactor = logsetup.Redactor(secret_values(preset))
        self._docker: recovery.DockerWiring | None = None

    @property
    def keepers(self) -> list[Keeper]:
        return list(self.backend.keepers) if self.backend is not None else []

    @property
    def paused(self) -> str | None:
        """Why launching stopped (an anomaly pause, a budget), if it did."""
        return self.policy.paused

    # ------------------------------------------------------------------ the port

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

    def tick(self, cid: str, frozen_secs: float, tier: str, last_signal: Any) -> None:
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

    def grade_failure(self, cid: str, c: Classification) -> None:
        self._decide(runbook.on_grade_failure(self.policy, self.rules, cid, c,
                                              now=time.time()))

    def throttled(self) -> None:
        self.set_throttle(on_throttled(self.throttle, self.clock()))

    def stopping(self) -> bool:
        return self.stop_signal is not None

    def forced(self) -> bool:
        return self._forced

    def _notify_failed(self, kind: str, url: str, why: str) -> None:
        if self.journal is not None:
            self.emit("notify_failed", kind=kind, url=url, why=why)

    def set_throttle(self, new: Throttle) -> None:
        before, self.throttle = self.throttle.limit, new
        if new.limit != before:
            self.emit("launch_throttled", limit=new.limit, ceiling=new.ceiling)

    # ------------------------------------------------------------------ policy

    def record_verdict(self, cid: str, attempt: int, c: Classification, *,
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
        self._decide(runbook.on_verdict(self.policy, self.rules, self.ledger, cid, c,
                                        regrade=regrade, now=time.time()))

    def check_budget(self) -> None:
        self._decide(runbook.budget_tick(self.policy, self.rules, self.ledger))

    def _decide(self, decision: runbook.Decision) -> None:
        """Apply what the run policy decided, in order."""
        self.policy, effects = decision
        for fx in effects:
            if isinstance(fx, runbook.Emit):
                self.emit(fx.event, **fx.fields)
            elif isinstance(fx, runbook.Milestone):
                self.milestone(fx.kind, **fx.info)
            elif isinstance(fx, runbook.Throttled):
                self.throttled()  # the harness saw the provider throttle: launch fewer
            elif isinstance(fx, runbook.WriteArmSummary):
                self._write_arm_summary(fx.arm)
            elif isinstance(fx, runbook.CountValid):
                self.done_this_session += 1

    def _attempt_spend(self, cid: str) -> budget.Spend:
        """What the attempt's summary says it used (its tokens; 0 without a summary)."""
        from autopilot.plan import cell_context
        from autopilot.state.fsutil import read_json

        ctx = cell_context(self.preset, self.plan.by_id[cid], 1, self.state_dir)
        return budget.of_summary(read_json(Path(render(self.preset.harness.summary, ctx))))

    def _write_arm_summary(self, arm: str) -> None:
        """summary-<arm>.txt, the origin's PASS/FAIL table, when an arm finishes."""
        from autopilot.views import report

        try:
            # From the ledger (the journal's verdicts), not by re-reading every artifact:
            # the run knows its verdicts; `autopilot summarize` re-derives them from disk.
            facts = report.facts_from_cells(
                [c for c in self.ledger.cells.values() if c.arm == arm])
            atomic_write_text(self.state_dir / f"summary-{arm}.txt",
                              report.arm_summary(self.preset, facts, arm))
        except OSError as e:
            log.warning("summary_write_failed", arm=arm, error=str(e))

    def endpoint_failed(self) -> str | None:
        """Why no replica can serve any more, or None while one can."""
        return runbook.endpoint_failure([k.failed for k in self.keepers])

    # ------------------------------------------------------------------ status

    def snapshot(self, light: bool = False) -> dict[str, Any]:
        keepers = self.keepers
        per = self.passes.per_replica
        slots = self.passes.replica_slots
        return build(RunView(
            preset=self.preset, plan=self.plan, ledger=self.ledger, phase=self.phase,
            outcome_reason=self.outcome_reason, pass_no=self.passes.pass_no,
            started_at=self.started_at, updated_at=iso(), elapsed=self.clock() - self.t0,
            done_this_session=self.done_this_session, throttle=self.throttle,
            pid=os.getpid(), host=socket.gethostname(),
            endpoint=keepers[0].describe() if keepers else None,
            endpoints=[{**k.describe(), "slots": per, "slots_used": per - slots[i].value}
                       for i, k in enumerate(keepers)] if self.backend is not None else None,
            streak=self.policy.streak.count, alarms=self.policy.alarms,
            orphans_cleaned=self.swept.cleaned, publish=self.publish_state,
        ), light)

    def progress_line(self) -> str:
        return oneline(self.snapshot(light=True))

    def _write_metrics(self, snap: dict[str, Any]) -> None:
        """The node_exporter textfile (--metrics-textfile), from the same snapshot."""
        from autopilot.state.liveness import FINAL_PHASES, Liveness
        from autopilot.views import metrics

        assert self.opts.metrics_textfile is not None
        live = Liveness("finished" if self.phase in FINAL_PHASES else "live", 0.0, "")
        try:
            metrics.write_textfile(self.opts.metrics_textfile, self.ledger, snap, live)
        except OSError as e:  # monitoring must never end the run
            log.warning("metrics_textfile_failed", path=str(self.opts.metrics_textfile),
                        error=str(e))

    def phase_final_write(self) -> None:
        try:
            snap = self.snapshot()
            atomic_write_json(self.state_dir / "status.json", snap)
            if self.opts.metrics_textfile:
                self._write_metrics(snap)
            self.lock.beat(self.phase)
        except OSError as e:  # a full disk: the run is ending anyway; the journal decides
            log.error("final_status_write_failed", error=str(e))

    # ------------------------------------------------------------------ the run

    def replay(self) -> None:
        announced = recovery.replay(self.state_dir, self.ledger)
        self.policy = runbook.Policy(announced=frozenset(announced))

    async def run(self) -> int:
        """Drive the run; returns the process exit code. The caller took care of config
        and state-dir validation; the lock is taken here (raises LockHeld)."""
        recovery.check_plan_identity(self.state_dir, self.plan, self.opts.allow_plan_change)
        self.lock.acquire()
        try:
            # Logging starts only once we own the run: a refused second supervisor
            # must not even append to the holder's autopilot.log.
            logsetup.configure(self.state_dir / "autopilot.log", console=self.opts.console_log,
                               secrets=secret_values(self.preset),
                               console_floor="warning" if self.opts.live_view else None)
            self.journal = Journal(self.state_dir / "journal.jsonl")
            self.replay()
            recovery.record_plan(self.state_dir, self.preset, self.plan, self.emit,
                                 preset_path=self.opts.preset_path,
                                 config_path=self.opts.config_path,
                                 identity=self.opts.identity)
            for w in self.opts.warnings:
                log.warning("preflight_warning", warning=w)
            enable_subreaper()
            self.lock.beat(self.phase)
            remove_stale_temps(self.state_dir)
            self.swept = await recovery.sweep_orphans(self.preset, self.plan, self.state_dir,
                                                      self.ledger, self.run_token, self.emit)
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

    def _make_backend(self) -> None:
        """The backend named by the preset, with one keeper per endpoint replica."""
        setting, group = self.passes.pending_group()
        d = self._docker
        w = Wiring(preset=self.preset, state_dir=self.state_dir, run_token=self.run_token,
                   port=self, redactor=self.redactor, clock=self.clock,
                   remove_sandbox=d.remove_sandbox if d else None,
                   sandbox_activity=d.sandbox_activity if d else None)
        self.backend = backend_class(self.preset.backend.kind)(w, setting, group)
        self.passes.make_slots(len(self.backend.keepers))

    async def _start_replicas(self) -> None:
        """Start every replica at once; raise only when none could start (the others
        then serve: one replica down slows the run, it does not stop it)."""
        keepers = self.keepers
        errors: dict[int, str] = {}

        async def one(i: int, k: Keeper) -> None:
            try:
                await k.start()
            except EndpointError as e:
                errors[i] = str(e)
                k.failed = f"replica {i}: {e}"

        if len(keepers) == 1:
            await keepers[0].start()
            return
        async with anyio.create_task_group() as tg:
            for i, k in enumerate(keepers):
                tg.start_soon(one, i, k)
        if len(errors) == len(keepers):
            raise EndpointError("; ".join(f"replica {i}: {e}" for i, e in errors.items()))
        for i, why in errors.items():
            self.milestone("endpoint_failed", why=f"replica {i} did not start: {why}",
                           replica=i)

    async def _drive(self) -> int:
        self._docker = await recovery.docker_setup(self.preset, self.plan, self.state_dir,
                                                   self.swept.cleaned)
        self._make_backend()
        code = EXIT_INCOMPLETE
        try:
            async with anyio.create_task_group() as tg:
                tg.start_soon(self.status.run)
                tg.start_soon(self.notifier.run)
                tg.start_soon(self._signals, tg.cancel_scope)
                tg.start_soon(self._heartbeat)
                if self.opts.live_view:
                    from autopilot.run import liveview  # rich: only on a terminal

                    tg.start_soon(liveview.show, self.snapshot)
                if isinstance(self.clock, RunClock):
                    tg.start_soon(self._clock_ticker)
                await self.status.write_now()
                code, drain = await self._serve(tg)
                if drain:
                    await self.notifier.drain(self.preset.notify.timeout_secs + 1)
                tg.cancel_scope.cancel()
        finally:
            with anyio.CancelScope(shield=True):
                sdnotify.notify("STOPPING=1")
                if self.backend is not None:
                    await self.backend.close()
                if self._docker is not None:
                    await self._docker.docker.close()
                self.phase_final_write()
        return code

    async def _serve(self, tg: Any) -> tuple[int, bool]:
        """Start the replicas and run the passes; the exit code, and whether to wait for
        pending notifications (not when a stop signal came during the endpoint start)."""
        started = {"target_n": self.plan.target_n, "identity": self.plan.identity,
                   "pid": os.getpid(), "preset": self.preset.name}
        if self.ledger.complete():
            # Nothing to run (e.g. a re-run with --publish): no endpoint needed.
            self.emit("run_started", **started, already_complete=True)
            return await self._finish(), True
        try:
            # A 397B load can take half an hour: a stop signal must not wait for it.
            with self.interruptible() as scope:
                await self._start_replicas()
        except EndpointError as e:
            self.outcome_reason = f"endpoint failed to start: {e}"
            self.milestone("endpoint_failed", why=str(e))
            return await self._finish(), True
        if scope.cancelled_caught:
            return await self._finish(), False
        for k in self.keepers:
            if not k.failed:
                tg.start_soon(k.watch)
        self.emit("run_started", **started)
        sdnotify.notify("READY=1")
        self.milestone("run_started", target_n=self.plan.target_n, cells=len(self.plan.cells))
        await self.passes.run(self.swept.adopted)
        return await self._finish(), True

    async def _finish(self) -> int:
        stopped_by = signal.Signals(self.stop_signal).name if self.stop_signal else None
        out = runbook.outcome(self.ledger, self.rules, stopped_by=stopped_by,
                              paused=self.policy.paused, reason=self.outcome_reason)
        self.phase, self.outcome_reason = out.phase, out.reason
        if out.phase == "stopped":
            self.emit("run_finished", outcome="stopped", reason=self.outcome_reason)
            # One line for the person who pressed Ctrl-C: how far, and how to go on.
            resume = f"; resume with: {self.opts.resume_command}" if self.opts.resume_command \
                else ""
            print(f"AUTOPILOT_STOPPED by {stopped_by}: {self.progress_line()}{resume}",
                  file=sys.stderr, flush=True)
            return EXIT_SIGINT if self.stop_signal == signal.SIGINT else EXIT_SIGTERM
        if out.phase == "COMPLETE":
            self.emit("run_finished", outcome="COMPLETE")
            self.milestone("run_complete", trust=self.ledger.trust()["invalid_by_reason"])
            if self.opts.publish:
                await self._publish()
            print("AUTOPILOT_COMPLETE", flush=True)
            return EXIT_COMPLETE
        self.emit("run_finished", outcome="INCOMPLETE", reason=self.outcome_reason)
        self.milestone("run_incomplete", why=self.outcome_reason,
                       excluded=[e["cell"] for e in self.ledger.trust()["excluded"]][:10])
        print(f"AUTOPILOT_INCOMPLETE {term(self.outcome_reason, 1000)}", flush=True)
        return EXIT_INCOMPLETE

    async def _publish(self) -> None:
        """scorecard.md + findings.md into the state dir, then a commit on the results
        branch. A failure (a git error, a hostile value in an artifact, a full disk) is
        logged as an error (on the console even with --quiet), journaled, shown in status
        and notified; the run stays COMPLETE and exits 0: a restart under
        Restart=on-failure would not fix it."""
        from autopilot.escape import clean
        from autopilot.run.publish import PublishResult, publish_run

        repo = str(self.opts.results_repo or self.preset.publish.results_repo or os.getcwd())
        res: PublishResult | None = None
        try:
            res = await anyio.to_thread.run_sync(publish_run, self.preset, self.plan.target_n,
                                                 self.state_dir, Path(repo))
        except Exception as e:
            log.exception("publish_crashed")
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

    # ------------------------------------------------------------------ background

    @contextlib.contextmanager
    def interruptible(self) -> Iterator[anyio.CancelScope]:
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
                    self._forced = True
                    log.warning("stop_forced", signal=signal.Signals(sig).name)

    async def _clock_ticker(self) -> None:
        """Read the run clock every TICK seconds: a longer silence is then the
        supervisor's own absence (SIGSTOP), never the cells' (see autopilot.run.clock)."""
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


__all__ = ["RunOptions", "Supervisor"]
