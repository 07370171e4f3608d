"""Signals have their meaning from a process's first instruction (autopilot.sigrecord).

``systemctl restart`` sends SIGUSR2 and starts a successor; a ``systemctl stop`` or another
restart can land in that successor's first second (imports, preflight, lock, replay,
sweep), before any event loop runs. Real processes throughout: the real CLI through its
real entry point, the demo endpoint and harnesses with seconds-long requests. The moment
a signal is sent is taken from the kernel (the process catches SIGTERM and SIGUSR2, as
/proc says), then moved by a seeded random delay across the start-up.
"""

from __future__ import annotations

import os
import random
import re
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import psutil
import pytest
from conftest import ROOT, events, run_cli, spawn_cli, wait_for
from test_live_restore import demo, gone, marked, slow_overlay, started, verdicts

from autopilot.run.recovery import STOPPED_AT_START

pytestmark = pytest.mark.slow


def catches(pid: int, *sigs: int) -> bool:
    """Whether the process has a handler for each of ``sigs`` (its SigCgt mask)."""
    try:
        status = Path(f"/proc/{pid}/status").read_text()
    except OSError:
        return False
    line = next(x for x in status.splitlines() if x.startswith("SigCgt:"))
    mask = int(line.split()[1], 16)
    return all(mask >> (s - 1) & 1 for s in sigs)


def handed_over(tmp: Path, state: Path, over: Path) -> list[int]:
    """A run with three attempts mid-request, handed over (exit 140): what it left."""
    p = spawn_cli(*demo(state, over), log=tmp / "first.log")
    try:
        started(state, 3)
        os.kill(p.pid, signal.SIGUSR2)
        assert p.wait(timeout=60) == 140
    finally:
        gone(p)
    left = marked(state)
    assert left  # the endpoint and the data paths with their harnesses
    # What an operator looks for in `ps` (docs/runbook.md): the data paths by name.
    parents = {psutil.Process(pid).ppid() for pid in left}  # a harness's: its data path
    titles = [" ".join(psutil.Process(pid).cmdline()).strip() for pid in parents]
    paths = [t for t in titles if t.startswith("autopilot data path ")]
    assert paths and all(re.fullmatch(r"autopilot data path [a-z0-9_-]+_v1 attempt 1", t)
                         for t in paths), titles
    return left


def signalled_at_start(state: Path, over: Path, sig: int, delay: float,
                       log: Path) -> int:
    """A successor, sent ``sig`` ``delay`` seconds after it can catch it; its exit code."""
    p = spawn_cli(*demo(state, over), log=log)
    try:
        wait_for(lambda: catches(p.pid, signal.SIGTERM, signal.SIGUSR2) or
                 p.poll() is not None, 30, "the successor's handlers")
        time.sleep(delay)  # the moment under test, not a wait for a condition
        os.kill(p.pid, sig)
        return p.wait(timeout=120)
    finally:
        gone(p)


@pytest.mark.parametrize("trial", range(3))
def test_a_stop_during_start_up_ends_what_the_predecessor_left(
        tmp_path: Path, trial: int) -> None:
    """``systemctl stop`` in a successor's start-up (at its first instruction that can
    catch it, then later): exit 143 with AUTOPILOT_STOPPED, and no process of the run
    left, the handed-over attempts and endpoint included (``KillMode=process`` means
    systemd would not end them)."""
    over = slow_overlay(tmp_path, latency=0.9, think="0.3", concurrency=3)
    state = tmp_path / "state"
    handed_over(tmp_path, state, over)
    delay = [0.0, *random.Random(20261205).sample([0.15, 0.4, 0.7, 1.0], 2)][trial]
    log = tmp_path / "second.log"
    code = signalled_at_start(state, over, signal.SIGTERM, delay, log)
    out = log.read_text()
    assert code == 143, out[-3000:]
    assert "AUTOPILOT_STOPPED by SIGTERM" in out
    assert marked(state) == []  # no attempt, no data path, no endpoint
    evs = events(state)
    assert evs[-1]["event"] == "run_finished" and evs[-1]["outcome"] == "stopped"
    assert sum(e["event"] == "endpoint_spawned" for e in evs) == 1  # nothing new started


def test_a_hand_over_during_start_up_leaves_everything_to_the_next(tmp_path: Path) -> None:
    """``systemctl restart`` twice in a row: the second SIGUSR2 lands in the successor's
    first instruction that can catch it. It exits 140 having ended nothing; the third
    supervisor re-attaches to the same attempts and endpoint: nothing re-run, the model
    loaded once."""
    over = slow_overlay(tmp_path, latency=0.9, think="0.3", concurrency=3)
    state = tmp_path / "state"
    left = handed_over(tmp_path, state, over)
    log = tmp_path / "second.log"
    code = signalled_at_start(state, over, signal.SIGUSR2, 0.0, log)
    assert code == 140, log.read_text()[-3000:]
    assert "AUTOPILOT_HANDED_OVER" in log.read_text()
    assert set(left) <= set(marked(state))  # everything it found still runs
    # The gap until a successor: every view says hand-over, none "stopped"/"interrupted".
    shown = run_cli("validate", "--state-dir", str(state))
    assert "RUNNING=3" in shown.stdout and "PENDING" not in shown.stdout, (
        shown.stdout)
    dash = run_cli("--state-dir", str(state), "--oneline", prog="dashboard")
    assert "handing over" in dash.stdout and "supervisor gone" not in dash.stdout, (
        dash.stdout + dash.stderr)
    r = subprocess.run([sys.executable, "-m", "autopilot", *demo(state, over)], cwd=ROOT,
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stdout + r.stderr[-2000:]
    evs = events(state)
    assert sum(e["event"] == "endpoint_spawned" for e in evs) == 1
    assert [e for e in evs if e["event"] == "cell_abandoned"] == []
    assert {c: a for c, (_, a) in verdicts(evs).items() if a != 1} == {}
    assert marked(state) == []


@pytest.mark.parametrize("verb", ["schema", "presets"])
def test_a_command_that_is_not_a_run_keeps_the_usual_meaning_of_a_stop(verb: str) -> None:
    """What the entry point recorded for a run is given back to any other command: a
    SIGTERM that came while it started is delivered then (death by SIGTERM, not exit 0)."""
    code = ("import os, signal, sys; from autopilot import sigrecord; sigrecord.install(); "
            "os.kill(os.getpid(), signal.SIGTERM); "
            "from autopilot.cli import main; sys.exit(main([sys.argv[1]]))")
    r = subprocess.run([sys.executable, "-c", code, verb], cwd=ROOT, capture_output=True,
                       timeout=60)
    assert r.returncode == -signal.SIGTERM


def test_a_recorded_signal_is_asked_in_order() -> None:
    """Only SIGUSR2 so far: a hand-over; any stop signal: a stop (as Stop.request)."""
    code = ("import os, signal; from autopilot import sigrecord; sigrecord.install(); "
            "print(sigrecord.asked()); os.kill(os.getpid(), signal.SIGUSR2); "
            "print(sigrecord.asked()); os.kill(os.getpid(), signal.SIGTERM); "
            "print(sigrecord.asked()); os.kill(os.getpid(), signal.SIGUSR2); "
            "print(sigrecord.asked())")
    r = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True,
                       text=True, timeout=60)
    assert r.stdout.split() == ["None", "handover", "stop", "stop"], r.stderr


def test_the_entry_point_records_before_it_imports_the_world() -> None:
    """The window where a signal still has its default action is the interpreter's own
    start: the entry installs the recorder before anyio, pydantic or the CLI load."""
    code = ("import sys, signal; import autopilot.boot as b; from autopilot import "
            "sigrecord; sigrecord.install(); heavy = [m for m in ('anyio', 'pydantic', "
            "'autopilot.cli', 'psutil') if m in sys.modules]; "
            "print(heavy, signal.getsignal(signal.SIGTERM) is sigrecord._record)")
    r = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True,
                       text=True, timeout=60)
    assert r.stdout.strip() == "[] True", r.stdout + r.stderr


def test_an_intent_whose_harness_never_spawned_keeps_its_attempt_number(
        tmp_path: Path) -> None:
    """A supervisor killed between journaling an intent and its data path spawning the
    harness (while the fork server starts, say) leaves attempts no harness touched: the
    successor abandons each as never started, uncharged, and its attempt number is used
    again, so kills at start-up do not make a cell's attempt count climb. One whose data
    path did spawn its harness (it recorded datapath.json) is not one of them."""
    import anyio

    from autopilot.datapath import wire
    from autopilot.loader import load_preset
    from autopilot.plan import Plan
    from autopilot.run.recovery import Swept, reattach_datapaths
    from autopilot.state.journal import Journal
    from autopilot.state.ledger import Ledger

    preset = load_preset("demo")
    plan = Plan(preset, 1)
    ledger = Ledger(plan)
    journal = Journal(tmp_path / "journal.jsonl")
    a, b = plan.cells[0].id, plan.cells[1].id

    def emit(event: Any, **fields: Any) -> dict[str, Any]:
        if not isinstance(event, str):
            fields = {**event.model_dump(exclude_unset=True, exclude={"ts", "event"}),
                      **fields}
            event = event.event
        rec = journal.append(event, **fields)
        ledger.apply(rec)
        return rec

    for _ in range(5):  # five start-up kills, each after cell a's intent
        attempt = ledger.cells[a].attempts + 1
        emit("cell_spawning", cell=a, attempt=attempt, token=f"t{attempt}")
        wire.attempt_dir(tmp_path, a, attempt).mkdir(parents=True, exist_ok=True)
        anyio.run(reattach_datapaths, preset, plan, tmp_path, ledger, emit, Swept())
    assert ledger.cells[a].attempts == 0 and ledger.cells[a].status == "pending"
    emit("cell_spawning", cell=b, attempt=1, token="tb")
    spawned = wire.attempt_dir(tmp_path, b, 1)
    spawned.mkdir(parents=True)
    wire.write_private_json(spawned / wire.RECORD, {"version": wire.VERSION, "pid": 1})
    found = Swept()
    lost = anyio.run(reattach_datapaths, preset, plan, tmp_path, ledger, emit, found)
    assert b not in found.never_started and b in lost  # its data path ran, and is gone
    assert ledger.cells[b].attempts == 1
    journal.close()


def test_autopilot_stop_ends_a_handed_over_run_and_leaves_a_finished_one_alone(
        tmp_path: Path) -> None:
    """`autopilot stop` (the unit's ExecStopPost after a stop that replaced a restart):
    on a handed-over run it ends every leftover and journals it; on a run that ended
    itself it changes nothing."""
    over = slow_overlay(tmp_path, latency=0.9, think="0.3", concurrency=3)
    state = tmp_path / "state"
    handed_over(tmp_path, state, over)
    r = run_cli("stop", "--state-dir", str(state))
    assert r.returncode == 0, r.stderr[-2000:]
    assert marked(state) == []
    kinds = [e["event"] for e in events(state)]
    assert "leftovers_stopped" in kinds
    # an attempt it ended is said to be stopped, not taken for a restart's
    assert all(e["why"] == STOPPED_AT_START for e in events(state)
               if e["event"] == "cell_abandoned")
    assert [e for e in events(state) if e["event"] == "run_finished"][-1]["outcome"] \
        == "stopped"
    before = (state / "journal.jsonl").read_bytes()
    again = run_cli("stop", "--state-dir", str(state))
    assert again.returncode == 0 and again.stdout.startswith("nothing to stop: the run "
                                                             "ended (stopped)")
    assert (state / "journal.jsonl").read_bytes() == before
