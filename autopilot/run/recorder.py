"""The loop's recording side: the backend's port, the run policy applied, the status.

Everything that happens to a run passes through ``Recorder.emit``: journal append
(fsync'd) -> ledger.apply -> log -> status mark. A backend reports through the port
methods (emit, milestone, tick, grade_failure, throttled, stopping, forced); a verdict
is recorded with its spend, and what it means for the run — quarantine, the
harness-break streak, budgets, an arm's completion — is decided by the pure run policy
(autopilot.run.runbook) and applied here in order. status.json is built from plain data
(autopilot.run.snapshot). The lifecycle around it (lock, start-up, passes, the end) is
autopilot.run.supervisor's.
"""

from __future__ import annotations

import contextlib
import errno
import os
import signal
import socket
import time
from collections.abc import Callable
from dataclasses import asdict
from pathlib import Path
from typing import Any

import anyio

from autopilot.backends.base import Backend, Keeper, Survivors
from autopilot.cell.childenv import urls_from_env
from autopilot.cell.validity import Classification
from autopilot.config import Preset
from autopilot.logsetup import get_logger
from autopilot.plan import Plan
from autopilot.run import recovery, runbook
from autopilot.run.clock import RunClock
from autopilot.run.notify import MILESTONES, Notifier
from autopilot.run.options import RunOptions
from autopilot.run.passes import Passes
from autopilot.run.snapshot import RunView, build, prior_elapsed
from autopilot.run.stopping import Stop
from autopilot.run.throttle import Throttle, on_throttled
from autopilot.state import budget
from autopilot.state.diskspace import DiskWatch, Reading, floor_bytes
from autopilot.state.eventbase import EventBase, record_of
from autopilot.state.fsguard import run_roots
from autopilot.state.fsutil import atomic_write_text, iso, read_json, storage_error
from autopilot.state.journal import Journal
from autopilot.state.ledger import Ledger
from autopilot.state.progress import oneline
from autopilot.state.runevents import LaunchThrottled, Milestone, MilestoneKind, NotifyFailed
from autopilot.state.status import StatusWriter
from autopilot.state.tokens import tokens_of
from autopilot.templates import render

log = get_logger(__name__)

TICK_STATUS_SECS = 5.0

# Log levels that mean something: a warning is the run healing itself, an error is
# something a person must look at (shown on the console even with --quiet).
WARNING_EVENTS = frozenset({"cell_killed", "endpoint_down", "endpoint_restart",
                            "cell_quarantined", "unsafe_path_refused", "journal_pid_refused",
                            "notify_failed", "launching_paused"})
ERROR_EVENTS = frozenset({"endpoint_failed", "harness_anomaly", "publish_failed"})


class Recorder:
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
            on_failure=self._notify_failed, clock=self.clock, before_send=self.settled,
        )
        self.ledger = Ledger(plan)
        self.journal: Journal | None = None
        self.backend: Backend | None = None  # where cells run: made by the supervisor
        self.rules = runbook.Rules.of(preset)
        self.policy = runbook.Policy()
        self.passes = Passes(self)
        self.phase = "starting"
        self.outcome_reason = ""
        self.started_at = iso()
        self.t0 = self.clock()
        self.elapsed_before = prior_elapsed(read_json(self.state_dir / "status.json"))
        self.done_this_session = 0
        self.swept = recovery.Swept()
        self.survivors = Survivors()  # what a backend re-attaches to elsewhere
        self.stop = Stop()
        self.storage_reason: str | None = None  # a full disk made the run hand over
        self.throttle = Throttle(preset.run.concurrency, preset.run.concurrency)
        self.status = StatusWriter(
            self.state_dir / "status.json", self.snapshot, preset.run.status_debounce_secs,
            also=self._write_metrics if opts.metrics_textfile else None,
        )
        self._tick_marked = 0.0
        self.publish_state: dict[str, Any] | None = None
        # Free space under the run's roots: below the floor, launching waits (passes).
        self.disk = DiskWatch(run_roots(preset, self.state_dir),
                              floor_bytes(preset.run.disk_floor_mb, preset.preflight.min_free_gb),
                              self.clock, on_change=self._disk_changed)

    @property
    def keepers(self) -> list[Keeper]:
        return list(self.backend.keepers) if self.backend is not None else []

    @property
    def stop_signal(self) -> int | None:
        return self.stop.signal

    @property
    def paused(self) -> str | None:
        """Why launching stopped (an anomaly pause, a budget), if it did."""
        return self.policy.paused

    # ------------------------------------------------------------------ the port

    def emit(self, event: str | EventBase, **fields: Any) -> dict[str, Any]:
        """Journal, apply, log, mark. ``event`` is its type, constructed where it is
        written (``emit(LeftoversStopped(...))``), or, in the older form, its kind's name
        and fields (checked against the same type by the journal)."""
        assert self.journal is not None
        event, fields = record_of(event, fields)
        try:
            record = self.journal.append(event, **fields)
        except OSError as e:  # nothing half-written (the line is cut back); who raised
            if storage_error(e) is not None:  # decides, the running attempts stay
                self.storage_failed(e)
            raise
        self.ledger.apply(record)
        name = fields.get("kind") if event == "milestone" else event
        level = ("error" if name in ERROR_EVENTS else "warning" if name in WARNING_EVENTS
                 else "info")
        # What was journaled (bounded), not what came in: a huge value is cut once.
        getattr(log, level)(event, **{k: v for k, v in record.items()
                                      if k not in ("token", "ts", "event")})
        self.status.mark()
        return record

    async def settled(self) -> None:
        """Every event journaled so far is on disk (before an effect that outlives the
        machine: a notification, a publish). A commit that failed is the next append's
        error, where the run decides what a full disk means."""
        if self.journal is not None:
            try:
                await self.journal.settled()
            except OSError as e:
                log.warning("journal_not_settled", error=str(e))

    def storage_failed(self, err: OSError) -> None:
        """A full disk (or an I/O error) under the run: a reason to hand over, never to
        kill work. Launching stops and every running attempt stays with its data path
        and the endpoint serving, as for SIGUSR2; a successor (the resume, or systemd's
        Restart=) re-attaches once space is back. Called where the error is first seen,
        before the task group cancels the cells, so each of them detaches. A stop that
        was already asked for stays a stop."""
        if self.storage_reason is None:
            where = err.filename or self.state_dir
            why = "disk full" if err.errno in (errno.ENOSPC, errno.EDQUOT) else (
                f"storage error ({errno.errorcode.get(err.errno or 0, err.errno)})")
            self.storage_reason = f"{why}: {where}"
            log.error("storage_failed", why=self.storage_reason,
                      note="handing over: running attempts stay with their data paths")
        self.stop.request(signal.SIGUSR2)

    async def guarded(self, task: Callable[[], Any]) -> None:
        """A background task of the loop whose storage error is seen as such before it
        cancels its siblings (the cells, which then detach rather than die)."""
        try:
            await task()
        except BaseException as e:
            disk = storage_error(e)
            if disk is not None:
                self.storage_failed(disk)
            raise

    def milestone(self, kind: MilestoneKind, **info: Any) -> None:
        priority = MILESTONES.get(kind, ("", "normal"))[1]
        payload = {
            "kind": kind, "priority": priority, "preset": self.preset.name,
            "model": self.preset.model, "progress": self.progress_line(), **info,
        }
        self.emit(Milestone(**payload))
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
        return self.stop.signal is not None

    def forced(self) -> bool:
        return self.stop.forced

    def handing_over(self) -> bool:
        return self.stop.handover

    def interruptible(self) -> contextlib.AbstractContextManager[anyio.CancelScope]:
        return self.stop.interruptible()

    def _disk_changed(self, change: str | None, reading: Reading) -> None:
        """The disk fell below the run's floor, or came back: say so (and on the phone).
        Launching waits meanwhile (Passes._disk_gate); the attempts it overlapped are
        INVALID(disk_full), which spends no retry."""
        free_mb = round(reading.free / 1e6, 1)
        floor_mb = round(self.disk.floor / 1e6, 1)
        if change == "low":
            self.milestone("disk_low", where=reading.where, free_mb=free_mb, floor_mb=floor_mb,
                           why=f"{free_mb} MB free under {reading.where}, below the run's floor "
                               f"of {floor_mb} MB: launching paused")
        else:
            self.milestone("disk_ok", where=reading.where, free_mb=free_mb, floor_mb=floor_mb,
                           why=f"{free_mb} MB free under {reading.where}: launching resumed")

    def _notify_failed(self, kind: str, url: str, why: str) -> None:
        if self.journal is not None:
            self.emit(NotifyFailed(kind=kind, url=url, why=why))

    def set_throttle(self, new: Throttle) -> None:
        before, self.throttle = self.throttle.limit, new
        if new.limit != before:
            self.emit(LaunchThrottled(limit=new.limit, ceiling=new.ceiling))

    # ------------------------------------------------------------------ policy

    def record_verdict(self, cid: str, attempt: int, c: Classification, *,
                       regrade: bool = False) -> None:
        extra: dict[str, Any] = {}
        if not regrade:  # a regrade spends nothing
            summary = self._attempt_summary(cid)
            reported = budget.of_summary(summary)
            rec = self.ledger.cells[cid].metered
            metered = budget.of_metered(rec) if rec and rec.get("attempt") == attempt else None
            unread_count = rec.get("unmetered") if rec and rec.get("attempt") == attempt else None
            unread = unread_count if type(unread_count) is int and unread_count > 0 else 0
            spent, basis = budget.cost_basis(metered, reported, self.preset.gateway.tolerance,
                                             budget.reported_fields(summary), unread)
            extra["spend"] = [spent.prompt, spent.completion]
            extra["cost_basis"] = basis
            by_bucket = tokens_of(rec.get("tokens")) if metered is not None and rec else None
            if spent == metered and by_bucket is not None and not by_bucket.empty:
                extra["tokens"] = by_bucket.as_dict()
            if metered is not None and basis != "metered":
                extra["self_reported"] = [reported.prompt, reported.completion]
            if rec and rec.get("attempt") == attempt:  # what the gateway saw, with the verdict
                extra["gateway"] = {"requests": rec.get("requests"), "errors": rec.get("errors")}
                if unread:  # spend of unknown size: the budget's concern
                    extra["unmetered"] = unread
        self.emit(c.as_event(cid, attempt, regrade=regrade).model_copy(update=extra))
        self._decide(runbook.on_verdict(self.policy, self.rules, self.ledger, cid, c,
                                        regrade=regrade, now=time.time()))

    def check_budget(self) -> None:
        self._decide(runbook.budget_tick(self.policy, self.rules, self.ledger))

    def _decide(self, decision: runbook.Decision) -> None:
        """Apply what the run policy decided, in order."""
        self.policy, effects = decision
        for effect in effects:
            if isinstance(effect, runbook.Emit):
                self.emit(effect.event)
            elif isinstance(effect, runbook.HarnessAnomaly | runbook.BudgetReached
                            | runbook.ArmComplete):
                self.milestone(effect.kind, **asdict(effect))
            elif isinstance(effect, runbook.Throttled):
                self.throttled()  # the harness saw the provider throttle: launch fewer
            elif isinstance(effect, runbook.WriteArmSummary):
                self._write_arm_summary(effect.arm)
            elif isinstance(effect, runbook.CountValid):
                self.done_this_session += 1

    def _attempt_summary(self, cid: str) -> Any:
        """The attempt's summary as the harness wrote it (None where there is none)."""
        from autopilot.plan import cell_context
        from autopilot.state.fsutil import read_json

        ctx = cell_context(self.preset, self.plan.by_id[cid], 1, self.state_dir)
        return read_json(Path(render(self.preset.harness.summary, ctx)))

    def _write_arm_summary(self, arm: str) -> None:
        """summary-<arm>.txt, the origin's PASS/FAIL table, when an arm finishes."""
        from autopilot.views import report

        try:
            # From the ledger (the journal's verdicts), not by re-reading every artifact:
            # the run knows its verdicts; `autopilot summarize` re-derives them from disk.
            facts = report.facts_from_cells(
                [cell for cell in self.ledger.cells.values() if cell.arm == arm])
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
            disk=self.disk.describe(), elapsed_before=self.elapsed_before,
        ), light)

    def progress_line(self) -> str:
        from autopilot.state.statusdoc import read

        return oneline(read(self.snapshot(light=True)))

    def _write_metrics(self, snap: dict[str, Any]) -> None:
        """The node_exporter textfile (--metrics-textfile), from the same snapshot."""
        from autopilot.views.metrics import write_run_textfile

        assert self.opts.metrics_textfile is not None
        write_run_textfile(self.opts.metrics_textfile, self.ledger, snap)


__all__ = ["Recorder"]
