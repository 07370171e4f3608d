"""Inspect tasks for tests/test_inspect.py: a solver that raises inside Inspect, and one
that hangs for good (no request, no progress: the freeze watchdog's case)."""

from __future__ import annotations

import asyncio

from inspect_ai import Task, task
from inspect_ai.dataset import Sample
from inspect_ai.scorer import includes
from inspect_ai.solver import Generate, Solver, TaskState, generate, solver


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
