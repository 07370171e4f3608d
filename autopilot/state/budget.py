"""Spend and budgets (``[budget]`` per run, ``[campaign] budget_*`` per campaign): pure.

Spend is what each finished attempt's summary says it used (``total_prompt_tokens``,
``total_completion_tokens``: the origin harness's names), INVALID attempts included
(a retried cell costs twice). It is journaled with each verdict, so a resumed run or a
campaign adds it up from journals alone. Priced spend uses the rate card (USD per
million tokens in, out); a model without a price cannot be held to a USD budget, and
that is said, not assumed to be $0.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # the data path reads counts through this module: no pydantic there
    from autopilot.config.measure import Rate
    from autopilot.state.cellevents import CellVerdict
    from autopilot.state.eventbase import EventBase

# A token count past this is no count (a quadrillion tokens; a hostile 401-digit integer
# would overflow every float it meets).
MAX_COUNT = 10**15


def count_or_none(value: Any) -> float | None:
    """A token count as the harness wrote it, if it is one: a finite number in
    [0, MAX_COUNT] (JSON lets a harness write Infinity, NaN, true, a string or an
    integer of any length)."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    if isinstance(value, float) and not math.isfinite(value):
        return None
    return float(value) if 0 <= value <= MAX_COUNT else None


@dataclass(frozen=True)
class Spend:
    prompt: int = 0
    completion: int = 0

    @property
    def tokens(self) -> int:
        return self.prompt + self.completion

    def __add__(self, other: Spend) -> Spend:
        return Spend(self.prompt + other.prompt, self.completion + other.completion)

    def __sub__(self, other: Spend) -> Spend:
        return Spend(self.prompt - other.prompt, self.completion - other.completion)

    def usd(self, rate: Rate | None) -> float | None:
        """Priced for a budget: every prompt token at the fresh input price (a cache
        read costs less, so this bound errs toward stopping early, never late)."""
        if rate is None or rate.input is None or rate.output is None:
            return None
        return (self.prompt * rate.input + self.completion * rate.output) / 1e6


def of_summary(summary: Any) -> Spend:
    """An attempt's spend from its summary (values of the wrong shape count as 0)."""
    if not isinstance(summary, dict):
        return Spend()
    prompt = count_or_none(summary.get("total_prompt_tokens")) or 0
    completion = count_or_none(summary.get("total_completion_tokens")) or 0
    return Spend(int(prompt), int(completion))


# Whose word an attempt's tokens rest on; METERED: the gateway's count is used.
# "metered_partial": the gateway's count of what it could read, a floor (some responses
# could not be metered: their size is unknown, and the budget fails closed on them).
COST_BASES = frozenset({"metered", "metered_partial", "self_reported",
                        "self_reported_mismatch"})
METERED = frozenset({"metered", "metered_partial", "self_reported_mismatch"})


def cost_basis(metered: Spend | None, reported: Spend, tolerance: float,
               fields: tuple[str, ...] = ("prompt", "completion"),
               unmetered: int = 0) -> tuple[Spend, str]:
    """What an attempt spent, and on whose word. The gateway's count (``metered``) is
    the spend wherever there is one; the harness's own summary is kept beside it, and a
    disagreement beyond ``tolerance`` (a share of the larger count) in a field the
    harness reported (``fields``) is flagged — a kernel that under-reports its cost, a
    CLI that records 0 billed tokens. With ``unmetered`` responses the gateway's count
    is a floor ("metered_partial"), never topped up by the harness's word: a claim is
    never shown as the gateway's count. Without the gateway the harness's word is all
    there is ("self_reported"), and a budget does not count on it (``reached``)."""
    if metered is None:
        return reported, "self_reported"
    if unmetered:
        return metered, "metered_partial"
    for f in fields:
        by_meter, by_harness = getattr(metered, f), getattr(reported, f)
        if abs(by_meter - by_harness) > tolerance * max(by_meter, by_harness, 1):
            return metered, "self_reported_mismatch"
    return metered, "metered"


def reported_fields(summary: Any) -> tuple[str, ...]:
    """The token counts a summary states (a missing one is not a claim of zero)."""
    if not isinstance(summary, dict):
        return ()
    return tuple(f for f, key in (("prompt", "total_prompt_tokens"),
                                  ("completion", "total_completion_tokens")) if key in summary)


def of_metered(event: Any) -> Spend | None:
    """An attempt's spend from its journaled ``cell_metered`` (None: no request went
    through the gateway, or a record of the wrong shape)."""
    if not isinstance(event, dict) or type(event.get("requests")) is not int \
            or event["requests"] < 1:
        return None
    prompt = count_or_none(event.get("prompt_tokens"))
    completion = count_or_none(event.get("completion_tokens"))
    if prompt is None or completion is None:
        return None
    return Spend(int(prompt), int(completion))


def of_verdict(event: CellVerdict) -> Spend:
    """The spend a verdict journaled (a regrade re-judges: it spends nothing); its
    ``spend`` is as read (untrusted), so only two counts in range are a spend."""
    spend = event.spend
    if event.regrade or not isinstance(spend, list) or len(spend) != 2 \
            or not all(type(count) is int and 0 <= count <= MAX_COUNT for count in spend):
        return Spend()
    return Spend(spend[0], spend[1])


def of_events(events: Iterable[EventBase]) -> Spend:
    """The spend journaled with a run's verdicts (its journal's events as their types:
    ``ReplayResult.typed``)."""
    from autopilot.state.cellevents import CellVerdict

    total = Spend()
    for event in events:
        if isinstance(event, CellVerdict):
            total = total + of_verdict(event)
    return total


def reached(tokens: int | None, usd: float | None, spend: Spend,
            rate: Rate | None, unmetered: int = 0, claimed: Spend | None = None) -> str | None:
    """Why the budget is reached (or can no longer be shown not to be), or None.
    ``spend``: what the gateway metered. ``unmetered``: responses whose spend the gateway
    could not read; ``claimed``: spend only a harness's own summary states (no gateway
    count). The size of either is unknown to us, never 0 and never the harness's word,
    so a run with any cannot prove it is under its cap: it fails closed."""
    if tokens is None and usd is None:
        return None
    if unmetered > 0:
        return (f"budget unprovable: {unmetered} response(s) the gateway could not meter "
                f"(spend unknown, not 0; metered so far {spend.tokens} tokens)")
    if claimed is not None and claimed.tokens > 0:
        return (f"budget unprovable: {claimed.tokens} tokens rest only on harnesses' own "
                f"summaries, which no gateway counted (metered so far {spend.tokens} tokens)")
    if tokens is not None and spend.tokens >= tokens:
        return f"budget reached: {spend.tokens} tokens of {tokens}"
    if usd is not None:
        cost = spend.usd(rate)
        if cost is None:
            return ("budget unusable: a USD budget needs a rate-card price for this model "
                    "(it is unpriced, not $0)")
        if cost >= usd:
            return f"budget reached: ${cost:.4f} of ${usd:g}"
    return None
