"""Preflight of an Inspect preset (``preflight.commands``): Inspect is installed at the
version this package was tested with, every task file loads, every cell's task exists
in it, every sample id is in that task's dataset, and a task that reduces its epochs
several ways has the one that decides named. All problems at once, on the last line
(the one the autopilot's refusal quotes). A plan that passed is not checked again
while nothing it depends on changed (Inspect's version, the tasks, their files' size
and mtime, a published task's package version: ``~/.cache/bench-autopilot``); a task
file that imports another file of yours is re-checked only when the task file itself
changes, and a stale pass shows as that cell's eval failing, INVALID, never a FAIL."""

from __future__ import annotations

import argparse
import contextlib
import hashlib
import importlib.metadata
import importlib.util
import itertools
import json
import os
import shlex
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


def problems(tasks: list[dict[str, Any]], preset_args: list[str] | None = None) -> list[str]:
    """Every problem of the plan's Inspect tasks; ``preset_args``: the preset's
    ``inspect_args`` (a task's own replace them), where ``-T`` task args are found."""
    preset_args = preset_args or []
    try:
        got = importlib.metadata.version("inspect-ai")
    except importlib.metadata.PackageNotFoundError:
        return ["inspect-ai is not installed (pip install 'bench-autopilot[inspect]')"]
    out = []
    if got != INSPECT_VERSION:
        out.append(f"inspect-ai {got} is installed; this preset was tested with "
                   f"{INSPECT_VERSION} (pip install 'bench-autopilot[inspect]')")
    modules: dict[Path, Any] = {}
    samples: dict[tuple[str, str, str], list[Any]] = {}
    reducers: dict[tuple[str, str, str], list[str]] = {}
    for task in tasks:
        v = task.get("vars") or {}
        name, sid = v.get("inspect_task", ""), v.get("sample", "")
        given = split_args(v["inspect_args"]) if "inspect_args" in v else list(preset_args)
        args = task_args(given)
        key = (v.get("inspect_file", ""), name, json.dumps(args, sort_keys=True, default=str))
        if key not in samples:
            try:
                if registered(name):  # a published task (inspect_evals/<name>), unchanged
                    from inspect_ai._eval.loader import load_tasks

                    loaded = load_tasks([name], args)[0]
                else:
                    path = task_file(v.get("inspect_file", ""))
                    if path not in modules:
                        try:
                            modules[path] = load(path)
                        except Exception as e:  # user code: any error is its problem
                            modules[path] = None
                            out.append(f"{path}: does not load ({type(e).__name__}: {e})")
                    if modules[path] is None:
                        continue
                    factory = getattr(modules[path], name, None)
                    if not callable(factory):
                        out.append(f"task {task.get('id')}: {path} has no @task {name!r}")
                        continue
                    loaded = factory(**args)
                samples[key] = dataset_ids(loaded.dataset)
                reducers[key] = reducer_names(loaded)
            except Exception as e:
                samples[key] = []
                out.append(f"task {task.get('id')}: {name}() fails ({type(e).__name__}: {e})")
                continue
        ways, chosen = reducers.get(key, []), v.get("reducer", "")
        if len(ways) > 1 and chosen not in ways:
            out.append(f"task {task.get('id')}: {name} reduces its epochs {len(ways)} ways "
                       f"({', '.join(ways)}): set vars.reducer to the one that decides"
                       if not chosen else f"task {task.get('id')}: {name} has no reducer "
                       f"{chosen!r} (it has {', '.join(ways)})")
        have = samples[key]
        wanted = [wanted_id.strip() for wanted_id in sid.split(",") if wanted_id.strip()]
        lost = [wanted_id for wanted_id in wanted if not any(matches(i, wanted_id) for i in have)]
        if lost:
            ids = [str(i) for i in have]
            shown = ", ".join(ids[:20]) + (f" ... ({len(ids)})" if len(ids) > 20 else "")
            out.append(f"task {task.get('id')}: sample {lost[0]!r} is not in {name} "
                       f"(it has {shown or 'none'})")
    return out


def reducer_names(task: Any) -> list[str]:
    """The names Inspect gives a task's epoch reducers in its log (``max``, ``mean``,
    ``pass_at_2``...): several mean several scores per sample, side by side."""
    from inspect_ai.scorer._reducer import reducer_log_names

    given = getattr(task, "epochs_reducer", None)
    return list(reducer_log_names(given) or []) if given else []


def registered(name: str) -> bool:
    """A task Inspect finds by name in an installed package (``inspect_evals/gsm8k``),
    not in a file of ours."""
    return "/" in name and "@" not in name and not name.endswith(".py")


def split_args(value: str) -> list[str]:
    """A preset's ``inspect_args`` string, split as a shell would (never run by one)."""
    return shlex.split(value)


def task_args(args: list[str]) -> dict[str, Any]:
    """The ``-T name=value`` task arguments among Inspect flags, parsed as Inspect
    parses them (values as YAML)."""
    pairs = [b for a, b in itertools.pairwise(args) if a in ("-T", "--task-arg")]
    pairs += [a.split("=", 1)[1] for a in args if a.startswith("--task-arg=")]
    from inspect_ai._util.config import parse_cli_args

    return parse_cli_args(pairs)


def plan_key(tasks: list[dict[str, Any]], preset_args: list[str]) -> str | None:
    """What a passed check depends on: Inspect's version, the interpreter, the plan's
    tasks and arguments, and each task file as it is now (path, size, mtime) or the
    version of the package a published task comes from. None: something cannot be
    pinned (the check is run)."""
    try:
        pins: list[Any] = [importlib.metadata.version("inspect-ai"), sys.executable,
                           tasks, preset_args]
    except importlib.metadata.PackageNotFoundError:
        return None
    for task in tasks:
        v = task.get("vars") or {}
        name = str(v.get("inspect_task", ""))
        try:
            if registered(name):
                pins.append(importlib.metadata.version(name.split("/")[0]))
            else:
                info = task_file(str(v.get("inspect_file", ""))).resolve().stat()
                pins.append([str(task_file(str(v.get("inspect_file", ""))).resolve()),
                             info.st_size, info.st_mtime_ns])
        except (OSError, importlib.metadata.PackageNotFoundError):
            return None
    blob = json.dumps(pins, sort_keys=True, default=str).encode()
    return hashlib.sha256(blob).hexdigest()


def _cache_dir() -> Path:
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "bench-autopilot" / "inspect-check"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="inspect_check", description=__doc__.splitlines()[0])
    parser.add_argument("--inspect-args", action="append", default=[],
                        help="the preset's inspect_args (the first cell's values)")
    args = parser.parse_args(argv)
    tasks = json.loads(os.environ.get("AUTOPILOT_PLAN_TASKS") or "[]")
    preset_args = [x for a in args.inspect_args for x in split_args(a)]
    # A plan that passed as it stands now passes again: its tasks are not loaded a
    # second time (an import of Inspect and of every task, seconds, before each run).
    key = plan_key(tasks, preset_args)
    passed = _cache_dir() / f"{key}.passed" if key else None
    if passed is not None and passed.is_file():
        print(f"inspect: {len(tasks)} task(s) load, every sample id exists (as checked "
              "before: nothing they depend on changed)")
        return 0
    found = problems(tasks, preset_args)
    if found:
        print("inspect: " + "; ".join(found))
        return 1
    if passed is not None:
        with contextlib.suppress(OSError):  # a read-only home: checked every time
            passed.parent.mkdir(parents=True, exist_ok=True)
            passed.touch()
    print(f"inspect: {len(tasks)} task(s) load, every sample id exists")
    return 0


if __name__ == "__main__":
    sys.exit(main())
