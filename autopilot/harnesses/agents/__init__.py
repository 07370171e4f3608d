"""The agent CLIs a cell can run as its harness, by name (autopilot.harnesses.agent_run)."""

from __future__ import annotations

from autopilot.harnesses.agents.base import Agent
from autopilot.harnesses.agents.claude import AGENT as CLAUDE
from autopilot.harnesses.agents.codex import AGENT as CODEX
from autopilot.harnesses.agents.gemini import AGENT as GEMINI
from autopilot.harnesses.agents.opencode import AGENT as OPENCODE

AGENTS: dict[str, Agent] = {a.name: a for a in (CLAUDE, CODEX, GEMINI, OPENCODE)}

__all__ = ["AGENTS", "Agent"]
