"""Live restore: each attempt's data path outlives the supervisor (autopilot.datapath).

Real processes throughout: the real CLI, the demo simulator with seconds-long requests
(so a kill lands mid-request), real data paths. A supervisor is killed with SIGKILL at
random moments, frozen with SIGSTOP, handed over with SIGUSR2; a data path is killed on
its own; a stranger knocks on a data path's channel.
"""

from __future__ import annotations

import json
import os
import random
import signal
import socket
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
from conftest import (
    ROOT,
    cli_env,
    env_holders,
    events,
    run_cli,
    spawn_cli,
    wait_for,
    write_overlay,
)

pytestmark = pytest.mark.slow

DEMO_ARGV = [
    "{python}", "-m", "autopilot.demo.harness", "{cell}",
    "--task", "{task}", "--arm", "{arm}", "--n", "{n}", "--attempt", "{attempt}",
    "--host", "{host}", "--port", "{port}", "--model", "{model}", "--out", "{output_dir}",
    "--seed", "{seed}", "--think-secs", "{think_secs}", "--hang-share", "{hang_share}",
]


def slow_overlay(tmp: Path, latency: float = 0.8, think: str = "0.3", concurrency: int = 3,
                 **extra: Any) -> Path:
    """The demo with requests that take most of a second: a kill lands mid-request."""
    doc: dict[str, Any] = {"vars": {"think_secs": think},
                           "endpoint": {"latency_secs": latency},
                           "run": {"concurrency": concurrency}}
    for k, v in extra.items():
        doc.setdefault(k, {}).update(v)
    return write_overlay(tmp / "slow.json", doc)


def demo(state: Path, over: Path, n: int = 1) -> tuple[str, ...]:
    return ("--preset", "demo", "--target-n", str(n), "--config", str(over),
            "--state-dir", str(state), "--quiet")


def gone(p: subprocess.Popen[bytes]) -> None:
    """The supervisor a test started is not left behind, whatever the test did."""
    if p.poll() is None:
        p.kill()
    p.wait(timeout=30)


def run_token(state: Path) -> str:
    return (state / "run.token").read_text().strip()


def marked(state: Path) -> list[int]:
    from autopilot.cell.procs import RUN_TOKEN_ENV

    return env_holders(RUN_TOKEN_ENV, {run_token(state)})


def verdicts(evs: list[dict[str, Any]]) -> dict[str, tuple[str, int]]:
    """cell -> (its last verdict, the attempt that gave it)."""
    out = {}
    for e in evs:
        if e["event"] == "cell_verdict":
            out[e["cell"]] = (e["verdict"] if e["verdict"] != "INVALID"
                              else f"INVALID({e['reason']})", e["attempt"])
    return out


def started(state: Path, n: int = 1) -> Any:
    return wait_for(lambda: len([e for e in events(state) if e["event"] == "cell_started"
                                 and e.get("datapath_pid")]) >= n, 60, "cells started")


def test_a_kill_storm_loses_no_attempt_and_counts_as_a_run_without_kills(
        tmp_path: Path) -> None:
    """>= 20 SIGKILLs of the supervisor at random moments, each followed by a resume:
    every attempt running at a kill completes as the same attempt (none abandoned, none
    re-run), every verdict is metered, the verdicts equal those of the same run without
    kills, the endpoint is never reloaded, and nothing of the run is left at the end."""
    over = slow_overlay(tmp_path, latency=0.9, think="0.3", concurrency=2)
    ref = tmp_path / "ref"
    r = run_cli("--preset", "demo", "--target-n", "2", "--config", str(over),
                "--state-dir", str(ref), "--quiet", timeout=400)
    assert r.returncode == 0, r.stdout + r.stderr[-2000:]

    state = tmp_path / "storm"
    args = ("--preset", "demo", "--target-n", "2", "--config", str(over),
            "--state-dir", str(state), "--quiet")
    rng = random.Random(20261201)
    kills = 0
    log = tmp_path / "storm.log"
    code = None
    while kills < 20:
        p = spawn_cli(*args, log=log)
        try:
            # a random moment: during start-up, recovery, or the run
            time.sleep(rng.uniform(0.3, 2.2))
            if p.poll() is not None:
                code = p.returncode
                break
            p.kill()
            kills += 1
        finally:
            gone(p)
    assert kills >= 20, f"the run ended after {kills} kills (rc {code}): make it longer"
    r = run_cli(*args, timeout=400)
    assert r.returncode == 0, r.stdout + r.stderr[-2000:]

    evs = events(state)
    # An attempt whose harness had started is never abandoned; one a kill caught between
    # its intent and its data path's start (no harness yet) is, uncharged, as never
    # started, and its number is used again (kills do not make attempt numbers climb).
    began: set[tuple[str, int]] = set()
    for e in evs:
        if e["event"] == "cell_started":
            began.add((e["cell"], e["attempt"]))
        elif e["event"] == "cell_abandoned":
            assert (e["cell"], e["attempt"]) not in began, e
            assert e.get("never_started"), e
    got = verdicts(evs)
    runs = Counter(c for c, _ in began)
    assert {c: n for c, n in runs.items() if n != 1} == {}  # no harness ran twice
    assert got == verdicts(events(ref))  # the same verdicts, at the same attempt numbers
    metered = Counter((e["cell"], e["attempt"]) for e in evs if e["event"] == "cell_metered")
    assert {(c, a) for c, (_, a) in got.items()} <= set(metered)
    # one cell_metered per attempt, however often it was adopted: a reader adding up the
    # journal counts each spend once
    assert {k: n for k, n in metered.items() if n != 1} == {}
    # a re-attached attempt's wall is its whole wall (spawn to exit, as its data path
    # recorded both), not the part its last supervisor watched (1 s: the exit's poll)
    from autopilot.state.fsutil import parse_iso

    at = {(e["event"], e["cell"], e["attempt"]): parse_iso(e["ts"]) for e in evs
          if e["event"] in ("cell_started", "cell_reattached", "cell_exited")}
    spans = [(e["cell"], e["elapsed_secs"], at[("cell_exited", e["cell"], e["attempt"])]
              - at[("cell_started", e["cell"], e["attempt"])]) for e in evs
             if e["event"] == "cell_exited"
             and ("cell_reattached", e["cell"], e["attempt"]) in at]
    cut_short = [s for s in spans if s[1] + 1.0 < s[2]]  # recorded values, not timing
    assert spans and cut_short == []
    assert sum(e["event"] == "cell_reattached" for e in evs) > 0
    assert sum(e["event"] == "endpoint_spawned" for e in evs) == 1
    assert marked(state) == []


def test_a_frozen_supervisor_charges_no_cell(tmp_path: Path) -> None:
    """SIGSTOP of the supervisor for longer than the harness's request timeout: the
    data paths serve on, the harnesses finish, and after SIGCONT every verdict is
    valid and from the first attempt."""
    over = slow_overlay(tmp_path, latency=0.5, think="0.1", concurrency=3,
                        harness={"argv": [*DEMO_ARGV, "--timeout", "2", "--retry-secs",
                                          "2"]})
    state = tmp_path / "state"
    p = spawn_cli(*demo(state, over), log=tmp_path / "run.log")
    try:
        started(state, 2)
        os.kill(p.pid, signal.SIGSTOP)
        before = {e["cell"] for e in events(state) if e["event"] == "cell_started"}
        # Frozen past the harness's 2 s request timeout (a frozen gateway would have
        # made each of them give up), until a harness has ended meanwhile.
        time.sleep(5)
        wait_for(lambda: list(state.glob("datapath/*/attempt-1/exit.json")), 60,
                 "a harness that ended while the supervisor was frozen")
        os.kill(p.pid, signal.SIGCONT)
        assert p.wait(timeout=300) == 0
    finally:
        if p.poll() is None:
            os.kill(p.pid, signal.SIGCONT)
        gone(p)
    got = verdicts(events(state))
    assert before
    assert {c: v for c, v in got.items() if v[0].startswith("INVALID") or v[1] != 1} == {}


def test_a_kill_right_after_a_spawn_charges_nothing_and_leaves_nothing(
        tmp_path: Path) -> None:
    """SIGKILL as soon as the journal holds an attempt's intent (cell_spawning), before
    or just after its data path exists: the resume re-attaches to it or abandons it
    uncharged, and nothing of the killed supervisor is left."""
    over = slow_overlay(tmp_path, latency=0.3, think="0.1", concurrency=2)
    state = tmp_path / "state"
    args = demo(state, over)
    p = spawn_cli(*args, log=tmp_path / "run.log")
    try:
        journal = state / "journal.jsonl"
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            if journal.exists() and b'"cell_spawning"' in journal.read_bytes():
                break
            time.sleep(0.002)
        p.kill()
    finally:
        gone(p)
    r = run_cli(*args, timeout=300)
    assert r.returncode == 0, r.stdout + r.stderr[-2000:]
    evs = events(state)
    first = next(e for e in evs if e["event"] == "cell_spawning")
    cell = first["cell"]
    what = [e["event"] for e in evs if e.get("cell") == cell and e["event"] in (
        "cell_reattached", "cell_abandoned", "cell_adopted")]
    assert what and set(what) <= {"cell_reattached", "cell_abandoned", "cell_adopted"}
    assert all(not v.startswith("INVALID") for v, _ in verdicts(evs).values())
    assert [c for c in json.loads((state / "status.json").read_text())["trust"][
        "excluded"]] == []
    assert marked(state) == []


def test_a_killed_data_path_costs_its_attempt_only_and_no_retry(tmp_path: Path) -> None:
    """SIGKILL of one attempt's data path: that attempt is INVALID(datapath_lost) and
    re-run although no retry is left (infra_retries = 0), every other cell runs once."""
    over = slow_overlay(tmp_path, latency=0.8, think="0.3", concurrency=3,
                        trust={"infra_retries": 0})
    state = tmp_path / "state"
    p = spawn_cli(*demo(state, over), log=tmp_path / "run.log")
    try:
        ev = started(state) and next(e for e in events(state) if e["event"] == "cell_started"
                                     and e.get("datapath_pid"))
        os.kill(ev["datapath_pid"], signal.SIGKILL)
        assert p.wait(timeout=300) == 0
    finally:
        gone(p)
    evs = events(state)
    lost = [e for e in evs if e["event"] == "cell_verdict" and e["cell"] == ev["cell"]
            and e["attempt"] == 1]
    assert [(e["verdict"], e["reason"]) for e in lost] == [("INVALID", "datapath_lost")]
    got = verdicts(evs)
    assert got[ev["cell"]][1] == 2 and not got[ev["cell"]][0].startswith("INVALID")
    assert {c: a for c, (_, a) in got.items() if c != ev["cell"] and a != 1} == {}
    assert not [e for e in evs if e["event"] == "cell_quarantined"]
    assert marked(state) == []


def test_an_adopted_attempt_is_judged_by_the_gateway_evidence(tmp_path: Path) -> None:
    """Attempts that ended while no supervisor watched are adopted with the evidence
    their data paths recorded: against an endpoint answering as another model they are
    INVALID(arm_mismatch), never PASS from the harness's own numbers, and metered."""
    over = slow_overlay(tmp_path, latency=0.4, think="0.1", concurrency=3,
                        trust={"infra_retries": 0},
                        endpoint={"replica_env": [
                            {"AUTOPILOT_DEMO_ANSWER_AS": "someone-else-7b"}]})
    state = tmp_path / "state"
    args = demo(state, over)
    p = spawn_cli(*args, log=tmp_path / "run.log")
    try:
        started(state, 2)
        p.kill()
    finally:
        gone(p)
    running = [e for e in events(state) if e["event"] == "cell_started"
               and e.get("datapath_pid") and not any(
                   v["event"] == "cell_verdict" and v["cell"] == e["cell"]
                   for v in events(state))]
    assert running
    for e in running:  # every harness that was running ends while nobody watches
        wait_for(lambda e=e: (state / "datapath" / e["cell"] / "attempt-1" /
                              "exit.json").exists(), 120, f"{e['cell']} to end")
    run_cli(*args, timeout=300)
    evs = events(state)
    adopted = {e["cell"] for e in evs if e["event"] == "cell_adopted"}
    assert {e["cell"] for e in running} <= adopted
    for cell in adopted:
        v = next(e for e in evs if e["event"] == "cell_verdict" and e["cell"] == cell)
        assert (v["verdict"], v["reason"]) == ("INVALID", "arm_mismatch"), v
        m = next(e for e in evs if e["event"] == "cell_metered" and e["cell"] == cell)
        assert m["completion_tokens"] > 0 and m["models"] == {"someone-else-7b":
                                                              m["answered"]}


def test_a_hand_over_leaves_attempts_and_endpoint_running(tmp_path: Path) -> None:
    """SIGUSR2 (systemd's RestartKillSignal, so ``systemctl restart``): the supervisor
    exits 140 leaving every running attempt and the endpoint; the successor re-attaches
    to both; nothing is re-run and the model is loaded once."""
    over = slow_overlay(tmp_path, latency=0.8, think="0.3", concurrency=3)
    state = tmp_path / "state"
    args = demo(state, over)
    p = spawn_cli(*args, log=tmp_path / "run.log")
    try:
        started(state, 3)
        os.kill(p.pid, signal.SIGUSR2)
        assert p.wait(timeout=60) == 140
    finally:
        gone(p)
    assert "AUTOPILOT_HANDED_OVER" in (tmp_path / "run.log").read_text()
    left = marked(state)
    assert left  # the endpoint and the data paths with their harnesses
    r = run_cli(*args, timeout=300)
    assert r.returncode == 0, r.stdout + r.stderr[-2000:]
    evs = events(state)
    assert sum(e["event"] == "endpoint_spawned" for e in evs) == 1
    assert sum(e["event"] == "cell_reattached" for e in evs) >= 1
    assert [e for e in evs if e["event"] == "cell_abandoned"] == []
    assert {c: a for c, (_, a) in verdicts(evs).items() if a != 1} == {}
    assert marked(state) == []


def _knock(sock_path: str, lines: list[bytes], uid: int | None = None) -> bytes:
    """Connect to a channel (as ``uid``), send ``lines``, return what came back."""
    code = ("import socket, sys, os\n"
            "s = socket.socket(socket.AF_UNIX)\n"
            "s.settimeout(5)\n"
            "s.connect(sys.argv[1])\n"
            "out = b''\n"
            "try:\n"
            "    for line in sys.argv[2:]:\n"
            "        s.sendall(line.encode() + b'\\n')\n"
            "    while True:\n"
            "        b = s.recv(65536)\n"
            "        if not b: break\n"
            "        out += b\n"
            "        if out.count(b'\\n') >= len(sys.argv) - 2: break\n"
            "except OSError: pass  # refused: reset, broken pipe, timed out\n"
            "sys.stdout.buffer.write(out)\n")
    argv = [sys.executable, "-c", code, sock_path, *(x.decode() for x in lines)]
    if uid is not None:
        argv = ["setpriv", f"--reuid={uid}", f"--regid={uid}", "--clear-groups", *argv]
    r = subprocess.run(argv, capture_output=True, timeout=30, cwd="/")
    assert r.returncode == 0, r.stderr[-1000:]
    return r.stdout


def test_a_stranger_on_the_channel_is_refused_and_changes_nothing(tmp_path: Path) -> None:
    """Another user (even with the socket file opened up to everyone) is dropped before
    a byte is read; the run's own user without the attempt's secret gets nothing and
    changes nothing (a forged upstream would have sent the harness's requests to a dead
    port); with the secret, the channel answers."""
    over = slow_overlay(tmp_path, latency=1.5, think="0.5", concurrency=1)
    state = tmp_path / "state"
    p = spawn_cli(*demo(state, over), log=tmp_path / "run.log")
    try:
        ev = started(state) and next(e for e in events(state) if e["event"] == "cell_started")
        d = state / "datapath" / ev["cell"] / "attempt-1"
        wait_for(lambda: (d / "ctl.sock").exists(), 30, "the channel")
        # The same socket under a short name anyone may reach (a hard link: one inode,
        # opened to all), as a mistake in the state dir's modes would expose it: the
        # kernel's word on the caller's uid is the last line, and it must hold alone.
        link = Path(f"/tmp/ap-knock-{os.getpid()}.sock")
        link.unlink(missing_ok=True)
        os.link(d / "ctl.sock", link)
        try:
            os.chmod(link, 0o666)
            forged = json.dumps({"op": "wait", "timeout": 0,
                                 "upstream": [["0", "http://127.0.0.1:9"]]}).encode()
            hello = json.dumps({"op": "hello", "secret": "0" * 32, "version": 1}).encode()
            assert _knock(str(link), [hello, forged], uid=65534) == b""
            assert _knock(str(link), [hello, forged]) == b""
            secret = json.loads((d / "secret").read_text())["secret"]
            good = json.dumps({"op": "hello", "secret": secret, "version": 1}).encode()
            reply = json.loads(_knock(str(link), [good]).splitlines()[0])
            assert reply["ok"] and reply["harness_pid"] == ev["pid"]
        finally:
            link.unlink(missing_ok=True)
        assert p.wait(timeout=300) == 0
    finally:
        gone(p)
    got = verdicts(events(state))
    assert got and {c: v for c, v in got.items() if v[0].startswith("INVALID")} == {}
    assert Counter(a for _, a in got.values()) == Counter({1: len(got)})


def test_the_data_path_needs_its_spec_and_says_so() -> None:
    r = subprocess.run([sys.executable, "-m", "autopilot.datapath.process"], input=b"{}",
                       capture_output=True, timeout=60, cwd=ROOT, env=cli_env())
    assert r.returncode == 2 and b"no spec of version 1" in r.stderr


def test_channel_messages_are_bounded_and_shape_checked() -> None:
    from autopilot.datapath import wire
    from autopilot.datapath.client import meter_from

    assert wire.decode(b"[1]") is None and wire.decode(b"nan") is None
    assert wire.decode(b"[" * 100000) is None  # no RecursionError reaches anyone
    assert wire.decode(b"{}" + b" " * wire.LINE_CAP) is None
    assert wire.decode(b'{"op":"hello"}') == {"op": "hello"}
    assert meter_from({"requests": -1}) is None
    assert meter_from({"requests": True}) is None
    m = meter_from({"requests": 2, "answered": 2, "models": {"m": 2, "x": "y"},
                    "unknown": 1})
    assert m is not None and m.requests == 2 and m.models == {"m": 2}
    with socket.socket(socket.AF_UNIX) as a:
        assert wire.trusted_peer(os.geteuid())
        assert not wire.trusted_peer(65534) or os.geteuid() == 65534
        del a


def test_a_supervisor_killed_while_its_endpoint_loads_leaves_the_load_to_finish(
        tmp_path: Path) -> None:
    """kill -9 while the endpoint still answers 503 "loading": the successor waits for
    that exact process to finish loading and re-adopts it; the model is loaded once."""
    over = slow_overlay(tmp_path, latency=0.1, think="0",
                        endpoint={"startup_delay_secs": 4, "probe_interval_secs": 0.25})
    state = tmp_path / "state"
    p = spawn_cli(*demo(state, over))
    try:
        spawned = wait_for(lambda: next((e for e in events(state)
                                         if e["event"] == "endpoint_spawned"), None),
                           what="the endpoint spawned")
        p.kill()
    finally:
        gone(p)
    assert not [e for e in events(state) if e["event"] == "endpoint_started"]  # loading
    r = run_cli(*demo(state, over), timeout=300)
    assert r.returncode == 0, r.stdout + r.stderr[-2000:]
    evs = events(state)
    assert sum(e["event"] == "endpoint_spawned" for e in evs) == 1
    [started] = [e for e in evs if e["event"] == "endpoint_started"]
    assert started.get("readopted") is True and started["pid"] == spawned["pid"]
    assert marked(state) == []
