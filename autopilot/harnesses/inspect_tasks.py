"""Offline example Inspect tasks shipped with ``presets/inspect.toml``: inline samples,
no dataset download, small enough for a 270M model on two CPU cores. ``arith`` and
``words`` are question/answer tasks (``includes`` scorer); ``tool_add`` is agentic: the
model may call a Python tool (no sandbox needed), scored on the final answer. A tiny
model fails many samples: that is the honest score, not a bug."""

from __future__ import annotations

from inspect_ai import Task, task
from inspect_ai.dataset import Sample
from inspect_ai.scorer import includes
from inspect_ai.solver import generate, use_tools
from inspect_ai.tool import tool

ANSWER = " Reply with only the answer."


@task
def arith() -> Task:
    return Task(dataset=[
        Sample(id="add", input="What is 17 + 25?" + ANSWER, target="42"),
        Sample(id="mul", input="What is 6 times 7?" + ANSWER, target="42"),
        Sample(id="sub", input="What is 10 minus 3?" + ANSWER, target="7"),
    ], solver=[generate()], scorer=includes())


@task
def words() -> Task:
    return Task(dataset=[
        Sample(id="capital", input="What is the capital of France?" + ANSWER,
               target="Paris"),
        Sample(id="echo", input="Reply with exactly one word: banana", target="banana"),
    ], solver=[generate()], scorer=includes())


@tool
def add():  # type: ignore[no-untyped-def]
    async def execute(a: int, b: int) -> int:
        """Add two integers.

        Args:
            a: The first integer.
            b: The second integer.
        """
        return a + b

    return execute


@task
def tool_add() -> Task:
    return Task(dataset=[
        Sample(id="sum", input="Use the add tool to compute 123 + 456, then reply with "
               "only the result.", target="579"),
    ], solver=[use_tools(add()), generate()], scorer=includes())
