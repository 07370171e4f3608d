"""The matrix of cells, and the identity of a plan.

A cell is one (task, arm, replicate); its id ``{task}_{arm}_v{n}`` is what every file,
journal event and container name is keyed by. Cells are ordered replicate-major inside
each arm (all tasks' v1, then all v2, ...) so a run that stops early still has an even
spread of replicates to read.

The plan identity is a digest of what makes a cell *mean* something: the tasks and their
fields, the arms, the model, the harness and grader argv and the verdict mapping. N is
deliberately not part of it, so raising ``--target-n`` is an ordinary resume that adds
replicates; changing a task's prompt is not, and is refused unless the operator says so.
"""

from __future__ import annotations

import hashlib
import json
import sys
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path
from typing import Any

from autopilot.config import ArmEndpoint, Preset
from autopilot.templates import render


@dataclass(frozen=True, slots=True)
class Cell:
    task: str
    arm: str
    n: int

    @property
    def id(self) -> str:
        return f"{self.task}_{self.arm}_v{self.n}"


@dataclass(frozen=True)
class Plan:
    preset: Preset
    target_n: int

    @cached_property
    def cells(self) -> tuple[Cell, ...]:
        return tuple(
            Cell(task.id, arm.label, replicate)
            for arm in self.preset.arms
            for replicate in range(1, self.target_n + 1)
            for task in self.preset.tasks
        )

    @cached_property
    def by_id(self) -> dict[str, Cell]:
        return {cell.id: cell for cell in self.cells}

    @cached_property
    def identity(self) -> str:
        # Once per plan: the preset is frozen, and a digest of every task's dump costs
        # ~10 ms at 200 tasks (pydantic defaults go through inspect), which every status
        # snapshot and progress line used to pay again.
        return plan_identity(self.preset)


# Fields added after state dirs existed: left out of the digest while at their default,
# so upgrading the autopilot does not refuse a run that did not change.
_LATER_FIELDS = frozenset({"grader_argv", "grader_requires", "endpoint", "streak", "replicas",
                           "request", "request_by_dialect", "route"})


def _dump(obj: Any) -> dict[str, Any]:
    doc: dict[str, Any] = obj.model_dump(mode="json")
    for name in _LATER_FIELDS & doc.keys():
        field = type(obj).model_fields[name]
        default = field.get_default(call_default_factory=True)
        if hasattr(default, "model_dump"):
            default = default.model_dump(mode="json")
        if doc[name] == default:
            del doc[name]
    return doc


def plan_identity(preset: Preset) -> str:
    defining = {
        "model": preset.model,
        "vars": preset.vars,
        "tasks": [_dump(task) for task in preset.tasks],
        "arms": [_dump(arm) for arm in preset.arms],
        "harness_argv": preset.harness.argv,
        "grader_argv": preset.grader.argv,
        "verdicts": {k: _dump(v) for k, v in preset.grader.verdicts.items()},
    }
    blob = json.dumps(defining, sort_keys=True, separators=(",", ":")).encode()
    return hashlib.sha256(blob).hexdigest()[:16]


def cell_context(
    preset: Preset, cell: Cell, attempt: int, state_dir: Path, port: int = 0,
    host: str = "127.0.0.1", base_url: str = "",
) -> dict[str, str]:
    """The placeholders of a cell without a live endpoint (sweeps, cleanup, postflight)."""
    task = preset.task(cell.task)
    arm = preset.arm(cell.arm)
    ctx: dict[str, str] = {
        **preset.vars, **task.vars, **arm.vars,
        "cell": cell.id, "task": cell.task, "arm": cell.arm, "mode": arm.mode,
        "n": str(cell.n), "attempt": str(attempt), "port": str(port), "host": host,
        "base_url": base_url, "model": arm.model or preset.model,
        # the endpoint itself, whatever {port}/{host}/{base_url} say (the gateway's)
        "endpoint_host": host, "endpoint_port": str(port), "endpoint_base_url": base_url,
        "served_model": arm.route.model if arm.route else preset.model,
        "state_dir": str(state_dir),
        "python": sys.executable, "deadline": "0",
        # "1" when this attempt's INVALID would quarantine the cell (trust.infra_retries;
        # attempts ended otherwise count too, so it is never later than the real last)
        "last_try": "1" if attempt > preset.trust.infra_retries else "0",
        "api_key": "",  # the attempt's gateway key: set for its harness's launch only
    }
    ctx["output_dir"] = render(preset.harness.output_dir, ctx)
    ctx["transcript"] = render(preset.harness.transcript, ctx)
    ctx["grade_file"] = render(preset.grader.grade_file, ctx)
    ctx["scratch_dir"] = str(state_dir / "scratch" / cell.id)
    return ctx


def output_dirs(preset: Preset, plan: Plan, state_dir: Path) -> list[Path]:
    """Every cell's output dir (its first attempt's: what a run owns, autopilot.state.
    claims)."""
    return [Path(cell_context(preset, cell, 1, state_dir)["output_dir"]) for cell in plan.cells]


def arm_groups(preset: Preset) -> list[tuple[ArmEndpoint, tuple[str, ...]]]:
    """Arms grouped by their endpoint settings, in preset order. One group (the usual
    case: the harness carries the mode) means one endpoint for the whole run; several
    mean the endpoint is restarted with each group's settings in turn."""
    groups: dict[str, tuple[ArmEndpoint, list[str]]] = {}
    for arm in preset.arms:
        key = json.dumps(arm.endpoint.model_dump(mode="json"), sort_keys=True)
        groups.setdefault(key, (arm.endpoint, []))[1].append(arm.label)
    return [(setting, tuple(labels)) for setting, labels in groups.values()]
