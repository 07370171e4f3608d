"""``autopilot cleanup``: reclaim the box once a run is done — exact names only.

Kills the run's leftover harness and grader processes (they carry the run's marker;
with the lock free none can belong to a live supervisor), removes the plan's sandbox
containers (the preset's name template rendered for every cell of the plan), with
``--endpoint`` the endpoint container or process this state dir started (label or
marker says so), and the scratch dirs (exact rendered paths, never a glob). With the Ray
backend it does the same on every node first (the backend's ``cleanup``: the run's named
actors stopped, its placement group freed, its marked processes killed on every live
node). It refuses while a supervisor holds the run. First, it releases the run's output
dirs (autopilot.state.claims): ``autopilot release`` does that alone.
"""

from __future__ import annotations

from functools import partial
from pathlib import Path

import anyio

from autopilot.backends.base import backend_class
from autopilot.cell import cgroups
from autopilot.cell.procs import existing_run_token
from autopilot.cell.sweep import orphan_marked
from autopilot.config import Preset
from autopilot.plan import Plan, cell_context
from autopilot.run.preflight import needs_docker
from autopilot.run.sandboxes import sandbox_names, sandbox_owner
from autopilot.state.claims import mark_released, outside_roots, release_owned
from autopilot.state.fsguard import remove_or_clear, run_roots
from autopilot.state.journal import began
from autopilot.templates import render


def scratch_paths(preset: Preset, plan: Plan, state_dir: Path) -> list[Path]:
    paths: list[Path] = []
    for cell in plan.cells:
        ctx = cell_context(preset, cell, 1, state_dir)
        paths.append(Path(ctx["scratch_dir"]))
        paths += [Path(render(template, ctx)) for template in preset.harness.scratch_dirs]
        if preset.grader.extract:
            paths.append(Path(render(preset.grader.extract.into, ctx)))
    return [path for path in dict.fromkeys(paths) if path.exists()]


async def cleanup(preset: Preset, plan: Plan, state_dir: Path, *, endpoint: bool,
                  release_only: bool = False) -> list[str]:
    # The run's output dirs are its own until now (autopilot.state.claims): from here
    # another run may write, move and grade there.
    let_go = release_owned(outside_roots(run_roots(preset, state_dir), state_dir), state_dir)
    removed = [f"ownership of output root {root} (released: a next run over it may move this "
               "run's cell output dirs it shares into its own attempts, or rewrite them; "
               "this run's verdicts stand in its journal and its views say released)"
               for root in let_go]
    if let_go:
        mark_released(state_dir, let_go)
    if release_only:
        return removed
    token = existing_run_token(state_dir)  # none: no supervisor ever marked a process
    if token is not None:
        # What the backend keeps elsewhere (with Ray: every node of the cluster) first.
        removed += await anyio.to_thread.run_sync(partial(
            backend_class(preset.backend.kind).cleanup, preset, token, 2.0, endpoint,
            state_dir, sandbox_names(preset, plan, state_dir),
            began(state_dir / "journal.jsonl")))
        for found in await anyio.to_thread.run_sync(
                partial(orphan_marked, token, 2.0, endpoint=endpoint)):
            what = f"cell {found.cell}" if found.cell else "endpoint"
            removed.append(f"processes {' '.join(map(str, found.pids))} ({what})")
        contain = cgroups.for_run(token)[0]
        swept = await anyio.to_thread.run_sync(
            partial(contain.sweep, endpoint=endpoint)) if contain else []
        for group in swept:
            if group.pids:
                removed.append(f"processes {' '.join(map(str, group.pids))} (cgroup "
                               f"{group.group})")
            for f in group.foreign:  # never signalled: not the run's
                removed.append(f"spared process {f.pid} in cgroup {group.group} ({f.why})")
        if contain is not None:  # and no empty group of the run left behind (nor made)
            await anyio.to_thread.run_sync(contain.close)
    if preset.harness.user != "same":  # every process of a past cell's own uid
        from autopilot.cell.sweep import orphan_uids

        for uid, pids in await anyio.to_thread.run_sync(
                orphan_uids, state_dir / "journal.jsonl", preset.harness.uids, set(), 2.0):
            removed.append(f"processes {' '.join(map(str, pids))} (cell uid {uid})")
    if needs_docker(preset) and backend_class(preset.backend.kind).endpoint_here:
        from autopilot.cell.sandbox import Docker

        docker = Docker()
        try:
            template = preset.harness.sandbox_container
            if template:
                names = [render(template, cell_context(preset, cell, 1, state_dir))
                         for cell in plan.cells]
                removed += [f"container {name}" for name in await docker.remove_exact(
                    names, sandbox_owner(preset, state_dir))]
                removed += [f"nothing: spared container {spared['container']} ({spared['why']})"
                            for spared in docker.spared]
            if preset.harness.compose_projects:
                from autopilot.cell.sandbox import sweep_listed_projects

                removed += await sweep_listed_projects(docker, preset, plan, state_dir)
            if endpoint:
                removed += [f"container {name}" for name in
                            await docker.remove_labelled(str(state_dir), role="endpoint")]
        finally:
            await docker.close()
    roots = run_roots(preset, state_dir)
    clear = None
    if preset.harness.scratch_remove_image:
        async def clear(path: str) -> str | None:  # as the run does: Docker, never sudo
            from autopilot.cell.sandbox import Docker, clear_dir

            docker = Docker()
            try:
                return await clear_dir(docker, path, preset.harness.scratch_remove_image,
                                       str(state_dir))
            finally:
                await docker.close()

    for path in scratch_paths(preset, plan, state_dir):
        why, _ = await remove_or_clear(path, roots, state_dir, clear)
        removed.append(f"nothing: {why}" if why else f"dir {path}")  # said, never done
    return removed
