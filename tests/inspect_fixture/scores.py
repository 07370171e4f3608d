"""Inspect tasks in the shapes Inspect's published examples and inspect_evals use, for
the score semantics (tests/test_inspect_scores.py): samples without ids (Inspect numbers
them 1..N), a scorer that leaves a sample unscored (NaN: Inspect's metrics skip it), a
two-part dict score, and a task's own epochs with a reducer. Written for these tests,
never copied from Inspect's examples. The scorers look at the sample, not the model's
words, and the solver asks the model nothing (``answer``): Inspect's own ``mockllm``
stands in for the model and is never called (a call would count tokens with tiktoken,
which fetches its encoding from the internet)."""

from __future__ import annotations

import asyncio
from pathlib import Path

from inspect_ai import Epochs, Task, task
from inspect_ai.dataset import Sample
from inspect_ai.model import ModelOutput
from inspect_ai.scorer import CORRECT, INCORRECT, Score, Scorer, Target, mean, scorer
from inspect_ai.solver import Generate, Solver, TaskState, generate, solver

NAN = float("nan")


@solver
def answer() -> Solver:
    """A fixed answer, the model not asked."""
    async def solve(state: TaskState, generate: Generate) -> TaskState:
        state.output = ModelOutput.from_content(model="none", content="42")
        return state

    return solve


@scorer(metrics=[mean()])
def first_unscored() -> Scorer:
    """Sample 1 unscored, every other one correct."""
    async def score(state: TaskState, target: Target) -> Score:
        return Score(value=NAN if state.sample_id == 1 else CORRECT)

    return score


@task
def unscored() -> Task:
    return Task(dataset=[Sample(input="Say hi."), Sample(input="Say bye.")],
                solver=[answer()], scorer=first_unscored())


@scorer(metrics={"utility": [mean()], "security": [mean()]})
def two_parts() -> Scorer:
    """Useless and safe, as an agent that refuses every task is."""
    async def score(state: TaskState, target: Target) -> Score:
        return Score(value={"utility": 0, "security": 1})

    return score


@task
def parts() -> Task:
    return Task(dataset=[Sample(input="Delete the logs.")], solver=[answer()],
                scorer=two_parts())


@scorer(metrics=[mean()])
def right_on_later_epochs() -> Scorer:
    """Wrong at epoch 1, right at every later one: pass@k's case."""
    async def score(state: TaskState, target: Target) -> Score:
        return Score(value=INCORRECT if state.epoch == 1 else CORRECT)

    return score


@task
def epochs_max() -> Task:
    return Task(dataset=[Sample(id="q", input="Guess a number.")], solver=[answer()],
                scorer=right_on_later_epochs(), epochs=Epochs(3, "max"))


@task
def unscored_gen() -> Task:
    """``unscored`` with the model asked (the real-model test: tokens flow through the
    gateway as in any cell)."""
    return Task(dataset=[Sample(input="Say hi."), Sample(input="Say bye.")],
                solver=[generate()], scorer=first_unscored())


@scorer(metrics=[mean()])
def all_but_the_last() -> Scorer:
    """Samples 1..3 right, 4 wrong: 3 of 4."""
    async def score(state: TaskState, target: Target) -> Score:
        return Score(value=INCORRECT if state.sample_id == 4 else CORRECT)

    return score


@task
def mixed() -> Task:
    return Task(dataset=[Sample(input=f"Question {i}.") for i in range(1, 5)],
                solver=[answer()], scorer=all_but_the_last())


@task
def mixed_gen() -> Task:
    """``mixed`` with the model asked (the real-model test)."""
    return Task(dataset=[Sample(input=f"Say {i}.") for i in range(1, 5)],
                solver=[generate()], scorer=all_but_the_last())


@task
def levels(count: int = 2) -> Task:
    """A task argument (``-T count=5``) that shapes the dataset."""
    return Task(dataset=[Sample(input=f"Level {i}.") for i in range(1, count + 1)],
                solver=[answer()], scorer=all_but_the_last())


@solver
def answer_unless_broken(gate: str) -> Solver:
    """The fixed answer; sample 3 raises until ``<gate>/fixed`` exists (a sample that
    errors in Inspect). Every sample run appends its number to ``<gate>/ran.txt``."""
    async def solve(state: TaskState, generate: Generate) -> TaskState:
        where = Path(gate)
        with (where / "ran.txt").open("a") as f:
            f.write(f"{state.sample_id}\n")
        if state.sample_id == 3 and not (where / "fixed").exists():
            raise RuntimeError("sample 3 broke")
        state.output = ModelOutput.from_content(model="none", content="42")
        return state

    return solve


@scorer(metrics=[mean()])
def always_right() -> Scorer:
    async def score(state: TaskState, target: Target) -> Score:
        return Score(value=CORRECT)

    return score


@task
def flaky(gate: str = "") -> Task:
    """Four samples without ids; the third errors until fixed."""
    return Task(dataset=[Sample(input=f"Item {k}.") for k in range(1, 5)],
                solver=[answer_unless_broken(gate)], scorer=always_right())


@scorer(metrics=[mean()])
def beyond_numbers() -> Scorer:
    """Values at Inspect's edges: sample 1 infinitely good, 2 infinitely bad, 3 a word
    Inspect cannot read as a number (it warns and its metrics count 0)."""
    async def score(state: TaskState, target: Target) -> Score:
        return Score(value={1: float("inf"), 2: float("-inf")}.get(
            int(state.sample_id), "somewhat"))

    return score


@task
def extremes() -> Task:
    return Task(dataset=[Sample(input=f"Edge {k}.") for k in range(1, 4)],
                solver=[answer()], scorer=beyond_numbers())


@task
def extremes_readable() -> Task:
    """``extremes`` without its unreadable sample (a whole-task cell of the two)."""
    return Task(dataset=[Sample(input=f"Edge {k}.") for k in range(1, 3)],
                solver=[answer()], scorer=beyond_numbers())


@task
def two_ways() -> Task:
    """Epochs reduced two ways, side by side in Inspect's log: max says right, mean
    says half right."""
    return Task(dataset=[Sample(id="q", input="Guess a number.")], solver=[answer()],
                scorer=right_on_later_epochs(), epochs=Epochs(2, ["max", "mean"]))


@solver
def answer_until(gate: str) -> Solver:
    """The fixed answer; sample 3 waits until ``<gate>/open`` exists (it says so in
    ``<gate>/waiting``)."""
    async def solve(state: TaskState, generate: Generate) -> TaskState:
        if state.sample_id == 3:
            (Path(gate) / "waiting").touch()
            while not (Path(gate) / "open").exists():
                await asyncio.sleep(0.05)
        state.output = ModelOutput.from_content(model="none", content="42")
        return state

    return solve


@task
def held(gate: str = "") -> Task:
    """Three samples without ids; the third waits at the gate (an eval to kill)."""
    return Task(dataset=[Sample(input=f"Item {k}.") for k in range(1, 4)],
                solver=[answer_until(gate)], scorer=always_right())
