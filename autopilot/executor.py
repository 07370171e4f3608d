"""Where and how a cell runs: the seam between what the run decides and what carries it out.

The supervisor decides (ledger, passes, retries, which replica gets a cell) and journals;
an executor runs one attempt on the replica it was given and answers with its
classification (None: abandoned, nothing to record). ``LocalExecutor`` runs cells on this
machine; ``autopilot.rayexec.RayExecutor`` in a node's actor. A third backend (a Slurm
job per cell, say) is one more class with this shape and no change to the deciding side.
"""

from __future__ import annotations

from dataclasses import asdict
from typing import TYPE_CHECKING, Protocol

from autopilot.cells import CellRun
from autopilot.validity import Classification, classify

if TYPE_CHECKING:
    from autopilot.plan import Cell
    from autopilot.supervisor import Supervisor


class Executor(Protocol):
    async def run(self, cell: Cell, attempt: int, replica: int) -> Classification | None:
        """Run one attempt of ``cell`` against endpoint replica ``replica``."""

    async def close(self) -> None:
        """After every replica stopped: release what the backend holds."""


class LocalExecutor:
    """Cells as process trees on this machine (autopilot.cells.CellRun)."""

    def __init__(self, sup: Supervisor) -> None:
        self.sup = sup

    async def run(self, cell: Cell, attempt: int, replica: int) -> Classification | None:
        run = CellRun(self.sup._cell_context(replica), cell, attempt)
        if self.sup.preset.grader.mode == "per-cell":
            return await run.run()
        return await self._run_per_arm(run)

    async def _run_per_arm(self, run: CellRun) -> Classification | None:
        """Per-arm grading (the origin's way): a finished attempt with its outputs is
        journaled as ``cell_ran`` and graded once its whole arm has run; one without
        outputs is INVALID at once (no grader could change that)."""
        outcome = await run.execute()
        if outcome is None:
            return None
        if not outcome.completion:
            return classify(outcome, None, self.sup.preset.grader.verdicts)
        self.sup.emit("cell_ran", cell=run.cell.id, attempt=run.attempt,
                      outcome=asdict(outcome))
        return None

    async def close(self) -> None:
        return None


__all__ = ["Executor", "LocalExecutor"]
