"""status.json: a snapshot derived from in-memory state; schema, ETA, one-line summary.

The journal is the truth; status.json is for readers (dashboard, jq, systemd STATUS=).
It is rebuilt from memory and written atomically (temp + fsync + rename + dir fsync) on
every transition, debounced so a burst of events costs one write. The writing itself
happens in a worker thread so an fsync never stalls the event loop.

Schema (``schema_version`` 1; fields are only ever added):
  schema_version, phase (starting | run:pass<N> | COMPLETE | INCOMPLETE | stopped),
  outcome_reason, preset, description, model, engine, target_n, plan_identity,
  pid, host, started_at, updated_at, elapsed_secs, eta_secs, pass, max_passes,
  concurrency, totals{total,pass,fail,invalid,quarantined,running,pending,done},
  arms{<arm>: totals}, tasks{<arm>: {<task>: totals}},
  running[{cell,attempt,pid,frozen_secs,tier,last_signal,started_at}],
  recent_cells[{cell,verdict,ts,attempt,teardown_masked}], fails[...],
  trust{valid_cells,invalid_cells,invalid_attempts,invalid_by_reason,
        teardown_masked_cells,quarantined_cells,retried_cells,excluded[]},
  endpoint{engine,url,model,pid,create_time,container,attached,state,restarts,down_secs,
           down_since,failed},
  anomaly{streak,alarms}, orphans_cleaned[], tasks_order[], arms_order[],
  disk{low,floor_mb,free_mb,where} (null without a floor), gateway{failovers}
"""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import anyio

from autopilot.state.fsutil import atomic_write_json
from autopilot.state.progress import eta_secs, fmt_secs, oneline

__all__ = ["StatusWriter", "eta_secs", "fmt_secs", "oneline"]



class StatusWriter:
    """Debounced atomic writer: ``mark()`` is cheap and can be called on every event."""

    def __init__(self, path: Path, build: Callable[[], dict[str, Any]], debounce: float,
                 also: Callable[[dict[str, Any]], None] | None = None) -> None:
        self.path = path
        self.build = build
        self.also = also  # e.g. the metrics textfile, written with every status write
        self.debounce = debounce
        self._dirty = anyio.Event()
        self.writes = 0
        self.last_write_secs = 0.0

    def mark(self) -> None:
        self._dirty.set()

    async def run(self) -> None:
        while True:
            await self._dirty.wait()
            self._dirty = anyio.Event()
            await self.write_now()
            await anyio.sleep(self.debounce)

    async def write_now(self) -> None:
        snapshot = self.build()
        t0 = time.perf_counter()
        await anyio.to_thread.run_sync(atomic_write_json, self.path, snapshot)
        if self.also is not None:
            await anyio.to_thread.run_sync(self.also, snapshot)
        self.last_write_secs = time.perf_counter() - t0
        self.writes += 1
