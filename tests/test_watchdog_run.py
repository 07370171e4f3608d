"""Watchdogs inside real runs, against adversarial harnesses (handshakes, no sleeps)."""

from __future__ import annotations

import json
from pathlib import Path

import psutil
import pytest
from conftest import ROOT, events, run_cli, write_overlay

pytestmark = pytest.mark.slow
ADV = ROOT / "tests" / "adversaries"
CELL = "p1_bugfix_demo-nothink_v1"


def run_one(state_dir: Path, tmp: Path, argv: list[str], **extra: object):
    doc = {
        "tasks": [{"id": "p1_bugfix"}], "arms": [{"label": "demo-nothink", "mode": "nothink"}],
        "harness": {"argv": argv},
        "watchdog": {"poll_secs": 0.2, "warn_secs": 1, "probe_secs": 1.5, "kill_secs": 2.5,
                     "stuck_secs": 2, "kill_grace_secs": 0.5, "teardown_grace_secs": 1},
        "trust": {"infra_retries": 0},
        **extra,
    }
    over = write_overlay(tmp / "o.json", doc)
    r = run_cli("--preset", "demo", "--target-n", "1", "--config", str(over),
                "--state-dir", str(state_dir), "--quiet")
    return r, events(state_dir)


def verdict(evs):
    return next(e for e in evs if e["event"] == "cell_verdict")


def test_term_ignoring_double_forked_setsid_tree_is_gone(state_dir: Path, tmp_path: Path) -> None:
    # No progress at all, so idle alone climbs the tiers; stuck_secs is out of the way
    # (the transcript's clock starts at launch, idle's at the harness's READY line, so a
    # stuck_secs near probe_secs would race it).
    r, evs = run_one(state_dir, tmp_path, ["{python}", str(ADV / "unkillable_tree.py")],
                     watchdog={"poll_secs": 0.2, "warn_secs": 1, "probe_secs": 1.5,
                               "kill_secs": 2.5, "stuck_secs": 60, "kill_grace_secs": 0.5,
                               "teardown_grace_secs": 1})
    assert r.returncode == 1
    v = verdict(evs)
    assert (v["verdict"], v["reason"]) == ("INVALID", "stall")
    spool = (state_dir / "logs" / f"{CELL}.launcher.log").read_text()
    ready = next(line for line in spool.splitlines() if line.startswith("READY"))
    root, grandchild = (int(x) for x in ready.split()[1:])
    killed = next(e for e in evs if e["event"] == "cell_killed")
    assert {root, grandchild} <= set(killed["pids"])
    for pid in (root, grandchild):
        assert not psutil.pid_exists(pid) or psutil.Process(pid).status() == "zombie"
    tiers = [e["tier"] for e in evs if e["event"] == "cell_watchdog"]
    assert tiers == ["WARN", "PROBE", "KILL"]
    probe = next(e for e in evs if e["event"] == "cell_watchdog" and e["tier"] == "PROBE")
    assert probe["probe"]["alive"] is True and probe["probe"]["pids"] >= 2


def test_writes_forever_but_transcript_frozen(state_dir: Path, tmp_path: Path) -> None:
    r, evs = run_one(state_dir, tmp_path, ["{python}", str(ADV / "spew.py"), "{output_dir}"],
                     watchdog={"poll_secs": 0.2, "warn_secs": 50, "probe_secs": 60,
                               "kill_secs": 70, "stuck_secs": 2, "kill_grace_secs": 0.5})
    assert r.returncode == 1
    killed = next(e for e in evs if e["event"] == "cell_killed")
    assert "transcript frozen" in killed["reason"]
    assert verdict(evs)["reason"] == "stall"
    assert (state_dir / "logs" / f"{CELL}.launcher.log").stat().st_size > 1000


def test_early_exit_without_outputs(state_dir: Path, tmp_path: Path) -> None:
    r, evs = run_one(state_dir, tmp_path, ["{python}", str(ADV / "early_exit.py"), "3"])
    assert r.returncode == 1
    assert (verdict(evs)["verdict"], verdict(evs)["reason"]) == ("INVALID", "harness_crash")
    r, evs = run_one(tmp_path / "s2", tmp_path, ["{python}", str(ADV / "early_exit.py"), "0"])
    assert verdict(evs)["reason"] == "missing_output"


def test_finished_but_never_exits_is_teardown_masked(state_dir: Path, tmp_path: Path) -> None:
    argv = ["{python}", str(ADV / "linger.py"), "{cell}", "--task", "{task}", "--arm", "{arm}",
            "--n", "{n}", "--port", "{port}", "--model", "{model}", "--out", "{output_dir}",
            "--think-secs", "0"]
    r, evs = run_one(state_dir, tmp_path, argv)
    assert r.returncode == 0, r.stderr[-2000:]
    v = verdict(evs)
    assert v["verdict"] in ("PASS", "FAIL") and v["teardown_masked"] is True
    assert next(e for e in evs if e["event"] == "cell_killed")["kind"] == "teardown"
    status = json.loads((state_dir / "status.json").read_text())
    assert status["trust"]["teardown_masked_cells"] == 1


def test_daemon_left_behind_by_an_exited_harness_is_killed(state_dir: Path,
                                                            tmp_path: Path) -> None:
    # The root exits cleanly, but a double-forked daemon it started lives on, re-parented
    # to the supervisor (child subreaper): found among our children by the cell's token
    # and killed with the cell, never left running into the next one.
    argv = ["{python}", str(ADV / "daemonize.py"), "{cell}", "--task", "{task}", "--arm",
            "{arm}", "--n", "{n}", "--port", "{port}", "--model", "{model}", "--out",
            "{output_dir}", "--think-secs", "0"]
    pidfile = tmp_path / "daemon.pid"
    r, evs = run_one(state_dir, tmp_path, argv,
                     **{"harness": {"argv": argv, "env": {"DAEMON_PIDFILE": str(pidfile)}}})
    assert r.returncode == 0, r.stderr[-2000:]
    assert verdict(evs)["verdict"] in ("PASS", "FAIL")
    daemon = int(pidfile.read_text())
    try:
        p = psutil.Process(daemon)
        alive = p.status() != psutil.STATUS_ZOMBIE and p.environ().get(
            "AUTOPILOT_CELL_ID") == CELL
    except psutil.NoSuchProcess:
        alive = False
    if alive:
        p.kill()  # do not leak it when the feature is broken
    assert not alive
    leftovers = [json.loads(line) for line in (state_dir / "autopilot.log").open()
                 if "cell_leftovers_killed" in line]
    assert leftovers and daemon in leftovers[0]["pids"]


def test_deadline_kill_is_invalid_deadline(state_dir: Path, tmp_path: Path) -> None:
    argv = ["{python}", str(ADV / "spew.py"), "{output_dir}"]
    r, evs = run_one(state_dir, tmp_path, argv,
                     harness={"argv": argv, "wall_budget_secs": 1},
                     watchdog={"poll_secs": 0.2, "warn_secs": 50, "probe_secs": 60,
                               "kill_secs": 70, "stuck_secs": 100, "kill_grace_secs": 0.5,
                               "deadline_overhead_secs": 0.5})
    assert r.returncode == 1 and verdict(evs)["reason"] == "deadline"
    spool = (state_dir / "logs" / f"{CELL}.launcher.log").read_text()
    assert "argv" in spool


TERMINAL_THEN_HANG = (
    "import json, os, sys, time\n"
    "os.makedirs(sys.argv[1], exist_ok=True)\n"
    "open(os.path.join(sys.argv[1], 'transcript.jsonl'), 'a').write(\n"
    "    json.dumps({{'event': 'agent.completed'}}) + '\\n')\n"
    "time.sleep(3600)\n"
)


def test_terminal_transcript_row_counts_as_teardown_evidence(state_dir: Path,
                                                             tmp_path: Path) -> None:
    argv = ["{python}", "-c", TERMINAL_THEN_HANG, "{output_dir}"]
    r, evs = run_one(state_dir, tmp_path, argv, harness={
        "argv": argv, "terminal_row": {"field": "event", "values": ["agent.completed"]}},
        watchdog={"poll_secs": 0.2, "warn_secs": 50, "probe_secs": 60, "kill_secs": 70,
                  "stuck_secs": 100, "kill_grace_secs": 0.5, "teardown_grace_secs": 1})
    killed = next(e for e in evs if e["event"] == "cell_killed")
    assert killed["kind"] == "teardown"
    # no completion artifacts to grade: fail closed, never a silent pass
    assert r.returncode == 1 and verdict(evs)["reason"] == "missing_output"


@pytest.mark.parametrize("credit", [True, False])
def test_long_non_streaming_turn_is_progress_while_the_endpoint_decodes(
        state_dir: Path, tmp_path: Path, credit: bool) -> None:
    # Each model turn takes 3 s with nothing written (a non-streaming harness), past
    # stuck_secs 2: the endpoint's /slots counter moving is what tells the watchdog the
    # model is working. Without that evidence the same cell is killed as a stall.
    doc = {"tasks": [{"id": "p1_bugfix"}], "arms": [{"label": "demo-nothink", "mode": "nothink"}],
           "vars": {"think_secs": "0"}, "endpoint": {"latency_secs": 3},
           "watchdog": {"poll_secs": 0.2, "warn_secs": 1, "probe_secs": 1.5, "kill_secs": 2.5,
                        "stuck_secs": 2, "kill_grace_secs": 0.5, "endpoint_progress": credit},
           "trust": {"infra_retries": 0}}
    over = write_overlay(tmp_path / "o.json", doc)
    r = run_cli("--preset", "demo", "--target-n", "1", "--config", str(over),
                "--state-dir", str(state_dir), "--quiet", timeout=120)
    evs = events(state_dir)
    killed = [e for e in evs if e["event"] == "cell_killed"]
    if credit:
        assert r.returncode == 0, r.stdout + r.stderr[-2000:]
        assert not killed and verdict(evs)["verdict"] in ("PASS", "FAIL")
    else:
        assert r.returncode == 1
        assert killed and "transcript frozen" in killed[0]["reason"]
        assert (verdict(evs)["verdict"], verdict(evs)["reason"]) == ("INVALID", "stall")


def test_through_the_gateway_a_frozen_cell_beside_a_busy_one_is_frozen(
        state_dir: Path, tmp_path: Path) -> None:
    # Two cells at once: one in long model turns (3 s each, nothing written meanwhile),
    # one frozen with no request of its own. The endpoint decodes all along, for the
    # busy cell; without the gateway that counts for both, and the frozen cell lives
    # until the busy one is done. Through the gateway only a cell with a request in
    # flight is credited: the frozen one is killed while the busy one still works.
    doc = {"tasks": [{"id": "p1_bugfix", "vars": {"behave": "work"}},
                     {"id": "p2_extract", "vars": {"behave": "freeze"}}],
           "arms": [{"label": "demo-nothink", "mode": "nothink"}],
           "endpoint": {"latency_secs": 3},
           "harness": {"argv": ["{python}", str(ADV / "work_or_freeze.py"), "{behave}",
                                "{host}", "{port}", "{output_dir}", "{transcript}"]},
           "watchdog": {"poll_secs": 0.2, "warn_secs": 1, "probe_secs": 1.5, "kill_secs": 2.5,
                        "stuck_secs": 2, "kill_grace_secs": 0.5},
           "trust": {"infra_retries": 0}, "run": {"concurrency": 2}}
    over = write_overlay(tmp_path / "o.json", doc)
    r = run_cli("--preset", "demo", "--target-n", "1", "--config", str(over),
                "--state-dir", str(state_dir), "--quiet", timeout=120)
    evs = events(state_dir)
    busy, frozen = "p1_bugfix_demo-nothink_v1", "p2_extract_demo-nothink_v1"
    order = [(e["event"], e.get("cell")) for e in evs]
    assert ("cell_killed", busy) not in order, r.stderr[-2000:]
    assert order.index(("cell_killed", frozen)) < order.index(("cell_exited", busy))
    verdicts = {e["cell"]: (e["verdict"], e.get("reason")) for e in evs
                if e["event"] == "cell_verdict"}
    assert verdicts[frozen] == ("INVALID", "stall")
    assert verdicts[busy][0] in ("PASS", "FAIL")
    metered = {e["cell"]: e for e in evs if e["event"] == "cell_metered"}
    assert metered[busy]["requests"] == 4 and metered[frozen]["requests"] == 0
