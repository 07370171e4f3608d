"""Tokens by bucket: the one shape a count of tokens has, from the wire to the board.

Providers bill a request in buckets, and each bucket has its own price: fresh input,
input written to a prompt cache, input read from one (a tenth of the fresh price at
Anthropic and OpenAI), and output. Reasoning is counted beside them: it is part of the
output as every dialect bills it (the gateway's Gemini reader adds Gemini's separate
``thoughtsTokenCount`` to the output for that reason), so it is never priced twice.

A bucket a response did not report is ``None`` — absent, not 0 — and stays absent
through every sum until some response reports it: a run against an endpoint that
reports no cache says nothing of its cache, it does not claim 0 cache reads.

Counts come from untrusted input (an endpoint's usage, a journal line): ``tokens_of``
shape-checks them (an integer in [0, MAX_COUNT]) before they count.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, fields
from typing import Any

from autopilot.state.budget import MAX_COUNT

# The buckets, in the order the report shows them.
BUCKETS = ("input", "cache_write", "cache_read", "output", "reasoning")
# The buckets a request is billed by (reasoning is inside output).
BILLED = ("input", "cache_write", "cache_read", "output")


def _plus(a: int | None, b: int | None) -> int | None:
    if a is None:
        return b
    return a if b is None else a + b


@dataclass(frozen=True, slots=True)
class Tokens:
    """Token counts by bucket; ``None`` is a bucket nobody reported."""

    input: int | None = None
    """Fresh input: prompt tokens neither read from nor written to a cache."""
    cache_write: int | None = None
    """Input written to the provider's prompt cache (Anthropic's cache creation)."""
    cache_read: int | None = None
    """Input read from the prompt cache (a cache hit)."""
    output: int | None = None
    """Generated tokens, reasoning included."""
    reasoning: int | None = None
    """The part of ``output`` the model spent reasoning."""

    def __add__(self, other: Tokens) -> Tokens:
        return Tokens(*(_plus(getattr(self, bucket), getattr(other, bucket)) for bucket in BUCKETS))

    def over(self, other: Tokens) -> Tokens:
        """These counts where reported, ``other``'s elsewhere (a stream that says its
        input at the start and its output at the end)."""
        return Tokens(*(getattr(other, bucket) if getattr(self, bucket) is None
                        else getattr(self, bucket) for bucket in BUCKETS))

    @property
    def prompt(self) -> int | None:
        """Every input token, cache-inclusive (what chat's ``prompt_tokens`` counts)."""
        parts = [self.input, self.cache_write, self.cache_read]
        return None if all(part is None for part in parts) else sum(part or 0 for part in parts)

    @property
    def fresh(self) -> int:
        """Tokens neither read from a cache: fresh input, cache writes and output."""
        return (self.input or 0) + (self.cache_write or 0) + (self.output or 0)

    @property
    def total(self) -> int:
        """Every billed token, cache-inclusive."""
        return sum(getattr(self, bucket) or 0 for bucket in BILLED)

    @property
    def empty(self) -> bool:
        return all(getattr(self, bucket) is None for bucket in BUCKETS)

    def as_dict(self) -> dict[str, int]:
        """The reported buckets only (an absent one is not written as 0)."""
        return {bucket: v for bucket in BUCKETS if (v := getattr(self, bucket)) is not None}


def count_of(value: Any) -> int | None:
    """An integer count in [0, MAX_COUNT], or None (a bool, a fraction, NaN, a string, a
    negative, a 401-digit integer: not a count). A whole float (``12.0``, as some
    servers write every number) is its integer."""
    if type(value) is float and value.is_integer():
        value = int(value)
    if type(value) is not int or not 0 <= value <= MAX_COUNT:
        return None
    return value


def tokens_of(raw: Any) -> Tokens | None:
    """Tokens from a record (a journal line, exit.json): None when it is not a mapping
    or any bucket it names is not a count."""
    if isinstance(raw, Tokens):
        return raw
    if not isinstance(raw, Mapping):
        return None
    kept: dict[str, int] = {}
    for bucket in BUCKETS:
        if raw.get(bucket) is None:
            continue
        count = count_of(raw[bucket])
        if count is None:
            return None
        kept[bucket] = count
    return Tokens(**kept)


assert tuple(f.name for f in fields(Tokens)) == BUCKETS

__all__ = ["BILLED", "BUCKETS", "Tokens", "count_of", "tokens_of"]
