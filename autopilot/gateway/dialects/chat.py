"""OpenAI's chat/completions (and the older completions and embeddings routes): what
llama-server, vLLM, OpenRouter and most aggregators speak.

Usage: ``prompt_tokens`` (cache-inclusive; ``prompt_tokens_details.cached_tokens`` is
the cache read), ``completion_tokens`` (reasoning inclusive;
``completion_tokens_details.reasoning_tokens``). A stream is ``data:`` lines of
``chat.completion.chunk`` objects, the last one with usage when the client asked for it
(``stream_options.include_usage``), then ``data: [DONE]``.
"""

from __future__ import annotations

import re
from typing import Any, ClassVar

from autopilot.gateway.dialects.base import (
    Counts,
    Dialect,
    Route,
    StreamState,
    Usage,
    minus,
)
from autopilot.gateway.dialects.responses import usage_of_responses
from autopilot.gateway.jsonbound import STREAM_DEPTH, loads_bounded
from autopilot.state.tokens import Tokens

# Most of a stream is deltas: these find, in C, whether one carries text (a non-empty
# content / reasoning / text string, or a tool call) and whether it can carry a finish
# reason (a non-null one). A key inside a string value is escaped (\") and never matches.
_TEXT = re.compile(rb'"(?:content|reasoning_content|reasoning|text)"\s*:\s*"(?!")'
                   rb'|"tool_calls"\s*:\s*\[\s*\{')
_FINISH = re.compile(rb'"finish_reason"\s*:\s*"')


class Chat(Dialect):
    name: ClassVar[str] = "chat"

    def route(self, method: str, path: str) -> Route | None:
        if method != "POST":
            return None
        if path.endswith(("/chat/completions", "/completions")) or path in (
                "chat/completions", "completions"):
            return Route(self, generates=True, metered=True, keyed=True)
        if path.endswith("/embeddings"):
            return Route(self, metered=True, keyed=True)
        return None

    def usage(self, doc: Any) -> Usage | None:
        if not isinstance(doc, dict) or not isinstance(doc.get("usage"), dict):
            return None
        reported = doc["usage"]
        if "prompt_tokens" not in reported \
                and ("input_tokens" in reported or "output_tokens" in reported):
            return usage_of_responses(reported)  # a Responses-shaped usage (some servers)
        counts = Counts(reported)
        prompt = counts.get("prompt_tokens")
        cached = counts.get("prompt_tokens_details", "cached_tokens")
        return counts.usage(Tokens(input=minus(prompt, cached), cache_read=cached,
                                   output=counts.get("completion_tokens"),
                                   reasoning=counts.get("completion_tokens_details",
                                                   "reasoning_tokens")))

    def finish(self, doc: Any) -> str | None:
        if not isinstance(doc, dict) or not isinstance(doc.get("choices"), list):
            return None
        for choice in doc["choices"]:
            if isinstance(choice, dict) and isinstance(choice.get("finish_reason"), str):
                return str(choice["finish_reason"])[:40]
        return None

    def event(self, state: StreamState, name: str | None, payload: bytes) -> None:
        if payload == b"[DONE]":
            state.done = True
            return
        if state.model is not None and b'"usage"' not in payload \
                and not _FINISH.search(payload):
            # A chunk that can carry neither usage nor a finish reason (the model is
            # known): only whether it carries text counts, read without parsing it.
            if _TEXT.search(payload):
                state.chunks += 1
            return
        doc = loads_bounded(payload, STREAM_DEPTH)
        if doc is None:
            return
        if _has_content(doc):
            state.chunks += 1
        state.usage = self.usage(doc) or state.usage
        state.finish = self.finish(doc) or state.finish
        state.model = self.model(doc) or state.model


def _has_content(doc: Any) -> bool:
    """A stream chunk that carries generated text (content, reasoning or a tool call)."""
    if not isinstance(doc, dict) or not isinstance(doc.get("choices"), list):
        return False
    for choice in doc["choices"]:
        delta = choice.get("delta") if isinstance(choice, dict) else None
        if isinstance(delta, dict) and any(delta.get(k) for k in ("content", "reasoning_content",
                                                           "reasoning", "tool_calls")):
            return True
        if isinstance(choice, dict) and isinstance(choice.get("text"), str) and choice["text"]:
            return True
    return False


DIALECT = Chat()

__all__ = ["DIALECT", "Chat"]
