"""Passes and dispatch: which pending cell runs next, on which replica, and when.

A pass sweeps the pending cells in plan order, ``concurrency`` at a time; the run makes
up to ``max_passes`` of them per arm group (arms whose mode is an endpoint setting run
group by group, the endpoint restarted between them). Before each launch: the budget
(the run policy), a replica that may serve the arm, is up and has a free slot (the pure
``placement.choose_replica``), and the provider's throttle. Each attempt is the
backend's to run; its verdict goes back to the loop (``Loop.record_verdict``).
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from dataclasses import asdict
from typing import Any, Protocol

import anyio

from autopilot.backends.base import Backend, Keeper
from autopilot.cell.validity import Classification, RunOutcome
from autopilot.config import ArmEndpoint, Preset
from autopilot.errors import EndpointError, EndpointFailed
from autopilot.logsetup import get_logger
from autopilot.plan import Cell, Plan, arm_groups
from autopilot.run.placement import ReplicaView, choose_replica
from autopilot.run.throttle import CALM_SECS, Throttle, on_tick
from autopilot.state.cellevents import CellAbandoned, CellRan
from autopilot.state.diskspace import DiskWatch
from autopilot.state.eventbase import EventBase
from autopilot.state.fsutil import storage_error
from autopilot.state.ledger import CellState, Ledger
from autopilot.state.runevents import ArmGrading, MilestoneKind, PassStarted

log = get_logger(__name__)

# How often a wait for a replica looks again at the keepers (their up / given-up state
# changes at most once a probe), besides waking at once when a slot is given back.
KEEPER_RECHECK_SECS = 1.0

# (cell, attempt, outcome, the gateway's meter or None): an attempt that ended while no
# loop watched it, graded at start-up
Adopted = tuple[str, int, RunOutcome, Any]


class Loop(Protocol):
    """What dispatch needs of the loop that owns it (autopilot.run.supervisor)."""

    preset: Preset
    plan: Plan
    ledger: Ledger
    backend: Backend | None
    throttle: Throttle
    disk: DiskWatch
    phase: str
    outcome_reason: str
    clock: Callable[[], float]

    @property
    def keepers(self) -> list[Keeper]: ...
    @property
    def stop_signal(self) -> int | None: ...
    @property
    def paused(self) -> str | None: ...
    def emit(self, event: str | EventBase, **fields: Any) -> dict[str, Any]: ...
    def milestone(self, kind: MilestoneKind, **info: Any) -> None: ...
    def record_verdict(self, cid: str, attempt: int, c: Classification, *,
                       regrade: bool = False) -> None: ...
    def check_budget(self) -> None: ...
    def storage_failed(self, err: OSError) -> None: ...
    def set_throttle(self, new: Throttle) -> None: ...
    def endpoint_failed(self) -> str | None: ...
    def interruptible(self) -> contextlib.AbstractContextManager[anyio.CancelScope]: ...


class Passes:
    def __init__(self, loop: Loop) -> None:
        self.loop = loop
        self.preset = loop.preset
        self.pass_no = 0
        self.replica_slots: list[anyio.Semaphore] = []
        self._grading = anyio.Lock()
        self.slots = anyio.Semaphore(self.preset.run.concurrency)
        # Graders running beside the next cells' harnesses (Backend.grades_beside): as
        # many at most as cells run at once.
        self.graders = anyio.Semaphore(self.preset.run.concurrency)
        self._resumed = 0  # re-attached attempts still running
        self._resumed_changed = anyio.Event()
        # Set (and replaced) whenever a cell's slots are given back: what the replica and
        # throttle waits wake on, instead of polling.
        self._freed = anyio.Event()

    @property
    def per_replica(self) -> int:
        """Cells at once per replica: ``[endpoint] slots``, else concurrency split evenly."""
        replicas = self.preset.endpoint.replicas
        return self.preset.endpoint.slots or -(-self.preset.run.concurrency // replicas)

    def make_slots(self, count: int) -> None:
        # One replica: the pass's own semaphore bounds it (sized to the concurrency).
        size = self.per_replica if count > 1 else self.preset.run.concurrency
        self.replica_slots = [anyio.Semaphore(size) for _ in range(count)]

    def pending_group(self) -> tuple[ArmEndpoint, tuple[str, ...]]:
        """The first arm group (by endpoint settings) with cells to run."""
        groups = arm_groups(self.preset)
        pending = {cell.arm for cell in self.loop.ledger.pending()}
        return next((group for group in groups if pending & set(group[1])), groups[0])

    @property
    def _backend(self) -> Backend:
        assert self.loop.backend is not None
        return self.loop.backend

    # ------------------------------------------------------------------ passes

    async def run(self, adopted: list[Adopted],
                  reattached: list[tuple[str, int, Any]] | None = None) -> None:
        """Every pass of every arm group; first, the attempts a dead predecessor left
        finished (autopilot.run.recovery) are graded, and the ones still running under
        their data paths are watched again, each in a slot of its own."""
        loop = self.loop
        await self._grade_adopted(adopted)
        if self.preset.grader.mode == "per-arm":
            await self.grade_ready_arms(force=True)  # ran before a restart, not graded
        self.slots = anyio.Semaphore(self.preset.run.concurrency)
        async with anyio.create_task_group() as tg:
            for cid, attempt, datapath in reattached or ():
                replica = datapath.meta.get("replica") if isinstance(datapath.meta, dict) else 0
                replica = replica if type(replica) is int and 0 <= replica < len(
                    loop.keepers) else 0
                # Its slot is taken here (it is running); more of them than slots (a
                # resume with a lower --concurrency) run on slots of their own.
                slots, took = self.slots, False
                try:
                    slots.acquire_nowait()
                    took = True
                    if self.replica_slots:
                        self.replica_slots[replica].acquire_nowait()
                except anyio.WouldBlock:
                    if took:
                        slots.release()
                    slots, replica = anyio.Semaphore(0), -1
                self._resumed += 1
                tg.start_soon(self._run_cell, loop.plan.by_id[cid], attempt, slots,
                              replica, datapath)
            await self._all_groups()

    async def _all_groups(self) -> None:
        loop = self.loop
        keeper = loop.keepers[0]
        groups = arm_groups(self.preset)
        for setting, arms in groups:
            if loop.stop_signal or loop.paused:
                return
            if not any(cell.arm in arms for cell in loop.ledger.pending()):
                continue
            if len(groups) > 1 and keeper.ep.arm_group != arms:
                await self._resumed_done()  # no cell may run while the endpoint restarts
                # The arm's mode is an endpoint setting: restart it configured for them.
                try:
                    with loop.interruptible() as scope:
                        await self._backend.reconfigure(setting, arms)
                except EndpointError as e:
                    loop.outcome_reason = (f"endpoint failed to start for {', '.join(arms)}: "
                                           f"{e}")
                    loop.milestone("endpoint_failed", why=loop.outcome_reason)
                    return
                if scope.cancelled_caught:
                    return
            await self._group_passes(set(arms))
            if loop.endpoint_failed():
                return

    async def _group_passes(self, arms: set[str]) -> None:
        loop = self.loop
        for pass_no in range(1, self.preset.run.max_passes + 1):
            if loop.stop_signal or loop.paused or loop.ledger.complete():
                return
            pending = [cell for cell in loop.ledger.pending() if cell.arm in arms]
            if not pending and self._resumed:
                # Attempts re-attached at start-up still run: a retry they need goes in
                # a pass of this group.
                await self._resumed_done()
                pending = [cell for cell in loop.ledger.pending() if cell.arm in arms]
            if not pending:
                return
            self.pass_no = pass_no
            loop.phase = f"run:pass{pass_no}"
            loop.emit(PassStarted.model_validate({"pass": pass_no, "pending": len(pending)}))
            await self._run_pass(pending)
            failed = loop.endpoint_failed()
            if failed:
                loop.outcome_reason = failed
                return
            if self.preset.grader.mode == "per-arm" and not loop.stop_signal:
                await self.grade_ready_arms(force=True)

    async def _resumed_done(self) -> None:
        while self._resumed:
            await self._resumed_changed.wait()
            self._resumed_changed = anyio.Event()

    async def _run_pass(self, pending: list[CellState]) -> None:
        loop = self.loop
        slots = self.slots  # run-wide: re-attached attempts hold theirs too
        async with anyio.create_task_group() as tg:
            for cell_state in pending:
                await slots.acquire()
                loop.check_budget()  # a resumed run may already be past it
                if loop.stop_signal or loop.paused:
                    slots.release()
                    break
                cell = loop.plan.by_id[cell_state.id]
                replica: int | None = None
                try:
                    with loop.interruptible():  # an outage must not hold up a stop
                        replica = await self._pick_replica(cell.arm)
                except EndpointFailed:
                    # Not raised through the task group (it would arrive wrapped in an
                    # ExceptionGroup): running cells finish, the pass ends, the run stops.
                    slots.release()
                    break
                if loop.stop_signal or replica is None:  # stopped while waiting
                    if replica is not None:
                        self.replica_slots[replica].release()
                    slots.release()
                    break
                await self._throttle_gate(slots)
                await self._disk_gate()
                if loop.stop_signal:  # stopped while the disk was low
                    if self.replica_slots:
                        self.replica_slots[replica].release()
                    slots.release()
                    break
                tg.start_soon(self._run_cell, cell, cell_state.attempts + 1, slots, replica)

    async def _pick_replica(self, arm: str) -> int:
        """A replica that may serve ``arm`` (its pins), is up and has a free slot: the
        one with the most free slots. Raises EndpointFailed when none of them can ever
        serve again."""
        keepers = self.loop.keepers
        if len(keepers) == 1:
            await keepers[0].wait_up()  # raises EndpointFailed once given up
            self.replica_slots[0].acquire_nowait()  # sized to the concurrency: never waits
            return 0
        allowed = self.preset.arm(arm).replicas
        while True:
            choice = choose_replica([
                ReplicaView(up=k.is_up, failed=bool(k.failed), free=self.replica_slots[i].value)
                for i, k in enumerate(keepers)], allowed)
            if choice == "none":
                pool = allowed or list(range(len(keepers)))
                raise EndpointFailed(self.loop.endpoint_failed()
                                     or f"no replica of {pool} can serve {arm}")
            if choice != "wait":
                self.replica_slots[choice].acquire_nowait()
                return choice
            # A slot given back wakes this at once; a replica coming up or giving up is
            # its keeper's to see (every probe_interval_secs), so a second is fine enough.
            await self._until_freed(KEEPER_RECHECK_SECS)

    async def _throttle_gate(self, slots: anyio.Semaphore) -> None:
        """While the provider throttles, launch fewer cells at once (autopilot.run.throttle).
        Cells in flight = slots taken (this one's included): O(1), not a scan of a
        20,000-cell ledger per launch."""
        loop = self.loop
        while True:
            loop.set_throttle(on_tick(loop.throttle, loop.clock()))
            in_flight = self.preset.run.concurrency - slots.value - 1  # before this one
            if in_flight < loop.throttle.limit or loop.stop_signal:
                return
            # Until a cell ends, or the limit may next grow back (a calm CALM_SECS long).
            throttle = loop.throttle
            calm = max(throttle.last_signal, throttle.last_change) + CALM_SECS - loop.clock()
            with loop.interruptible():
                await self._until_freed(max(calm, 0.01))

    async def _disk_gate(self) -> None:
        """While free space is below the run's floor, launch nothing (the loop's disk
        watch says when it is back; a stop ends the wait)."""
        with self.loop.interruptible():
            await self.loop.disk.wait_ok()

    def _slot_freed(self) -> None:
        self._freed.set()
        self._freed = anyio.Event()

    async def _until_freed(self, timeout: float) -> None:
        with anyio.move_on_after(timeout):
            await self._freed.wait()

    async def _run_cell(self, cell: Cell, attempt: int, slots: anyio.Semaphore,
                        replica: int = 0, attached: Any = None) -> None:
        loop = self.loop
        held, grading = True, False

        def give_back() -> None:
            nonlocal held
            if held:
                held = False
                slots.release()
                if self.replica_slots and replica >= 0:
                    self.replica_slots[replica].release()
                self._slot_freed()

        async def ran() -> None:
            # The harness has ended: the endpoint's slot goes to the next cell while
            # this one is graded, beside it (graders bounded on their own).
            nonlocal grading
            give_back()
            await self.graders.acquire()
            grading = True

        try:
            try:
                if attached is not None:
                    result = await self._backend.resume(cell, attempt, max(replica, 0),
                                                        attached, ran)
                else:
                    result = await self._backend.run(cell, attempt, replica, ran)
            except Exception as e:  # a bug in our own code must not take the run down
                disk = storage_error(e)
                if disk is not None:  # the run hands over (Supervisor._disk_full), before
                    loop.storage_failed(disk)  # the other cells are cancelled: they detach
                    raise
                log.exception("cell_internal_error", cell=cell.id)
                loop.emit(CellAbandoned(cell=cell.id, attempt=attempt,
                          why=f"internal error: {type(e).__name__}: {e}"))
                return
            if result is not None:
                loop.record_verdict(cell.id, attempt, result)
        finally:
            give_back()
            if grading:
                self.graders.release()
            if attached is not None:
                self._resumed -= 1
                self._resumed_changed.set()
        if self.preset.grader.mode == "per-arm":
            await self.grade_ready_arms(force=False)

    # ------------------------------------------------------------------ grading here

    async def _grade_adopted(self, adopted: list[Adopted]) -> None:
        loop = self.loop
        for cid, attempt, outcome, meter in adopted:
            if self.preset.grader.mode == "per-arm":
                loop.emit(CellRan(cell=cid, attempt=attempt, outcome=asdict(outcome)))
            else:
                # With the gateway's evidence its data path recorded: the same model and
                # arm checks and the same meter as an attempt this loop watched.
                loop.record_verdict(cid, attempt, await self._backend.grade(
                    loop.plan.by_id[cid], attempt, outcome, meter=meter))
        adopted.clear()

    async def grade_ready_arms(self, force: bool) -> None:
        """Grade the ``ran`` cells of every arm with nothing left to run (or of every arm,
        with ``force``, at the end of a pass so retries can go in the next one)."""
        loop = self.loop
        async with self._grading:
            for arm in self.preset.arms:
                cells = [cell for cell in loop.ledger.cells.values() if cell.arm == arm.label]
                ran = [cell for cell in cells if cell.status == "ran"]
                if not ran:
                    continue
                busy = any(cell.status in ("running", "pending", "invalid") for cell in cells)
                if busy and not force:
                    continue
                loop.emit(ArmGrading(arm=arm.label, cells=len(ran)))
                for cell in ran:
                    outcome = RunOutcome(**(cell.ran_outcome or {}))
                    loop.record_verdict(cell.id, cell.attempts, await self._backend.grade(
                        loop.plan.by_id[cell.id], cell.attempts, outcome))

