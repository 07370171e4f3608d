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
  endpoint{engine,url,model,pid,attached,state,restarts,down_secs,failed},
  anomaly{streak,alarms}, orphans_cleaned[], tasks_order[], arms_order[]
"""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import anyio

from autopilot.fsutil import atomic_write_json

SCHEMA_VERSION = 1


def eta_secs(remaining: int, done_this_session: int, session_elapsed: float) -> float | None:
    """Remaining cells at this session's completion rate; None until one cell is done."""
    if remaining <= 0:
        return 0.0
    if done_this_session <= 0 or session_elapsed <= 0:
        return None
    return remaining * session_elapsed / done_this_session


def fmt_secs(secs: float | None) -> str:
    if secs is None:
        return "?"
    secs = round(secs)
    h, rem = divmod(secs, 3600)
    m, s = divmod(rem, 60)
    return f"{h}:{m:02d}:{s:02d}" if h else f"{m}:{s:02d}"


def oneline(status: dict[str, Any]) -> str:
    """``run:pass1 demo 14/24 done P9 F5 I0 | 2 running | eta 0:31``"""
    t = status.get("totals", {})
    trust = status.get("trust", {})
    parts = [
        f"{status.get('phase', '?')} {status.get('preset', '?')} "
        f"{t.get('done', 0)}/{t.get('total', 0)} done "
        f"P{t.get('pass', 0)} F{t.get('fail', 0)} I{t.get('invalid', 0)}"
        + (f" Q{t.get('quarantined')}" if t.get("quarantined") else "")
        + (f" M{trust.get('teardown_masked_cells')}" if trust.get("teardown_masked_cells")
           else ""),
        f"{t.get('running', 0)} running",
        f"eta {fmt_secs(status.get('eta_secs'))}",
    ]
    ep = status.get("endpoint") or {}
    if ep.get("state") not in (None, "up"):
        parts.append(f"endpoint {ep.get('state')}")
    return " | ".join(parts)


class StatusWriter:
    """Debounced atomic writer: ``mark()`` is cheap and can be called on every event."""

    def __init__(self, path: Path, build: Callable[[], dict[str, Any]], debounce: float) -> None:
        self.path = path
        self.build = build
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
        self.last_write_secs = time.perf_counter() - t0
        self.writes += 1
