"""The journal's events, typed: one frozen pydantic type per kind (the cells' in
``cellevents``, the run's in ``runevents``), a discriminated union of them, and the one
parser every reader of a journal goes through.

``parse`` turns a journal record (a dict) into its type: an unknown kind (a newer
version's) stays readable as a plain ``Unknown`` event, a record whose fields do not fit
its kind is None (skipped, as a torn line is). The journal checks what it appends
against the same types (``mistyped``), and the ledger folds them by type.
"""

from __future__ import annotations

from typing import Annotated, Any, Union

from pydantic import Field, ValidationError

from autopilot.fielddocs import describe
from autopilot.state.cellevents import CELL_EVENTS
from autopilot.state.eventbase import CellEventBase, EventBase
from autopilot.state.runevents import RUN_EVENTS

TYPES: dict[str, type[EventBase]] = {
    str(t.model_fields["event"].default): t for t in (*CELL_EVENTS, *RUN_EVENTS)}

# The union of them all, discriminated by kind (for a JSON Schema of the journal, or a
# caller that validates a record against every type at once).
Event = Annotated[Union[tuple(TYPES.values())], Field(discriminator="event")]  # type: ignore[valid-type]  # noqa: UP007


_OPERATOR = ("a record for the operator: logged as it happens (autopilot.log) and kept in "
             "the journal for the post-mortem; no view counts it")
_CAMPAIGN = ("campaign.jsonl: the campaign's own record; its entries are resumed from their "
             "own state dirs, not from it")
# Kinds no module reads back, and why that is right (tests/test_events.py holds every
# other kind to a reader).
RECORD_ONLY: dict[str, str] = {
    **dict.fromkeys(("cell_reattached", "cell_watchdog", "cell_files_received",
                     "scratch_not_removed", "scratch_removed_via_docker",
                     "foreign_in_cell_group", "foreign_outputs_moved", "regrade_skipped",
                     "datapath_version_mismatch", "pass_started",
                     "preset_changed", "arm_grading", "endpoint_up", "endpoint_reconfigure",
                     "endpoint_not_readopted", "orphan_killed", "claim_dropped",
                     "published", "ray_replica_started", "ray_actor_reaped", "lease_swept",
                     "lease_sweep_failed", "lease_sweep_unreachable",
                     "leftovers_stopped", "cell_deadline"), _OPERATOR),
    **dict.fromkeys(("campaign_started", "campaign_finished", "campaign_blocked",
                     "campaign_budget_reached", "entry_started", "entry_finished",
                     "entry_skipped"), _CAMPAIGN),
}


class Unknown(EventBase):
    """An event of a kind this version does not know (a newer one wrote it)."""


def parse(record: Any) -> EventBase | None:
    """A journal record as its type; None when it is no event or its fields do not fit."""
    kind = record.get("event") if isinstance(record, dict) else None
    if not isinstance(kind, str):
        return None
    try:  # the kind picks the type (what the union's discriminator does, one step less)
        return TYPES.get(kind, Unknown).model_validate(record)
    except ValidationError:
        return None


def mistyped(record: dict[str, Any]) -> str | None:
    """Why ``record`` does not fit its kind's type (None: it does); an unknown kind is
    one too: every kind the supervisor writes has a type."""
    kind = record.get("event")
    if kind not in TYPES:
        return f"event kind {kind!r} has no type in autopilot.state.events"
    try:
        TYPES[kind].model_validate(record)
    except ValidationError as e:
        return f"{kind}: {e.errors()[0]['loc']}: {e.errors()[0]['msg']}"
    return None


def events_markdown() -> str:
    """docs/events.md: every kind of the journal, its fields and what they mean."""
    lines = ["# Journal events", "",
             "Every line of a run's `journal.jsonl` (and a campaign's `campaign.jsonl`) is "
             "one of these, generated from their types (`autopilot schema --events > "
             "docs/events.md`; a test keeps this page equal to them). Every event has "
             "`ts` (ISO 8601, UTC) and `event` (its kind); an event of a cell has `cell` "
             "and `attempt`. Fields a later version adds are kept by an older reader.", ""]
    describe(TYPES.values())
    for kind, cls in TYPES.items():
        lines += [f"## `{kind}`", "", " ".join((cls.__doc__ or "").split()), ""]
        own = {n: f for n, f in cls.model_fields.items() if n not in ("ts", "event")}
        if kind in RECORD_ONLY:
            lines += [f"Read by no view: {RECORD_ONLY[kind]}.", ""]
        if own:
            lines += ["| field | description |", "| --- | --- |"]
            lines += [f"| `{f.alias or n}` | {' '.join((f.description or '').split())} |"
                      for n, f in own.items()]
            lines.append("")
    return "\n".join(lines)


__all__ = [
    "RECORD_ONLY",
    "TYPES",
    "CellEventBase",
    "Event",
    "EventBase",
    "Unknown",
    "events_markdown",
    "mistyped",
    "parse",
]
