"""The foreground progress display: what a person at a terminal sees while a run goes.

On a TTY (and without ``--quiet``) the supervisor shows one live panel instead of a
log line per event: an overall bar, per-arm counts, the running cells with their
watchdog tier, the endpoint's state and the ETA. Warnings and errors still print above
it (the console log floor is raised to warnings). It renders the same snapshot
status.json is written from, so what the panel says and what the dashboard says agree.
Imported only on a TTY: rich costs start-up time that a service never needs.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import anyio
from rich.console import Console, Group, RenderableType
from rich.live import Live
from rich.progress_bar import ProgressBar
from rich.table import Table
from rich.text import Text

from autopilot.escape import clean, finite
from autopilot.state.progress import fmt_secs

REFRESH_SECS = 0.5
MAX_RUNNING_ROWS = 12


def render(snap: dict[str, Any]) -> RenderableType:
    totals = snap.get("totals") or {}
    total, done = int(totals.get("total") or 0), int(totals.get("done") or 0)
    head = Text.assemble(
        (f"{clean(snap.get('phase'), 40)} ", "bold"),
        f"{clean(snap.get('preset'), 60)} · {clean(snap.get('model'), 60)} · ",
        f"{done}/{total} valid · P{totals.get('pass', 0)} F{totals.get('fail', 0)} "
        f"I{totals.get('invalid', 0)} Q{totals.get('quarantined', 0)} · "
        f"eta {fmt_secs(snap.get('eta_secs'))} · elapsed {fmt_secs(snap.get('elapsed_secs'))}")
    endpoint = snap.get("endpoint") or {}
    bar = Table.grid(padding=(0, 1))
    bar.add_row(ProgressBar(total=max(total, 1), completed=done, width=50),
                Text(f"{100 * done // max(total, 1)}%"))
    parts: list[RenderableType] = [
        head, bar,
        Text(f"endpoint {clean(endpoint.get('state'), 30)} · {clean(endpoint.get('engine'), 30)}"
             + (f" · restarts {endpoint['restarts']}" if endpoint.get("restarts") else "")),
    ]
    arms = snap.get("arms") or {}
    if arms:
        tbl = Table(box=None, pad_edge=False, show_header=True, header_style="dim")
        for col in ("arm", "pass", "fail", "invalid", "quar.", "running", "pending"):
            tbl.add_column(col, justify="left" if col == "arm" else "right")
        for arm, tally in arms.items():
            tbl.add_row(Text(clean(arm, 60)), *(str(tally.get(k, 0)) for k in (
                "pass", "fail", "invalid", "quarantined", "running", "pending")))
        parts.append(tbl)
    running = snap.get("running") or []
    if running:
        table = Table(box=None, pad_edge=False, show_header=True, header_style="dim")
        for col in ("running cell", "attempt", "tier", "frozen"):
            table.add_column(col, justify="left" if col == "running cell" else "right")
        for row in running[:MAX_RUNNING_ROWS]:
            tier = clean(row.get("tier") or "OK", 10)
            table.add_row(Text(clean(row.get("cell"), 80)), str(row.get("attempt", "")),
                          Text(tier, style="" if tier == "OK" else "bold yellow"),
                          f"{finite(row.get('frozen_secs')):.0f}s")
        if len(running) > MAX_RUNNING_ROWS:
            table.add_row(Text(f"… and {len(running) - MAX_RUNNING_ROWS} more"), "", "", "")
        parts.append(table)
    return Group(*parts)


async def show(snapshot: Callable[[], dict[str, Any]], console: Console | None = None) -> None:
    """Redraw the panel until cancelled; stderr (the log) prints above it."""
    console = console or Console(stderr=True)
    with Live(render(snapshot()), console=console, refresh_per_second=4,
              redirect_stderr=True, transient=False) as live:
        try:
            while True:
                await anyio.sleep(REFRESH_SECS)
                live.update(render(snapshot()))
        finally:
            live.update(render(snapshot()))
