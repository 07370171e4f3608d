"""The run's Docker side: which harness sandboxes are its (their exact names, its roots,
when it began), and, at start-up, the engine connected and what a dead predecessor left
there swept: containers ours by label, this plan's sandboxes by exact name, the Compose
projects its harnesses listed. Loaded only when a preset needs Docker."""

from __future__ import annotations

import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

from autopilot.config import Preset
from autopilot.errors import SandboxTaken
from autopilot.logsetup import get_logger
from autopilot.plan import Plan, cell_context
from autopilot.run.preflight import needs_docker
from autopilot.state.journal import began
from autopilot.templates import render

if TYPE_CHECKING:
    from autopilot.cell.sandbox import DockerSandboxes, Owner

log = get_logger(__name__)


def sandbox_names(preset: Preset, plan: Plan, state_dir: Path,
                  keep: frozenset[str] = frozenset()) -> tuple[str, ...]:
    """Every cell's sandbox container name (``harness.sandbox_container``), but ``keep``'s."""
    template = preset.harness.sandbox_container
    return tuple(render(template, cell_context(preset, cell, 1, state_dir))
                 for cell in plan.cells if cell.id not in keep) if template else ()


def sandbox_owner(preset: Preset, state_dir: Path) -> Owner:
    """Which harness sandboxes are this run's: its roots, and when it began (now, for a
    run with no event yet: nothing before is ours)."""
    from autopilot.cell.sandbox import Owner
    from autopilot.state.fsguard import run_roots

    return Owner(run_roots(preset, state_dir), began(state_dir / "journal.jsonl") or time.time())


async def docker_setup(preset: Preset, plan: Plan, state_dir: Path,
                       cleaned: list[dict[str, Any]],
                       keep: frozenset[str] = frozenset()) -> DockerSandboxes | None:
    """Connect to Docker when the preset needs it and sweep what a dead predecessor
    left: containers ours by label, harness sandboxes of this plan by their exact names,
    Compose projects its harnesses listed (appended to ``cleaned``). Returns the run's
    Docker side of its cells."""
    if not needs_docker(preset):
        return None
    # aiodocker (and aiohttp) load only when a preset needs Docker: -0.1 s of start-up
    from autopilot.cell.sandbox import Docker, DockerSandboxes, sweep_listed_projects

    docker = Docker()
    owner = sandbox_owner(preset, state_dir)
    boxes = DockerSandboxes(docker, preset, state_dir, owner)
    if preset.harness.sandbox_container:
        # Never the sandbox of an attempt re-attached to (``keep``): it is running.
        names = sandbox_names(preset, plan, state_dir, keep)
        for name in await docker.remove_exact(names, owner):
            cleaned.append({"container": name})
        for name in names:  # one daemon, two runs with these cell ids: refused, as outputs
            why = await docker.taken(name, owner)
            if why:
                await docker.close()
                raise SandboxTaken(
                    f"sandbox container {name} is another run's and live ({why}): this "
                    "run's harness would remove it at its cell's start. Let that run "
                    "finish, or give one run other cell ids")
    if preset.harness.compose_projects:
        # what a killed predecessor's harnesses listed
        cleaned += [{"compose": project} for project in
                    await sweep_listed_projects(docker, preset, plan, state_dir, keep)]
    for name in await docker.remove_labelled(str(state_dir)):
        cleaned.append({"container": name})
    if cleaned:
        log.info("orphans_swept", cleaned=cleaned)
    return boxes
