"""Preflight of an Inspect preset (``preflight.commands``): Inspect is installed at the
version this package was tested with, every task file loads, every cell's task exists
in it and every sample id is in that task's dataset. All problems at once, on the last
line (the one the autopilot's refusal quotes)."""

from __future__ import annotations

import argparse
import importlib.metadata
import importlib.util
import json
import os
import sys
from fnmatch import fnmatch
from pathlib import Path
from typing import Any

INSPECT_VERSION = "0.3.285"  # the [inspect] extra pins the same (tests/test_inspect.py)
SHIPPED = Path(__file__).with_name("inspect_tasks.py")


def task_file(value: str) -> Path:
    """"" or "shipped": the example tasks in this package; else the path given."""
    return SHIPPED if value in ("", "shipped") else Path(value)


def matches(sample_id: Any, wanted: str) -> bool:
    """``wanted`` names this sample as Inspect's ``--sample-id`` does: ids compared
    after Inspect's normalisation (``"7"`` and ``7`` are one id), shell-style globs."""
    return fnmatch(_normal(sample_id), _normal(wanted))


def _normal(value: Any) -> str:
    if isinstance(value, str) and value.isdigit():
        value = int(value)
    return value if isinstance(value, str) else str(value).zfill(20)


def dataset_ids(dataset: Any) -> list[Any]:
    """A dataset's sample ids as Inspect runs them: a sample without one is numbered
    by its place, from 1 (Inspect's own examples have no ids)."""
    return [s.id if s.id is not None else i + 1 for i, s in enumerate(dataset)]


def load(path: Path) -> Any:
    spec = importlib.util.spec_from_file_location(f"_inspect_tasks_{abs(hash(path))}", path)
    if spec is None or spec.loader is None:
        raise ImportError(f"cannot load {path}")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def problems(tasks: list[dict[str, Any]]) -> list[str]:
    try:
        got = importlib.metadata.version("inspect-ai")
    except importlib.metadata.PackageNotFoundError:
        return ["inspect-ai is not installed (pip install 'bench-autopilot[inspect]')"]
    out = []
    if got != INSPECT_VERSION:
        out.append(f"inspect-ai {got} is installed; this preset was tested with "
                   f"{INSPECT_VERSION} (pip install 'bench-autopilot[inspect]')")
    modules: dict[Path, Any] = {}
    samples: dict[tuple[Path, str], list[Any]] = {}
    for t in tasks:
        v = t.get("vars") or {}
        path, name, sid = task_file(v.get("inspect_file", "")), v.get("inspect_task", ""), \
            v.get("sample", "")
        if path not in modules:
            try:
                modules[path] = load(path)
            except Exception as e:  # a task file is user code: any error is its problem
                modules[path] = None
                out.append(f"{path}: does not load ({type(e).__name__}: {e})")
        mod = modules[path]
        if mod is None:
            continue
        fn = getattr(mod, name, None)
        if not callable(fn):
            out.append(f"task {t.get('id')}: {path} has no @task {name!r}")
            continue
        key = (path, name)
        if key not in samples:
            try:
                samples[key] = dataset_ids(fn().dataset)
            except Exception as e:
                samples[key] = []
                out.append(f"task {t.get('id')}: {name}() fails ({type(e).__name__}: {e})")
                continue
        if sid and not any(matches(i, sid) for i in samples[key]):
            have = [str(i) for i in samples[key]]
            shown = ", ".join(have[:20]) + (f" ... ({len(have)})" if len(have) > 20 else "")
            out.append(f"task {t.get('id')}: sample {sid!r} is not in {name} "
                       f"(it has {shown or 'none'})")
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="inspect_check", description=__doc__.splitlines()[0])
    ap.parse_args(argv)
    tasks = json.loads(os.environ.get("AUTOPILOT_PLAN_TASKS") or "[]")
    found = problems(tasks)
    if found:
        print("inspect: " + "; ".join(found))
        return 1
    print(f"inspect: {len(tasks)} task(s) load, every sample id exists")
    return 0


if __name__ == "__main__":
    sys.exit(main())
