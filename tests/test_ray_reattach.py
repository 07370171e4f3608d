"""A successor re-attaching to a Ray node's actor, without a cluster: the numbered
reports a node keeps until a head acknowledges them, the head journaling each once,
the journal's record of what was acknowledged, a successor's wait for an attempt, and
the survey's sorting of what an actor holds against the ledger. (tests/test_ray.py runs
all of it on a real cluster, with supervisors SIGKILLed and handing over.)"""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import pytest

from autopilot.backends.base import Survivors
from autopilot.backends.ray import reattach
from autopilot.backends.ray.node import Hello, NodeAgent, NodePort, Numbered, Polled
from autopilot.backends.ray.reattach import acked_reports, apply_polled, survey
from autopilot.cell.validity import Classification
from autopilot.plan import Cell
from autopilot.state.cellevents import CellExited, CellStarted
from autopilot.state.ledger import Ledger


class Port:
    """What a head's port was asked to journal, in order."""

    def __init__(self, ledger: Ledger | None = None) -> None:
        self.lines: list[tuple[str, dict[str, Any]]] = []
        self.ledger = ledger

    def emit(self, event: Any, **fields: Any) -> dict[str, Any]:
        kind = event if isinstance(event, str) else event.event
        self.lines.append((kind, fields))
        if self.ledger is not None and not isinstance(event, str):
            self.ledger.apply(event)
        return {}

    def milestone(self, kind: str, **info: Any) -> None:
        self.lines.append((f"milestone:{kind}", info))

    def grade_failure(self, cid: str, c: Classification) -> None:
        self.lines.append(("grade_failure", {"cell": cid}))

    def tick(self, cid: str, frozen_secs: float, tier: str, last_signal: Any) -> None:
        self.lines.append(("tick", {"cell": cid}))


def started(cell: str, attempt: int) -> CellStarted:
    return CellStarted(cell=cell, attempt=attempt, pid=4242)


def test_a_node_keeps_its_reports_until_a_head_acknowledges_them() -> None:
    port = NodePort()
    port.emit(started("a", 1))
    port.milestone("endpoint_restart", why="x")
    port.grade_failure("a", Classification("INVALID", reason="grader_failed"))
    reports, _ = port.drain(0)
    assert [n.seq for n in reports] == [1, 2, 3]
    # a head that read them and died before journaling leaves them to its successor
    assert [n.seq for n in port.drain(0)[0]] == [1, 2, 3]
    port.emit(CellExited(cell="a", attempt=1, code=0))
    assert [n.seq for n in port.drain(2)[0]] == [3, 4]  # up to 2 journaled: dropped
    assert port.drain(4)[0] == [] and port.reports == []


def test_the_head_journals_each_report_once_with_its_lease_and_number() -> None:
    port = Port()
    got = Polled([Numbered(1, event_report(started("a", 1))),
                  Numbered(2, event_report(CellExited(cell="a", attempt=1, code=0))),
                  Numbered(3, milestone_report("endpoint_restart"))], {}, None, [])
    acked = apply_polled(port, 1, "f" * 40, "s-1.1", 1, got)
    assert acked == 3
    assert [kind for kind, _ in port.lines] == ["cell_exited", "milestone:endpoint_restart"]
    for _, fields in port.lines:
        assert fields["lease"] == "s-1.1" and fields["replica"] == 1
        assert fields["node"] == "f" * 12
    assert [f["report_seq"] for _, f in port.lines] == [2, 3]
    # the same answer again (a successor's first poll of what was journaled): nothing
    assert apply_polled(port, 1, "f" * 40, "s-1.1", acked, got) == 3
    assert len(port.lines) == 2


def event_report(ev: Any) -> Any:
    """A report as a node's port makes it."""
    port = NodePort()
    port.emit(ev)
    return port.reports[0].report


def milestone_report(kind: str) -> Any:
    port = NodePort()
    port.milestone(kind, why="test")
    return port.reports[0].report


def test_what_was_acknowledged_is_read_back_from_the_journal(tmp_path: Path) -> None:
    journal = tmp_path / "journal.jsonl"
    lines = [
        {"event": "cell_started", "cell": "a", "attempt": 1, "lease": "s-0.1", "report_seq": 4},
        {"event": "cell_exited", "cell": "a", "attempt": 1, "lease": "s-0.1", "report_seq": 9},
        {"event": "cell_started", "cell": "b", "attempt": 1, "lease": "s-1.1", "report_seq": 2},
        # untrusted shapes are not a number of anything
        {"event": "cell_exited", "cell": "b", "attempt": 1, "lease": "s-1.1", "report_seq": "99"},
        {"event": "cell_exited", "cell": "b", "attempt": 1, "lease": 7, "report_seq": 50},
        {"event": "cell_exited", "cell": "b", "attempt": 1, "lease": "s-1.1", "report_seq": True},
    ]
    journal.write_text("".join(json.dumps({"ts": "2026-12-05T00:00:00Z", **x}) + "\n"
                               for x in lines))
    assert acked_reports(journal) == {"s-0.1": 9, "s-1.1": 2}


async def test_a_successor_waits_for_an_attempt_and_its_wait_never_cancels_it() -> None:
    agent = NodeAgent.__new__(NodeAgent)  # only the results table (no endpoint, no lease)
    fut: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
    agent.results = {("a", 1): fut}
    assert await agent.attach_cell("b", 1) == (False, None)
    waiter = asyncio.ensure_future(agent.attach_cell("a", 1))
    await asyncio.sleep(0)
    waiter.cancel()  # the successor goes (its own hand-over, say)
    with pytest.raises(asyncio.CancelledError):
        await waiter
    assert not fut.cancelled()  # ... the attempt's result does not
    c = Classification("PASS")
    fut.set_result((c, None))
    assert await agent.attach_cell("a", 1) == (True, (c, None))


class FakeActor:
    """An actor's ``poll`` as a successor's survey calls it."""

    def __init__(self, polled: Polled) -> None:
        self.polled = polled
        self.asked: list[tuple[Any, ...]] = []
        outer = self

        class _Poll:
            async def remote(self, *args: Any) -> Polled:
                outer.asked.append(args)
                return outer.polled

        self.poll = _Poll()


async def test_the_survey_sorts_what_an_actor_holds_by_the_journal(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    cells = [Cell("t1", "arm", 1), Cell("t2", "arm", 1), Cell("t3", "arm", 1),
             Cell("t4", "arm", 1)]
    ledger = Ledger(cells)
    ids = [c.id for c in cells]
    ledger.apply(started(ids[0], 1))  # running, journaled
    ledger.apply(started(ids[2], 2))  # the journal knows attempt 2, the actor runs 1
    (tmp_path / "journal.jsonl").write_text(json.dumps(
        {"ts": "2026-12-05T00:00:00Z", "event": "cell_started", "cell": ids[0], "attempt": 1,
         "pid": 1, "lease": "s-0.1", "report_seq": 1}) + "\n")
    # ids[1]'s start was never journaled: the actor's unacknowledged report says it
    polled = Polled([Numbered(1, event_report(started(ids[0], 1))),
                     Numbered(2, event_report(started(ids[1], 1)))], {}, None,
                    [(ids[0], 1), (ids[1], 1), (ids[2], 1)])
    actor = FakeActor(polled)
    hello = Hello("tok", "s-0.1", 0, {"node": "n" * 40}, [(ids[0], 1), (ids[1], 1),
                                                            (ids[2], 1)],
                  [(ids[3], 1)], None, 777)
    monkeypatch.setattr(reattach, "hellos", lambda preset, token: {0: (actor, hello)})
    port = Port(ledger)
    got = await survey(None, "tok", tmp_path, port, ledger)  # type: ignore[arg-type]
    assert actor.asked[0][4] == 1  # it asked for what the journal lacks
    assert [k for k, _ in port.lines] == ["cell_started"]  # ids[1]'s, once
    assert isinstance(got, Survivors)
    assert sorted((c, a) for c, a, _ in got.attempts) == [(ids[0], 1), (ids[1], 1)]
    s = got.replicas[0]
    assert s.taken == [(ids[3], 1)]  # ended, and its verdict journaled: let go
    assert s.revoked == [(ids[2], 1)]  # not the attempt the journal knows: killed there
    assert s.acked == 2 and s.replayed == 1
    assert got.leases == {"s-0.1"} and got.pids == {777}
    assert {"endpoint-0", f"cell-{ids[0]}-a1", f"grade-{ids[1]}-a1"} <= got.groups
