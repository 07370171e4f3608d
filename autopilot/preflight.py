"""Preflight: fail closed before anything is launched or spent.

Every check here runs before the lock is taken and before any process is spawned, so a
failure exits 2 with nothing written. Checks: the harness and grader programs (and the
scripts handed to an interpreter) exist; required env vars are set (names only — values
are never printed; lookup order: environment, then ``.env`` in the working directory);
for a hosted provider, a live authenticated models-list probe that the key is valid and
the exact model id exists, with the closest ids on a miss; Docker reachable when
anything needs it; sha256 pins of files (drift: a loud warning, or a refusal with
``pin = "strict"``); free disk in the state dir. ``offline`` skips the live probes.
"""

from __future__ import annotations

import hashlib
import os
import shutil
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from dotenv import dotenv_values

from autopilot.config import Preset
from autopilot.errors import EndpointError, PreflightError
from autopilot.fsutil import iso
from autopilot.plan import Cell, Plan, cell_context
from autopilot.templates import render, render_argv


@dataclass
class PreflightReport:
    warnings: list[str] = field(default_factory=list)
    identity: dict[str, Any] = field(default_factory=dict)


def _static_ctx(preset: Preset, task_id: str, arm_label: str, state_dir: Path) -> dict[str, str]:
    return cell_context(preset, Cell(task_id, arm_label, 1), 1, state_dir)


def _program_problems(argv: list[str], cwd: str | None, what: str) -> list[str]:
    base = Path(cwd) if cwd else Path.cwd()
    prog = argv[0]
    problems = []
    if "/" in prog:
        p = Path(prog) if Path(prog).is_absolute() else base / prog
        if not (p.is_file() and os.access(p, os.X_OK)):
            problems.append(f"{what} program {prog} not found or not executable")
    elif shutil.which(prog) is None:
        problems.append(f"{what} program {prog!r} not on PATH")
    if Path(prog).name.startswith("python") and len(argv) > 1 and not argv[1].startswith("-"):
        script = Path(argv[1]) if Path(argv[1]).is_absolute() else base / argv[1]
        if not script.is_file():
            where = "" if Path(argv[1]).is_absolute() else f" (cwd {base})"
            problems.append(f"{what} script {argv[1]} not found{where}")
    return problems


def resolve_env(names: list[str], dotenv: Path) -> list[str]:
    """Names still missing after looking in the environment, then ``dotenv``. Found
    ``.env`` values are exported so cells inherit them; they are never printed."""
    missing = [n for n in names if not os.environ.get(n)]
    if missing and dotenv.is_file():
        values = dotenv_values(dotenv)
        for n in list(missing):
            if values.get(n):
                os.environ[n] = str(values[n])
                missing.remove(n)
    return missing


def sha256_file(path: Path) -> str:
    h = hashlib.sha256()
    with path.open("rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def needs_docker(preset: Preset) -> bool:
    mode = getattr(preset.endpoint, "mode", "process")
    return preset.preflight.docker or mode == "docker" or bool(preset.harness.sandbox_container)


async def docker_reachable() -> str | None:
    """None when the engine answers a ping, else why not."""
    try:
        import aiodocker
    except ImportError:
        return "aiodocker is not installed"
    try:
        async with aiodocker.Docker() as d:
            await d.version()
    except Exception as e:
        return f"{type(e).__name__}: {e}"
    return None


async def run_preflight(
    preset: Preset, plan: Plan, state_dir: Path, *, offline: bool
) -> PreflightReport:
    report = PreflightReport()
    problems: list[str] = []
    for task in preset.tasks:
        for arm in preset.arms:
            ctx = _static_ctx(preset, task.id, arm.label, state_dir)
            hcwd = render(preset.harness.cwd, ctx) if preset.harness.cwd else None
            gcwd = render(preset.grader.cwd, ctx) if preset.grader.cwd else None
            problems += _program_problems(render_argv(preset.harness.argv, ctx), hcwd, "harness")
            problems += _program_problems(render_argv(preset.grader.argv, ctx), gcwd, "grader")
            for f in preset.preflight.files:
                if not Path(render(f, ctx)).exists():
                    problems.append(f"required file {render(f, ctx)} not found")
    names = list(preset.preflight.env)
    if preset.endpoint.engine == "provider" and preset.endpoint.api_key_env:
        names.append(preset.endpoint.api_key_env)
    missing = resolve_env(names, Path.cwd() / ".env")
    if missing:
        problems.append(f"env var(s) not set (nor in ./.env): {', '.join(missing)}")
    problems = list(dict.fromkeys(problems))
    if problems:
        raise PreflightError("preflight: " + "; ".join(problems[:5])
                             + (f" (and {len(problems) - 5} more)" if len(problems) > 5 else ""))

    probe = shutil.disk_usage(_existing(state_dir))
    if probe.free < preset.preflight.min_free_gb * 1e9:
        raise PreflightError(f"preflight: only {probe.free / 1e9:.1f} GB free under {state_dir}"
                             f" (min_free_gb = {preset.preflight.min_free_gb})")

    pins: dict[str, Any] = {}
    ctx = _static_ctx(preset, preset.tasks[0].id, preset.arms[0].label, state_dir)
    for tmpl, want in preset.preflight.pins.items():
        path = Path(render(tmpl, ctx))
        got = sha256_file(path) if path.is_file() else None
        pins[str(path)] = {"sha256": got, "pinned": want, "match": got == want}
        if got != want:
            msg = f"pin drift: {path} sha256 {got or 'missing'} != pinned {want}"
            if preset.preflight.pin == "strict":
                raise PreflightError(f"preflight: {msg} (pin = strict)")
            report.warnings.append(msg)
    report.identity = {"ts": iso(), "preset": preset.name, "plan": plan.identity,
                       "pins": pins, "model": preset.model}

    if needs_docker(preset):
        why = await docker_reachable()
        if why:
            raise PreflightError(f"preflight: Docker unreachable ({why})")
    if not offline and preset.endpoint.engine == "provider":
        from autopilot.endpoints.provider import ProviderEndpoint

        ep = ProviderEndpoint(preset, state_dir)
        try:
            ok, why = await ep.probe(check_model=True)
        except EndpointError as e:
            raise PreflightError(f"preflight: {e}") from None
        finally:
            await ep.aclose()
        if not ok:
            raise PreflightError(f"preflight: provider {ep.base_url} not answering ({why})")
    return report


def _existing(path: Path) -> Path:
    while not path.exists() and path.parent != path:
        path = path.parent
    return path
