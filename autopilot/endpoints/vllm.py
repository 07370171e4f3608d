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
        spec = preset.endpoint
        assert isinstance(spec, VllmConfig)
        if spec.attach:
            return []
        problems = []
        if spec.mode == "process":
            problems.append(program_problem(
                preset, vllm_binary(spec.binary),
                " (pip install vllm on the GPU box, or point $AUTOPILOT_VLLM at it)"))
        # a model may be a hub id; a container's is checked where it is mounted
        problems.append(model_problem(preset, spec.model_path, mounted(preset, spec.model_path)))
        return [problem for problem in problems if problem]

    @classmethod
    def capacity_problems(cls, preset: Preset) -> list[str]:
        """vLLM refuses (HTTP 400) every request whose prompt + max_tokens exceed
        ``--max-model-len``: a harness that asks for more could never get an answer."""
        spec, need = preset.endpoint, preset.harness.max_context
        assert isinstance(spec, VllmConfig)
        if need and spec.max_model_len < need:
            return [f"the harness asks for up to {need} tokens a request (harness."
                    f"max_context: prompt + max_tokens) but vLLM serves max_model_len = "
                    f"{spec.max_model_len}; vLLM refuses such a request with HTTP 400 (every "
                    f"cell would be an api_error): raise endpoint.max_model_len to at "
                    f"least {need}"]
        return []

    @classmethod
    def pins(cls, preset: Preset) -> Pins:
        spec = preset.endpoint
        assert isinstance(spec, VllmConfig)
        box = spec.container()
        return Pins(binary="" if box else vllm_binary(spec.binary),
                    image=box.image if box else "", model_path=spec.model_path)

    @property
    def c(self) -> VllmConfig:
        assert isinstance(self.cfg, VllmConfig)
        return self.cfg

    def argv(self) -> list[str]:
        spec = self.c
        binary = vllm_binary(spec.binary)
        argv = [
            binary, "serve", spec.model_path or self.served_model,
            "--host", self.host, "--port", str(self.port),
            "--served-model-name", spec.served_model_name or self.served_model,
            "--max-model-len", str(spec.max_model_len),
            "--gpu-memory-utilization", str(spec.gpu_memory_utilization),
        ]
        if spec.tool_call_parser:
            argv += ["--enable-auto-tool-choice", "--tool-call-parser", spec.tool_call_parser]
        if spec.reasoning_parser:
            argv += ["--reasoning-parser", spec.reasoning_parser]
        return argv + list(spec.args)

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

