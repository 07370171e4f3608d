"""vLLM's OpenAI-compatible server (``vllm serve``) as a supervised local process."""

from __future__ import annotations

import os

from autopilot.config import VllmEndpoint as VllmConfig
from autopilot.endpoints.base import Endpoint


class VllmEndpoint(Endpoint):
    engine = "vllm"
    progress_api = "metrics"

    @property
    def c(self) -> VllmConfig:
        assert isinstance(self.cfg, VllmConfig)
        return self.cfg

    def argv(self) -> list[str]:
        c = self.c
        binary = os.environ.get("AUTOPILOT_VLLM") or c.binary
        argv = [
            binary, "serve", c.model_path or self.served_model,
            "--host", self.host, "--port", str(self.port),
            "--served-model-name", c.served_model_name or self.served_model,
            "--max-model-len", str(c.max_model_len),
            "--gpu-memory-utilization", str(c.gpu_memory_utilization),
        ]
        if c.tool_call_parser:
            argv += ["--enable-auto-tool-choice", "--tool-call-parser", c.tool_call_parser]
        if c.reasoning_parser:
            argv += ["--reasoning-parser", c.reasoning_parser]
        return argv + list(c.args)

    default_image = "vllm/vllm-openai:latest"
    default_container = "vllm-autopilot"

    def container_cmd(self) -> list[str]:
        # The vllm/vllm-openai image's entrypoint is the API server: no "serve" verb.
        argv = self.full_argv()
        return ["--model", argv[2], *argv[3:]]

    def env(self) -> dict[str, str]:
        env = super().env()
        env.update(self.c.env)
        return env

