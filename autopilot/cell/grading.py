"""Run a cell's grader and read its grade file.

The grader is someone else's program: it gets an argv (never a shell string), a timeout,
and its output spooled to the cell's grade log. An optional ``extract`` step unpacks an
artifact (the origin's ``workspace_final.tar.gz``) into a scratch dir that is removed
afterwards, whatever happens. What the grade *means* is decided by ``validity``.
"""

from __future__ import annotations

import contextlib
import os
import subprocess
import tarfile
import time
from collections.abc import AsyncIterator, Callable, Mapping
from dataclasses import replace
from pathlib import Path
from typing import Any

import anyio

from autopilot.cell.cgroups import Containment, group_name
from autopilot.cell.childenv import child_env
from autopilot.cell.procs import (
    LEASE_ENV,
    OWNED,
    RUN_TOKEN_ENV,
    Tracker,
    child_exited,
    grade_marker,
    identify,
    kill_tree,
    spawn,
)
from autopilot.cell.users import as_user
from autopilot.cell.validity import (
    Checks,
    Classification,
    GradeOutcome,
    RunOutcome,
    classify,
    grader_unavailable,
    lookup,
)
from autopilot.config import Preset
from autopilot.escape import clean
from autopilot.state.budget import count_or_none
from autopilot.state.cellevents import CellGradeMetered
from autopilot.state.fsguard import UnsafePath, remove_tree, run_roots
from autopilot.state.statedir import open_append
from autopilot.state.untrusted import load_json, open_fd
from autopilot.templates import grader_argv, render, render_argv


def _extract(archive: Path, into: Path, roots: tuple[Path, ...], state_dir: Path) -> None:
    remove_tree(into, roots, state_dir)  # through the guard: UnsafePath outside the run
    into.mkdir(parents=True)
    # The archive is the harness's: a regular file, never through a symlink, or none.
    with os.fdopen(open_fd(archive), "rb") as raw, tarfile.open(fileobj=raw) as archive_tar:
        # 'data' refuses absolute paths, '..', devices and links out of the tree.
        archive_tar.extractall(into, filter="data")


async def run_grader(
    argv: list[str],
    *,
    cwd: str | None,
    env: Mapping[str, str],
    timeout: float,
    grade_file: Path,
    log_path: Path,
    roots: tuple[Path, ...],
    state_dir: Path,
    extract: tuple[Path, Path] | None = None,
    contain: tuple[Containment, str] | None = None,
    user: int | None = None,
) -> GradeOutcome:
    """Run one grader. ``extract`` (archive, into) unpacks into a scratch dir first and
    removes it after; ``roots`` / ``state_dir`` bound where that may happen (fsguard);
    ``contain`` (the run's cgroups, a group name): the grader runs in that group, and
    what it leaves there is killed when it ends."""
    scratch = extract[1] if extract else None
    guard_dir = state_dir
    try:
        if extract is not None:
            archive, into = extract
            try:
                await anyio.to_thread.run_sync(_extract, archive, into, roots, guard_dir)
            except UnsafePath as e:
                scratch = None  # refused: nothing there is ours to remove
                return GradeOutcome(False, f"extract refused: {e}")
            except (OSError, tarfile.TarError) as e:
                return GradeOutcome(False, f"extract {archive.name} failed: {e}")
        try:  # a stale grade must never be read as fresh
            remove_tree(grade_file, roots, guard_dir)
        except UnsafePath as e:
            return GradeOutcome(False, f"grade file refused: {e}")
        group = contain[0].group(contain[1]) if contain is not None else None
        if user is not None:  # the cell's own uid (autopilot.cell.users), after its group
            argv = as_user(argv, user)
        with open_append(log_path) as log:
            try:
                proc = await spawn(
                    contain[0].wrap(argv, group) if contain and group else argv, cwd=cwd,
                    env=dict(env), stdout=log, stderr=subprocess.STDOUT,
                    start_new_session=True,
                )
            except OSError as e:
                return GradeOutcome(False, f"grader could not start: {e.strerror}")
            try:
                with anyio.move_on_after(timeout) as scope:
                    code = await proc.wait()
                if scope.cancelled_caught and child_exited(proc.pid):
                    # Timed out by the event loop's clock, but in fact finished: the
                    # supervisor itself was frozen (SIGSTOP) past the timeout.
                    with anyio.CancelScope(shield=True):
                        code = await proc.wait()
                elif scope.cancelled_caught:
                    ident = identify(proc.pid)
                    if ident is not None:
                        await anyio.to_thread.run_sync(kill_tree, Tracker(ident), 1.0)
                    with anyio.CancelScope(shield=True):
                        await proc.wait()
                    return GradeOutcome(False, f"grader timed out after {timeout:.0f}s")
            finally:
                OWNED.discard(proc.pid)
                if contain is not None and group is not None:
                    with anyio.CancelScope(shield=True):
                        await anyio.to_thread.run_sync(contain[0].kill, group)
        # The grader's file, read as anything from outside (a FIFO, a symlink, a 50 MB
        # verdict word: refused, and said why).
        grade, refused = load_json(grade_file)
        if code != 0:
            return GradeOutcome(False, f"grader exit code {code}", grade)
        return GradeOutcome(True, f"grade file refused: {refused}" if refused else "", grade)
    finally:
        if scratch is not None:
            with contextlib.suppress(UnsafePath):
                remove_tree(scratch, roots, guard_dir)


def read_checks(preset: Preset, ctx: Mapping[str, str]) -> Checks:
    """Token accounting, the harness's finish reason and executed-vs-requested
    configuration, from the harness's own files."""
    trust = preset.trust
    tokens: float | None = None
    malformed: list[str] = []
    refused: list[str] = []

    def harness_json(template: str) -> Any:
        value, why = load_json(Path(render(template, ctx)))
        if why:  # a FIFO, a device, a symlink, a huge file: a named malformed outcome
            refused.append(why)
        return value

    if trust.tokens:
        value = lookup(harness_json(trust.tokens.file), trust.tokens.field)
        tokens = count_or_none(value)
        if value is not None and tokens is None:
            malformed.append(f"{trust.tokens.field} is {clean(value, 60)}, not a finite count")
    finish_error = rate_limited = None
    if trust.finish:
        why = lookup(harness_json(trust.finish.file), trust.finish.field)
        if why is not None and not isinstance(why, str):
            malformed.append(f"{trust.finish.field} is a {type(why).__name__}, not a string")
        elif isinstance(why, str) and why.startswith(tuple(trust.finish.rate_limited_prefixes)):
            rate_limited = why
        elif isinstance(why, str) and why.startswith(tuple(trust.finish.invalid_prefixes)):
            finish_error = why
    mismatches = []
    for chk in trust.arm_checks:
        got = lookup(harness_json(chk.file), chk.field)
        want = render(chk.expect, ctx)
        if got is None or str(got) != want:
            mismatches.append(f"{chk.field}: requested {want!r}, executed {got!r}")
    malformed += [f"refused {clean(why, 200)}" for why in dict.fromkeys(refused)]
    return Checks(tokens=tokens, tokens_checked=trust.tokens is not None,
                  mismatches=tuple(mismatches), finish_error=finish_error,
                  rate_limited=rate_limited,
                  malformed="; ".join(malformed) or None)


def _grader_cwd(preset: Preset, ctx: Mapping[str, str]) -> str | None:
    return render(preset.grader.cwd, ctx) if preset.grader.cwd else None


def missing_requirements(preset: Preset, task_id: str, ctx: Mapping[str, str]) -> list[str]:
    """The task's ``grader_requires`` that are not there (relative to the grader's cwd)."""
    base = Path(_grader_cwd(preset, ctx) or Path.cwd())
    missing = []
    for tmpl in preset.task(task_id).grader_requires:
        path = Path(render(tmpl, ctx))
        if not (path if path.is_absolute() else base / path).exists():
            missing.append(str(path))
    return missing


OnGradeRetry = Callable[[int, Classification], None]


async def grade_outputs(
    preset: Preset, ctx: Mapping[str, str], outcome: RunOutcome, grade_log: Path,
    checks: Checks, base_env: Mapping[str, str] | None = None,
    on_retry: OnGradeRetry | None = None, contain: Containment | None = None,
    extra_env: Mapping[str, str] | None = None, user: int | None = None,
) -> Classification:
    """Run the task's grader on a finished attempt's outputs and classify. A failure of
    grading alone (crash, timeout, malformed grade, GRADER_FAILED) re-runs the grader on
    the same outputs up to ``grader.retries`` times: never the harness."""
    grader = preset.grader
    missing = missing_requirements(preset, ctx["task"], ctx)
    if missing:
        return grader_unavailable(missing, outcome.killed == "teardown")
    extract = None
    if grader.extract:
        extract = (Path(render(grader.extract.archive, ctx)),
                   Path(render(grader.extract.into, ctx)))
    # The grader's own inheritance (its pass_env, not the harness's), plus a marker a
    # sweep recognises: not the run token itself, nor any gateway key (a grader is not
    # the harness, and must not be able to spend through a cell's gateway).
    env = child_env(preset, "grader")
    if base_env is not None and RUN_TOKEN_ENV in base_env:
        env[RUN_TOKEN_ENV] = grade_marker(base_env[RUN_TOKEN_ENV])
    if base_env is not None and LEASE_ENV in base_env:
        # On a Ray node the grader is the lease's as its harness is: swept with it when
        # the node is lost, spared with it when a successor re-attaches.
        env[LEASE_ENV] = base_env[LEASE_ENV]
    env.update(extra_env or {})  # model-graded scoring: the grading listener's own key
    env["AUTOPILOT_CELL_ID"] = ctx["cell"]
    env["AUTOPILOT_CELL_ATTEMPT"] = ctx["attempt"]
    argv = render_argv(grader_argv(preset, ctx["task"]), ctx)
    state_dir = Path(ctx["state_dir"])
    roots = run_roots(preset, state_dir)
    tries = grader.retries + 1
    for grade_try in range(1, tries + 1):
        env["AUTOPILOT_GRADE_TRY"] = str(grade_try)
        launched = time.time()  # wall: comparable across nodes
        grade = await run_grader(
            argv, cwd=_grader_cwd(preset, ctx), env=env, timeout=grader.timeout_secs,
            grade_file=Path(ctx["grade_file"]), log_path=grade_log, extract=extract,
            roots=roots, state_dir=state_dir,
            contain=(contain, group_name("grade", ctx["cell"], int(ctx["attempt"]), user))
            if contain is not None else None, user=user,
        )
        judged = replace(classify(outcome, grade, grader.verdicts, checks, grader.verdict_field),
                         launched=launched)
        # "unscored" is the grader's reading of a score that is not there (Inspect's
        # NaN): a second reading of the same outputs says the same
        if not judged.grade_side or judged.reason == "unscored" or grade_try == tries:
            return judged
        if on_retry is not None:
            on_retry(grade_try, judged)
    raise AssertionError("unreachable")


async def judge_cell(
    preset: Preset, ctx: Mapping[str, str], outcome: RunOutcome, grade_log: Path,
    base_env: Mapping[str, str] | None = None, on_retry: OnGradeRetry | None = None,
    contain: Containment | None = None, extra_env: Mapping[str, str] | None = None,
    user: int | None = None,
) -> Classification:
    """Gather evidence for a finished attempt, run the grader when it can count, classify."""
    checks = read_checks(preset, ctx) if outcome.completion else Checks()
    untrusted = checks.mismatches or checks.finish_error or (
        checks.tokens_checked and not (checks.tokens and checks.tokens > 0))
    if outcome.completion and not untrusted:
        return await grade_outputs(preset, ctx, outcome, grade_log, checks, base_env, on_retry,
                                   contain, extra_env, user)
    return classify(outcome, None, preset.grader.verdicts, checks, preset.grader.verdict_field)


@contextlib.asynccontextmanager
async def model_access(context: Any, cell: str, attempt: int, ctx: dict[str, str],
                       upstreams: Callable[[], list[tuple[str, str]]]
                       ) -> AsyncIterator[tuple[dict[str, str], dict[str, str]]]:
    """The grader's context and extra environment. With ``[grader] model_access``
    (model-graded scoring) and a gateway (``cx``: the cell's context): a listener of the
    grading's own for as long as it runs ({base_url}, a key of its own), journaled as
    cell_grade_metered; else the endpoint's own address and no key."""
    from urllib.parse import urlsplit

    gateway = context.gateway
    if not (context.preset.grader.model_access and gateway is not None
            and ctx.get("endpoint_base_url")):
        yield ctx, {}
        return
    log_path = context.state_dir / "gateway" / cell / f"grade-{attempt}.jsonl"
    async with gateway.grading(cell, attempt, upstreams, log_path, model=ctx["model"]) as listener:
        path = urlsplit(context.keeper.ep.api_base).path
        own = {**ctx, "port": str(listener.port), "host": "127.0.0.1",
               "base_url": f"http://127.0.0.1:{listener.port}{path}"}
        try:
            yield own, dict.fromkeys(context.key_env, listener.key)
        finally:
            if listener.meter.requests or listener.meter.unauthorized:
                context.emit(CellGradeMetered(cell=cell, attempt=attempt,
                        **listener.meter.summary()))
