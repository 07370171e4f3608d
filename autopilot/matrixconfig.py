"""The matrix of a run: its tasks (``[[tasks]]``) and arms (``[[arms]]``).

Part of the configuration schema (autopilot.config re-exports every name); the cells
they make are in autopilot.plan.
"""

from __future__ import annotations

import re
from typing import Any

from pydantic import Field, field_validator, model_validator

from autopilot.configbase import Frozen as _Frozen
from autopilot.configbase import check_name as _check_name

Argv = list[str | list[str]]


class Task(_Frozen):
    """One task of the benchmark: a row of the matrix, run once per arm and replicate."""

    id: str
    """The task's id: a plain name (letters, digits, '.', '_', '-'), part of every cell id
    and rendered as ``{task}``."""
    vars: dict[str, str] = Field(default_factory=dict)
    """Placeholders of this task's own, for every template of its cells."""
    stuck_secs: float | None = Field(default=None, gt=0)
    """This task's own transcript-freeze limit (default: ``watchdog.stuck_secs``)."""
    wall_budget_secs: float | None = Field(default=None, gt=0)
    """This task's own wall budget (default: ``harness.wall_budget_secs``)."""
    # The origin's three p1 tasks share `phase1_grade.py <kind> <workspace> <baseline>`.
    grader_argv: Argv | None = None
    """This task's own grader command line, where it differs from ``grader.argv``."""
    grader_requires: list[str] = Field(default_factory=list)
    """Files the grader needs beyond itself (a helper script, a baseline dir), as
    templates: checked by preflight and before every grading; missing, the task's
    cells cannot be graded (``grader.on_unavailable``)."""

    @field_validator("id")
    @classmethod
    def _id(cls, v: str) -> str:
        return _check_name(v, "task id")


class ArmEndpoint(_Frozen):
    """Where an arm's mode acts when the harness has no switch for it: the endpoint's
    own settings (llama-server `--reasoning-budget 0`, vLLM's default chat-template
    kwargs). Arms whose settings differ run against differently started endpoints."""

    args: list[str] = Field(default_factory=list)
    """Extra arguments of the endpoint's command line for this arm."""
    env: dict[str, str] = Field(default_factory=dict)
    """Extra environment of the endpoint's process for this arm."""


class Arm(_Frozen):
    """One arm: a setting every task is run under (think / nothink, a model...)."""

    label: str
    """The arm's label, part of every cell id; it must carry its mode as a token
    (``qwen-think``), so that no two modes can share a run name."""
    mode: str
    """The arm's mode, rendered as ``{mode}`` (e.g. ``think``, ``nothink``)."""
    model: str | None = None
    """The model this arm's cells ask for, where it differs from the preset's ``model``."""
    replicas: list[int] | None = None
    """Pin this arm's cells to these endpoint replicas (default: any replica)."""
    vars: dict[str, str] = Field(default_factory=dict)
    """Placeholders of this arm's own, for every template of its cells."""
    endpoint: ArmEndpoint = Field(default_factory=ArmEndpoint)
    """Endpoint settings this arm needs (``[arms.endpoint]``)."""
    request: dict[str, Any] = Field(default_factory=dict)
    """Deep-merged into each of this arm's generation requests by the gateway (e.g.
    ``chat_template_kwargs``): arms that differ only here share one loaded model."""

    @field_validator("label")
    @classmethod
    def _label(cls, v: str) -> str:
        return _check_name(v, "arm label")

    @model_validator(mode="after")
    def _mode_in_label(self) -> Arm:
        # Origin doc 004: run names are keyed by label only, so an arm whose label does
        # not carry its mode is silently skipped as "already complete". Refuse it here.
        if self.mode not in label_tokens(self.label):
            raise ValueError(
                f"arm label {self.label!r} does not encode its mode {self.mode!r} "
                f"(e.g. '{self.label}-{self.mode}')"
            )
        return self


def label_tokens(label: str) -> list[str]:
    return [t for t in re.split(r"[-_.]", label) if t]
