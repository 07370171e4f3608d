"""What the engines we start ourselves (llama.cpp, vLLM) share beyond running: the
checks that their program and model resolve here, and what identifies them (``Pins``).

The engines' class hooks (``Endpoint.preflight_problems``, ``Endpoint.pins``) use these;
preflight and drift reach an engine only through those hooks.
"""

from __future__ import annotations

import shutil
from dataclasses import dataclass
from pathlib import Path

from autopilot.config import Preset


@dataclass(frozen=True)
class Pins:
    """What identifies the engine serving a run, as its class knows it: drift hashes the
    files and records the names (identity.jsonl, the report)."""

    binary: str = ""  # the program, resolved as it will run (a path or a PATH name)
    image: str = ""  # the container image
    model_path: str = ""  # a file or directory (a hub id when not absolute)
    model_package: str = ""  # a Python package that provides the model file


def program_problem(preset: Preset, binary: str, hint: str = "") -> str | None:
    """Why ``binary`` cannot be run here (None: it can)."""
    if shutil.which(binary) or Path(binary).is_file():
        return None
    src = preset.env_source(binary)
    return f"endpoint binary {binary} not found{hint}" + (f" ({src})" if src else "")


def model_problem(preset: Preset, model_path: str, local: bool) -> str | None:
    """Why the model file is missing (None: it is there, or it is not ours to check:
    a hub id, or a container's path that is not mounted from here)."""
    if not model_path or not local or Path(model_path).exists():
        return None
    src = preset.env_source(model_path)
    return f"endpoint model {model_path} not found" + (f" ({src})" if src else "")


def mounted(preset: Preset, model_path: str) -> bool:
    """The model lies on this host: a process's absolute path, or a path inside the
    container's ``model_dir`` mount."""
    box = preset.endpoint.container()
    if box is None:
        return model_path.startswith("/")
    return bool(box.model_dir) and model_path.startswith(box.model_dir.rstrip("/") + "/")
