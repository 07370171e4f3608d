"""What every journal event has, before its own fields (autopilot.state.events)."""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict


class EventBase(BaseModel):
    """One line of the journal. Frozen; fields of a later version are kept as extras
    (an older reader still folds a newer journal, ignoring what it does not know)."""

    # defer_build: a type's validator is built when it is first used, not at import (a
    # run uses a few of the ~100 kinds; a successor's start-up is a run's dead time).
    # The fields' docstrings are read only where shown (autopilot.fielddocs).
    model_config = ConfigDict(frozen=True, extra="allow", populate_by_name=True,
                              defer_build=True)

    ts: str | None = None
    """When it was journaled (ISO 8601, UTC)."""
    event: str
    """The kind: the discriminator each event type fixes."""


class CellEventBase(EventBase):
    """An event of one attempt of one cell."""

    cell: str
    """The cell's id (``{task}_{arm}_v{n}``)."""
    attempt: int | None = None
    """Its attempt, counted from 1."""


def record_of(event: str | EventBase, fields: dict[str, Any]) -> tuple[str, dict[str, Any]]:
    """An event as its kind and the fields written (those set where it was built, and
    ``fields`` over them): what a journal line holds."""
    if isinstance(event, EventBase):
        return event.event, {**event.model_dump(exclude_unset=True, by_alias=True,
                                                exclude={"ts", "event"}),
                             **fields}
    return event, fields
