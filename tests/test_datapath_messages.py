"""The data path's messages (issue #46): each a type, read back as written, and anything
else from the other side (another version, a hostile peer of the run's user) read as
the message it can be, never as a crash or a wrong value."""

from __future__ import annotations

import math
from dataclasses import replace

import pytest

from autopilot.attemptspec import AttemptSpec, GatewayLimits, GatewaySpec, HarnessSpec
from autopilot.datapath import wire
from autopilot.datapath.messages import (
    WAIT_CAP_SECS,
    Attempt,
    Forked,
    Hello,
    Poll,
    Refusal,
    Status,
    read_record,
)

ATTEMPT = Attempt(pid=41, harness_pid=42, harness_ticks=9000, port=8123,
                  meta={"token": "t", "group": "cell-x-a1"}, ticks=8999,
                  spawn_error=None, started=1.5e9)


def through_the_wire(doc: dict) -> dict | None:
    return wire.decode(wire.encode(doc))


def test_each_message_is_read_back_as_written() -> None:
    assert Hello.of(through_the_wire(Hello("s3cret").to_wire())) == Hello("s3cret")
    for poll in (Poll(), Poll(5.0), Poll(0.0, (("http://a", "a"), ("http://b", "b")))):
        assert Poll.of(through_the_wire(poll.to_wire())) == poll
    assert Refusal.of(through_the_wire(Refusal(7).to_wire())) == Refusal(7)
    st = Status(exited=True, code=-9, ended=12.5, throttled=3,
                meter={"requests": 2}, failovers=({"replica": "0", "to": "1"},))
    assert Status.of(through_the_wire(st.to_wire())) == st
    assert Forked.of(Forked(77).to_wire()) == Forked(77)
    assert Forked.of(Forked(None, "bad spec").to_wire()) == Forked(None, "bad spec")


def test_the_attempts_three_forms_read_as_one() -> None:
    # The answer to a hello, the ready line and datapath.json say the same attempt.
    assert Attempt.of(through_the_wire(ATTEMPT.record())) == ATTEMPT
    ready = through_the_wire(ATTEMPT.ready())
    assert Attempt.is_ready(ready) and not Attempt.is_ready(ATTEMPT.hello())
    got = Attempt.of(ready)
    assert got is not None and (got.pid, got.harness_pid, got.port, got.meta) == (
        41, 42, 8123, ATTEMPT.meta)
    assert Refusal.of(ATTEMPT.hello()) is None  # an answer of our version is no refusal


@pytest.mark.parametrize("doc", [
    {"pid": "41", "harness_pid": -3, "port": True, "meta": ["x"], "started": "now",
     "spawn_error": 5},
    {"pid": 0, "harness_ticks": 1.5, "ticks": None},
])
def test_an_attempt_of_the_wrong_shape_keeps_nothing_wrong(doc: dict) -> None:
    got = Attempt.of(doc)
    assert got == Attempt(None, None, None, None, {}, None, None, None)


def test_a_poll_is_bounded_whatever_it_asks() -> None:
    for timeout, want in ((math.nan, 0.0), (-5, 0.0), (1e9, WAIT_CAP_SECS),
                          (math.inf, WAIT_CAP_SECS), ("10", 0.0), (True, 0.0), (2, 2.0)):
        poll = Poll.of({"op": "wait", "timeout": timeout})
        assert poll is not None and poll.wait == want, timeout
    assert Poll.of({"op": "anything"}) == Poll()  # a status, then
    assert Poll.of({"upstream": [["u", "r"], ["only one"]]}) == Poll()  # not a list of pairs
    assert Poll.of(None) is None  # not a message: the channel ends


def test_a_hello_needs_a_secret_and_says_its_version() -> None:
    assert Hello.of({"op": "hello"}) is None
    assert Hello.of({"op": "wait", "secret": "s"}) is None
    assert Hello.of({"op": "hello", "secret": "s", "version": "1"}) == Hello("s", -1)


def test_a_status_of_the_wrong_shape_changes_nothing() -> None:
    st = Status.of({"exited": "yes", "code": "0", "ended": True, "throttled": -1,
                    "meter": [1], "failovers": [{"ok": 1}, "x", 3] + [{}] * 2000,
                    "spawn_error": "e" * 1000})
    assert st is not None
    assert (st.exited, st.code, st.ended, st.throttled, st.meter) == (
        False, None, None, None, None)
    assert len(st.failovers) == 998 and "x" not in st.failovers  # of the first 1,000
    assert st.spawn_error == "e" * 300
    # exit.json has no "exited": it is the end by what it is
    assert Status.of({"code": 0, "ended": 3}, exited=True) == Status(True, 0, 3.0)


def test_a_fork_server_answer_of_the_wrong_shape_is_no_pid() -> None:
    assert Forked.of({"ok": True, "pid": "12"}) == Forked(None, "refused")
    assert Forked.of({"ok": True, "pid": -1}) == Forked(None, "refused")
    assert Forked.of([1]) is None


def test_a_record_an_earlier_data_path_wrote_under_its_old_name_is_read(tmp_path) -> None:
    # A successor of this version re-attaches to a data path of the last (shim.json).
    wire.write_private_json(tmp_path / wire.LEGACY_RECORD, ATTEMPT.record())
    assert read_record(tmp_path) == ATTEMPT
    newer = ATTEMPT.__class__(**{**ATTEMPT.__dict__, "port": 9000})
    wire.write_private_json(tmp_path / wire.RECORD, newer.record())
    assert read_record(tmp_path) == newer  # its own name first


SPEC = AttemptSpec(
    "t1_a_v1", 2, HarnessSpec(("/bin/sh", "-c", "true"), {"PATH": "/bin"}, "/s/spool", "/w"),
    meta={"token": "t", "uid": None, "arms": ["a"]},
    gateway=GatewaySpec((("http://127.0.0.1:1", "0"),), "/s/gw.jsonl",
                        GatewayLimits(max_request=1 << 20, hold_429=2.5),
                        {"temperature": 0}, {"messages": {"max_tokens": 9}}, key="k",
                        model="m", upstream_key="u", rewrite=True, dialects=("chat",),
                        secrets=("s3cret",), fd=7),
    dir="/s/datapath/t1_a_v1/attempt-2", secret="x" * 32)


def test_an_attempts_spec_is_read_back_as_written_and_only_by_its_version() -> None:
    doc = wire.decode(wire.encode_spec(SPEC))
    assert wire.spec_of(doc) == SPEC
    assert wire.spec_of({**doc, "version": wire.VERSION + 1}) is None  # another loop's
    without = replace(SPEC, gateway=None)
    assert wire.spec_of(wire.decode(wire.encode_spec(without))) == without
    assert SPEC.with_listener(3).gateway.fd == 3 and without.with_listener(3) == without


@pytest.mark.parametrize("change", [
    {"harness": {"argv": [], "env": {}, "spool": "/s"}},  # nothing to run
    {"harness": {"argv": ["sh", 1], "env": {}, "spool": "/s"}},
    {"harness": {"argv": ["sh"], "env": {"A": 1}, "spool": "/s"}},  # env of strings only
    {"gateway": {"upstream": [["only-one"]]}},
    {"gateway": "yes"},  # a gateway that is no gateway is no spec, not "no gateway"
    {"attempt": "2"}, {"cell": None}, {"dir": ""}, {"secret": 7}, {"meta": []},
])
def test_a_spec_of_the_wrong_shape_is_no_spec(change: dict) -> None:
    doc = wire.decode(wire.encode_spec(SPEC))
    assert doc is not None
    if "gateway" in change and isinstance(change["gateway"], dict):
        change = {"gateway": {**doc["gateway"], **change["gateway"]}}
    assert wire.spec_of({**doc, **change}) is None


def test_a_gateways_limits_and_listener_are_shape_checked() -> None:
    doc = wire.decode(wire.encode_spec(SPEC))
    assert doc is not None
    limits = doc["gateway"]["limits"]
    assert GatewayLimits.of(limits) == SPEC.gateway.limits  # each field of its own type
    for bad in ({"limits": {**limits, "max_request": "1"}}, {"limits": [1]}, {"log_path": 3},
                {"limits": {**limits, "max_records": True}},  # a bool is no count
                {"limits": {**limits, "max_depth": 64.0}},  # an int field takes no float
                {"limits": {**limits, "spare": 1}},  # another version's
                {"limits": {k: v for k, v in limits.items() if k != "parse_cap"}}):
        assert wire.spec_of({**doc, "gateway": {**doc["gateway"], **bad}}) is None, bad
    # a float field takes an int (JSON writes 300.0 as written, 5 as 5)
    assert GatewayLimits.of({**limits, "body_secs": 5}) == replace(SPEC.gateway.limits,
                                                                    body_secs=5)
    # a listener number that is no descriptor is none (the data path then refuses it)
    odd = wire.spec_of({**doc, "gateway": {**doc["gateway"], "fd": -1}})
    assert odd is not None and odd.gateway is not None and odd.gateway.fd is None
