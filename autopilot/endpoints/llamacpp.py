"""llama.cpp's ``llama-server`` as a supervised local process.

The autopilot always adds ``--reasoning-format none`` unless the preset sets
``reasoning_format`` explicitly (origin doc 004: without it a think arm's reasoning is not
returned in-band and the grader scores garbage). ``--alias`` makes the served model id
the preset's ``model`` so the readiness check can demand exactly that id.
"""

from __future__ import annotations

import os

from autopilot.config import LlamaCppEndpoint as LlamaCppConfig
from autopilot.endpoints.base import Endpoint


class LlamaCppEndpoint(Endpoint):
    engine = "llamacpp"

    @property
    def c(self) -> LlamaCppConfig:
        assert isinstance(self.cfg, LlamaCppConfig)
        return self.cfg

    def argv(self) -> list[str]:
        c = self.c
        binary = os.environ.get("AUTOPILOT_LLAMA_SERVER") or c.binary
        argv = [
            binary, "-m", c.model_path, "--host", self.host, "--port", str(self.port),
            "-c", str(c.ctx_size), "--alias", self.served_model,
        ]
        if "--reasoning-format" not in c.args:
            argv += ["--reasoning-format", c.reasoning_format]
        return argv + list(c.args)

    default_image = "ghcr.io/ggml-org/llama.cpp:server-cuda"
    default_container = "llama-autopilot"

    def env(self) -> dict[str, str]:
        env = dict(os.environ)
        env.update(self.c.env)
        return env
