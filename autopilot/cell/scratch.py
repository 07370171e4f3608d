"""An attempt's scratch dirs, removed before and after it (the preset's exact paths)."""

from __future__ import annotations

from collections.abc import Mapping

from autopilot.cell.context import CellContext
from autopilot.config import Preset
from autopilot.state.cellevents import ScratchNotRemoved, ScratchRemovedViaDocker, UnsafePathRefused
from autopilot.state.fsguard import remove_or_clear
from autopilot.templates import render


async def clean_scratch(context: CellContext, preset: Preset, ctx: Mapping[str, str], cell: str,
                        attempt: int) -> str | None:
    """Remove the harness's scratch dirs (through Docker where a root-owned sandbox's
    files stay: fsguard.remove_or_clear); what is left is journaled, and returned as
    the reason (None: all clean)."""
    left = None
    for tmpl in preset.harness.scratch_dirs:
        path = render(tmpl, ctx)  # exact path, never a glob
        boxes = context.sandboxes
        clear = boxes.clear_dir if boxes is not None and boxes.clears else None
        why, how = await remove_or_clear(path, context.roots, context.state_dir, clear)
        if how == "cleared":
            context.emit(ScratchRemovedViaDocker(cell=cell, attempt=attempt, path=path))
        if why is None:
            continue
        if how == "not_removed":
            context.emit(ScratchNotRemoved(cell=cell, attempt=attempt, path=path, why=why))
        else:
            context.emit(UnsafePathRefused(cell=cell, attempt=attempt,
                    action="remove scratch dir", why=why))
        left = left or why
    return left
