"""What cells cost, by token bucket and price basis (the report's and the board's).

Every cell is priced from its own tokens by bucket (autopilot.state.pricing) at its
arm's rate (an arm with a route is billed for its route's model), and the sums say on
what basis: ``buckets`` where every cell's every bucket is priced, a floor where some
bucket is not (which ones), ``unpriced`` cells counted apart — never added as $0.
"""

from __future__ import annotations

import statistics
from collections.abc import Iterable, Sequence
from typing import Any, Protocol

from autopilot.config import Preset
from autopilot.escape import md
from autopilot.state.pricing import PRICE_BASES, Priced, price, total
from autopilot.state.tokens import BUCKETS, Tokens
from autopilot.views.energy import J_PER_KWH


class Costed(Protocol):
    @property
    def tokens(self) -> Tokens | None: ...


def summed(cells: Iterable[Costed]) -> Tokens:
    out = Tokens()
    for f in cells:
        if f.tokens is not None:
            out = out + f.tokens
    return out


def priced(preset: Preset, arm: str, cells: Iterable[Costed]) -> Priced:
    rate = preset.rate_for(arm)
    return total(price(f.tokens, rate) for f in cells if f.tokens is not None)


def histogram(cost: Priced) -> str:
    """``buckets 12, floor 3 (no price for cache_write), unpriced 1``."""
    parts = []
    for basis in PRICE_BASES:
        if cost.bases[basis]:
            extra = (f" (no price for {', '.join(sorted(cost.unpriced_buckets))})"
                     if basis == "floor" else "")
            parts.append(f"{basis} {cost.bases[basis]}{extra}")
    return ", ".join(parts) or "-"


def usd_text(cost: Priced) -> str:
    if not cost.bases:
        return "-"
    if cost.bases["unpriced"] == sum(cost.bases.values()):
        return "unpriced"
    figure = f"{cost.usd:.4f}"
    if cost.bases["floor"]:
        figure = f"≥ {figure}"
    if cost.bases["unpriced"]:
        figure += f" (+{cost.bases['unpriced']} unpriced)"
    return figure


def cost_line(preset: Preset, arm: str, cells: Sequence[Costed]) -> list[str]:
    """Cache-inclusive tokens, fresh tokens, each bucket, USD, the basis histogram."""
    tokens = summed(cells)
    cost = priced(preset, arm, cells)
    buckets = ["-" if getattr(tokens, bucket) is None else str(getattr(tokens, bucket))
               for bucket in BUCKETS]
    return [str(tokens.total), str(tokens.fresh), *buckets, usd_text(cost), histogram(cost)]


def cost_doc(preset: Preset, arm: str, cells: Sequence[Costed]) -> dict[str, Any]:
    """The same for JSON (the board)."""
    tokens = summed(cells)
    cost = priced(preset, arm, cells)
    basis = "unpriced" if not cost.bases or cost.bases["unpriced"] == sum(cost.bases.values()) \
        else ("buckets" if cost.exact else "floor" if not cost.bases["unpriced"] else "partial")
    return {"usd": None if basis == "unpriced" else round(cost.usd, 6), "basis": basis,
            "bases": dict(cost.bases), "unpriced_buckets": sorted(cost.unpriced_buckets),
            "tokens": tokens.as_dict(), "tokens_total": tokens.total, "tokens_fresh": tokens.fresh}


def tokens_section(preset: Preset, facts: Sequence[Any], arms: list[str]) -> list[str]:
    """The report's section on tokens and cost (facts: autopilot.views.report.CellFacts)."""
    with_usage = [f for f in facts if f.completion_tokens is not None]
    if not with_usage:
        return ["No usage data: the harness reported no token counts.", ""]
    metered = sum(f.cost_basis is not None for f in with_usage)
    partial = sum(f.cost_basis == "metered_partial" for f in with_usage)
    source = (f"the gateway's metered counts ({metered} of {len(with_usage)} cells"
              + (f", {partial} of them a floor: responses the gateway could not meter, "
                 "their size unknown" if partial else "")
              + "; the summary files' self-reported counts elsewhere)" if metered else
              "the token totals in the summary files (self-reported: no gateway counted)")
    out = [f"Tokens: {source}; priced by bucket from the preset's rate card (an arm "
           "with a route by its route's model). Price basis per cell: buckets (every "
           "bucket it used is priced), floor (a bucket it used has no price: the figure "
           "is a lower bound), unpriced (its model is not on the rate card: no figure, "
           "never added as zero).", "",
           "| arm | route | cells with usage | tokens (cache-inclusive) | tokens fresh | "
           "input | cache write | cache read | output | reasoning | cost (USD) | "
           "price basis |", "|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for arm in arms:
        mine = [f for f in with_usage if f.arm == arm]
        line = cost_line(preset, arm, mine)
        out.append(f"| {arm} | {md(route_name(preset, arm), 80)} | {len(mine)} | "
                   + " | ".join(line) + " |")
    energy = any(f.joules is not None for f in facts)
    out += ["", "Per task (valid cells; medians, as the origin's summarize.sh):", "",
            "| task | arm | pass / valid | median tokens | median wall (s) |"
            + (" median energy (Wh) |" if energy else ""),
            "|---|---|---|---|---|" + ("---|" if energy else "")]
    for task in dict.fromkeys(f.task for f in facts):
        for arm in arms:
            cells = [f for f in facts if f.task == task and f.arm == arm and f.valid]
            if not cells:
                continue
            toks = [float((f.prompt_tokens or 0) + (f.completion_tokens or 0)) for f in cells
                    if f.completion_tokens is not None]
            walls = [f.wall_secs for f in cells if f.wall_secs is not None]
            passes = sum(f.verdict == "PASS" for f in cells)
            watt_hours = [f.joules * 1000 / J_PER_KWH for f in cells if f.joules is not None]
            out.append(f"| {task} | {arm} | {passes}/{len(cells)} | "
                       f"{_median(toks, '{:.0f}')} | {_median(walls, '{:.1f}')} |"
                       + (f" {_median(watt_hours, '{:.2f}')} |" if energy else ""))
    return [*out, ""]


def _median(values: list[float], fmt: str) -> str:
    return fmt.format(statistics.median(values)) if values else "-"


def route_name(preset: Preset, arm: str) -> str:
    """Where an arm's requests go, for a column head: its route, or the run's endpoint."""
    route = preset.arm(arm).route
    if route is None:
        return f"endpoint · {preset.endpoint.engine}"
    return f"{route.dialect} · {route.origin()} · {route.model}"


__all__ = ["cost_doc", "cost_line", "histogram", "priced", "route_name", "summed",
           "tokens_section", "usd_text"]
