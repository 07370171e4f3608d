"""The local backend: every replica's endpoint and every cell on this machine.

Cells are process trees here (autopilot.cell.runner.CellRun: exact-identity tree kill,
the transcript-freeze and stall watchdog, grading). With per-arm grading (the origin's
way) a finished attempt with its outputs is journaled as ``cell_ran`` and graded once
its whole arm has run; one without outputs is INVALID at once (no grader could change
that).
"""

from __future__ import annotations

from functools import partial
from typing import TYPE_CHECKING, Any

from autopilot.backends.base import Backend, Ran, Wiring

if TYPE_CHECKING:  # loaded on use: the loader asks this class its (no) load checks
    from autopilot.cell.validity import Classification
    from autopilot.config import ArmEndpoint
    from autopilot.endpoints.keeper import Keeper
    from autopilot.plan import Cell


class LocalBackend(Backend):
    kind = "local"

    def __init__(self, wiring: Wiring, setting: ArmEndpoint, group: tuple[str, ...]) -> None:
        from autopilot.endpoints import make_endpoint
        from autopilot.endpoints.keeper import Keeper

        super().__init__(wiring, setting, group)
        replicas = wiring.preset.endpoint.replicas
        keepers: list[Keeper] = []
        for i in range(replicas):
            endpoint = make_endpoint(wiring.preset, wiring.state_dir, i)
            endpoint.arm_setting, endpoint.arm_group = setting, group
            # With several replicas, every event a keeper journals names its replica.
            emit = wiring.port.emit if replicas == 1 else partial(wiring.port.emit, replica=i)
            milestone = (wiring.port.milestone if replicas == 1
                         else partial(wiring.port.milestone, replica=i))
            k = Keeper(endpoint, emit, milestone, wiring.clock)
            k.on_throttled = wiring.port.throttled
            k.readopt_record = (wiring.readopt or {}).get(i)
            keepers.append(k)
        self.keepers = keepers
        self.local = keepers

    async def reconfigure(self, setting: ArmEndpoint, arms: tuple[str, ...]) -> None:
        await self.local[0].reconfigure(setting, arms)

    # Each attempt's data path runs here and outlives the loop (autopilot.datapath).
    reattaches = True

    async def run(self, cell: Cell, attempt: int, replica: int,
                  ran: Ran | None = None) -> Classification | None:
        from autopilot.cell.runner import CellRun

        run = CellRun(self.context(replica), cell, attempt)
        return await self.conclude(run, await run.execute(), ran)

    async def resume(self, cell: Cell, attempt: int, replica: int,
                     attached: Any, ran: Ran | None = None) -> Classification | None:
        from autopilot.cell.runner import CellRun

        run = CellRun(self.context(replica), cell, attempt)
        return await self.conclude(run, await run.execute(attached=attached), ran)


__all__ = ["LocalBackend"]
