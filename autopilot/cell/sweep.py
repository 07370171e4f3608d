"""Orphan sweep on start: what a SIGKILLed predecessor left running.

Its cells' harness trees (recorded in the journal with pid + start time and their
per-attempt token), any process still carrying the run's marker (spawned but never
journaled) and the endpoint process it started are killed by exact identity;
its containers are removed by label (ours) or by this plan's exact sandbox names. Its
orphans were re-parented to init, not to us, so the token scan here looks at every
process (``full_scan``).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from autopilot.cell.procs import (
    DATAPATH_ENV,
    LEASE_ENV,
    TOKEN_ENV,
    ProcIdentity,
    Tracker,
    _wait_gone,
    journaled_identity,
    kill_tree,
    marked_processes,
    run_marked,
    start_ticks,
    verify,
)
from autopilot.logsetup import get_logger
from autopilot.state.journal import read_events
from autopilot.state.ledger import CellState

log = get_logger(__name__)


# Refusals of journal-named processes, as (what, pid): the caller journals them.
Refusals = list[dict[str, Any]]


def _marked_root(ident: ProcIdentity | None, token: str, what: str,
                 refused: Refusals) -> ProcIdentity | None:
    """``ident`` if its live process is this run's (see procs.run_marked), else None."""
    if ident is None:
        return None
    proc = verify(ident)
    if proc is None:
        return None
    if not run_marked(proc, token):
        refused.append({"what": what, "pid": ident.pid})
        log.warning("journal_pid_refused", what=what, pid=ident.pid)
        return None
    return ident


def orphan_cells(cells: list[CellState], journal: Path, grace: float, token: str,
                 refused: Refusals) -> list[tuple[CellState, list[int]]]:
    """(cell, killed pids) for every cell the journal shows as still running. The
    journal is untrusted: a recorded process is killed only if it is this run's."""
    running = [state for state in cells if state.status == "running"]
    if not running:
        return []
    tokens: dict[str, str | None] = {}
    for event in read_events(journal):
        if event.get("event") in ("cell_spawning", "cell_started") and \
                isinstance(event.get("cell"), str):
            tokens[event["cell"]] = event.get("token")
    out = []
    for cell in running:
        pids: list[int] = []
        ident = _marked_root(journaled_identity({
            "pid": cell.pid, "create_time": cell.create_time, "start_ticks": cell.start_ticks,
        }), token, f"cell {cell.id}", refused)
        if ident is not None:
            pids = kill_tree(Tracker(ident, tokens.get(cell.id), full_scan=True), grace)
        out.append((cell, pids))
    return out


@dataclass(frozen=True)
class Killed:
    """Processes a sweep ended, exactly: a cell's (its id), or an endpoint's (``cell``
    None; ``engine`` where the journal names it)."""

    pids: list[int]
    cell: str | None = None
    engine: str | None = None


def orphan_marked(run_token: str, grace: float, endpoint: bool = True,
                  lease: str | None = None, keep: frozenset[str] = frozenset(),
                  keep_pids: frozenset[int] = frozenset(),
                  keep_leases: frozenset[str] = frozenset()) -> list[Killed]:
    """Kill every process still carrying this run's marker: at start-up, with the lock
    held, none can be ours yet, so each is a predecessor's. This catches what the journal
    cannot know: a harness or grader spawned by a supervisor SIGKILLed before it could
    journal the spawn, which would otherwise run on beside its cell's next attempt (or,
    for an endpoint, hold its port). ``cell`` is None for an endpoint; ``endpoint=False``
    leaves endpoint processes alone; ``lease`` keeps to one Ray actor's processes;
    ``keep``: the tokens of attempts re-attached to (their data path and harness tree
    carry them), ``keep_pids``: a re-adopted endpoint's tree, ``keep_leases``: the Ray
    actors a successor re-attaches to (what they run carries their lease)."""
    out: list[Killed] = []
    for proc, env in marked_processes(run_token):
        if keep and (env.get(TOKEN_ENV) in keep or env.get(DATAPATH_ENV) in keep):
            continue
        if proc.pid in keep_pids or (keep_leases and env.get(LEASE_ENV) in keep_leases):
            continue
        if not endpoint and "AUTOPILOT_CELL_ID" not in env:
            continue
        if lease is not None and env.get(LEASE_ENV) != lease:
            continue  # another actor's (autopilot.backends.ray.node): not what was lost
        # create_time() is cached by psutil: this is the identity seen by the scan, so a
        # process that died meanwhile (killed with an earlier one's tree) is left alone.
        ident = ProcIdentity(proc.pid, proc.create_time(), start_ticks(proc.pid))
        pids = kill_tree(Tracker(ident, env.get(TOKEN_ENV), full_scan=True), grace)
        if pids:
            out.append(Killed(pids, env.get("AUTOPILOT_CELL_ID")))
    if out:
        log.info("orphan_unjournaled_killed", found=[(k.cell, k.pids) for k in out])
    return out


def orphan_endpoint(journal: Path, token: str, refused: Refusals,
                    keep: frozenset[int] = frozenset()) -> Killed | None:
    """Stop exactly the endpoint processes dead predecessors spawned (journaled at spawn,
    before their load finished; never an attached one); what was killed, or None. Each
    kill is identity-checked, so a process that already exited, or a recycled pid, is
    left alone."""
    killed: list[int] = []
    engine = None
    seen: set[ProcIdentity] = set()
    for event in read_events(journal):
        if event.get("event") not in ("endpoint_spawned", "endpoint_started") \
                or event.get("attached"):
            continue
        ident = journaled_identity(event)
        if ident is None or ident in seen or ident.pid in keep:
            continue
        seen.add(ident)
        if _marked_root(ident, token, "endpoint", refused) is None:
            continue
        engine = event.get("engine")
        killed += kill_tree(Tracker(ident), 5.0)
    if not killed:
        return None
    log.info("orphan_endpoint_killed", pids=killed)
    return Killed(killed, engine=engine if isinstance(engine, str) else None)


def orphan_uids(journal: Path, uids: tuple[int, int], keep: set[Any], grace: float
                ) -> list[tuple[int, list[int]]]:
    """Kill every process of a uid the journal gave a cell (``cell_spawning``'s ``uid``,
    inside the preset's range: the journal is untrusted) but those in ``keep`` (attempts
    re-attached to). With a user per cell a cell's uid is no one else's, so a process of
    it that left its group (or was never in one) is still found."""
    import signal

    import psutil

    from autopilot.cell.users import processes_of

    seen: set[int] = set()
    for event in read_events(journal):
        given = event.get("uid")
        if event.get("event") == "cell_spawning" and type(given) is int \
                and uids[0] <= given <= uids[1] and given not in keep:
            seen.add(given)
    out = []
    for uid in sorted(seen):
        procs = processes_of(uid)
        if not procs:
            continue
        for proc in procs:
            try:
                proc.send_signal(signal.SIGKILL)  # psutil checks the identity first
            except psutil.Error:
                continue
        _wait_gone(procs, grace)  # without reaping: a child of ours is asyncio's
        out.append((uid, sorted(proc.pid for proc in procs)))
    if out:
        log.info("orphan_uids_killed", found=out)
    return out
