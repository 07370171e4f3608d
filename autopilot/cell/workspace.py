"""Where an attempt starts: a clean workspace, the last attempt's outputs moved aside
(never deleted: the evidence of an INVALID attempt survives its retry), the cell's own
uid where the preset runs each cell as one, and no stale sandbox under its name."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

import anyio

from autopilot.cell.context import CellContext, move_aside
from autopilot.cell.scratch import clean_scratch
from autopilot.cell.users import own_dirs
from autopilot.logsetup import get_logger
from autopilot.state.cellevents import ForeignOutputsMoved, UnsafePathRefused
from autopilot.state.fsguard import UnsafePath

log = get_logger(__name__)

Refusal = tuple[str, int]  # why the attempt cannot start, and the exit code it is given


async def prepare_workspace(context: CellContext, ctx: Mapping[str, str], cell: str, attempt: int,
                            output_dir: Path, sandbox: str | None
                            ) -> tuple[Refusal | None, int | None]:
    """Ready the attempt's workspace: a refusal when it cannot start on it, and the uid
    it runs as (None: the supervisor's own)."""
    # A killed predecessor's workspace copies would make the harness fail (the origin
    # removes a stale input copy with `sudo rm -rf`): every attempt starts clean.
    dirty = await clean_scratch(context, context.preset, ctx, cell, attempt)
    if dirty is not None:
        # Never started on a dirty workspace: the harness's own `rm -rf` of it would
        # crash the attempt anyway, and a stale tree could pass for this attempt's work.
        return (f"scratch dir not removed: {dirty}", 126), None
    try:
        moved = move_aside(output_dir, context.state_dir, cell, attempt - 1, context.roots)
    except UnsafePath as e:
        # Nothing is moved or deleted; the attempt cannot start on stale outputs.
        context.emit(UnsafePathRefused(cell=cell, attempt=attempt, action="move aside",
                                       why=str(e)))
        return (f"output dir refused: {e}", 126), None
    if moved and attempt == 1:  # no attempt of ours wrote it: said, and kept
        context.emit(ForeignOutputsMoved(cell=cell, path=str(output_dir), to=str(moved),
                                         why="there before this run's first attempt of the cell"))
    elif moved:
        log.info("attempt_moved_aside", to=str(moved))
    output_dir.mkdir(parents=True, exist_ok=True)
    uid = None
    if context.users is not None:
        try:
            # Off the loop: a uid handed on is first scrubbed of what it left in the
            # shared sticky dirs (a scan of /tmp, whatever its size).
            uid = await anyio.to_thread.run_sync(context.users.take, cell)
        except LookupError as e:
            return (str(e), 126), None
        await anyio.to_thread.run_sync(own_dirs, output_dir, context.state_dir, uid)
    # A sandbox already under this attempt's name is stale (a killed predecessor's
    # harness whose `docker run` landed after the start-up sweep): left there, it
    # would make this attempt fail on a name conflict and cost it a retry.
    if sandbox and context.sandboxes and await context.sandboxes.remove(sandbox, launching=True):
        log.info("stale_sandbox_removed", container=sandbox)
    return None, uid
