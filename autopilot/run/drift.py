"""Drift pins: a resumed run is measured with the benchmark it began with.

The plan identity (autopilot.plan) hashes the argv *templates*; an edited harness, task
prompt, grader or ground truth at the same path would pass it silently, and a run would
then mix two benchmarks. The files a preset names in ``[preflight] benchmark_files``
(rendered per task) are hashed at the first launch and recorded in plan.json; every
resume hashes them again, and any change is refused like a plan change (or, with
``--allow-plan-change``, journaled as ``benchmark_drift``). A directory's digest is a
tree hash over its entries' relative paths and contents (symlinks by their target,
never followed). The origin's methodology is the same rule: "drift via harness sha256".
"""

from __future__ import annotations

import hashlib
import os
import re
from pathlib import Path
from typing import Any

from autopilot.config import Preset
from autopilot.plan import Cell, cell_context
from autopilot.templates import render_argv

CHUNK = 1 << 20


def _file_sha(path: Path) -> str:
    sha = hashlib.sha256()
    with path.open("rb") as f:
        while block := f.read(CHUNK):
            sha.update(block)
    return sha.hexdigest()


def digest(path: Path) -> str | None:
    """sha256 of a file, ``tree:<sha256>`` of a directory, None for nothing there."""
    try:
        if path.is_symlink():
            return "link:" + hashlib.sha256(os.readlink(path).encode()).hexdigest()
        if path.is_file():
            return _file_sha(path)
        if not path.is_dir():
            return None
        sha = hashlib.sha256()
        for root, dirs, files in os.walk(path, followlinks=False):
            dirs.sort()
            linked = [subdir for subdir in dirs if Path(root, subdir).is_symlink()]
            for name in sorted(files + linked):
                entry = Path(root, name)
                rel = entry.relative_to(path).as_posix()
                sha.update(rel.encode() + b"\0" + (digest(entry) or "-").encode() + b"\n")
        return "tree:" + sha.hexdigest()
    except OSError:
        return None


def benchmark_pins(preset: Preset, state_dir: Path) -> dict[str, str | None]:
    """Every benchmark file of the preset, once, with its digest."""
    templates = preset.preflight.benchmark_files
    if not templates:
        return {}
    seen: dict[str, str | None] = {}
    for task in preset.tasks:
        ctx = cell_context(preset, Cell(task.id, preset.arms[0].label, 1), 1, state_dir)
        for name in render_argv(templates, ctx):
            if name and name not in seen:
                seen[name] = digest(Path(name))
    return seen


def changed(recorded: Any, now: dict[str, str | None]) -> list[str]:
    """The files whose digest differs from the one recorded at the first launch (a run
    recorded before pins existed, or without any, has nothing to compare)."""
    if not isinstance(recorded, dict) or not recorded:
        return []
    names = sorted(set(recorded) | set(now), key=str)
    return [str(name) for name in names if recorded.get(name) != now.get(name)]


SAMPLE = 4 << 20  # bytes hashed at each end of a model file (a 200 GB GGUF in seconds)


def model_identity(path: Path) -> dict[str, Any]:
    """A model file by its size and a sampled hash (its first and last 4 MiB): enough to
    tell two GGUFs apart without reading hundreds of GB; a directory (a vLLM model) by
    its file count and total size."""
    try:
        if path.is_dir():
            files = [f for f in path.rglob("*") if f.is_file() and not f.is_symlink()]
            return {"path": str(path), "files": len(files),
                    "size": sum(f.stat().st_size for f in files)}
        size = path.stat().st_size
        sha = hashlib.sha256(str(size).encode())
        with path.open("rb") as f:
            sha.update(f.read(SAMPLE))
            if size > 2 * SAMPLE:
                f.seek(size - SAMPLE)
                sha.update(f.read(SAMPLE))
        return {"path": str(path), "size": size, "sample_sha256": sha.hexdigest()}
    except OSError as e:
        return {"path": str(path), "unreadable": e.strerror or type(e).__name__}


_SONAME = re.compile(rb"lib[A-Za-z0-9_+.-]*?\.so(?:\.[0-9]+)*")
SCAN_CAP = 256 << 20  # a binary's bytes searched for the libraries it names


def linked_libraries(binary: Path, limit: int = 32) -> dict[str, str]:
    """sha256 of the shared libraries beside ``binary`` (its dir, or ``../lib``) that it
    names, and that they name in turn: where an engine keeps its code (llama.cpp's
    ``llama-server`` is a 17 KB launcher of ``libllama-server-impl.so`` and
    ``libggml-*.so``). Names are read from the files' bytes, never by running ``ldd``
    on them; what is not beside the binary (libc) is the system's, not the engine's."""
    try:
        real = binary.resolve()
    except OSError:
        return {}
    dirs = [real.parent, real.parent.parent / "lib"]
    todo, out = [real], dict[str, str]()
    while todo and len(out) < limit:
        try:
            with todo.pop().open("rb") as f:
                names = {soname.decode() for soname in _SONAME.findall(f.read(SCAN_CAP))}
        except OSError:
            continue
        for name in sorted(names):
            if name in out:
                continue
            for directory in dirs:
                try:
                    lib = (directory / name).resolve()
                    if lib.is_file() and lib != real:
                        out[name] = _file_sha(lib)
                        todo.append(lib)
                        break
                except OSError:
                    continue
    return dict(sorted(out.items()))


def endpoint_identity(preset: Preset) -> dict[str, Any]:
    """What serves the model, recorded per launch (identity.jsonl) and shown in the
    report: the engine's binary (path + sha256) or image, and the model file's identity
    (or the model package and its version)."""
    import importlib.metadata
    import shutil

    from autopilot.endpoints import ENGINES
    from autopilot.endpoints.served import Pins

    endpoint = preset.endpoint
    out: dict[str, Any] = {"engine": endpoint.engine}
    pins = ENGINES[endpoint.engine].pins(preset)
    if endpoint.attach or pins == Pins():
        return out
    if pins.image:
        out["image"] = pins.image
    elif pins.binary:
        found = shutil.which(pins.binary) or pins.binary
        out["binary"] = {"path": found, "sha256": digest(Path(found))}
        libs = linked_libraries(Path(found))
        if libs:
            out["libraries"] = libs
    model, package = pins.model_path, pins.model_package
    if model and model.startswith("/"):
        out["model"] = model_identity(Path(model))
    elif package:
        try:
            version = importlib.metadata.version(package.replace("_", "-"))
        except importlib.metadata.PackageNotFoundError:
            version = None
        out["model"] = {"package": package, "version": version}
    elif model:
        out["model"] = {"name": model}  # a hub id: served as named
    from autopilot.run.power import inventory

    gpus = inventory(preset)
    if gpus:
        out["gpus"] = gpus
    return out


__all__ = ["benchmark_pins", "changed", "digest", "endpoint_identity", "linked_libraries",
           "model_identity"]
