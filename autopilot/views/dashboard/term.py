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


def header(d: DashData) -> list[str]:
    s = d.status
    ep = s.get("endpoint") or {}
    lines = [
        f"{s.get('phase', '?')} | preset {s.get('preset', '?')} | model {s.get('model', '?')} | "
        f"engine {s.get('engine', '?')} (endpoint {ep.get('state', '?')}) | "
        f"elapsed {fmt_secs(s.get('elapsed_secs'))} | eta {fmt_secs(s.get('eta_secs'))}",
        trust_line(d.trust),
    ]
    reps = s.get("endpoints")
    if isinstance(reps, list) and reps:
        lines.append("replicas: " + " · ".join(
            f"{r.get('replica', i)} {r.get('state', '?')} {r.get('slots_used', 0)}/"
            f"{r.get('slots', '?')} slots" + (f", {r['restarts']} restarts"
                                              if r.get("restarts") else "")
            + (f" on {r.get('host')} node {r['node']}" if r.get("node") else "")
            for i, r in enumerate(reps) if isinstance(r, dict)))
    live = s.get("liveness") or {}
    if live.get("label"):  # the figures are as the supervisor last wrote them
        lines[0] = f"{live['label']}, as last written: {lines[0]}"
    if s.get("released"):
        lines[0] += f" | released {s['released']} (its outputs may be another run's now)"
    if s.get("outcome_reason"):
        lines.append(f"reason: {s['outcome_reason']}")
    return lines


def trust_line(t: Trust) -> str:
    by = t.invalid_by_reason
    reasons = ", ".join(f"{k} {v}" for k, v in by.items())
    # Every INVALID attempt, as validate and the report count them; those that spent a
    # retry (grader_unavailable, datapath_lost... do not) said apart where they differ.
    spent = t.invalid_attempts
    every = sum(by.values())
    return (f"trust: valid {t.valid_cells} | invalid now {t.invalid_cells}"
            f" | invalid attempts {every}{f' ({reasons})' if reasons else ''}"
            f"{f', {spent} spending a retry' if spent != every else ''} | quarantined "
            f"{t.quarantined_cells} | teardown-masked "
            f"{t.teardown_masked_cells} | retried {t.retried_cells}"
            + (f" | tokens: harness disagrees with the gateway on {t.cost_mismatch_cells}"
               if t.cost_mismatch_cells else ""))


def delta(d: DashData, arm: str, task: str, passes: int, valid: int) -> str:
    b = d.baseline
    if not b or b.get("arm") != arm or not valid:
        return ""
    base = (b.get("passes") or {}).get(task)
    if base is None:
        return ""
    pp = round((passes / valid - base / b["n"]) * 100)
    return f"{pp:+d}pp"


def grid_table(d: DashData, arm: str, width: int | None = None) -> tuple[Table, bool]:
    """One row per task. Wide: a column per replicate with its full code. Compact, when
    that would not fit ``width`` (e.g. N=20 on 80 columns): one strip of one-letter codes
    in groups of 5, which wraps instead of being cut to '…'. Returns (table, compact)."""
    warn = finite(d.doc.thresholds.warn_secs)
    n_max = d.target_n
    has_base = bool(d.baseline and d.baseline.get("arm") == arm)
    rows: list[tuple[str, list[CellState | None], str, list[str]]] = []
    total_p = total_v = 0
    for task, row in d.matrix(arm).items():
        c = counts(row.values())
        total_p += c["pass"]
        total_v += c["valid"]
        cells = [row.get(n) for n in range(1, n_max + 1)]
        extra = [delta(d, arm, task, c["pass"], c["valid"])] if has_base else []
        rows.append((task, cells, f"{c['pass']}/{c['valid']}" + samples_text(c), extra))
    total_pv, total_extra = f"{total_p}/{total_v}", ([""] if has_base else [])

    def table(compact: bool) -> Table:
        t = Table(box=None, pad_edge=False)
        t.add_column("task", no_wrap=True)
        if compact:
            t.add_column(f"v1-v{n_max}", overflow="fold")
        else:
            for n in range(1, n_max + 1):
                t.add_column(f"v{n}", justify="center", no_wrap=True)
        t.add_column("pass/valid", justify="right", no_wrap=True)
        if has_base and d.baseline:
            t.add_column(Text(f"Δ vs base (N={d.baseline.get('n')})"), justify="right",
                         no_wrap=True)
        return t

    codes = [[analysis.code(cell, warn) for cell in cells] for _, cells, _, _ in rows]
    if width is not None and rows:
        # Measuring the whole table costs seconds at 20,000 cells; one row holding the
        # widest entry of every column, plus the total row, has the same natural width.
        probe = table(compact=False)
        probe.add_row(Text(max((r[0] for r in rows), key=len)),
                      *(max(col, key=len) for col in zip(*codes, strict=True)),
                      max((r[2] for r in rows), key=len),
                      *[max(col, key=len) for col in zip(*(r[3] for r in rows), strict=True)])
        probe.add_row("total", *[""] * n_max, total_pv, *total_extra)
        if not fits(probe, width):
            t = table(compact=True)
            for task, cells, pv, extra in rows:
                strip = Text()
                for n, cell in enumerate(cells, start=1):
                    if n > 1 and n % 5 == 1:
                        strip.append(" ")
                    strip.append(analysis.compact_code(cell, warn),
                                 style=STYLE[analysis.kind(cell).split()[0]])
                t.add_row(Text(task), strip, pv, *extra)
            t.add_row(Text("total", style="bold"), "", total_pv, *total_extra)
            return t, True
    wide = table(compact=False)
    for (task, cells, pv, extra), row_codes in zip(rows, codes, strict=True):
        t_cells = [Text(code, style=STYLE[analysis.kind(cell).split()[0]])
                   for code, cell in zip(row_codes, cells, strict=True)]
        wide.add_row(Text(task), *t_cells, pv, *extra)
    wide.add_row(Text("total", style="bold"), *[""] * n_max, total_pv, *total_extra)
    return wide, False


def fits(renderable: RenderableType, width: int) -> bool:
    """Whether ``renderable``'s natural width fits ``width`` columns: rich would squeeze
    a wider table into it by cutting cells to '…', which is what must not happen."""
    probe = Console(width=1 << 16, no_color=True, file=io.StringIO())
    return probe.measure(renderable).maximum <= width


def events_text(d: DashData) -> list[str]:
    out = []
    for ev in d.events:
        ts = str(ev.get("ts", ""))[11:19]
        what = ev.get("event", "")
        if what == "cell_verdict":
            v = ev.get("verdict")
            label = v if v != "INVALID" else f"INVALID({ev.get('reason')})"
            detail = f"{ev.get('cell')} {label}" + (" teardown-masked" if ev.get(
                "teardown_masked") else "")
        elif what == "milestone":
            detail = f"{ev.get('kind')} [{ev.get('priority')}]"
        elif what == "plan_changed":
            detail = f"identity {ev.get('old')} -> {ev.get('new')} (--allow-plan-change)"
        else:
            detail = " ".join(str(ev.get(k)) for k in ("cell", "reason", "why", "outcome")
                              if ev.get(k))
        out.append(f"{ts} {what} {detail}".rstrip())
    return out


def grid(d: DashData, *, events: bool = True, spark: bool = True,
         width: int | None = None) -> RenderableType:
    """The default view; with ``width``, arms whose wide grid would not fit are compact."""
    parts: list[RenderableType] = [Text(line) for line in header(d)]
    any_compact = False
    for arm in d.arms:
        table, compact = grid_table(d, arm, width)
        any_compact = any_compact or compact
        parts.append(Text(""))
        parts.append(Text(f"arm {arm}", style="bold"))
        parts.append(table)
    parts.append(Text(""))
    parts.append(Text(analysis.LEGEND, style="dim"))
    if any_compact:
        parts.append(Text(analysis.COMPACT_LEGEND, style="dim"))
    if spark and d.completions:
        parts.append(Text(f"completions |{analysis.sparkline(analysis.bins(d.completions))}|"))
    if events and d.events:
        parts.append(Text("recent events:"))
        parts.extend(Text("  " + line) for line in events_text(d))
    return Group(*parts)


def pct(p: int, v: int) -> str:
    return f"{p}/{v} {round(100 * p / v):3d}%" if v else "-"


def trend_view(d: DashData) -> RenderableType:
    parts: list[RenderableType] = [Text(trust_line(d.trust))]
    for arm in d.arms:
        rows = stats.trend(analysis.statuses(d.matrix(arm)), d.target_n)
        wins = list(rows[0].windows) if rows else []
        t = Table(box=None, pad_edge=False)
        t.add_column("task")
        for w in wins:
            t.add_column(f"v1-{w}", justify="right")
        t.add_column("")
        for r in rows:
            t.add_row(Text(r.task), *[pct(*r.windows[w]) for w in wins],
                      "misleading at small N" if r.misleading else "")
        parts += [Text(""), Text(f"arm {arm}: cumulative pass rate (valid cells only)",
                                 style="bold"), t]
    return Group(*parts)


def flips_view(d: DashData) -> RenderableType:
    parts: list[RenderableType] = [Text(trust_line(d.trust))]
    for arm in d.arms:
        t = Table(box=None, pad_edge=False)
        t.add_column("task")
        t.add_column("modal")
        t.add_column("flips")
        t.add_column("valid", justify="right")
        for r in stats.flips(analysis.statuses(d.matrix(arm))):
            t.add_row(Text(r.task), Text(r.modal),
                      Text(" ".join(f"v{n}:{v[0]}" for n, v in r.flips) or "-"), str(r.valid))
        parts += [Text(""), Text(f"arm {arm}: cells that differ from the task's modal verdict",
                                 style="bold"), t]
    return Group(*parts)


def make_console(no_color: bool, width: int | None = None, file: Any = None) -> Console:
    return Console(no_color=no_color, color_system=None if no_color else "auto",
                   width=width, file=file, highlight=False, soft_wrap=False)


def board_view(board: dict[str, Any]) -> RenderableType:
    """The board across runs; every value from a run goes in as Text (never markup)."""
    t = Table(box=None, pad_edge=False)
    for col in ("model", "arm", "p/v", "rate [95% CI]", "N", "invalid", "quar.",
                "masked", "tokens", "cost"):
        name = col in ("model", "arm", "invalid")
        t.add_column(col, justify="left" if name else "right", no_wrap=not name,
                     overflow="fold", min_width=12 if col in ("model", "arm") else None)
    for r in board["rows"]:
        ci = (f"{r['rate'] * 100:.0f}% [{r['wilson'][0] * 100:.0f}-{r['wilson'][1] * 100:.0f}]"
              if r["wilson"] else "-")
        inv = ", ".join(f"{k} {v}" for k, v in r["invalid_by_reason"].items()) or "0"
        tok = f"{r['tokens']['prompt']}/{r['tokens']['completion']}" if r["tokens"] else "-"
        cost = f"${r['cost']['usd']:.4f}" if r["cost"]["usd"] is not None else "unpriced"
        t.add_row(Text(clean(r["model"], 80)), Text(clean(r["arm"], 80)),
                  f"{r['pass']}/{r['valid']}", ci, f"{r['n_reached']}/{r['target_n']}",
                  Text(clean(inv, 120)), str(r["quarantined"]), str(r["teardown_masked"]),
                  tok, cost)
    parts: list[RenderableType] = [Text(f"board of {len(board['runs'])} runs", style="bold")]
    if board.get("mixed"):
        parts.append(Text("MIXED: the runs' task tables or graders differ; rates do not "
                          "compare across them", style="bold"))
    return Group(*parts, t)
