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

from autopilot.backends.base import backend_class
from autopilot.config import Argv, Preset
from autopilot.errors import EndpointError, PreflightError
from autopilot.plan import Cell, Plan, cell_context
from autopilot.state.fsutil import iso
from autopilot.templates import grader_argv, placeholders, render, render_argv


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
        path = Path(prog) if Path(prog).is_absolute() else base / prog
        if not (path.is_file() and os.access(path, os.X_OK)):
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
    missing = [name for name in names if not os.environ.get(name)]
    if missing and dotenv.is_file():
        values = dotenv_values(dotenv)
        for name in list(missing):
            if values.get(name):
                os.environ[name] = str(values[name])
                missing.remove(name)
    return missing


def sha256_file(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()


def needs_docker(preset: Preset) -> bool:
    return (preset.preflight.docker or preset.endpoint.container() is not None
            or bool(preset.harness.sandbox_container or preset.harness.scratch_remove_image))


async def docker_reachable() -> str | None:
    """None when the engine answers a ping, else why not."""
    try:
        import aiodocker
    except ImportError:
        return "aiodocker is not installed"
    try:
        async with aiodocker.Docker() as docker:
            await docker.version()
    except Exception as e:
        return f"{type(e).__name__}: {e}"
    return None


async def command_problems(preset: Preset, state_dir: Path) -> list[str]:
    """Run ``preflight.commands`` (argv lists, the first cell's values, every task in
    $AUTOPILOT_PLAN_TASKS); each that does not exit 0 in time is one problem, with the
    last line it printed. Its output is untrusted: cut and escaped."""
    import asyncio
    import json
    import subprocess

    from autopilot.escape import term

    out: list[str] = []
    if not preset.preflight.commands:
        return out
    ctx = _static_ctx(preset, preset.tasks[0].id, preset.arms[0].label, state_dir)
    env = {**os.environ, "AUTOPILOT_PLAN_TASKS": json.dumps(
        [{"id": task.id, "vars": {**preset.vars, **task.vars}} for task in preset.tasks])}
    for tmpl in preset.preflight.commands:
        argv = render_argv(tmpl, ctx)
        try:
            proc = await asyncio.create_subprocess_exec(
                *argv, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT, env=env)
        except OSError as e:
            out.append(f"preflight command {argv[0]} cannot start: {e.strerror}")
            continue
        try:
            text, _ = await asyncio.wait_for(proc.communicate(),
                                             preset.preflight.command_timeout_secs)
        except TimeoutError:
            proc.kill()  # our child, by its pid
            await proc.wait()
            out.append(f"preflight command {' '.join(argv[:4])} did not finish in "
                       f"{preset.preflight.command_timeout_secs:g} s")
            continue
        if proc.returncode != 0:
            lines = [line for line in text.decode("utf-8", "replace").splitlines() if line.strip()]
            last = term(lines[-1], 400) if lines else "(no output)"
            out.append(f"preflight command {' '.join(argv[:4])} exited {proc.returncode}: "
                       f"{last}")
    return out


async def image_identity(name: str) -> dict[str, Any]:
    """The image a tag names now (its id and registry digests): a tag moves, the id is
    what served the model. Unknown (not pulled yet, daemon error) is said, never guessed."""
    import aiodocker

    try:
        async with aiodocker.Docker() as docker:
            got = await docker.images.inspect(name)
    except Exception as e:
        return {"id": None, "why": f"{type(e).__name__}: {str(e)[:200]}"}
    digests = got.get("RepoDigests") if isinstance(got, dict) else None
    return {"id": str(got.get("Id", ""))[:80] or None,
            "repo_digests": [str(digest)[:200] for digest in digests[:4]]
            if isinstance(digests, list) else []}


def _looks_like_path(value: str) -> bool:
    return ("/" in value and not value.startswith(("-", "http://", "https://"))
            and not any(char.isspace() for char in value) and "{" not in value)


def _runtime(value: str, ctx: dict[str, str]) -> bool:
    """Paths the run itself creates (outputs, scratch, the state dir): not checked."""
    roots = [ctx["state_dir"], ctx["output_dir"], ctx["scratch_dir"],
             str(Path(ctx["grade_file"]).parent)]
    return any(value == root or value.startswith(root.rstrip("/") + "/") for root in roots)


def referenced_paths(argv: Argv, ctx: dict[str, str], cwd: str | None) -> list[Path]:
    """Files and dirs an argv template references through its placeholders (and the
    scripts handed to an interpreter): what must exist before a cell can run."""
    base = Path(cwd) if cwd else Path.cwd()
    rendered: list[str] = []
    for item in argv:
        parts = [item] if isinstance(item, str) else item
        if not isinstance(item, str) and not all(
                ctx.get(name) for part in item for name in placeholders(part)):
            continue  # an optional group that drops out for this cell
        rendered += [render(part, ctx) for part in parts if placeholders(part)]
    out = []
    for value in rendered:
        if not _looks_like_path(value) or _runtime(value, ctx):
            continue
        if Path(value).is_absolute():
            out.append(Path(value))
        elif (base / Path(value).parts[0]).exists():
            # Relative: judged only where its first part is there (tooling/inputs/x);
            # "org/model" is a model id, not a path of this checkout.
            out.append(base / value)
    return out


def checkout_problems(preset: Preset, state_dir: Path) -> tuple[list[str], list[str]]:
    """(problems, warnings): every file the cells reference, per task, all at once, each
    missing one with the ``${VAR}`` that set its path; grader requirements per task."""
    from autopilot.cell.grading import missing_requirements

    per_task: dict[str, list[str]] = {}
    notes: dict[str, str] = {}
    warnings: list[str] = []
    for task in preset.tasks:
        misses: list[str] = []
        for arm in preset.arms:
            ctx = _static_ctx(preset, task.id, arm.label, state_dir)
            hcwd = render(preset.harness.cwd, ctx) if preset.harness.cwd else None
            gcwd = render(preset.grader.cwd, ctx) if preset.grader.cwd else None
            for cwd in (hcwd, gcwd):
                if cwd and not Path(cwd).is_dir():
                    misses.append(f"cwd {cwd}")
            missing = missing_requirements(preset, task.id, ctx)
            paths = referenced_paths(preset.harness.argv, ctx, hcwd)
            if not (missing and preset.grader.on_unavailable == "record"):
                # (a grader recorded as unavailable will not run: its files do not matter)
                paths += referenced_paths(grader_argv(preset, task.id), ctx, gcwd)
            misses += [f"{path}" for path in paths if not path.exists()]
            if missing:
                msg = f"{task.id}: grader needs {', '.join(missing)}"
                if preset.grader.on_unavailable == "refuse":
                    misses += missing
                    ref = preset.env_of("grader.on_unavailable")
                    how = (f"{ref.name}=record (grader.on_unavailable)" if ref else
                           'grader.on_unavailable = "record"')
                    notes.update({missing_path: f"the grader needs it; {how} runs the task and "
                                  "records it INVALID(grader_unavailable)"
                                  for missing_path in missing})
                else:
                    warnings.append(msg + ": its cells will be INVALID(grader_unavailable)")
        misses = list(dict.fromkeys(misses))
        if misses:
            per_task[task.id] = misses
    problems = []
    for task_id, misses in per_task.items():
        described = []
        for missing_path in misses:
            why = "; ".join(part for part in (notes.get(missing_path, ""),
                                              preset.env_source(missing_path)) if part)
            described.append(f"{missing_path} not found" + (f" ({why})" if why else ""))
        problems.append(f"{task_id}: " + "; ".join(described))
    return problems, list(dict.fromkeys(warnings))


def endpoint_problems(preset: Preset) -> list[str]:
    """The endpoint's program and model must resolve before anything launches (on the
    machine that starts it: the engine's own hook says what that means)."""
    from autopilot.endpoints import ENGINES

    return ENGINES[preset.endpoint.engine].preflight_problems(preset)


def slot_problems(preset: Preset) -> list[str]:
    """Whether the endpoint can serve what the harness asks (harness.max_context, the
    run's concurrency), whatever the backend: the engine's own hook."""
    from autopilot.endpoints import ENGINES

    return ENGINES[preset.endpoint.engine].capacity_problems(preset)


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
            problems += _program_problems(render_argv(grader_argv(preset, task.id), ctx), gcwd,
                                          "grader")
            for f in preset.preflight.files:
                if not Path(render(f, ctx)).exists():
                    problems.append(f"required file {render(f, ctx)} not found")
    problems += await command_problems(preset, state_dir)
    found, warned = checkout_problems(preset, state_dir)
    report.warnings += warned
    backend = backend_class(preset.backend.kind)
    if backend.endpoint_here:
        problems += endpoint_problems(preset)
    problems += backend.preflight(preset)
    problems += slot_problems(preset)
    names = list(preset.preflight.env)
    if preset.endpoint.key_env():
        names.append(preset.endpoint.key_env())
    names += [arm_spec.route.api_key_env for arm_spec in preset.arms
              if arm_spec.route and arm_spec.route.api_key_env]
    missing = resolve_env(names, Path.cwd() / ".env")
    if missing:
        problems.append(f"env var(s) not set (nor in ./.env): {', '.join(missing)}")
    problems = list(dict.fromkeys(problems))
    if found:
        # Every miss of the checkout, per task, at once: one look fixes them all.
        raise PreflightError(f"preflight: {len(found)} task(s) reference missing files:\n  "
                             + "\n  ".join(found + problems))
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
    from autopilot.run.drift import endpoint_identity

    report.identity = {"ts": iso(), "preset": preset.name, "plan": plan.identity,
                       "pins": pins, "model": preset.model,
                       "endpoint": endpoint_identity(preset)}

    if needs_docker(preset) and backend.endpoint_here:  # (else each node's own daemon)
        why = await docker_reachable()
        if why:
            raise PreflightError(f"preflight: Docker unreachable ({why})")
        image = report.identity["endpoint"].get("image")
        if image:
            report.identity["endpoint"]["image_id"] = await image_identity(image)
    from autopilot.endpoints import ENGINES

    if not offline and ENGINES[preset.endpoint.engine].checked_live:
        engine = ENGINES[preset.endpoint.engine](preset, state_dir)
        try:
            ok, why = await engine.probe(check_model=True)
        except EndpointError as e:
            raise PreflightError(f"preflight: {e}") from None
        finally:
            await engine.aclose()
        if not ok:
            raise PreflightError(f"preflight: provider {engine.api_base} not answering ({why})")
    if not offline and any(arm_spec.route for arm_spec in preset.arms):
        from autopilot.run.routes import route_problems

        bad = await route_problems(preset)
        if bad:
            raise PreflightError("preflight: " + "; ".join(bad))
    return report


def _existing(path: Path) -> Path:
    while not path.exists() and path.parent != path:
        path = path.parent
    return path
