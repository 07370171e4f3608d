"""vLLM's OpenAI-compatible server (``vllm serve``) as a supervised local process."""

from __future__ import annotations

import os

from autopilot.config import Preset
from autopilot.config import VllmEndpoint as VllmConfig
from autopilot.endpoints.base import Endpoint
from autopilot.endpoints.served import Pins, model_problem, mounted, program_problem


def vllm_binary(configured: str) -> str:
    return os.environ.get("AUTOPILOT_VLLM") or configured


class VllmEndpoint(Endpoint):
    engine = "vllm"
    progress_api = "metrics"

    @classmethod
    def preflight_problems(cls, preset: Preset) -> list[str]:
        c = preset.endpoint
        assert isinstance(c, VllmConfig)
        if c.attach:
            return []
        problems = []
        if c.mode == "process":
            problems.append(program_problem(
                preset, vllm_binary(c.binary),
                " (pip install vllm on the GPU box, or point $AUTOPILOT_VLLM at it)"))
        # a model may be a hub id; a container's is checked where it is mounted
        problems.append(model_problem(preset, c.model_path, mounted(preset, c.model_path)))
        return [x for x in problems if x]

    @classmethod
    def capacity_problems(cls, preset: Preset) -> list[str]:
        """vLLM refuses (HTTP 400) every request whose prompt + max_tokens exceed
        ``--max-model-len``: a harness that asks for more could never get an answer."""
        c, need = preset.endpoint, preset.harness.max_context
        assert isinstance(c, VllmConfig)
        if need and c.max_model_len < need:
            return [f"the harness asks for up to {need} tokens a request (harness."
                    f"max_context: prompt + max_tokens) but vLLM serves max_model_len = "
                    f"{c.max_model_len}; vLLM refuses such a request with HTTP 400 (every "
                    f"cell would be an api_error): raise endpoint.max_model_len to at "
                    f"least {need}"]
        return []

    @classmethod
    def pins(cls, preset: Preset) -> Pins:
        c = preset.endpoint
        assert isinstance(c, VllmConfig)
        box = c.container()
        return Pins(binary="" if box else vllm_binary(c.binary),
                    image=box.image if box else "", model_path=c.model_path)

    @property
    def c(self) -> VllmConfig:
        assert isinstance(self.cfg, VllmConfig)
        return self.cfg

    def argv(self) -> list[str]:
        c = self.c
        binary = vllm_binary(c.binary)
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

