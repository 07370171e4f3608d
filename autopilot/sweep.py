"""Orphan sweep on start: what a SIGKILLed predecessor left running.

Its cells' harness trees (recorded in the journal with pid + start time and their
per-attempt token) and the endpoint process it started are killed by exact identity;
its containers are removed by label (ours) or by this plan's exact sandbox names. Its
orphans were re-parented to init, not to us, so the token scan here looks at every
process (``full_scan``).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import structlog

from autopilot.journal import read_events
from autopilot.ledger import CellState
from autopilot.procs import ProcIdentity, Tracker, kill_tree

log = structlog.get_logger(__name__)


def orphan_cells(cells: list[CellState], journal: Path, grace: float
                 ) -> list[tuple[CellState, list[int]]]:
    """(cell, killed pids) for every cell the journal shows as still running."""
    running = [c for c in cells if c.status == "running"]
    if not running:
        return []
    tokens: dict[str, str | None] = {}
    for ev in read_events(journal).events:
        if ev.get("event") == "cell_started" and isinstance(ev.get("cell"), str):
            tokens[ev["cell"]] = ev.get("token")
    out = []
    for cell in running:
        pids: list[int] = []
        if cell.pid and cell.create_time:
            tracker = Tracker(ProcIdentity(cell.pid, cell.create_time), tokens.get(cell.id),
                              full_scan=True)
            pids = kill_tree(tracker, grace)
        out.append((cell, pids))
    return out


def orphan_endpoint(journal: Path) -> dict[str, Any] | None:
    """Stop exactly the endpoint process a dead predecessor started (never an attached
    one); what was killed, or None."""
    last: dict[str, Any] | None = None
    for ev in read_events(journal).events:
        if ev.get("event") == "endpoint_started":
            last = ev
        elif ev.get("event") == "run_finished":
            last = None
    if not last or last.get("attached") or not last.get("pid") or not last.get("create_time"):
        return None
    pids = kill_tree(Tracker(ProcIdentity(int(last["pid"]), float(last["create_time"]))), 5.0)
    if not pids:
        return None
    log.info("orphan_endpoint_killed", pids=pids)
    return {"endpoint": last.get("engine"), "pids": pids}
