"""Model endpoints: one interface, an engine per kind, chosen by the preset's ``engine``.

    builtin   the demo simulator (autopilot.demo.endpoint), an honest fake
    llamacpp  llama.cpp's llama-server
    vllm      ``vllm serve``
    provider  a hosted OpenAI-compatible API: no lifecycle, an authenticated probe
    none      no endpoint at all (a harness that needs none)

``make_endpoint`` is the name -> class registry (uvicorn-style); the ``Keeper`` owns the
lifecycle inside the supervisor's task group.
"""

from __future__ import annotations

from pathlib import Path

from autopilot.config import Preset
from autopilot.endpoints.base import Endpoint
from autopilot.endpoints.builtin import BuiltinEndpoint
from autopilot.endpoints.llamacpp import LlamaCppEndpoint
from autopilot.endpoints.none import NoEndpoint
from autopilot.endpoints.provider import ProviderEndpoint
from autopilot.endpoints.vllm import VllmEndpoint

ENGINES: dict[str, type[Endpoint]] = {
    "builtin": BuiltinEndpoint,
    "llamacpp": LlamaCppEndpoint,
    "vllm": VllmEndpoint,
    "provider": ProviderEndpoint,
    "none": NoEndpoint,
}


def make_endpoint(preset: Preset, state_dir: Path, replica: int = 0) -> Endpoint:
    return ENGINES[preset.endpoint.engine](preset, state_dir, replica)


__all__ = ["ENGINES", "Endpoint", "make_endpoint"]
