"""Gemini CLI (npm ``@google/gemini-cli``): ``gemini -p PROMPT --output-format
stream-json``, Google generateContent against ``GOOGLE_GEMINI_BASE_URL`` with
``GEMINI_API_KEY``.

It needs API-key auth selected in ``~/.gemini/settings.json`` (the cell's home) and a
trusted workspace (``GEMINI_CLI_TRUST_WORKSPACE``) to run headless. Its last event
(``type: result``) carries ``stats`` with its own token counts (``input`` /
``prompt`` cache-inclusive, ``cached``, ``candidates``, ``thoughts``).
"""

from __future__ import annotations

import json
from typing import Any, ClassVar

from autopilot.harnesses.agents.base import Agent, Claim, Launch, Setup, count, json_lines, obj

SETTINGS = {"security": {"auth": {"selectedType": "gemini-api-key"}},
            "general": {"disableAutoUpdate": True, "disableUpdateNag": True},
            "privacy": {"usageStatisticsEnabled": False}, "telemetry": {"enabled": False}}


class GeminiCli(Agent):
    name: ClassVar[str] = "gemini"
    binary: ClassVar[str] = "gemini"
    dialects: ClassVar[tuple[str, ...]] = ("gemini",)

    def launch(self, s: Setup, binary: str) -> Launch:
        conf = s.home / ".gemini"
        conf.mkdir(parents=True, exist_ok=True)
        (conf / "settings.json").write_text(json.dumps(SETTINGS))
        argv = [binary, "-p", s.prompt, "-m", s.model, "--output-format", "stream-json",
                *s.extra]
        return Launch(argv, {"GEMINI_API_KEY": s.key, "GOOGLE_GEMINI_BASE_URL": s.base_url,
                             "GEMINI_CLI_TRUST_WORKSPACE": "true", "NO_BROWSER": "true"})

    def claim(self, stdout: str) -> Claim:
        claimed = Claim()
        parts: list[str] = []
        for e in json_lines(stdout):
            kind = e.get("type")
            if kind == "init" and isinstance(e.get("model"), str):
                claimed.model = e["model"][:200]
            elif kind == "message" and e.get("role") == "assistant" \
                    and isinstance(e.get("content"), str):
                parts.append(e["content"])
            elif kind == "error" or (kind == "result" and e.get("status") == "error"):
                err = obj(e.get("error")) or e
                claimed.error = str(err.get("message") or err.get("type") or "error")[:300]
            if kind == "result" and isinstance(e.get("stats"), dict):
                self._stats(claimed, e["stats"])
        claimed.answer = "".join(parts)[:20000]
        return claimed

    @staticmethod
    def _stats(c: Claim, stats: dict[str, Any]) -> None:
        models = stats.get("models")
        for model in models.values() if isinstance(models, dict) else [stats]:
            if not isinstance(model, dict):
                continue
            tokens = model.get("tokens")
            if isinstance(tokens, dict):  # --output-format json
                GeminiCli._tokens(c, tokens.get("prompt", tokens.get("input")),
                                  tokens.get("cached"), tokens.get("candidates"),
                                  tokens.get("thoughts"))
                continue
            # stream-json: input_tokens (cache-inclusive), output_tokens (the answer),
            # cached; the thinking is what the total holds beyond them
            total, inp, out = (count(model.get(k)) for k in ("total_tokens", "input_tokens",
                                                          "output_tokens"))
            thoughts = None
            if total is not None and inp is not None and out is not None \
                    and total > inp + out:
                thoughts = total - inp - out
            GeminiCli._tokens(c, inp, model.get("cached"), out, thoughts)

    @staticmethod
    def _tokens(c: Claim, prompt: Any, cached: Any, answer: Any, thoughts: Any) -> None:
        p, k = count(prompt), count(cached)
        if p is not None:
            c.add("input", p - min(k or 0, p))
        c.add("cache_read", k)
        a, th = count(answer), count(thoughts)
        if a is not None or th is not None:
            c.add("output", (a or 0) + (th or 0))
        c.add("reasoning", th)


AGENT = GeminiCli()
