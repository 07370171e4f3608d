"""The supervisor: one anyio task group that drives a run to its target N.

Order of a start, chosen so that bad input and double drive touch nothing:
  1. validate the state dir and the plan identity (read-only);
  2. take the run lock (exit 3 if another supervisor holds it);
  3. replay the journal, sweep orphans a SIGKILLed predecessor left (autopilot.run.recovery),
     start the endpoint replicas (through the backend);
  4. passes: each sweeps the pending cells in plan order, ``concurrency`` at a time
     (autopilot.run.passes).
Every state change goes through ``emit`` (autopilot.run.recorder, which the supervisor
is): journal append (fsync'd) -> ledger.apply -> log -> status mark. A resumed run and
one that never stopped therefore cannot disagree.

The loop only records and applies: what a verdict, a grading failure or a budget tick
means for the run is decided by the pure run policy (autopilot.run.runbook), which answers
with effects the recorder applies in order. The supervisor is the backend's ``Port``: a
backend reports through it and never sees the rest.
"""

from __future__ import annotations

import contextlib
import os
import signal
import sys
from collections.abc import Callable
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING, Any

import anyio

from autopilot import logsetup, sdnotify
from autopilot.backends.base import Wiring, backend_class
from autopilot.cell import cgroups, users
from autopilot.cell.childenv import secret_values
from autopilot.cell.procs import enable_subreaper, kill_adoptees, run_token
from autopilot.config import Preset
from autopilot.errors import (
    EXIT_COMPLETE,
    EXIT_HANDOVER,
    EXIT_INCOMPLETE,
    EXIT_SIGINT,
    EXIT_SIGTERM,
    EndpointError,
)
from autopilot.escape import term
from autopilot.logsetup import get_logger
from autopilot.plan import Plan, output_dirs
from autopilot.privacy import dumpable, make_undumpable
from autopilot.run import background, drift, power, recovery, runbook, sandboxes
from autopilot.run.clock import RunClock
from autopilot.run.options import RunOptions
from autopilot.run.recorder import Recorder
from autopilot.state.claims import Claims, outside_roots
from autopilot.state.fsguard import remove_stale_temps, run_roots
from autopilot.state.fsutil import atomic_write_json, storage_error
from autopilot.state.journal import Journal
from autopilot.state.lock import RunLock

if TYPE_CHECKING:
    from autopilot.cell.sandbox import DockerSandboxes

from autopilot.state.runevents import (
    ClaimDropped,
    Published,
    PublishFailed,
    RunFinished,
    RunHandedOver,
    RunStarted,
)
from autopilot.state.statedir import open_append

log = get_logger(__name__)


class Supervisor(Recorder):
    """The run's lifecycle: the lock, start-up, the backend, the passes, the end."""

    def __init__(self, preset: Preset, plan: Plan, opts: RunOptions, *,
                 clock: Callable[[], float] | None = None) -> None:
        super().__init__(preset, plan, opts, clock=clock)
        self.lock = RunLock(self.state_dir)
        self.claims = Claims()
        self.run_token = ""  # the run's marker: read (or made) once the lock is ours
        self.redactor = logsetup.Redactor(secret_values(preset))
        self._docker: DockerSandboxes | None = None

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
        and state-dir validation; the lock is taken here (raises LockHeld). Stop signals
        are acted on from the first step (those recorded since the process began too)."""
        self.stop.listen(self.status.mark)
        try:
            return await self._run()
        finally:
            self.stop.unlisten()

    async def _run(self) -> int:
        # Before any secret is read into a value of ours: a harness of the same user must
        # not read this process's environment (autopilot.privacy).
        make_undumpable()
        # The benchmark's own files, hashed once: compared with the run's first launch
        # here, recorded in plan.json below (autopilot.run.drift).
        pins = drift.benchmark_pins(self.preset, self.state_dir)
        recovery.check_plan_identity(self.state_dir, self.plan, self.opts.allow_plan_change,
                                     pins)
        self.lock.acquire()
        try:
            # One live run per output root (a harness checkout), and no cell output dir
            # of a finished run that was not released: exit 3 naming the holder.
            self.claims.take(outside_roots(run_roots(self.preset, self.state_dir),
                                           self.state_dir), self.state_dir,
                             output_dirs(self.preset, self.plan, self.state_dir))
            self.run_token = run_token(self.state_dir)
            # Logging starts only once we own the run: a refused second supervisor
            # must not even append to the holder's autopilot.log.
            logsetup.configure(open_append(self.state_dir / "autopilot.log", binary=False),
                               console=self.opts.console_log,
                               secrets=secret_values(self.preset),
                               console_floor="warning" if self.opts.live_view else None)
            self.journal = Journal(self.state_dir / "journal.jsonl", group=True)
            self.replay()
            if self.stop.signal is not None:  # came during start-up (before the sweep)
                return await self._stopped_starting()
            for gone in self.claims.dropped:
                self.emit(ClaimDropped.model_validate({**gone, "why": "its state dir is gone"}))
            recovery.record_plan(self.state_dir, self.preset, self.plan, self.emit,
                                 preset_path=self.opts.preset_path,
                                 config_path=self.opts.config_path,
                                 identity=self.opts.identity, pins=pins)
            for warning in self.opts.warnings:
                log.warning("preflight_warning", warning=warning)
            enable_subreaper()
            self.lock.beat(self.phase)
            remove_stale_temps(self.state_dir)
            kind = backend_class(self.preset.backend.kind)
            # What a predecessor left elsewhere (a Ray node's actor) that proves this
            # run's: its reports journaled, then spared by the sweep and re-attached to.
            self.survivors = await kind.survey(self.preset, self.run_token, self.state_dir,
                                               self, self.ledger)
            self.swept = await recovery.sweep_orphans(
                self.preset, self.plan, self.state_dir, self.ledger, self.run_token,
                self.emit, reattach=kind.reattaches, spare=self.survivors)
            return await self._drive()
        except BaseException as e:
            disk = storage_error(e)
            if disk is None:
                raise
            return self._disk_full(disk)
        finally:
            if self.journal is not None:
                self.journal.close()
            self.claims.release()
            self.lock.release()

    async def _stopped_starting(self) -> int:
        """A signal before the first launch. A hand-over leaves everything to the
        successor; a stop ends what a predecessor left (``KillMode=process``: no one else
        will), journals what it ended, and says so."""
        if self.stop.handover:
            return self._handed_over()
        self.swept = await recovery.stop_leftovers(self.preset, self.plan, self.state_dir,
                                                   self.ledger, self.run_token, self.emit)
        ended = sum(len(cleaned.get("pids") or ()) for cleaned in self.swept.cleaned)
        print(f"autopilot: stopped before any launch: {ended} process(es) the run had left "
              "running were ended", file=sys.stderr, flush=True)
        return await self._finish()

    def _disk_full(self, err: OSError) -> int:
        """ENOSPC / EIO / EDQUOT / EROFS anywhere: a hand-over (Recorder.storage_failed),
        unless a stop was asked for first. Every running attempt was left to its data path
        and the endpoint serving; say so in one line and record what still fits. The
        journal holds only whole lines (Journal.append cuts a partial one back), so the
        successor, once space is back, re-attaches and counts nothing twice."""
        self.storage_failed(err)
        reason = self.storage_reason or str(err)
        if self.stop.handover:  # status.json keeps what fitted (the disk is full)
            return self._handed_over(cause=reason)
        self.phase, self.outcome_reason = "INCOMPLETE", reason
        with contextlib.suppress(OSError, AssertionError):
            self.emit(RunFinished(outcome="INCOMPLETE", reason=self.outcome_reason))
        with contextlib.suppress(OSError):
            self.phase_final_write()
        print(f"AUTOPILOT_INCOMPLETE {term(self.outcome_reason, 1000)}", flush=True)
        return EXIT_INCOMPLETE

    def _make_backend(self) -> None:
        """The backend named by the preset, with one keeper per endpoint replica."""
        setting, group = self.passes.pending_group()
        docker = self._docker
        wiring = Wiring(preset=self.preset, state_dir=self.state_dir, run_token=self.run_token,
                        port=self, redactor=self.redactor, clock=self.clock,
                        sandboxes=docker, disk=self.disk,
                        readopt=self.swept.endpoints, survivors=self.survivors.replicas)
        self.backend = backend_class(self.preset.backend.kind)(wiring, setting, group)
        self.passes.make_slots(len(self.backend.keepers))

    async def _drive(self) -> int:
        if backend_class(self.preset.backend.kind).endpoint_here:  # (else on each node)
            self._docker = await sandboxes.docker_setup(
                self.preset, self.plan, self.state_dir, self.swept.cleaned,
                self.swept.kept_cells)
        self._make_backend()
        code = EXIT_INCOMPLETE
        try:
            async with anyio.create_task_group() as tg:
                tg.start_soon(self.guarded, self.status.run)
                tg.start_soon(self.notifier.run)
                tg.start_soon(self.guarded, partial(background.heartbeat, self.lock,
                                                    lambda: self.phase, self.progress_line))
                if self.opts.live_view:
                    from autopilot.run import liveview  # rich: only on a terminal

                    tg.start_soon(liveview.show, self.snapshot)
                if isinstance(self.clock, RunClock):
                    tg.start_soon(background.clock_ticker, self.clock)
                tg.start_soon(background.disk_watch, self.disk, self.preset.run.disk_check_secs)
                tg.start_soon(power.sample_loop, self.preset, self.state_dir)
                await self.status.write_now()
                code, drain = await self._serve(tg)
                if drain:
                    await self.notifier.drain(self.preset.notify.timeout_secs + 1)
                tg.cancel_scope.cancel()
        finally:
            with anyio.CancelScope(shield=True):
                sdnotify.notify("STOPPING=1")
                handover = self.stop.handover
                if self.backend is not None:
                    await self.backend.close(keep_endpoints=handover)
                if not handover:  # the run's fork server ends with it, whoever started it
                    from autopilot.datapath.forks import end_forkserver

                    await anyio.to_thread.run_sync(end_forkserver, self.state_dir)
                if self._docker is not None:
                    await self._docker.docker.close()
                contain = cgroups.for_run(self.run_token)[0] if self.run_token else None
                if contain is not None:  # what is left of the run's groups (empty ones)
                    await anyio.to_thread.run_sync(contain.close)
                elif not handover:  # the fallback: every adoptee of ours is the run's
                    left = await anyio.to_thread.run_sync(kill_adoptees)
                    if left:
                        log.info("adoptees_killed", pids=left)
                self.phase_final_write()
        return code

    async def _serve(self, tg: Any) -> tuple[int, bool]:
        """Start the replicas and run the passes; the exit code, and whether to wait for
        pending notifications (not when a stop signal came during the endpoint start)."""
        who = users.resolve(self.preset, self.state_dir)  # what the report says of it
        started = {"target_n": self.plan.target_n, "identity": self.plan.identity,
                   "pid": os.getpid(), "preset": self.preset.name, "dumpable": dumpable(),
                   "harness_user": {"mode": who.mode, "why": who.why,
                                    "groups": list(who.group_names)},
                   "containment": cgroups.mode_line(),
                   # the clock this launch carries on from (its earlier launches' time)
                   "elapsed_before": self.elapsed_before}
        if self.ledger.complete():
            # Nothing to run (e.g. a re-run with --publish): no endpoint needed.
            self.emit(RunStarted.model_validate({**started, "already_complete": True}))
            return await self._finish(), True
        try:
            # A 397B load can take half an hour: a stop signal must not wait for it.
            with self.interruptible() as scope:
                assert self.backend is not None
                tg.start_soon(self.backend.warm)  # the data paths' fork server, meanwhile
                await self.backend.start()
        except EndpointError as e:
            self.outcome_reason = f"endpoint failed to start: {e}"
            self.milestone("endpoint_failed", why=str(e))
            return await self._finish(), True
        if scope.cancelled_caught:
            if not self.stop.handover:  # re-attached attempts the passes never took
                self.swept = await recovery.stop_leftovers(
                    self.preset, self.plan, self.state_dir, self.ledger, self.run_token,
                    self.emit)
            return await self._finish(), False
        for k in self.keepers:
            if not k.failed:
                tg.start_soon(k.watch)
        self.emit(RunStarted.model_validate(started))
        sdnotify.notify("READY=1")
        self.milestone("run_started", target_n=self.plan.target_n, cells=len(self.plan.cells))
        await self.passes.run(self.swept.adopted,
                              [*self.swept.reattached, *self.survivors.attempts])
        return await self._finish(), True

    async def _finish(self) -> int:
        if self.stop.handover:
            return self._handed_over()
        stopped_by = self.stop.name
        out = runbook.outcome(self.ledger, self.rules, stopped_by=stopped_by,
                              paused=self.policy.paused, reason=self.outcome_reason)
        self.phase, self.outcome_reason = out.phase, out.reason
        if out.phase == "stopped":
            self.emit(RunFinished(outcome="stopped", reason=self.outcome_reason))
            # One line for the person who pressed Ctrl-C: how far, and how to go on.
            resume = f"; resume with: {self.opts.resume_command}" if self.opts.resume_command \
                else ""
            print(f"AUTOPILOT_STOPPED by {stopped_by}: {self.progress_line()}{resume}",
                  file=sys.stderr, flush=True)
            return EXIT_SIGINT if self.stop_signal == signal.SIGINT else EXIT_SIGTERM
        if out.phase == "COMPLETE":
            self.emit(RunFinished(outcome="COMPLETE"))
            self.milestone("run_complete", trust=self.ledger.trust().invalid_by_reason)
            if self.opts.publish:
                await self._publish()
            print("AUTOPILOT_COMPLETE", flush=True)
            return EXIT_COMPLETE
        self.emit(RunFinished(outcome="INCOMPLETE", reason=self.outcome_reason))
        self.milestone("run_incomplete", why=self.outcome_reason,
                       excluded=[e.cell for e in self.ledger.trust().excluded][:10])
        print(f"AUTOPILOT_INCOMPLETE {term(self.outcome_reason, 1000)}", flush=True)
        return EXIT_INCOMPLETE

    def _handed_over(self, cause: str = "") -> int:
        """SIGUSR2 (``systemctl restart``), or ``cause`` (a full disk): the loop goes,
        its attempts and endpoint stay; the successor re-attaches to both."""
        running = [cell.id for cell in self.ledger.cells.values() if cell.status == "running"]
        self.phase, self.outcome_reason = "handed_over", (
            (f"{cause}; " if cause else "")
            + f"{len(running)} attempt(s) left running under their data paths")
        with contextlib.suppress(OSError, AssertionError):  # a full disk: it stands
            self.emit(RunHandedOver(running=running[:1000]))
        resume = ("; resume once space is back (under systemd, Restart= does)" if cause else
                  f"; resume with: {self.opts.resume_command}" if self.opts.resume_command
                  else "")
        print(f"AUTOPILOT_HANDED_OVER: {term(self.outcome_reason, 1000)}{resume}",
              file=sys.stderr, flush=True)
        return EXIT_HANDOVER

    async def _publish(self) -> None:
        """scorecard.md + findings.md into the state dir, then a commit on the results
        branch. A failure is logged as an error (on the console even with --quiet),
        journaled, shown in status and notified; the run stays COMPLETE and exits 0: a
        restart under Restart=on-failure would not fix it."""
        from autopilot.run.publish import publish_state

        repo = str(self.opts.results_repo or self.preset.publish.results_repo or os.getcwd())
        await self.settled()  # the run's record on disk before its results leave the box
        self.publish_state = await anyio.to_thread.run_sync(
            publish_state, self.preset, self.plan.target_n, self.state_dir, Path(repo))
        if self.publish_state["ok"]:
            self.emit(Published(**self.publish_state))
            return
        with contextlib.suppress(OSError):  # an error: on the console even with --quiet
            self.emit(PublishFailed(**self.publish_state))
            self.milestone("publish_failed", why=self.publish_state["error"])


__all__ = ["RunOptions", "Supervisor"]
