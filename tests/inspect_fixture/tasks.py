"""Inspect tasks for tests/test_inspect.py: a solver that raises inside Inspect, one
that hangs for good (no request, no progress: the freeze watchdog's case), and one whose
command in Inspect's local sandbox runs longer than the freeze watchdog's limit (work
that is not a model request, and is not a freeze), and one whose later samples wait at a
gate the test opens (a kill mid-eval at a known sample, for the resume), and scorers
that take their time: one awaiting an external judge, one computing in process."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

from inspect_ai import Task, task
from inspect_ai.dataset import Sample, example_dataset
from inspect_ai.scorer import (
    CORRECT,
    INCORRECT,
    Score,
    Scorer,
    Target,
    includes,
    mean,
    model_graded_qa,
    scorer,
)
from inspect_ai.solver import Generate, Solver, TaskState, generate, solver
from inspect_ai.util import sandbox


@solver
def explode() -> Solver:
    async def solve(state: TaskState, generate: Generate) -> TaskState:
        raise RuntimeError("solver exploded: boom-42")

    return solve


@solver
def hang() -> Solver:
    async def solve(state: TaskState, generate: Generate) -> TaskState:
        await asyncio.sleep(3600)
        return state

    return solve


@task
def raises() -> Task:
    return Task(dataset=[Sample(id="r1", input="hi", target="x")], solver=[explode()],
                scorer=includes())


@task
def hangs() -> Task:
    return Task(dataset=[Sample(id="h1", input="hi", target="x")],
                solver=[hang(), generate()], scorer=includes())


@solver
def long_command(secs: int = 14) -> Solver:
    async def solve(state: TaskState, generate: Generate) -> TaskState:
        done = await sandbox().exec(["sleep", str(secs)], timeout=secs + 60)
        assert done.success, done.stderr
        return state

    return solve


@task
def sandboxed() -> Task:
    return Task(dataset=[Sample(id="s1", input="Say yes.", target="yes")],
                solver=[long_command(), generate()], scorer=includes(), sandbox="local")


@solver
def at_gate(gate: str, from_sample: int) -> Solver:
    """Samples numbered ``from_sample`` and on wait until ``<gate>/open`` exists (each
    says so in ``<gate>/waiting-<n>``); every sample leaves ``<gate>/asked-<n>`` once
    the model has answered it."""
    async def solve(state: TaskState, generate: Generate) -> TaskState:
        n, where = int(state.sample_id), Path(gate)
        if n >= from_sample:
            (where / f"waiting-{n}").touch()
            while not (where / "open").exists():
                await asyncio.sleep(0.05)
        state = await generate(state)
        (where / f"asked-{n}").touch()
        return state

    return solve


@task
def gated(gate: str = "", from_sample: int = 4) -> Task:
    """Six samples without ids (Inspect numbers them 1..6), one model call each."""
    return Task(dataset=[Sample(input=f"Say the number {k}.", target=str(k))
                         for k in range(1, 7)],
                solver=[at_gate(gate, from_sample)], scorer=includes())


@task
def guide(n: int = 2) -> Task:
    """The first ``n`` questions of the security guide dataset Inspect ships (no ids),
    graded by a model (Inspect's model_graded_qa: its ``grader`` role when one is set)."""
    return Task(dataset=example_dataset("security_guide")[:n], solver=[generate()],
                scorer=model_graded_qa())


@scorer(metrics=[mean()])
def awaits_a_judge(secs: float = 14) -> Scorer:
    """A scorer that waits ``secs`` for an answer from elsewhere (an external judge):
    nothing of it shows in a request through the cell's gateway, nor in Inspect's
    events, until it returns."""
    async def score(state: TaskState, target: Target) -> Score:
        await asyncio.sleep(secs)
        return Score(value=CORRECT)

    return score


@scorer(metrics=[mean()])
def computes(secs: float = 14) -> Scorer:
    """A scorer that computes for ``secs`` in Inspect's own process, awaiting nothing."""
    async def score(state: TaskState, target: Target) -> Score:
        end = time.monotonic() + secs
        n = 0
        while time.monotonic() < end:
            n += 1
        return Score(value=CORRECT if n else INCORRECT)

    return score


@task
def slow_judge(secs: float = 14) -> Task:
    return Task(dataset=[Sample(id="j1", input="Say yes.", target="yes")],
                solver=[generate()], scorer=awaits_a_judge(secs))


@task
def slow_scoring(secs: float = 14) -> Task:
    return Task(dataset=[Sample(id="c1", input="Say yes.", target="yes")],
                solver=[generate()], scorer=computes(secs))
