"""A cell's cost from its tokens by bucket and its model's rate card entry (pure).

Each cell gets a price basis, the board's word for how far its dollar figure can be
trusted (the origin needle-bench keeps the same per cell, with a histogram of them):
``buckets`` — every bucket it used has a price and the figure is their sum;
``floor`` — some bucket it used has none (named), so the figure is a lower bound;
``unpriced`` — its model is not on the rate card: no figure at all, never $0.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass

from autopilot.config.measure import Rate
from autopilot.state.tokens import BILLED, Tokens

PRICE_BASES = ("buckets", "floor", "unpriced")


@dataclass(frozen=True)
class Price:
    usd: float | None
    basis: str  # one of PRICE_BASES
    unpriced: tuple[str, ...] = ()  # the buckets with tokens and no price (a floor's)

    def label(self) -> str:
        return f"floor (no price for {', '.join(self.unpriced)})" if self.unpriced \
            else self.basis


def price(tokens: Tokens, rate: Rate | None) -> Price:
    if rate is None:
        return Price(None, "unpriced")
    usd, missing = 0.0, []
    for bucket in BILLED:
        count = getattr(tokens, bucket)
        if not count:
            continue
        unit_price = rate.price_of(bucket)
        if unit_price is None:
            missing.append(bucket)
        else:
            usd += count * unit_price / 1e6
    return Price(usd, "floor" if missing else "buckets", tuple(missing))


@dataclass(frozen=True)
class Priced:
    """Cells' prices summed: dollars where known, how many cells on each basis."""
    usd: float
    bases: Counter[str]
    unpriced_buckets: frozenset[str]

    @property
    def exact(self) -> bool:
        return not self.bases["floor"] and not self.bases["unpriced"]


def total(prices: Iterable[Price]) -> Priced:
    usd, bases, missing = 0.0, Counter[str](), set[str]()
    for priced in prices:
        bases[priced.basis] += 1
        usd += priced.usd or 0.0
        missing.update(priced.unpriced)
    return Priced(usd, bases, frozenset(missing))


__all__ = ["PRICE_BASES", "Price", "Priced", "price", "total"]
