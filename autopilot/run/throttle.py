"""Launch-rate back-off for a throttling hosted provider: a pure decision, table-tested.

A provider answering 429 is infrastructure, not model failure. Launching cells at full
concurrency into it only makes each one wait out more Retry-Afters (and give up as
INVALID(rate_limited)). So each throttle signal (the probe's 429, a cell that ended
rate-limited) halves the number of cells launched at once, at most once per
``HALVE_SECS``; after ``CALM_SECS`` without a signal it grows back by one, and so on up
to the configured concurrency (AIMD, as TCP does).
"""

from __future__ import annotations

from dataclasses import dataclass, replace

HALVE_SECS = 5.0  # signals closer together than this are one episode
CALM_SECS = 15.0  # quiet this long: one more cell at once


@dataclass(frozen=True)
class Throttle:
    limit: int  # cells launched at once now
    ceiling: int  # the configured concurrency
    last_signal: float = float("-inf")
    last_change: float = float("-inf")

    @property
    def throttled(self) -> bool:
        return self.limit < self.ceiling


def on_throttled(throttle: Throttle, now: float) -> Throttle:
    if now - throttle.last_change < HALVE_SECS:
        return replace(throttle, last_signal=now)
    return replace(throttle, limit=max(1, throttle.limit // 2), last_signal=now, last_change=now)


def on_tick(throttle: Throttle, now: float) -> Throttle:
    calm_since = max(throttle.last_signal, throttle.last_change)
    if throttle.limit >= throttle.ceiling or now - calm_since < CALM_SECS:
        return throttle
    return replace(throttle, limit=throttle.limit + 1, last_change=now)
