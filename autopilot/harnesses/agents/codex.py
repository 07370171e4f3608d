"""Codex CLI (npm ``@openai/codex``): ``codex exec --json PROMPT``, OpenAI Responses (or
chat) against a ``[model_providers.autopilot]`` entry of the ``config.toml`` in
``CODEX_HOME`` (the cell's home), its key read from the variable that entry names.

It reads its stdin when that is not a terminal: the harness closes it. Its JSON lines
carry ``turn.completed`` events with the turn's usage (``input_tokens``
cache-inclusive, ``cached_input_tokens``, ``output_tokens``,
``reasoning_output_tokens``), ``item.completed`` items (``agent_message``: its answer),
and ``turn.failed`` / ``error`` when it gives up.
"""

from __future__ import annotations

import json
from typing import ClassVar

from autopilot.harnesses.agents.base import Agent, Claim, Launch, Setup, count, json_lines, obj

KEY_VAR = "AUTOPILOT_AGENT_KEY"


class Codex(Agent):
    name: ClassVar[str] = "codex"
    binary: ClassVar[str] = "codex"
    dialects: ClassVar[tuple[str, ...]] = ("responses", "chat")

    def launch(self, s: Setup, binary: str) -> Launch:
        home = s.home / ".codex"
        home.mkdir(parents=True, exist_ok=True)
        wire = s.dialect if s.dialect in self.dialects else self.dialects[0]
        # TOML strings as JSON strings: the same escapes for what we write here.
        lines = [f"model = {json.dumps(s.model)}", 'model_provider = "autopilot"',
                 "[model_providers.autopilot]", 'name = "autopilot gateway"',
                 f"base_url = {json.dumps(s.base_url)}", f'env_key = "{KEY_VAR}"',
                 f"wire_api = {json.dumps(wire)}"]
        (home / "config.toml").write_text("\n".join(lines) + "\n")
        argv = [binary, "exec", "--json", "--skip-git-repo-check", "-C", str(s.workdir),
                *s.extra, s.prompt]
        return Launch(argv, {"CODEX_HOME": str(home), KEY_VAR: s.key})

    def claim(self, stdout: str) -> Claim:
        claimed = Claim()
        for e in json_lines(stdout):
            kind = e.get("type")
            if kind == "turn.completed" and isinstance(e.get("usage"), dict):
                usage = e["usage"]
                total = count(usage.get("input_tokens"))
                cached = count(usage.get("cached_input_tokens"))
                if total is not None:
                    claimed.add("input", total - min(cached or 0, total))
                claimed.add("cache_read", cached)
                claimed.add("cache_write", usage.get("cache_write_input_tokens"))
                claimed.add("output", usage.get("output_tokens"))
                claimed.add("reasoning", usage.get("reasoning_output_tokens"))
                claimed.turns = (claimed.turns or 0) + 1
            elif kind == "item.completed" and isinstance(e.get("item"), dict):
                item = e["item"]
                if item.get("type") == "agent_message" and isinstance(item.get("text"), str):
                    claimed.answer = item["text"][:20000]
            elif kind in ("turn.failed", "error"):
                err = obj(e.get("error")) or e
                claimed.error = str(err.get("message") or kind)[:300]
        return claimed


AGENT = Codex()
