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


def _word(c: CellState) -> str:
    if c.status in ("PASS", "FAIL"):
        return c.status
    if c.status == "invalid":
        return f"INVALID({c.reason})"
    if c.status == "ungraded":  # its run stands, its grade does not: excluded, not pending
        return f"UNGRADED({c.reason})"
    return {"quarantined": "QUARANTINED", "running": "RUNNING", "ran": "RUNNING"}.get(
        c.status, "PENDING")


def to_json(d: DashData) -> str:
    arms: dict[str, Any] = {}
    for arm in d.arms:
        tasks = {}
        every = []
        for task, row in d.matrix(arm).items():
            c = counts(row.values())
            every += list(row.values())
            tasks[task] = {"pass": c["pass"], "valid": c["valid"],
                           **({"samples": c["samples"]} if "samples" in c else {}),
                           "cells": {f"v{n}": _word(cell) for n, cell in sorted(row.items())}}
        arms[arm] = {"totals": counts(every), "tasks": tasks}
    s = d.status
    doc = {"schema_version": SCHEMA_VERSION, "phase": s.get("phase"), "preset": s.get("preset"),
           "model": s.get("model"), "target_n": d.target_n, "generated_at": iso(),
           "liveness": s.get("liveness"),
           "arms": arms, "trust": d.trust.as_json()}
    return json.dumps(doc, separators=(",", ":"), sort_keys=False)
