"""``dashboard --json``: a compact, stable, machine-readable status.

Schema (``schema_version`` 1; fields are only ever added):
  {"schema_version": 1, "phase", "preset", "model", "target_n", "generated_at",
   "arms": {<arm>: {"totals": {"pass", "fail", "valid", "invalid", "quarantined",
                               "ungraded", "running", "pending"},
                    "tasks": {<task>: {"pass", "valid", "samples" (where cells grade many
                                       items: {"passed", "scored", "unscored", "errored"}),
                                       "cells": {"v<n>": "PASS" | "FAIL" | "INVALID(<reason>)"
                                                 | "UNGRADED(<reason>)" | "QUARANTINED"
                                                 | "RUNNING" | "PENDING"}}}}},
   "trust": {"valid_cells", "invalid_cells", "invalid_attempts", "invalid_by_reason",
             "teardown_masked_cells", "quarantined_cells", "retried_cells", "excluded",
             "metered_cells", "cost_mismatch_cells"}}
Verdicts come from the journal, where each was recorded from the cell's grade file by
the validity classifier; pass rates count valid cells only.
"""

from __future__ import annotations

import json
from typing import Any

from autopilot.state.fsutil import iso
from autopilot.state.ledger import CellState
from autopilot.views.dashboard.model import DashData, counts

SCHEMA_VERSION = 1


def _word(cell: CellState) -> str:
    if cell.status in ("PASS", "FAIL"):
        return cell.status
    if cell.status == "invalid":
        return f"INVALID({cell.reason})"
    if cell.status == "ungraded":  # its run stands, its grade does not: excluded, not pending
        return f"UNGRADED({cell.reason})"
    return {"quarantined": "QUARANTINED", "running": "RUNNING", "ran": "RUNNING"}.get(
        cell.status, "PENDING")


def to_json(data: DashData) -> str:
    arms: dict[str, Any] = {}
    for arm in data.arms:
        tasks = {}
        every = []
        for task, row in data.matrix(arm).items():
            tally = counts(row.values())
            every += list(row.values())
            tasks[task] = {"pass": tally["pass"], "valid": tally["valid"],
                           **({"samples": tally["samples"]} if "samples" in tally else {}),
                           "cells": {f"v{replicate}": _word(cell)
                                     for replicate, cell in sorted(row.items())}}
        arms[arm] = {"totals": counts(every), "tasks": tasks}
    status = data.status
    doc = {"schema_version": SCHEMA_VERSION, "phase": status.get("phase"),
           "preset": status.get("preset"),
           "model": status.get("model"), "target_n": data.target_n, "generated_at": iso(),
           "liveness": status.get("liveness"),
           "arms": arms, "trust": data.trust.as_json()}
    return json.dumps(doc, separators=(",", ":"), sort_keys=False)
