"""Preflight of an Inspect preset (``preflight.commands``): Inspect is installed at the
version this package was tested with, every task file loads, every cell's task exists
in it and every sample id is in that task's dataset. All problems at once, on the last
line (the one the autopilot's refusal quotes)."""

from __future__ import annotations

import argparse
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
    for t in tasks:
        v = t.get("vars") or {}
        name, sid = v.get("inspect_task", ""), v.get("sample", "")
        given = split_args(v["inspect_args"]) if "inspect_args" in v else list(preset_args)
        args = task_args(given)
        key = (v.get("inspect_file", ""), name, json.dumps(args, sort_keys=True, default=str))
        if key not in samples:
            try:
                if registered(name):  # a published task (inspect_evals/<name>), unchanged
                    from inspect_ai._eval.loader import load_tasks

                    dataset = load_tasks([name], args)[0].dataset
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
                    fn = getattr(modules[path], name, None)
                    if not callable(fn):
                        out.append(f"task {t.get('id')}: {path} has no @task {name!r}")
                        continue
                    dataset = fn(**args).dataset
                samples[key] = dataset_ids(dataset)
            except Exception as e:
                samples[key] = []
                out.append(f"task {t.get('id')}: {name}() fails ({type(e).__name__}: {e})")
                continue
        have = samples[key]
        wanted = [w.strip() for w in sid.split(",") if w.strip()]
        lost = [w for w in wanted if not any(matches(i, w) for i in have)]
        if lost:
            ids = [str(i) for i in have]
            shown = ", ".join(ids[:20]) + (f" ... ({len(ids)})" if len(ids) > 20 else "")
            out.append(f"task {t.get('id')}: sample {lost[0]!r} is not in {name} "
                       f"(it has {shown or 'none'})")
    return out


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


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="inspect_check", description=__doc__.splitlines()[0])
    ap.add_argument("--inspect-args", action="append", default=[],
                    help="the preset's inspect_args (the first cell's values)")
    args = ap.parse_args(argv)
    tasks = json.loads(os.environ.get("AUTOPILOT_PLAN_TASKS") or "[]")
    found = problems(tasks, [x for a in args.inspect_args for x in split_args(a)])
    if found:
        print("inspect: " + "; ".join(found))
        return 1
    print(f"inspect: {len(tasks)} task(s) load, every sample id exists")
    return 0


if __name__ == "__main__":
    sys.exit(main())
