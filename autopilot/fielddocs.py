"""A model field's docstring as its description, read only where it is shown.

The configuration and journal types document each field by the string under it.
pydantic can read those itself (``use_attribute_docstrings``), but it then parses every
class's source as the class is made: 70 ms of every start-up, a successor's included,
for text only ``autopilot schema`` and the generated pages show. Those callers call
``describe`` first; the supervisor never parses a source file.
"""

from __future__ import annotations

import ast
import inspect
import textwrap
import typing
from collections.abc import Iterable
from functools import cache
from typing import Any

from pydantic import BaseModel


@cache
def _own_docs(cls: type) -> dict[str, str]:
    """The docstrings under the fields that ``cls``'s own body declares."""
    try:
        body = ast.parse(textwrap.dedent(inspect.getsource(cls))).body[0]
    except (OSError, TypeError, SyntaxError, IndexError):
        return {}
    if not isinstance(body, ast.ClassDef):
        return {}
    docs: dict[str, str] = {}
    for node, after in zip(body.body, body.body[1:], strict=False):
        if not (isinstance(after, ast.Expr) and isinstance(after.value, ast.Constant)
                and isinstance(after.value.value, str)):
            continue
        if isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
            docs[node.target.id] = inspect.cleandoc(after.value.value)
        elif (isinstance(node, ast.Assign) and len(node.targets) == 1
              and isinstance(node.targets[0], ast.Name)):
            docs[node.targets[0].id] = inspect.cleandoc(after.value.value)
    return docs


def models_in(annotation: Any) -> list[type[BaseModel]]:
    """The models a field's type names (``A``, ``list[A]``, ``dict[str, A | B]``...)."""
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return [annotation]
    return [m for a in typing.get_args(annotation) for m in models_in(a)]


def _reachable(models: Iterable[type[BaseModel]]) -> list[type[BaseModel]]:
    """``models`` and every model their fields hold, innermost first (a model's schema
    embeds those it holds, so they are rebuilt before it)."""
    order: dict[type[BaseModel], None] = {}
    entered: set[type[BaseModel]] = set()

    def visit(model: type[BaseModel]) -> None:
        if model in entered:  # done, or a cycle
            return
        entered.add(model)
        for field in model.model_fields.values():
            for inner in models_in(field.annotation):
                visit(inner)
        order[model] = None

    for model in models:
        visit(model)
    return list(order)


_described: set[type[BaseModel]] = set()


def describe(models: Iterable[type[BaseModel]]) -> None:
    """Give every field of ``models`` (and of the models they hold) its docstring as its
    description, where it has none, and rebuild each so its JSON Schema carries it."""
    for model in _reachable(models):
        if model in _described:
            continue
        docs: dict[str, str] = {}
        for cls in reversed(model.__mro__):  # a subclass's docstring wins
            if isinstance(cls, type) and issubclass(cls, BaseModel) and cls is not BaseModel:
                docs.update(_own_docs(cls))
        for name, field in model.model_fields.items():
            if field.description is None and name in docs:
                field.description = docs[name]
        model.model_rebuild(force=True)
        _described.add(model)


__all__ = ["describe", "models_in"]
