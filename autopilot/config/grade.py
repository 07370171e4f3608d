"""How a cell is graded (``[grader]``) and what its evidence must show to be counted
(``[trust]``).

Part of the configuration schema (autopilot.config re-exports every name); the code
that grades and classifies is in autopilot.cell.grading and autopilot.cell.validity.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Literal

from pydantic import Field, field_validator, model_validator

from autopilot.config.base import Frozen as _Frozen
from autopilot.config.matrix import Argv

INVALID_REASONS = frozenset({
    "stall", "deadline", "harness_crash", "missing_output", "grader_failed",
    "malformed_grade", "zero_tokens", "arm_mismatch", "endpoint_down", "api_error",
    "grader_unavailable", "malformed_summary", "rate_limited", "disk_full", "unmetered",
    "config", "datapath_lost", "unscored", "sample_errors", "interrupted"})
# Reasons that lie with grading, not with the harness's run: the outputs stand, so the
# grader is re-run on them; the harness never is (an hour of GPU work is not re-spent).
# "unscored": the grader's own word that the sample has no score (Inspect's NaN).
# ("sample_errors": some of a cell's samples errored; the harness re-runs only those.)
GRADE_REASONS = frozenset({"grader_failed", "malformed_grade", "grader_unavailable",
                           "unscored"})


class Extract(_Frozen):
    """An archive the grader needs unpacked before it runs."""

    archive: str
    """The archive (a template)."""
    into: str = "{scratch_dir}"
    """Where it is unpacked (a template)."""


class VerdictRule(_Frozen):
    """What one word of the grader's verdict field means."""

    verdict: Literal["PASS", "FAIL", "INVALID"]
    """The verdict the word stands for."""
    reason: str | None = None
    """For INVALID: why (one of the INVALID reasons, e.g. ``grader_failed``)."""
    caveat: str | None = None
    """A caveat carried with the verdict into the report (e.g. "structural check only")."""
    streak: bool | None = None
    """Counts towards the harness-break streak (three MISSING_OUTPUT or GRADER_FAILED in a
    row mean the harness or grader broke, not the model). Unset: as its reason says
    (a broken harness's or grader's reasons count); ``false``: never, for a word that
    speaks of the eval's own data (a score no reader can read), not of a break."""

    @model_validator(mode="after")
    def _reason(self) -> VerdictRule:
        if self.verdict == "INVALID" and not self.reason:
            raise ValueError("an INVALID verdict word needs a reason")
        if self.reason is not None and self.reason not in INVALID_REASONS:
            raise ValueError(f"reason {self.reason!r} is not one of {sorted(INVALID_REASONS)}")
        return self


DEFAULT_VERDICTS: dict[str, VerdictRule] = {
    "PASS": VerdictRule(verdict="PASS"),
    "FAIL": VerdictRule(verdict="FAIL"),
    # Origin: a lone MISSING_OUTPUT is the model's failure; a streak is a harness break.
    "MISSING_OUTPUT": VerdictRule(verdict="FAIL", caveat="no deliverable", streak=True),
    "GRADER_FAILED": VerdictRule(verdict="INVALID", reason="grader_failed", streak=True),
    "INVALID_JSON": VerdictRule(verdict="FAIL", caveat="deliverable unparsable"),
    "STRUCTURAL_PASS": VerdictRule(verdict="PASS", caveat="structural check only"),
    "STRUCTURAL_FAIL": VerdictRule(verdict="FAIL", caveat="structural check only"),
}


class Grader(_Frozen):
    """The program that grades a cell's outputs and writes its verdict."""

    argv: Argv
    """The grader's command line, a list of templates (``{grade_file}`` is where it
    writes; a task may have its own ``grader_argv``)."""
    cwd: str | None = None
    """The grader's working directory (a template; default: the supervisor's)."""
    pass_env: list[str] = Field(default_factory=list)
    """Variables withheld from children by default that the grader does need."""
    timeout_secs: float = Field(default=600, gt=0)
    """A grading that runs longer is killed (INVALID(grader_failed), graded again)."""
    grade_file: str = "{output_dir}/grade.json"
    """The JSON file the grader writes (a template)."""
    verdict_field: str = "verdict"
    """The grade file's key that holds the verdict word."""
    mode: Literal["per-cell", "per-arm"] = "per-cell"
    """"per-cell": graded as each cell ends; "per-arm": once every cell of an arm has."""
    retries: int = Field(default=2, ge=0)
    """Re-runs of the grader on the same outputs before the verdict stands as INVALID."""
    on_unavailable: Literal["refuse", "record"] = "refuse"
    """A task whose ``grader_requires`` are missing: "refuse" the run at preflight, or
    "record" its cells as INVALID(grader_unavailable) after one harness run each."""
    extract: Extract | None = None
    """An archive unpacked before grading (``[grader.extract]``)."""
    verdicts: dict[str, VerdictRule] = Field(default_factory=lambda: dict(DEFAULT_VERDICTS))
    """The grader's verdict words and what each means (``PASS = "PASS"`` is short for
    ``PASS = { verdict = "PASS" }``); a word not listed is INVALID(malformed_grade)."""
    model_access: bool = False
    """Model-graded scoring: the grader gets a gateway listener of its own
    (``{base_url}``, a key of its own as OPENAI_API_KEY), metered as grading, apart from
    the cell's spend."""

    @field_validator("verdicts", mode="before")
    @classmethod
    def _short_verdicts(cls, v: Any) -> Any:
        if isinstance(v, Mapping):
            return {k: {"verdict": r} if isinstance(r, str) else r for k, r in v.items()}
        return v


class TokenCheck(_Frozen):
    """The harness's own count of completion tokens: zero means no model work was done
    (INVALID(zero_tokens))."""

    file: str = "{output_dir}/summary.json"
    """The JSON file that holds the count (a template)."""
    field: str = "total_completion_tokens"
    """Its key (a dotted path)."""


class ArmCheck(_Frozen):
    """A file that must show the arm's setting took effect (else INVALID(arm_mismatch))."""

    file: str
    """The JSON file to read (a template)."""
    field: str
    """Its key (a dotted path)."""
    expect: str
    """The value it must have (a template, e.g. ``{mode}``)."""


class FinishCheck(_Frozen):
    """A harness's own record of why it stopped; an endpoint error there means the run
    broke (INVALID(api_error)), whatever the grader later finds in the workspace."""

    file: str = "{output_dir}/summary.json"
    """The JSON file that holds the finish reason (a template)."""
    field: str = "finish_reason"
    """Its key (a dotted path)."""
    invalid_prefixes: list[str] = Field(default_factory=lambda: ["api_error"])
    """Finish reasons starting with one of these are INVALID(api_error)."""
    rate_limited_prefixes: list[str] = Field(default_factory=lambda: ["rate_limited"])
    """The harness gave up because the provider kept answering 429: INVALID(rate_limited),
    retried without counting towards quarantine (the provider's state, not the model's)."""


class Trust(_Frozen):
    """What a cell's evidence must show for its verdict to be counted, and what a run
    does when it does not."""

    infra_retries: int = Field(default=2, ge=0)
    """How often a cell's INVALID attempt is retried; INVALID once more, the cell is
    quarantined (the attempt past them renders ``{last_try}`` = 1)."""
    anomaly_streak: int = Field(default=3, ge=1)
    """This many streak verdicts in a row (MISSING_OUTPUT, GRADER_FAILED) is a
    harness-break anomaly."""
    on_anomaly: Literal["alert", "pause"] = "alert"
    """"alert": say so and go on; "pause": stop launching (running cells finish, the run
    ends INCOMPLETE) rather than burn the night on a broken harness."""
    tokens: TokenCheck | None = None
    """Refuse a verdict whose attempt spent no completion tokens (``[trust.tokens]``)."""
    finish: FinishCheck | None = None
    """Read the harness's finish reason (``[trust.finish]``)."""
    arm_checks: list[ArmCheck] = Field(default_factory=list)
    """Files that must show the arm took effect (``[[trust.arm_checks]]``)."""
    count: Literal["evidence", "invalid"] = "evidence"
    """How a killed or broken attempt counts: "evidence", the model's own failure (a
    deadline while the endpoint answered, a loop, a context it outgrew) is a FAIL with
    its caveat; "invalid", every such attempt INVALID, retried."""
