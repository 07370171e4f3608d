"""Start-up: the plan's identity, the journal replayed, what a dead predecessor left.

Run by the loop once it holds the lock, before any endpoint starts:
- the plan is the state dir's (or the change is allowed, and journaled);
- the journal is replayed into the ledger (a torn last line is skipped);
- processes a SIGKILLed predecessor left are killed by their recorded identity (and any
  still carrying the run's marker) (its Docker containers: autopilot.run.sandboxes); a
  cell whose harness had finished its work before the predecessor died is
  *adopted* (graded from its outputs) instead of re-run.
Every function takes the pieces it needs and journals through ``emit``: nothing here
holds state of its own.
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING, Any

import anyio

from autopilot.cell import cgroups, sweep
from autopilot.cell.context import whole_wall
from autopilot.cell.validity import RunOutcome, attempt_outcomes
from autopilot.config import Preset
from autopilot.errors import PlanChangedError
from autopilot.logsetup import get_logger
from autopilot.plan import Cell, Plan, cell_context
from autopilot.run import drift
from autopilot.run.preflight import needs_docker
from autopilot.run.sandboxes import sandbox_names
from autopilot.state import resolved
from autopilot.state.cellevents import (
    CellAbandoned,
    CellAdopted,
    CellMetered,
    DatapathVersionMismatch,
    ForeignInCellGroup,
)
from autopilot.state.fsutil import atomic_write_json, iso, parse_iso, read_json
from autopilot.state.journal import began, read_events
from autopilot.state.ledger import CellState, Ledger
from autopilot.state.runevents import (
    BenchmarkDrift,
    JournalPidRefused,
    LeftoversStopped,
    OrphanKilled,
    PlanChanged,
    PresetChanged,
)
from autopilot.state.statedir import open_append
from autopilot.templates import render

if TYPE_CHECKING:
    from autopilot.backends.base import Survivors

log = get_logger(__name__)

Emit = Callable[..., dict[str, Any]]


def check_plan_identity(state_dir: Path, plan: Plan, allow_change: bool,
                        pins: dict[str, str | None] | None = None) -> dict[str, Any] | None:
    """Refuse a state dir made by another plan, or by the same plan on other benchmark
    files (autopilot.run.drift; ``pins``: their digests now). Read-only."""
    recorded = read_json(state_dir / "plan.json")
    if not isinstance(recorded, dict):
        return None
    if recorded.get("identity") != plan.identity and not allow_change:
        unset = plan.preset.defaulted_env()
        if unset:  # the likeliest cause first: this shell lacks the run's variables
            raise PlanChangedError(
                f"{state_dir}: holds a run of preset {recorded.get('preset')!r} with plan "
                f"identity {recorded.get('identity')}, but this shell gives "
                f"{plan.identity}: {'; '.join(unset)} — set it as for the run (e.g. in "
                "the unit's Environment=), or pass --allow-plan-change if the plan "
                "really changed")
        raise PlanChangedError(
            f"{state_dir}: holds a run of preset {recorded.get('preset')!r} with plan "
            f"identity {recorded.get('identity')}, but this preset gives {plan.identity} "
            "(tasks, arms, model, harness or grader changed); use another --state-dir "
            "or pass --allow-plan-change"
        )
    if pins is None:
        pins = drift.benchmark_pins(plan.preset, state_dir)
    moved = drift.changed(recorded.get("benchmark_files"), pins)
    if moved and not allow_change:
        unset = plan.preset.defaulted_env()  # a path that moved: likelier than an edit
        raise PlanChangedError(
            f"{state_dir}: {len(moved)} benchmark file(s) changed since this run began: "
            f"{', '.join(moved[:5])}{' ...' if len(moved) > 5 else ''} (their sha256 is in "
            f"plan.json{'; ' + '; '.join(unset) if unset else ''}); restore them, use "
            "another --state-dir, or pass --allow-plan-change to go on with the new ones "
            "(journaled)")
    return recorded


def replay(state_dir: Path, ledger: Ledger) -> set[str]:
    """Fold the journal into ``ledger``; the arms whose completion was announced."""
    result = read_events(state_dir / "journal.jsonl")
    announced: set[str] = set()
    for record in result:  # streamed: one pass, one line held at a time
        ledger.apply(record)
        if record.get("event") == "milestone" and record.get("kind") == "arm_complete":
            announced.add(str(record.get("arm")))
    if result.torn_lines:  # what the pass found
        log.warning("journal_torn_lines_skipped", lines=result.torn_lines)
    return announced


def record_plan(state_dir: Path, preset: Preset, plan: Plan, emit: Emit, *,
                preset_path: str | None, config_path: str | list[str] | None,
                identity: dict[str, Any] | None,
                pins: dict[str, str | None] | None = None) -> None:
    """plan.json (enough for read-only tools to rebuild the plan, and the benchmark
    files' digests) and, per launch, the preflight's identity record."""
    path = state_dir / "plan.json"
    recorded = read_json(path)
    pins = drift.benchmark_pins(preset, state_dir) if pins is None else pins
    if isinstance(recorded, dict):
        if recorded.get("identity") != plan.identity:
            emit(PlanChanged(old=recorded.get("identity"), new=plan.identity))
        before = recorded.get("benchmark_files")
        moved = drift.changed(before, pins)
        if moved:  # only with --allow-plan-change (check_plan_identity refuses it else)
            assert isinstance(before, dict)
            emit(BenchmarkDrift(files={f: {"was": before.get(f), "now": pins.get(f)}
                                           for f in moved[:50]}))
    digest, changed = resolved.write(state_dir, preset)
    if changed and isinstance(recorded, dict):
        # What the run resolved differs from the last launch's (a flag, an overlay, a
        # variable of this shell): said, so a view's numbers can be traced to it.
        emit(PresetChanged(keys=changed[:50], more=max(0, len(changed) - 50)))
    atomic_write_json(path, {
        "preset": preset.name, "resolved_sha256": digest, "preset_path": preset_path,
        "config_path": config_path,
        "target_n": plan.target_n, "identity": plan.identity,
        "tasks": [task.id for task in preset.tasks],
        "arms": [arm.label for arm in preset.arms], "recorded_at": iso(),
        "benchmark_files": pins,
    })
    if identity:
        with open_append(state_dir / "identity.jsonl", binary=False) as f:
            f.write(json.dumps(identity) + "\n")


@dataclass
class Swept:
    """What the start-up sweep found: for status, attempts to grade, attempts still
    running under their data paths, and endpoints still serving that may be re-adopted."""
    cleaned: list[dict[str, Any]] = field(default_factory=list)
    adopted: list[tuple[str, int, RunOutcome, Any]] = field(default_factory=list)
    reattached: list[tuple[str, int, Any]] = field(default_factory=list)
    endpoints: dict[int, dict[str, Any]] = field(default_factory=dict)
    never_started: set[str] = field(default_factory=set)  # intents with no harness spawned

    @property
    def kept_cells(self) -> frozenset[str]:
        return frozenset(cid for cid, _, _ in self.reattached)


async def reattach_datapaths(preset: Preset, plan: Plan, state_dir: Path, ledger: Ledger,
                             emit: Emit, found: Swept) -> set[str]:
    """Every attempt the journal shows running whose data path still carries it is
    re-attached to; one whose data path recorded its end (while no loop watched) is
    adopted with that record's gateway evidence. Returns the cells whose data path is
    gone without a record: their evidence is incomplete, so they are never adopted."""
    from autopilot.datapath import wire
    from autopilot.datapath.client import DataPath, finished_record, meter_from
    from autopilot.datapath.messages import read_record

    lost: set[str] = set()
    for cell in [state for state in ledger.cells.values() if state.status == "running"]:
        attempt_dir = wire.attempt_dir(state_dir, cell.id, cell.attempts)
        if cell.pid is None and not any((attempt_dir / f).exists()
                                        for f in (wire.RECORD, wire.LEGACY_RECORD, wire.EXIT)):
            # The intent is journaled but no data path ever spawned its harness (killed
            # while the fork server started, say): abandoned as never started, and its
            # attempt number used again: the harness never touched it.
            found.never_started.add(cell.id)
            emit(CellAbandoned(cell=cell.id, attempt=cell.attempts, never_started=True,
                               why="its harness was never spawned (the supervisor was "
                                   "killed first): nothing to charge or re-attach"))
            continue
        if not attempt_dir.is_dir():
            continue  # spawned before data paths (an older state dir)
        datapath = await DataPath.attach(attempt_dir)
        if datapath is not None:
            # Killed between the intent and the start's record: the start is journaled
            # on re-attach, so every attempt that ran has its cell_started.
            datapath.unjournaled = cell.pid is None
            found.reattached.append((cell.id, cell.attempts, datapath))
            if datapath.drain is not None:
                emit(DatapathVersionMismatch(cell=cell.id, attempt=cell.attempts,
                     version=datapath.drain, ours=wire.VERSION,
                     why="watched by its files until it ends; no new attempt uses it"))
            continue
        rec = finished_record(attempt_dir)
        if rec is None:
            lost.add(cell.id)
            continue
        code, meter = rec.code, meter_from(rec.meter)
        record = read_record(attempt_dir)
        meta = record.meta if record is not None else {}
        launched = meta.get("launched") if isinstance(meta, dict) else None
        outcome = ended_outcome(preset, plan.by_id[cell.id], state_dir, cell, code,
                                launched if isinstance(launched, int | float) else None)
        found.adopted.append((cell.id, cell.attempts, outcome, meter))
        ended = rec.ended
        wall = (whole_wall(float(launched), float(ended), -1.0)
                if isinstance(launched, int | float) and isinstance(ended, int | float)
                else None)
        emit(CellAdopted(cell=cell.id, attempt=cell.attempts,
             why="the harness ended while no supervisor watched; its data path recorded "
                 "the end", outcome=asdict(outcome), metered=meter is not None,
             elapsed_secs=wall if wall is not None and wall >= 0 else None))
        known = cell.metered is not None and cell.metered.get("attempt") == cell.attempts
        if meter is not None and not known:
            # the attempt's spend, as for an attempt watched to its end: once per attempt
            # (a successor that adopts it again journals no second one to add up)
            emit(CellMetered(cell=cell.id, attempt=cell.attempts, **meter.summary()))
    return lost


def ended_outcome(preset: Preset, cell: Cell, state_dir: Path, state: CellState,
                  code: int | None, launched: float | None = None) -> RunOutcome:
    """The outcome of an attempt whose data path recorded the harness's exit: its code,
    and whether the completion artifacts are there and this attempt's (newer than its
    launch as the data path recorded it, else as the journal has it)."""
    ctx = cell_context(preset, cell, state.attempts, state_dir)
    started = launched if launched is not None else parse_iso(state.started_ts)
    complete = True
    for tmpl in preset.harness.completion:
        try:
            mtime = Path(render(tmpl, ctx)).stat().st_mtime
        except OSError:
            complete = False
            break
        if started is None or mtime < started - 1.0:
            complete = False
            break
    return RunOutcome(exit_code=code, completion=complete)


def live_endpoints(journal: Path, token: str) -> dict[int, dict[str, Any]]:
    """The endpoint a predecessor started for each replica (its last endpoint_started,
    or endpoint_spawned: ``loading``) whose exact process still lives and carries this
    run's marker: what a successor may re-adopt instead of reloading the model."""
    from autopilot.cell.procs import journaled_identity, run_marked, verify

    last: dict[int, dict[str, Any]] = {}
    for record in read_events(journal):
        if record.get("event") in ("endpoint_spawned", "endpoint_started") \
                and not record.get("attached"):
            replica = record.get("replica", 0)
            # spawned and never started: killed while it loaded (a successor waits for
            # the load to end rather than start it again: a 397B model loads for minutes)
            last[replica if type(replica) is int else 0] = {
                **record, "loading": record.get("event") == "endpoint_spawned"}
    out = {}
    for replica, record in last.items():
        ident = journaled_identity(record)
        proc = verify(ident) if ident is not None else None
        if proc is not None and run_marked(proc, token):
            out[replica] = record
    return out


async def sweep_orphans(preset: Preset, plan: Plan, state_dir: Path, ledger: Ledger,
                        run_token: str, emit: Emit, reattach: bool = False,
                        spare: Survivors | None = None,
                        why: str = "supervisor restarted") -> Swept:
    """Kill what a dead predecessor left running (in a worker thread: kills wait) but
    what may be re-attached to (``reattach``: attempts under their data paths, the
    endpoint; ``spare``: what the backend re-attaches to elsewhere, a Ray node's actor
    with its attempts and endpoint); its other cells go back to pending (journaled from
    the loop). ``why``: what a killed attempt is journaled as abandoned for."""
    journal = state_dir / "journal.jsonl"
    grace = preset.watchdog.kill_grace_secs
    found = Swept()
    lost: set[str] = set()
    if reattach:
        lost = await reattach_datapaths(preset, plan, state_dir, ledger, emit, found)
        found.endpoints = await anyio.to_thread.run_sync(live_endpoints, journal, run_token)
    handled = {cid for cid, _, _ in found.reattached} | {
        adoption[0] for adoption in found.adopted} | found.never_started | {
        cid for cid, _, _ in (spare.attempts if spare else ())}
    cells = [state for state in ledger.cells.values() if state.id not in handled]
    reattached = [datapath for _, _, datapath in found.reattached]
    keep_tokens = frozenset(str(datapath.meta.get("token")) for datapath in reattached)
    keep_groups = frozenset(str(datapath.meta.get("group")) for datapath in reattached) | {
        f"endpoint-{replica}" for replica in found.endpoints} | (
        spare.groups if spare else frozenset())
    # A forked data path carries its fork server's environment, not its attempt's token:
    # kept by its pid (its harness tree, by the token it carries).
    keep_pids = frozenset(record["pid"] for record in found.endpoints.values()) | {
        datapath.pid for datapath in reattached} | (spare.pids if spare else frozenset())
    keep_leases = spare.leases if spare else frozenset()
    # The fork server a predecessor left serving is re-attached, not swept (alone: the
    # data paths it forked are kept or swept as their attempts are).
    from autopilot.datapath.forks import live_forkserver

    server = live_forkserver(state_dir) if reattach else None
    exited: dict[tuple[str, int], RunOutcome] | None = None
    refused: sweep.Refusals = []
    for cell, pids in await anyio.to_thread.run_sync(
            sweep.orphan_cells, cells, journal, grace, run_token, refused):
        found.cleaned.append({"cell": cell.id, "pids": pids})
        if exited is None:  # read only when a predecessor left cells running
            exited = attempt_outcomes(read_events(journal))
        outcome = None if cell.id in lost else finished_outcome(
            preset, plan.by_id[cell.id], state_dir, cell, exited, killed=cell.pid in pids)
        if cell.id in lost:
            emit(CellAbandoned(cell=cell.id, attempt=cell.attempts,
                 why="its data path ended without recording the harness's end (the "
                     "attempt's evidence is incomplete)", killed_pids=pids))
            continue
        if outcome is not None:
            # The harness finished before its supervisor died: grade that work
            # rather than throw away (maybe) an hour of GPU time.
            found.adopted.append((cell.id, cell.attempts, outcome, None))
            emit(CellAdopted(cell=cell.id, attempt=cell.attempts,
                 why="harness finished before the supervisor died", outcome=asdict(outcome)))
            continue
        emit(CellAbandoned(cell=cell.id, attempt=cell.attempts, why=why, killed_pids=pids))
    endpoint = await anyio.to_thread.run_sync(sweep.orphan_endpoint, journal, run_token,
                                              refused, keep_pids)
    for refusal in refused:
        emit(JournalPidRefused(**refusal, why="named by the journal, but the process "
             "carries neither this run's marker nor is our descendant: not signalled"))
    if endpoint:
        found.cleaned.append({"endpoint": endpoint.engine, "pids": endpoint.pids})
    # Then what no journal line records (a spawn the predecessor died before writing).
    for marked in await anyio.to_thread.run_sync(
            lambda: sweep.orphan_marked(run_token, grace, keep=keep_tokens,
                                        keep_pids=keep_pids | _trees(keep_pids)
                                        | ({server} if server else set()),
                                        keep_leases=keep_leases)):
        found.cleaned.append({"cell": marked.cell, "pids": marked.pids, "unjournaled": True})
        emit(OrphanKilled(cell=marked.cell, pids=marked.pids,
             why="spawned by a predecessor killed before journaling it"))
    # Last, whatever is still in the run's cgroups: a child that cleared its environment
    # and double-forked carries no marker and no parent, but cannot leave its group.
    contain = cgroups.for_run(run_token)[0]
    if contain is not None:
        for group in await anyio.to_thread.run_sync(
                lambda: contain.sweep(keep=keep_groups)):
            for f in group.foreign:
                emit(ForeignInCellGroup(cell=None, group=f.group, pid=f.pid, why=f.why))
            if not group.pids:
                continue
            found.cleaned.append({"cgroup": group.group, "pids": group.pids})
            emit(OrphanKilled(cell=None, group=group.group, pids=group.pids,
                 why="left in the run's cgroup by a predecessor"))
    # And with a user per cell, every process of a past cell's uid (one that wrote its
    # pid out of its group, say): a cell's uid is no one else's.
    if preset.harness.user != "same":  # the journal says which uids were cells'
        keep_uids = {datapath.meta.get("uid") for _, _, datapath in found.reattached}
        for uid, pids in await anyio.to_thread.run_sync(
                lambda: sweep.orphan_uids(journal, preset.harness.uids, keep_uids, grace)):
            found.cleaned.append({"uid": uid, "pids": pids})
            emit(OrphanKilled(cell=None, uid=uid, pids=pids,
                 why="a process of a past cell's own uid"))
    return found


STOPPED_AT_START = "stopped: a stop signal during start-up ended it (not charged)"


async def stop_leftovers(preset: Preset, plan: Plan, state_dir: Path, ledger: Ledger,
                         run_token: str, emit: Emit) -> Swept:
    """A stop during start-up (``systemctl stop`` right after a ``restart``): end what a
    predecessor left, since no one else will (``KillMode=process``): its attempts by
    identity and marker (the sweep without re-attaching), its endpoint process, and an
    endpoint container or a backend's endpoint elsewhere. Journaled like any sweep."""
    found = await sweep_orphans(preset, plan, state_dir, ledger, run_token, emit,
                                why=STOPPED_AT_START)
    from autopilot.backends.base import backend_class  # the backends import this module

    grace = preset.watchdog.kill_grace_secs
    kind = backend_class(preset.backend.kind)
    elsewhere = await anyio.to_thread.run_sync(partial(
        kind.cleanup, preset, run_token, grace, True, state_dir,
        sandbox_names(preset, plan, state_dir), began(state_dir / "journal.jsonl")))
    if needs_docker(preset) and kind.endpoint_here:  # (a Ray node's daemon: above)
        from autopilot.cell.sandbox import Docker

        docker = Docker()
        try:
            elsewhere += [f"container {name}" for name in
                          await docker.remove_labelled(str(state_dir), role="endpoint")]
        finally:
            await docker.close()
    from autopilot.datapath.forks import end_forkserver

    server = await anyio.to_thread.run_sync(end_forkserver, state_dir)
    if server is not None:  # (the marker sweep finds it too; by its record, surely)
        found.cleaned.append({"removed": f"data path fork server {server}"})
    for what in elsewhere:
        found.cleaned.append({"removed": what})
    emit(LeftoversStopped(cleaned=found.cleaned[:1000], why="a stop signal during "
                          "start-up: nothing of the run is left running"))
    return found


def _trees(pids: frozenset[int]) -> frozenset[int]:
    """Every descendant of ``pids`` (a re-adopted endpoint's workers carry the marker)."""
    import psutil

    from autopilot.proctree import descendants

    out: set[int] = set()
    for pid in pids:
        with contextlib.suppress(psutil.Error):
            out.update(child.pid for child in descendants(psutil.Process(pid)))
    return frozenset(out)


def finished_outcome(preset: Preset, cell: Cell, state_dir: Path, state: CellState,
                     exited: dict[tuple[str, int], RunOutcome],
                     killed: bool) -> RunOutcome | None:
    """The outcome of a journaled-running attempt whose completion artifacts are all
    there and newer than its start; else None. A harness still alive then (``killed``
    by the sweep) had finished its work and hung in teardown: teardown-masked."""
    ctx = cell_context(preset, cell, state.attempts, state_dir)
    started = parse_iso(state.started_ts)
    for tmpl in preset.harness.completion:
        try:
            mtime = Path(render(tmpl, ctx)).stat().st_mtime
        except OSError:
            return None
        if started is None or mtime < started - 1.0:  # a stale file of another attempt
            return None
    if killed:
        return RunOutcome(exit_code=None, killed="teardown", completion=True)
    known = exited.get((state.id, state.attempts))
    return known if known is not None and known.completion else RunOutcome(
        exit_code=None, completion=True)
