"""The contracts between the parts are typed: every journal kind the code emits has a
type, every type is read back somewhere (or says why not), a run's whole journal and its
status.json fit their types, and a journal or status of another version stays
readable."""

from __future__ import annotations

import ast
import json
import re
from pathlib import Path

from conftest import ROOT, events, run_cli, write_overlay

from autopilot.fielddocs import describe
from autopilot.state.events import (
    RECORD_ONLY,
    TYPES,
    Unknown,
    events_markdown,
    mistyped,
    parse,
)
from autopilot.state.ledger import Ledger
from autopilot.state.statusdoc import check
from autopilot.state.statusdoc import read as read_status

PKG = ROOT / "autopilot"
EMITTERS = {"emit", "_emit", "append", "Emit"}


def emitted_kinds() -> dict[str, str]:
    """Every event kind the package emits -> where: a literal (``append("kind")``), or
    a type constructed where it is emitted (``emit(CellKilled(...))``: its kind)."""
    by_class = {cls.__name__: kind for kind, cls in TYPES.items()}
    out = {}
    for path in PKG.rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if not (isinstance(node, ast.Call) and node.args):
                continue
            name = node.func.attr if isinstance(node.func, ast.Attribute) \
                else getattr(node.func, "id", "")
            first = node.args[0]
            if name not in EMITTERS:
                continue
            if isinstance(first, ast.Constant) and isinstance(first.value, str) \
                    and re.fullmatch(r"[a-z_]+", first.value):
                out.setdefault(first.value, f"{path.relative_to(ROOT)}:{node.lineno}")
            elif isinstance(first, ast.Call) and name != "append":  # a list's append
                built = first.func
                if isinstance(built, ast.Attribute) and built.attr == "model_validate":
                    built = built.value  # RunStarted.model_validate({...})
                cls = built.attr if isinstance(built, ast.Attribute) \
                    else getattr(built, "id", "")
                if cls in by_class or (cls.endswith("Event") and cls[:-5] in by_class):
                    kind = by_class.get(cls) or by_class[cls[:-5]]
                    out.setdefault(kind, f"{path.relative_to(ROOT)}:{node.lineno}")
                elif cls and cls[0].isupper():
                    out.setdefault(f"<{cls}>", f"{path.relative_to(ROOT)}:{node.lineno}")
    return out


def test_every_emitted_kind_has_a_type() -> None:
    kinds = emitted_kinds()
    assert len(kinds) > 40  # the scan sees the emit sites
    # list.append("x") of plain strings is no event: only the journal's kinds are asked;
    # an emitted constructor that is no event type shows as <Name>
    untyped = {k: w for k, w in kinds.items() if k not in TYPES and k not in NOT_EVENTS}
    assert untyped == {}


# Literal first arguments of append/emit that are not journal events (a list's append).
NOT_EVENTS = {"graders"}


def test_every_type_has_a_reader_or_says_why_not() -> None:
    sources = {p: p.read_text() for p in PKG.rglob("*.py")
               if p.name not in ("events.py", "cellevents.py", "runevents.py")}
    unread = []
    for kind, cls in TYPES.items():
        pattern = re.compile(re.escape(f'"{kind}"') + rf"|\b{cls.__name__}\b")
        read = any(not re.search(r"(emit|append|Emit)\(\s*$", text[:m.start()][-40:])
                   for text in sources.values() for m in pattern.finditer(text))
        if not read and kind not in RECORD_ONLY:
            unread.append(kind)
    assert unread == []
    assert set(RECORD_ONLY) <= set(TYPES)


def test_the_events_page_is_generated_from_the_types() -> None:
    page = (ROOT / "docs" / "events.md").read_text()
    assert page == events_markdown() + "\n", (
        "docs/events.md is stale: python -m autopilot schema --events > docs/events.md")
    assert all(f"## `{kind}`" in page for kind in TYPES)


def test_every_type_documents_every_field() -> None:
    # `event` is the discriminator: each type fixes it to its kind (EventBase says so).
    describe(TYPES.values())  # what the generated page does first
    missing = [f"{kind}.{name}" for kind, cls in TYPES.items()
               for name, f in cls.model_fields.items()
               if name != "event" and not (f.description or "").strip()]
    assert missing == []
    assert all(cls.__doc__ for cls in TYPES.values())


def test_a_run_and_a_chaos_run_write_only_typed_events(state_dir: Path,
                                                        tmp_path: Path) -> None:
    over = write_overlay(tmp_path / "o.json", {"vars": {"think_secs": "0.05"}})
    r = run_cli("--preset", "demo-chaos", "--target-n", "1", "--config", str(over),
                "--state-dir", str(state_dir), "--quiet", timeout=300)
    assert r.returncode in (0, 1), r.stderr[-2000:]
    evs = events(state_dir)  # asserts each fits its type
    kinds = {e["event"] for e in evs}
    assert {"run_started", "cell_started", "cell_verdict", "endpoint_restart"} <= kinds
    assert "journal_event_mistyped" not in (state_dir / "autopilot.log").read_text()
    status = json.loads((state_dir / "status.json").read_text())
    assert check(status) is None  # what the snapshot built is the schema's, field by field
    doc = read_status(status)
    assert doc.totals.total == status["totals"]["total"] > 0
    assert doc.thresholds.warn_secs == status["thresholds"]["warn_secs"]
    # The ledger folds the typed events as it folded the records.
    led = Ledger([])
    for ev in evs:
        led.apply(parse(ev))  # type: ignore[arg-type]
    assert led.endpoint_restarts == sum(e["event"] == "endpoint_restart" for e in evs)


def test_a_journal_of_another_version_stays_readable() -> None:
    newer = {"ts": "2026-01-01T00:00:00Z", "event": "cell_verdict", "cell": "a_b_v1",
             "attempt": 1, "verdict": "PASS", "confidence": 0.9}  # a field added later
    ev = parse(newer)
    assert ev is not None and ev.model_extra == {"confidence": 0.9}
    unknown = parse({"event": "cell_teleported", "cell": "a_b_v1"})
    assert isinstance(unknown, Unknown) and unknown.event == "cell_teleported"
    assert parse({"event": "cell_verdict", "cell": 7}) is None  # a kind's shape is kept
    assert parse(["not", "an", "event"]) is None
    assert mistyped({"event": "cell_teleported"}) is not None
    assert mistyped({"event": "cell_started", "cell": "x", "pid": "not a pid"})


def test_a_status_of_another_shape_reads_as_defaults_never_as_another_type() -> None:
    doc = read_status({"phase": "COMPLETE", "pass": 2, "eta_secs": "soon",
                       "totals": {"total": "many", "pass": 3},
                       "running": [{"cell": "a_b_v1", "pid": "x"}], "added_later": 1})
    assert (doc.phase, doc.pass_no, doc.eta_secs) == ("COMPLETE", 2, None)
    assert (doc.totals.total, doc.totals.pass_) == (0, 3)
    assert doc.running[0].cell == "a_b_v1" and doc.running[0].pid is None
    assert doc.model_extra == {"added_later": 1}
    assert read_status(["not", "a", "status"]).phase == ""
    assert check({"totals": {"total": "many"}}) == (
        "totals.total: Input should be a valid integer, unable to parse string as an integer")


def test_a_typed_event_is_written_under_its_journal_names() -> None:
    """A field with an alias (``pass``: a Python keyword) is written as the journal
    names it, whichever way the event was built, and reads back the same."""
    from autopilot.state.eventbase import record_of
    from autopilot.state.runevents import PassStarted

    for built in (PassStarted(pass_no=3, pending=2),
                  PassStarted.model_validate({"pass": 3, "pending": 2})):
        kind, fields = record_of(built, {})
        assert (kind, fields) == ("pass_started", {"pass": 3, "pending": 2})
        again = parse({"event": kind, **fields})
        assert isinstance(again, PassStarted) and again.pass_no == 3


def test_every_milestone_kind_is_one_the_notifier_knows() -> None:
    # Writers are typed (MilestoneKind: mypy checks each call's kind); the notifier's
    # table of icons and priorities covers exactly those kinds.
    from autopilot.run.notify import MILESTONES
    from autopilot.state.runevents import MILESTONE_KINDS

    assert set(MILESTONES) == MILESTONE_KINDS


def test_the_counts_the_ledger_writes_are_the_counts_status_json_reads() -> None:
    """status.json's totals (and each arm's and task's) are written from the ledger's
    Counts and read back as statusdoc's Totals: every field of one is a field of the
    other, by the same name and value, and ``done`` is what was passed and failed."""
    from autopilot.state.ledger import Counts
    from autopilot.state.statusdoc import Totals

    written = Counts(9, 3, 2, 1, 1, 0, 1, 1, 0, {"passed": 4, "scored": 6}).as_json()
    read = Totals.model_validate(written, context={"strict": True})
    assert read.model_dump(by_alias=True) == written
    assert (read.done, read.pass_, read.items) == (5, 3, {"passed": 4, "scored": 6})
    assert "items" not in Counts(1, 1).as_json()  # only where there are some
