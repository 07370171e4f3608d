"""opencode (npm ``opencode-ai``): ``opencode run PROMPT --format json`` in the
workspace, with an ``opencode.json`` there naming one provider, ``autopilot``, whose
``baseURL`` is the cell's gateway (``@ai-sdk/openai-compatible`` for chat,
``@ai-sdk/anthropic`` for Messages), its key read from a variable.

Its JSON events carry ``step_finish`` parts with that step's own token counts
(``input`` fresh, ``output`` without reasoning, ``reasoning``, ``cache.read`` /
``cache.write``) and a ``cost``; steps it makes on its own (a session title) are not in
them — which is why the count is the wire's.
"""

from __future__ import annotations

import json
from typing import ClassVar

from autopilot.harnesses.agents.base import Agent, Claim, Launch, Setup, count, json_lines, obj

KEY_VAR = "AUTOPILOT_AGENT_KEY"
SDK = {"chat": "@ai-sdk/openai-compatible", "messages": "@ai-sdk/anthropic"}


class OpenCode(Agent):
    name: ClassVar[str] = "opencode"
    binary: ClassVar[str] = "opencode"
    dialects: ClassVar[tuple[str, ...]] = ("chat", "messages")

    def launch(self, s: Setup, binary: str) -> Launch:
        wire = s.dialect if s.dialect in self.dialects else self.dialects[0]
        config = {"$schema": "https://opencode.ai/config.json", "autoupdate": False,
                  "share": "disabled", "model": f"autopilot/{s.model}",
                  "provider": {"autopilot": {
                      "npm": SDK[wire], "name": "autopilot gateway",
                      "options": {"baseURL": s.base_url, "apiKey": "{env:" + KEY_VAR + "}"},
                      "models": {s.model: {"name": s.model}}}}}
        (s.workdir / "opencode.json").write_text(json.dumps(config, indent=1))
        # the model named on the command line: opencode otherwise picks a provider of
        # its own from any *_API_KEY it sees
        argv = [binary, "run", "--format", "json", "-m", f"autopilot/{s.model}", *s.extra,
                s.prompt]
        return Launch(argv, {KEY_VAR: s.key, "OPENCODE_DISABLE_AUTOUPDATE": "1",
                             "OPENCODE_DISABLE_MODELS_FETCH": "1"})

    def claim(self, stdout: str) -> Claim:
        claimed = Claim()
        parts: list[str] = []
        cost = 0.0
        for e in json_lines(stdout):
            part = obj(e.get("part"))
            kind = e.get("type")
            if kind == "text" and isinstance(part.get("text"), str):
                parts.append(part["text"])
            elif kind == "step_finish" and part.get("tokens"):
                tokens = obj(part.get("tokens"))
                cache = obj(tokens.get("cache"))
                claimed.add("input", tokens.get("input"))
                claimed.add("cache_read", cache.get("read"))
                claimed.add("cache_write", cache.get("write"))
                out, why = count(tokens.get("output")), count(tokens.get("reasoning"))
                if out is not None or why is not None:
                    claimed.add("output", (out or 0) + (why or 0))
                claimed.add("reasoning", why)
                if isinstance(part.get("cost"), int | float):
                    cost += float(part["cost"])
                claimed.turns = (claimed.turns or 0) + 1
            elif kind == "error":
                err = obj(e.get("error")) or e
                data = obj(err.get("data")) or err
                claimed.error = str(data.get("message") or err.get("name") or "error")[:300]
        claimed.answer = "".join(parts)[:20000]
        claimed.cost_usd = cost if claimed.turns else None
        return claimed


AGENT = OpenCode()
