"""A cell's watchdog limits, resolved in one place.

The preset already holds what is in force (the environment's overrides are a loader
layer), and a task may set its own ``stuck_secs`` and ``wall_budget_secs``. Every part
that needs a cell's limits (the runner, recovery, a Ray node, status.json) asks
``limits_for``, so a value can never differ between the kill decision and what a user
is shown.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

from autopilot.config import Preset


@dataclass(frozen=True)
class TaskLimits:
    warn_secs: float
    probe_secs: float
    kill_secs: float
    stuck_secs: float
    teardown_grace_secs: float
    kill_grace_secs: float
    wall_budget_secs: float
    # From the attempt's start to the hard deadline: the wall budget plus the overhead
    # allowed for start-up and teardown, never over the cap.
    deadline_secs: float
    deadline_cap_secs: float = 3600.0
    # Seconds of wall budget per item still to run, for a harness that says how many
    # it holds (autopilot.cell.itemsprogress); 0: none (the task sets its own budget)
    per_item_secs: float = 0.0

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def limits_for(preset: Preset, task_id: str) -> TaskLimits:
    watchdog = preset.watchdog
    task = preset.task(task_id)
    budget = task.wall_budget_secs or preset.harness.wall_budget_secs
    return TaskLimits(
        warn_secs=watchdog.warn_secs, probe_secs=watchdog.probe_secs, kill_secs=watchdog.kill_secs,
        stuck_secs=task.stuck_secs or watchdog.stuck_secs,
        teardown_grace_secs=watchdog.teardown_grace_secs, kill_grace_secs=watchdog.kill_grace_secs,
        wall_budget_secs=budget,
        deadline_secs=min(budget + watchdog.deadline_overhead_secs, watchdog.deadline_cap_secs),
        deadline_cap_secs=watchdog.deadline_cap_secs,
        per_item_secs=0.0 if task.wall_budget_secs else preset.harness.item_budget_secs,
    )
