"""The matrix of a run: its tasks (``[[tasks]]``) and arms (``[[arms]]``).

Part of the configuration schema (autopilot.config re-exports every name); the cells
they make are in autopilot.plan.
"""

from __future__ import annotations

import re
from typing import Any, Literal
from urllib.parse import urlsplit

from pydantic import Field, field_validator, model_validator

from autopilot.config.base import Frozen as _Frozen
from autopilot.config.base import check_name as _check_name

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


Dialect = Literal["chat", "responses", "messages", "gemini"]
_ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]{0,127}")


class Route(_Frozen):
    """An arm's own way to its model (``[arms.route]``): a vendor's own API for a native
    arm, an aggregator for a kernel arm. The arm's cells reach only this route, through
    their gateway; the run's ``[endpoint]`` serves the arms without one."""

    base_url: str
    """The provider's base URL as its own SDKs take it (https://api.anthropic.com,
    https://openrouter.ai/api/v1, https://generativelanguage.googleapis.com);
    ``{base_url}`` gives the harness the gateway's address with this path."""
    dialect: Dialect
    """The protocol the provider speaks: ``chat`` (OpenAI chat/completions), ``responses``
    (OpenAI Responses), ``messages`` (Anthropic Messages), ``gemini`` (Google
    generateContent). The key is attached only to this dialect's model routes."""
    api_key_env: str = ""
    """The NAME of the variable that holds this route's key (never its value; it stays
    in the supervisor, the harness gets its attempt's key)."""
    model: str
    """The model id as this provider spells it: the gateway asks for it on every request
    of the arm (an agent CLI asks for its own vendor's ids) and preflight checks it
    exists."""

    @field_validator("base_url")
    @classmethod
    def _url(cls, v: str) -> str:
        parts = urlsplit(v)
        if parts.scheme not in ("http", "https") or not parts.hostname or parts.query \
                or parts.fragment:
            raise ValueError(f"{v!r} is not an http(s) base URL without query")
        return v.rstrip("/")

    @field_validator("api_key_env")
    @classmethod
    def _env(cls, v: str) -> str:
        if v and not _ENV_NAME.fullmatch(v):
            # never echoed: a key pasted here by mistake must not reach a log or a terminal
            raise ValueError(f"not a variable name ({len(v)} characters, not shown): write "
                             "the NAME of the variable that holds the key, not the key")
        return v

    def origin(self) -> str:
        """scheme://host:port: the harness sends the path."""
        parts = urlsplit(self.base_url)
        return f"{parts.scheme}://{parts.netloc}"

    def path(self) -> str:
        return urlsplit(self.base_url).path

    def dialects(self) -> frozenset[str]:
        return frozenset({self.dialect})


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
    request_by_dialect: dict[Dialect, dict[str, Any]] = Field(default_factory=dict)
    """Settings for one dialect's requests only, over ``request``, each where that
    dialect takes it (``[arms.request_by_dialect.messages] thinking = {...}``;
    ``responses``: ``reasoning``; ``gemini``: ``generationConfig.thinkingConfig``)."""
    route: Route | None = None
    """This arm's own route to its model (``[arms.route]``); none: the run's endpoint."""

    @property
    def requests_settings(self) -> bool:
        return bool(self.request or any(self.request_by_dialect.values()))

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
    return [token for token in re.split(r"[-_.]", label) if token]
