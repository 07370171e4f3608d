"""What every agent CLI adapter answers (autopilot.harnesses.agent_run drives them).

An agent CLI is a vendor's own program (Claude Code, Codex CLI, Gemini CLI, opencode),
run headless as a cell's harness. Its adapter says three things and nothing else: how to
run it pointed at the cell's gateway (argv, environment, the config files it reads, all
inside the cell's own home), and what its own output claims — the tokens and cost it
says it used, why it stopped, its answer. The claim is written to the cell's summary as
the agent's word; the count and the price come from the gateway's meter (the wire),
never from here.

Adding an agent is one module beside this one and one line in the table of
``autopilot.harnesses.agents`` (docs/agents.md says how).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar

# The buckets an agent's claim is written in (the gateway's own: autopilot.state.tokens).
BUCKETS = ("input", "cache_write", "cache_read", "output", "reasoning")
MAX_COUNT = 10**15
# Words in an agent's error that mean the provider refused for capacity (429/529).
THROTTLE_WORDS = ("overloaded", "rate limit", "rate_limit", "429", "529",
                  "resource_exhausted", "resource has been exhausted", "too many requests")


@dataclass(frozen=True)
class Launch:
    """How to start one agent session: its argv (the prompt included) and the
    variables it needs beside the cell's environment."""

    argv: list[str]
    env: dict[str, str] = field(default_factory=dict)


@dataclass
class Claim:
    """What the agent's own output says of its session."""

    tokens: dict[str, int] = field(default_factory=dict)  # by bucket; absent: not said
    cost_usd: float | None = None  # its own price (at its vendor's list price)
    answer: str = ""
    error: str | None = None  # the provider's error that stopped it, in its words
    stopped: str | None = None  # its own reason to stop short (e.g. a turn limit)
    model: str | None = None  # the model it says it asked for
    turns: int | None = None

    def add(self, bucket: str, value: Any) -> None:
        counted = count(value)
        if counted is not None:
            self.tokens[bucket] = self.tokens.get(bucket, 0) + counted

    @property
    def finish(self) -> str:
        """The summary's finish_reason: ``completed``; ``rate_limited: ...`` (the
        provider refused for capacity) or ``api_error: ...`` (it failed otherwise), which
        the preset's trust.finish prefixes make INVALID; ``stopped: ...`` (the agent's
        own limit: the model's, judged by the grader)."""
        if self.error is not None:
            low = self.error.lower()
            if any(word in low for word in THROTTLE_WORDS):
                return f"rate_limited: {self.error}"[:300]
            return f"api_error: {self.error}"[:300]
        return f"stopped: {self.stopped}"[:300] if self.stopped else "completed"


def count(value: Any) -> int | None:
    if type(value) is not int or not 0 <= value <= MAX_COUNT:
        return None
    return value


def obj(value: Any) -> dict[str, Any]:
    """A JSON object from an agent's output, or an empty one for anything else."""
    return value if isinstance(value, dict) else {}


def json_lines(text: str) -> list[dict[str, Any]]:
    """The JSON objects of a JSON-lines output (anything else skipped: a CLI's warning)."""
    out = []
    for line in text.splitlines():
        line = line.strip()
        if line.startswith("{"):
            try:
                doc = json.loads(line)
            except ValueError:
                continue
            if isinstance(doc, dict):
                out.append(doc)
    return out


@dataclass(frozen=True)
class Setup:
    """Where and how one session runs."""

    home: Path  # the cell's own home: every config and session file of the agent
    workdir: Path  # where it works
    base_url: str  # the cell's gateway, with the route's path
    key: str  # the attempt's key (never the provider's)
    model: str  # the model id the agent asks for (its vendor's spelling)
    prompt: str
    max_output_tokens: int | None = None
    dialect: str | None = None  # the wire it should speak, where it can speak several
    extra: tuple[str, ...] = ()  # the preset's own arguments for the CLI


class Agent:
    name: ClassVar[str]
    binary: ClassVar[str]  # its executable's name on PATH
    dialects: ClassVar[tuple[str, ...]]  # the wires it can speak, its default first

    def launch(self, s: Setup, binary: str) -> Launch:
        raise NotImplementedError

    def claim(self, stdout: str) -> Claim:
        raise NotImplementedError


__all__ = ["BUCKETS", "Agent", "Claim", "Launch", "Setup", "count", "json_lines", "obj"]
