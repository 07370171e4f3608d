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
    b = analysis.bins(times)
    if not b:
        return None
    top = max(b) or 1
    w = width / len(b)
    bars = [{"x": round(i * w, 2), "w": round(w * 0.9, 2), "h": round(c / top * height, 2),
             "y": round(height - c / top * height, 2)} for i, c in enumerate(b) if c]
    return {"width": width, "height": height, "bars": bars}


def live_context(d: DashData, links: bool = False) -> dict[str, Any]:
    """What the grid fragment (``_live.html.j2``) shows; ``links``: each cell links to
    its own page (the served view)."""
    warn = finite(d.doc.thresholds.warn_secs)
    arms = []
    for arm in d.arms:
        rows = []
        tp = tv = 0
        for task, row in d.matrix(arm).items():
            c = counts(row.values())
            tp, tv = tp + c["pass"], tv + c["valid"]
            cells = []
            for n in range(1, d.target_n + 1):
                cell = row.get(n)
                title = cell.id if cell else ""
                if cell is not None and cell.reason:
                    title += f" INVALID({cell.reason})"
                elif cell and cell.status == "FAIL" and cell.caveat:
                    title += f" FAIL ({cell.caveat})"
                cells.append({"kind": analysis.kind(cell), "code": analysis.code(cell, warn),
                              "title": title, "id": cell.id if cell else ""})
            rows.append({"task": task, "cells": cells, "score": f"{c['pass']}/{c['valid']}",
                         "delta": delta(d, arm, task, c["pass"], c["valid"])})
        arms.append({"name": arm, "rows": rows, "total": f"{tp}/{tv}",
                     "has_base": bool(d.baseline and d.baseline.get("arm") == arm)})
    return {"status": d.status, "header": header(d), "arms": arms,
            "ns": range(1, d.target_n + 1), "legend": analysis.LEGEND,
            "spark": _spark(d.completions), "events": events_text(d), "links": links}


def render_html(d: DashData, refresh: int = 15) -> str:
    return _env.get_template("dashboard.html.j2").render(
        **live_context(d), refresh=refresh, generated=iso(), state_dir=str(d.state_dir))


def render_template(name: str, **ctx: Any) -> str:
    return _env.get_template(name).render(**ctx)
