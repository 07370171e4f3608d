"""What a run is measured against and priced by: its spend limits (``[budget]``), local
energy (``[cost]``), the baseline and other models' published results
(``[comparators]``).

Part of the configuration schema (autopilot.config re-exports every name); the code
that uses them is in autopilot.state.budget, autopilot.run.power and
autopilot.views.report / energy.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import Field, model_validator

from autopilot.config.base import Frozen as _Frozen


class Baseline(_Frozen):
    """An arm's earlier pass counts per task, the run's results are held against."""

    arm: str
    """The arm whose results are compared (one of the preset's arms)."""
    n: int = Field(ge=1)
    """Replicates per task the baseline ran."""
    passes: dict[str, int]
    """A task id -> its passes out of ``n``."""


class Comparator(_Frozen):
    """A published result of another model, in its own unit: passes of the cells it ran
    (``passes`` of ``of``), and/or task families where at least 2/3 of its replicates
    passed (``families`` of ``families_of``). A bare number has no unit (a family count
    read as a pass total is how 7 came to stand beside 20/36), so it is refused."""

    passes: int | None = Field(default=None, ge=0)
    """Passes of the cells it ran."""
    of: int | None = Field(default=None, ge=1)
    """The cells it ran."""
    families: int | None = Field(default=None, ge=0)
    """Task families where at least 2/3 of its replicates passed."""
    families_of: int | None = Field(default=None, ge=1)
    """The task families it ran."""
    source: str = Field(default="", max_length=200)
    """Where the figures come from (shown beside them)."""

    @model_validator(mode="after")
    def _units(self) -> Comparator:
        for count, total, names in ((self.passes, self.of, "passes/of"),
                                    (self.families, self.families_of,
                                     "families/families_of")):
            if (count is None) != (total is None):
                raise ValueError(f"give {names} together (a count and what it is out of)")
            if count is not None and total is not None and count > total:
                raise ValueError(f"{names}: {count} is more than {total}")
        if self.passes is None and self.families is None:
            raise ValueError("give passes = P, of = N and/or families = F, families_of = T")
        return self


class Budget(_Frozen):
    """Spend limits of a run: reached, launching stops (a milestone says so) and the run
    ends INCOMPLETE with the reason. Spend is every attempt's token totals from its summary
    (INVALID attempts cost money too), priced by the rate card for ``usd``."""

    tokens: int | None = Field(default=None, ge=1)
    """The most tokens (prompt + completion) the run may spend."""
    usd: float | None = Field(default=None, gt=0)
    """The most USD the run may spend (priced by ``rate_card``)."""


class Cost(_Frozen):
    """Local energy (autopilot.run.power): every GPU's power draw sampled while the run
    lasts, apportioned to the cells running on each replica's GPUs, reported as kWh and
    at ``usd_per_kwh``. ``auto`` samples when the endpoint runs on this host (local
    backend; llama.cpp or vLLM) and ``nvidia_smi`` answers; unavailable stays unavailable."""

    usd_per_kwh: float | None = Field(default=None, gt=0)
    """The price of a kWh (none: energy is reported without a price)."""
    power: Literal["auto", "off"] = "auto"
    """"auto": sample where it can be; "off": never."""
    sample_secs: float = Field(default=15, ge=0.2, le=3600)
    """How often the GPUs' power draw is read."""
    nvidia_smi: str = "nvidia-smi"
    """The nvidia-smi program."""


class Rate(_Frozen):
    """A model's list price by token bucket, in USD per million tokens (a ``rate_card``
    entry). A bare ``[in, out]`` pair prices every input token (cache reads and writes
    too) at ``in``, as before buckets; a table prices each bucket it names, and a
    bucket with tokens but no price makes the cell's cost a floor, said as such."""

    input: float | None = Field(default=None, ge=0)
    """Fresh input tokens."""
    output: float | None = Field(default=None, ge=0)
    """Output tokens (reasoning included: it is billed as output)."""
    cache_read: float | None = Field(default=None, ge=0)
    """Input read from the prompt cache (often a tenth of ``input``)."""
    cache_write: float | None = Field(default=None, ge=0)
    """Input written to the prompt cache."""

    @model_validator(mode="before")
    @classmethod
    def _pair(cls, v: Any) -> Any:
        if isinstance(v, list | tuple):
            if len(v) != 2:
                raise ValueError(f"a bare rate is [in, out] (two prices), not {len(v)} values")
            return {"input": v[0], "output": v[1], "cache_read": v[0], "cache_write": v[0]}
        return v

    def price_of(self, bucket: str) -> float | None:
        return getattr(self, bucket, None)  # type: ignore[no-any-return]
