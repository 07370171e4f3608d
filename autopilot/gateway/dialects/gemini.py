"""Google's generateContent (``POST /v1beta/models/{model}:generateContent``, and
``:streamGenerateContent?alt=sse``): what Gemini CLI speaks.

The model is in the path, not the body; the key goes in ``x-goog-api-key`` (clients may
put it in ``?key=`` instead: the gateway takes either from the harness and sends the
header upstream). Usage (``usageMetadata``): ``promptTokenCount`` is cache-inclusive
(``cachedContentTokenCount`` is the cache read; ``toolUsePromptTokenCount`` more
input), ``candidatesTokenCount`` the answer and ``thoughtsTokenCount`` the thinking,
billed as output beside it: the output bucket is their sum. A stream (``alt=sse``) is
``data:`` lines, each a whole GenerateContentResponse; the last one's usage stands.
The arm's thinking setting goes in ``generationConfig.thinkingConfig``.
"""

from __future__ import annotations

import re
from typing import Any, ClassVar
from urllib.parse import quote

from autopilot.gateway.dialects.base import (
    Counts,
    Dialect,
    Route,
    StreamState,
    Usage,
    minus,
    model_name,
)
from autopilot.gateway.jsonbound import STREAM_DEPTH, loads_bounded
from autopilot.state.tokens import Tokens

_PATH = re.compile(r"/models/([\w.@-]{1,200}):(generateContent|streamGenerateContent|"
                   r"countTokens)$")
_TEXT = re.compile(rb'"text"\s*:\s*"(?!")|"functionCall"\s*:\s*\{')


class Gemini(Dialect):
    name: ClassVar[str] = "gemini"
    key_header: ClassVar[str] = "x-goog-api-key"
    key_scheme: ClassVar[str] = ""
    models_path: ClassVar[str] = "/v1beta/models?pageSize=1000"

    def route(self, method: str, path: str) -> Route | None:
        match = _PATH.search(path)
        if method != "POST" or match is None:
            return None
        if match.group(2) == "countTokens":
            return Route(self, keyed=True, model=match.group(1))
        return Route(self, generates=True, metered=True, keyed=True, model=match.group(1))

    def model_ids(self, doc: Any) -> list[str]:
        models = doc.get("models") if isinstance(doc, dict) else None
        return [str(m["name"]).removeprefix("models/") for m in models or ()
                if isinstance(m, dict) and isinstance(m.get("name"), str)]

    def asked(self, doc: Any, route: Route) -> str | None:
        return route.model

    def with_model(self, doc: Any, path: str, route: Route, model: str) -> tuple[Any, str]:
        match = _PATH.search(path)
        if match is None:
            return doc, path
        return doc, path[:match.start(1)] + quote(model, safe="") + path[match.end(1):]

    def streams(self, doc: Any, route: Route, path: str) -> bool:
        return path.endswith(":streamGenerateContent")

    def usage(self, doc: Any) -> Usage | None:
        reported = doc.get("usageMetadata") if isinstance(doc, dict) else None
        if not isinstance(reported, dict):
            return None
        counts = Counts(reported)
        prompt, cached = counts.get("promptTokenCount"), counts.get("cachedContentTokenCount")
        tool = counts.get("toolUsePromptTokenCount")
        answer, thoughts = counts.get("candidatesTokenCount"), counts.get("thoughtsTokenCount")
        fresh = minus(prompt, cached)
        if fresh is not None and tool is not None:
            fresh += tool
        output = None if answer is None and thoughts is None else (answer or 0) + (thoughts or 0)
        return counts.usage(Tokens(input=fresh, cache_read=cached, output=output,
                                   reasoning=thoughts))

    def finish(self, doc: Any) -> str | None:
        cands = doc.get("candidates") if isinstance(doc, dict) else None
        for cand in cands if isinstance(cands, list) else ():
            if isinstance(cand, dict) and isinstance(cand.get("finishReason"), str):
                return str(cand["finishReason"])[:40]
        return None

    def model(self, doc: Any) -> str | None:
        return model_name(doc.get("modelVersion")) if isinstance(doc, dict) else None

    def event(self, state: StreamState, name: str | None, payload: bytes) -> None:
        if _TEXT.search(payload):
            state.chunks += 1
        if state.model is not None and b'"finishReason"' not in payload \
                and b'"error"' not in payload:
            # Each chunk repeats a running usage; the last one (with its finish reason)
            # has it whole: the chunks between are read for text only, without parsing.
            return
        doc = loads_bounded(payload, STREAM_DEPTH)
        if not isinstance(doc, dict):
            return
        got = self.usage(doc)
        if got is not None:
            state.usage = got.over(state.usage)
        state.finish = self.finish(doc) or state.finish
        state.done = state.done or self.finish(doc) is not None
        state.model = self.model(doc) or state.model
        if isinstance(doc.get("error"), dict):
            err = doc["error"]
            state.error = str(err.get("status") or err.get("message") or "error")[:200]

    def refusal(self, status: int, doc: Any) -> str | None:
        err = doc.get("error") if isinstance(doc, dict) else None
        if isinstance(err, dict) and err.get("status") in ("RESOURCE_EXHAUSTED", "UNAVAILABLE"):
            return "throttled" if err["status"] == "RESOURCE_EXHAUSTED" else "endpoint_error"
        return None


DIALECT = Gemini()

__all__ = ["DIALECT", "Gemini"]
