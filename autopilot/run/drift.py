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
from pathlib import Path
from typing import Any

from autopilot.config import Preset
from autopilot.plan import Cell, cell_context
from autopilot.templates import render_argv

CHUNK = 1 << 20


def _file_sha(path: Path) -> str:
    h = hashlib.sha256()
    with path.open("rb") as f:
        while block := f.read(CHUNK):
            h.update(block)
    return h.hexdigest()


def digest(path: Path) -> str | None:
    """sha256 of a file, ``tree:<sha256>`` of a directory, None for nothing there."""
    try:
        if path.is_symlink():
            return "link:" + hashlib.sha256(os.readlink(path).encode()).hexdigest()
        if path.is_file():
            return _file_sha(path)
        if not path.is_dir():
            return None
        h = hashlib.sha256()
        for root, dirs, files in os.walk(path, followlinks=False):
            dirs.sort()
            for name in sorted(files + [d for d in dirs if Path(root, d).is_symlink()]):
                entry = Path(root, name)
                rel = entry.relative_to(path).as_posix()
                h.update(rel.encode() + b"\0" + (digest(entry) or "-").encode() + b"\n")
        return "tree:" + h.hexdigest()
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
    return [str(n) for n in names if recorded.get(n) != now.get(n)]


__all__ = ["benchmark_pins", "changed", "digest"]
