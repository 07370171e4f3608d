"""The Inspect task tools/bench.py's `inspect` figure runs both ways (plain `inspect
eval`, and the autopilot's whole-task cell): 24 short questions, Inspect's `includes`
scorer. Its own, never a copy of Inspect's examples."""

from __future__ import annotations

from inspect_ai import Task, task
from inspect_ai.dataset import Sample
from inspect_ai.scorer import includes
from inspect_ai.solver import generate


@task
def bench24() -> Task:
    return Task(dataset=[Sample(input=f"What is {i} plus {i}? Reply with only the number.",
                                target=str(2 * i)) for i in range(1, 25)],
                solver=[generate()], scorer=includes())
