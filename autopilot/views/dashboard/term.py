"""Terminal views with rich: the grid (default), trend and flips.

Every cell shows a letter code as well as a colour, so the grid reads the same with
``--no-color`` / ``NO_COLOR``; rates are over valid cells, next to the trust counts.
"""

from __future__ import annotations

import io
from typing import Any

from rich.console import Console, Group, RenderableType
from rich.table import Table
from rich.text import Text

from autopilot.escape import clean, finite
from autopilot.state.ledger import CellState, Trust
from autopilot.state.status import fmt_secs
from autopilot.views import stats
from autopilot.views.dashboard import analysis
from autopilot.views.dashboard.model import DashData, counts, samples_text

STYLE = {
    "pass": "bold green", "fail": "bold red", "invalid": "bold yellow",
    "quarantined": "bold magenta", "running": "bold cyan", "pending": "dim",
}


def header(data: DashData) -> list[str]:
    status = data.status
    endpoint = status.get("endpoint") or {}
    lines = [
        f"{status.get('phase', '?')} | preset {status.get('preset', '?')} | "
        f"model {status.get('model', '?')} | "
        f"engine {status.get('engine', '?')} (endpoint {endpoint.get('state', '?')}) | "
        f"elapsed {fmt_secs(status.get('elapsed_secs'))} | eta {fmt_secs(status.get('eta_secs'))}",
        trust_line(data.trust),
    ]
    reps = status.get("endpoints")
    if isinstance(reps, list) and reps:
        lines.append("replicas: " + " · ".join(
            f"{replica.get('replica', i)} {replica.get('state', '?')} "
            f"{replica.get('slots_used', 0)}/"
            f"{replica.get('slots', '?')} slots" + (f", {replica['restarts']} restarts"
                                                    if replica.get("restarts") else "")
            + (f" on {replica.get('host')} node {replica['node']}" if replica.get("node") else "")
            for i, replica in enumerate(reps) if isinstance(replica, dict)))
    live = status.get("liveness") or {}
    if live.get("label"):  # the figures are as the supervisor last wrote them
        lines[0] = f"{live['label']}, as last written: {lines[0]}"
    if status.get("released"):
        lines[0] += f" | released {status['released']} (its outputs may be another run's now)"
    if status.get("outcome_reason"):
        lines.append(f"reason: {status['outcome_reason']}")
    return lines


def trust_line(trust: Trust) -> str:
    by_reason = trust.invalid_by_reason
    reasons = ", ".join(f"{k} {v}" for k, v in by_reason.items())
    # Every INVALID attempt, as validate and the report count them; those that spent a
    # retry (grader_unavailable, datapath_lost... do not) said apart where they differ.
    spent = trust.invalid_attempts
    every = sum(by_reason.values())
    return (f"trust: valid {trust.valid_cells} | invalid now {trust.invalid_cells}"
            f" | invalid attempts {every}{f' ({reasons})' if reasons else ''}"
            f"{f', {spent} spending a retry' if spent != every else ''} | quarantined "
            f"{trust.quarantined_cells} | teardown-masked "
            f"{trust.teardown_masked_cells} | retried {trust.retried_cells}"
            + (f" | tokens: harness disagrees with the gateway on {trust.cost_mismatch_cells}"
               if trust.cost_mismatch_cells else ""))


def delta(data: DashData, arm: str, task: str, passes: int, valid: int) -> str:
    baseline = data.baseline
    if not baseline or baseline.get("arm") != arm or not valid:
        return ""
    base = (baseline.get("passes") or {}).get(task)
    if base is None:
        return ""
    points = round((passes / valid - base / baseline["n"]) * 100)
    return f"{points:+d}pp"


def grid_table(data: DashData, arm: str, width: int | None = None) -> tuple[Table, bool]:
    """One row per task. Wide: a column per replicate with its full code. Compact, when
    that would not fit ``width`` (e.g. N=20 on 80 columns): one strip of one-letter codes
    in groups of 5, which wraps instead of being cut to '…'. Returns (table, compact)."""
    warn = finite(data.doc.thresholds.warn_secs)
    n_max = data.target_n
    has_base = bool(data.baseline and data.baseline.get("arm") == arm)
    rows: list[tuple[str, list[CellState | None], str, list[str]]] = []
    total_p = total_v = 0
    for task, row in data.matrix(arm).items():
        tally = counts(row.values())
        total_p += tally["pass"]
        total_v += tally["valid"]
        cells = [row.get(replicate) for replicate in range(1, n_max + 1)]
        extra = [delta(data, arm, task, tally["pass"], tally["valid"])] if has_base else []
        rows.append((task, cells, f"{tally['pass']}/{tally['valid']}" + samples_text(tally), extra))
    total_pv, total_extra = f"{total_p}/{total_v}", ([""] if has_base else [])

    def table(compact: bool) -> Table:
        frame = Table(box=None, pad_edge=False)
        frame.add_column("task", no_wrap=True)
        if compact:
            frame.add_column(f"v1-v{n_max}", overflow="fold")
        else:
            for replicate in range(1, n_max + 1):
                frame.add_column(f"v{replicate}", justify="center", no_wrap=True)
        frame.add_column("pass/valid", justify="right", no_wrap=True)
        if has_base and data.baseline:
            frame.add_column(Text(f"Δ vs base (N={data.baseline.get('n')})"), justify="right",
                             no_wrap=True)
        return frame

    codes = [[analysis.code(cell, warn) for cell in cells] for _, cells, _, _ in rows]
    if width is not None and rows:
        # Measuring the whole table costs seconds at 20,000 cells; one row holding the
        # widest entry of every column, plus the total row, has the same natural width.
        probe = table(compact=False)
        probe.add_row(Text(max((entry[0] for entry in rows), key=len)),
                      *(max(col, key=len) for col in zip(*codes, strict=True)),
                      max((entry[2] for entry in rows), key=len),
                      *[max(col, key=len)
                        for col in zip(*(entry[3] for entry in rows), strict=True)])
        probe.add_row("total", *[""] * n_max, total_pv, *total_extra)
        if not fits(probe, width):
            compact_table = table(compact=True)
            for task, cells, score, extra in rows:
                strip = Text()
                for replicate, cell in enumerate(cells, start=1):
                    if replicate > 1 and replicate % 5 == 1:
                        strip.append(" ")
                    strip.append(analysis.compact_code(cell, warn),
                                 style=STYLE[analysis.kind(cell).split()[0]])
                compact_table.add_row(Text(task), strip, score, *extra)
            compact_table.add_row(Text("total", style="bold"), "", total_pv, *total_extra)
            return compact_table, True
    wide = table(compact=False)
    for (task, cells, score, extra), row_codes in zip(rows, codes, strict=True):
        t_cells = [Text(code, style=STYLE[analysis.kind(cell).split()[0]])
                   for code, cell in zip(row_codes, cells, strict=True)]
        wide.add_row(Text(task), *t_cells, score, *extra)
    wide.add_row(Text("total", style="bold"), *[""] * n_max, total_pv, *total_extra)
    return wide, False


def fits(renderable: RenderableType, width: int) -> bool:
    """Whether ``renderable``'s natural width fits ``width`` columns: rich would squeeze
    a wider table into it by cutting cells to '…', which is what must not happen."""
    probe = Console(width=1 << 16, no_color=True, file=io.StringIO())
    return probe.measure(renderable).maximum <= width


def events_text(data: DashData) -> list[str]:
    out = []
    for event in data.events:
        ts = str(event.get("ts", ""))[11:19]
        what = event.get("event", "")
        if what == "cell_verdict":
            v = event.get("verdict")
            label = v if v != "INVALID" else f"INVALID({event.get('reason')})"
            detail = f"{event.get('cell')} {label}" + (" teardown-masked" if event.get(
                "teardown_masked") else "")
        elif what == "milestone":
            detail = f"{event.get('kind')} [{event.get('priority')}]"
        elif what == "plan_changed":
            detail = f"identity {event.get('old')} -> {event.get('new')} (--allow-plan-change)"
        else:
            detail = " ".join(str(event.get(k)) for k in ("cell", "reason", "why", "outcome")
                              if event.get(k))
        out.append(f"{ts} {what} {detail}".rstrip())
    return out


def grid(data: DashData, *, events: bool = True, spark: bool = True,
         width: int | None = None) -> RenderableType:
    """The default view; with ``width``, arms whose wide grid would not fit are compact."""
    parts: list[RenderableType] = [Text(line) for line in header(data)]
    any_compact = False
    for arm in data.arms:
        table, compact = grid_table(data, arm, width)
        any_compact = any_compact or compact
        parts.append(Text(""))
        parts.append(Text(f"arm {arm}", style="bold"))
        parts.append(table)
    parts.append(Text(""))
    parts.append(Text(analysis.LEGEND, style="dim"))
    if any_compact:
        parts.append(Text(analysis.COMPACT_LEGEND, style="dim"))
    if spark and data.completions:
        parts.append(Text(f"completions |{analysis.sparkline(analysis.bins(data.completions))}|"))
    if events and data.events:
        parts.append(Text("recent events:"))
        parts.extend(Text("  " + line) for line in events_text(data))
    return Group(*parts)


def pct(passes: int, valid: int) -> str:
    return f"{passes}/{valid} {round(100 * passes / valid):3d}%" if valid else "-"


def trend_view(data: DashData) -> RenderableType:
    parts: list[RenderableType] = [Text(trust_line(data.trust))]
    for arm in data.arms:
        rows = stats.trend(analysis.statuses(data.matrix(arm)), data.target_n)
        wins = list(rows[0].windows) if rows else []
        table = Table(box=None, pad_edge=False)
        table.add_column("task")
        for window in wins:
            table.add_column(f"v1-{window}", justify="right")
        table.add_column("")
        for row in rows:
            table.add_row(Text(row.task), *[pct(*row.windows[window]) for window in wins],
                          "misleading at small N" if row.misleading else "")
        parts += [Text(""), Text(f"arm {arm}: cumulative pass rate (valid cells only)",
                                 style="bold"), table]
    return Group(*parts)


def flips_view(data: DashData) -> RenderableType:
    parts: list[RenderableType] = [Text(trust_line(data.trust))]
    for arm in data.arms:
        table = Table(box=None, pad_edge=False)
        table.add_column("task")
        table.add_column("modal")
        table.add_column("flips")
        table.add_column("valid", justify="right")
        for row in stats.flips(analysis.statuses(data.matrix(arm))):
            table.add_row(Text(row.task), Text(row.modal),
                          Text(" ".join(f"v{replicate}:{v[0]}" for replicate, v in row.flips)
                               or "-"), str(row.valid))
        parts += [Text(""), Text(f"arm {arm}: cells that differ from the task's modal verdict",
                                 style="bold"), table]
    return Group(*parts)


def make_console(no_color: bool, width: int | None = None, file: Any = None) -> Console:
    return Console(no_color=no_color, color_system=None if no_color else "auto",
                   width=width, file=file, highlight=False, soft_wrap=False)


def board_view(board: dict[str, Any]) -> RenderableType:
    """The board across runs; every value from a run goes in as Text (never markup)."""
    table = Table(box=None, pad_edge=False)
    for col in ("model", "arm", "p/v", "rate [95% CI]", "N", "invalid", "quar.",
                "masked", "tokens", "cost"):
        name = col in ("model", "arm", "invalid")
        table.add_column(col, justify="left" if name else "right", no_wrap=not name,
                         overflow="fold", min_width=12 if col in ("model", "arm") else None)
    for row in board["rows"]:
        bounds = row["wilson"]
        interval = (f"{row['rate'] * 100:.0f}% [{bounds[0] * 100:.0f}-{bounds[1] * 100:.0f}]"
                    if bounds else "-")
        inv = ", ".join(f"{k} {v}" for k, v in row["invalid_by_reason"].items()) or "0"
        tok = f"{row['tokens']['prompt']}/{row['tokens']['completion']}" if row["tokens"] else "-"
        cost = f"${row['cost']['usd']:.4f}" if row["cost"]["usd"] is not None else "unpriced"
        table.add_row(Text(clean(row["model"], 80)), Text(clean(row["arm"], 80)),
                      f"{row['pass']}/{row['valid']}", interval,
                      f"{row['n_reached']}/{row['target_n']}",
                      Text(clean(inv, 120)), str(row["quarantined"]), str(row["teardown_masked"]),
                      tok, cost)
    parts: list[RenderableType] = [Text(f"board of {len(board['runs'])} runs", style="bold")]
    if board.get("mixed"):
        parts.append(Text("MIXED: the runs' task tables or graders differ; rates do not "
                          "compare across them", style="bold"))
    return Group(*parts, table)
