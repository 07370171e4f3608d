"""The self-contained HTML page: one file, no external assets, a meta refresh, an inline
SVG sparkline, and every string escaped (jinja2 autoescaping: a task or reason holding
markup renders as text, and no script from the data can run)."""

from __future__ import annotations

from typing import Any

from jinja2 import Environment, PackageLoader, select_autoescape

from autopilot.escape import finite
from autopilot.state.fsutil import iso
from autopilot.views.dashboard import analysis
from autopilot.views.dashboard.model import DashData, counts
from autopilot.views.dashboard.term import delta, events_text, header

_env = Environment(
    loader=PackageLoader("autopilot.views.dashboard", "templates"),
    autoescape=select_autoescape(default=True, default_for_string=True),
    trim_blocks=True, lstrip_blocks=True,
)


def _spark(times: list[float], width: int = 400, height: int = 40) -> dict[str, Any] | None:
    bins = analysis.bins(times)
    if not bins:
        return None
    top = max(bins) or 1
    bar_width = width / len(bins)
    bars = [{"x": round(i * bar_width, 2), "w": round(bar_width * 0.9, 2),
             "h": round(count / top * height, 2), "y": round(height - count / top * height, 2)}
            for i, count in enumerate(bins) if count]
    return {"width": width, "height": height, "bars": bars}


def live_context(data: DashData, links: bool = False) -> dict[str, Any]:
    """What the grid fragment (``_live.html.j2``) shows; ``links``: each cell links to
    its own page (the served view)."""
    warn = finite(data.doc.thresholds.warn_secs)
    arms = []
    for arm in data.arms:
        rows = []
        pass_total = valid_total = 0
        for task, row in data.matrix(arm).items():
            tally = counts(row.values())
            pass_total, valid_total = pass_total + tally["pass"], valid_total + tally["valid"]
            cells = []
            for replicate in range(1, data.target_n + 1):
                cell = row.get(replicate)
                title = cell.id if cell else ""
                if cell is not None and cell.reason:
                    title += f" INVALID({cell.reason})"
                elif cell and cell.status == "FAIL" and cell.caveat:
                    title += f" FAIL ({cell.caveat})"
                cells.append({"kind": analysis.kind(cell), "code": analysis.code(cell, warn),
                              "title": title, "id": cell.id if cell else ""})
            rows.append({"task": task, "cells": cells, "score": f"{tally['pass']}/{tally['valid']}",
                         "delta": delta(data, arm, task, tally["pass"], tally["valid"])})
        arms.append({"name": arm, "rows": rows, "total": f"{pass_total}/{valid_total}",
                     "has_base": bool(data.baseline and data.baseline.get("arm") == arm)})
    return {"status": data.status, "header": header(data), "arms": arms,
            "ns": range(1, data.target_n + 1), "legend": analysis.LEGEND,
            "spark": _spark(data.completions), "events": events_text(data), "links": links}


def render_html(data: DashData, refresh: int = 15) -> str:
    return _env.get_template("dashboard.html.j2").render(
        **live_context(data), refresh=refresh, generated=iso(), state_dir=str(data.state_dir))


def render_template(name: str, **ctx: Any) -> str:
    return _env.get_template(name).render(**ctx)
