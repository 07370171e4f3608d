"""Claude Code (npm ``@anthropic-ai/claude-code``): ``claude -p PROMPT --output-format
stream-json --verbose``, Anthropic Messages against ``ANTHROPIC_BASE_URL``.

Its config and session files live under ``CLAUDE_CONFIG_DIR`` (the cell's home);
``CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC`` keeps it off every other network;
``CLAUDE_CODE_MAX_OUTPUT_TOKENS`` caps each request. It refuses model ids it does not
know, so it asks for a ``claude-*`` id and the arm's route names the served model. Its
last line (``type: result``) carries its own usage (``input_tokens`` fresh,
``cache_creation_input_tokens``, ``cache_read_input_tokens``, ``output_tokens``) and a
``total_cost_usd`` at Claude's list price, whatever answered.
"""

from __future__ import annotations

from typing import ClassVar

from autopilot.harnesses.agents.base import Agent, Claim, Launch, Setup, json_lines


class ClaudeCode(Agent):
    name: ClassVar[str] = "claude"
    binary: ClassVar[str] = "claude"
    dialects: ClassVar[tuple[str, ...]] = ("messages",)

    def launch(self, s: Setup, binary: str) -> Launch:
        env = {"ANTHROPIC_BASE_URL": s.base_url, "ANTHROPIC_API_KEY": s.key,
               "CLAUDE_CONFIG_DIR": str(s.home / ".claude"),
               "CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC": "1", "DISABLE_AUTOUPDATER": "1",
               "DISABLE_TELEMETRY": "1", "DISABLE_ERROR_REPORTING": "1"}
        if s.max_output_tokens:
            env["CLAUDE_CODE_MAX_OUTPUT_TOKENS"] = str(s.max_output_tokens)
        argv = [binary, "-p", s.prompt, "--output-format", "stream-json", "--verbose",
                "--model", s.model, *s.extra]
        return Launch(argv, env)

    def claim(self, stdout: str) -> Claim:
        claimed = Claim()
        events = json_lines(stdout)
        result = next((e for e in reversed(events) if e.get("type") == "result"), None)
        init = next((e for e in events if e.get("subtype") == "init"), None)
        if init is not None and isinstance(init.get("model"), str):
            claimed.model = init["model"][:200]
        if result is None:
            claimed.error = "no result line in its output"
            return claimed
        usage = result.get("usage") if isinstance(result.get("usage"), dict) else {}
        for bucket, key in (("input", "input_tokens"), ("cache_write",
                            "cache_creation_input_tokens"),
                            ("cache_read", "cache_read_input_tokens"),
                            ("output", "output_tokens")):
            claimed.add(bucket, usage.get(key))
        cost = result.get("total_cost_usd")
        claimed.cost_usd = float(cost) if isinstance(cost, int | float) else None
        claimed.answer = str(result.get("result") or "")[:20000]
        turns = result.get("num_turns")
        claimed.turns = turns if type(turns) is int else None
        if result.get("api_error") == "max_output_tokens":  # the model's length, no outage
            claimed.stopped = "max_output_tokens"
        elif result.get("api_error") or result.get("api_error_status"):
            claimed.error = str(result.get("api_error") or result.get("api_error_status"))[:200]
            if isinstance(result.get("result"), str):
                claimed.error += f" ({result['result'][:200]})"
        elif result.get("is_error"):
            claimed.stopped = str(result.get("subtype") or "error")[:100]
        return claimed


AGENT = ClaudeCode()
