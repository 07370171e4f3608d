"""Endpoint replicas on one machine (no Ray): cells go to a replica with a free slot, an
arm may be pinned, one replica dying over and over slows the run instead of stopping it,
and the run ends endpoint_failed only when no replica can serve."""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

import pytest
from conftest import events, run_cli, write_overlay

CRASHY = {"AUTOPILOT_DEMO_CRASH_AFTER": "3"}  # the demo endpoint dies after 3 requests


def run(tmp_path: Path, overlay: dict, n: int = 3) -> tuple[int, Path]:
    state = tmp_path / "state"
    over = write_overlay(tmp_path / "o.json", {"vars": {"think_secs": "0.05"}, **overlay})
    r = run_cli("--preset", "demo", "--target-n", str(n), "--config", str(over),
                "--state-dir", str(state), "--quiet")
    return r.returncode, state


@pytest.mark.slow
def test_one_replica_dying_again_and_again_slows_the_run_but_never_stops_it(
        tmp_path: Path) -> None:
    code, state = run(tmp_path, {"endpoint": {"replicas": 3,
                                              "replica_env": [{}, CRASHY, {}]},
                                 "run": {"concurrency": 6}})
    assert code == 0
    evs = events(state)
    where = Counter(e["replica"] for e in evs if e["event"] == "cell_started")
    assert where[0] > 0 and where[2] > 0  # the healthy replicas kept serving
    restarts = Counter(e.get("replica") for e in evs if e["event"] == "endpoint_restart")
    assert restarts and set(restarts) == {1}  # only the faulty one was restarted
    valid = Counter(e["cell"] for e in evs if e["event"] == "cell_verdict"
                    and e["verdict"] in ("PASS", "FAIL"))
    status = json.loads((state / "status.json").read_text())
    assert status["phase"] == "COMPLETE" and set(valid.values()) == {1}
    assert len(valid) == status["totals"]["total"] == 36
    ports = {ep["url"] for ep in status["endpoints"]}
    assert len(status["endpoints"]) == 3 and len(ports) == 3
    assert (state / "endpoint-1.log").exists() and (state / "endpoint-2.log").exists()


def test_a_pinned_arm_runs_only_on_its_replicas(tmp_path: Path) -> None:
    code, state = run(tmp_path, {"endpoint": {"replicas": 2},
                                 "arms": [{"label": "demo-nothink", "mode": "nothink"},
                                          {"label": "demo-think", "mode": "think",
                                           "replicas": [1]}],
                                 "tasks": [{"id": "p1_bugfix"}, {"id": "p2_extract"}]}, n=2)
    assert code == 0
    think = {e["replica"] for e in events(state)
             if e["event"] == "cell_started" and "_demo-think_" in e["cell"]}
    assert think == {1}


def test_the_run_fails_only_when_no_replica_can_serve(tmp_path: Path) -> None:
    code, state = run(tmp_path, {
        "endpoint": {"replicas": 2, "replica_env": [CRASHY, CRASHY], "max_restarts": 1,
                     "restart_window_secs": 600},
        "tasks": [{"id": "p1_bugfix"}, {"id": "p2_extract"}, {"id": "p3_market"}]})
    assert code == 1
    evs = events(state)
    failed = [e for e in evs if e["event"] == "milestone" and e["kind"] == "endpoint_failed"]
    assert {e.get("replica") for e in failed} == {0, 1}  # both gave up, each said so
    status = json.loads((state / "status.json").read_text())
    assert status["phase"] == "INCOMPLETE" and "replica" in status["outcome_reason"]


@pytest.mark.parametrize(("overlay", "why"), [
    ({"endpoint": {"replicas": 2, "replica_env": [{}, {}, {}]}}, "3 entries for 2 replica"),
    ({"endpoint": {"replicas": 2}, "arms": [{"label": "demo-nothink", "mode": "nothink"},
                                             {"label": "demo-think", "mode": "think",
                                              "replicas": [2]}]}, "outside 0..1"),
    ({"endpoint": {"replicas": 2}, "arms": [
        {"label": "demo-think", "mode": "think", "endpoint": {"args": ["--x"]}},
        {"label": "demo-nothink", "mode": "nothink"}]}, "same endpoint settings"),
])
def test_replica_config_errors(tmp_path: Path, overlay: dict, why: str) -> None:
    over = write_overlay(tmp_path / "o.json", overlay)
    r = run_cli("--preset", "demo", "--target-n", "1", "--config", str(over), "--dry-run",
                "--state-dir", str(tmp_path / "s"))
    assert r.returncode == 2 and why in r.stderr


def test_dry_run_prints_the_placement(tmp_path: Path) -> None:
    over = write_overlay(tmp_path / "o.json", {
        "endpoint": {"replicas": 2, "port": 18100, "slots": 3,
                     "replica_env": [{"CUDA_VISIBLE_DEVICES": "0"},
                                     {"CUDA_VISIBLE_DEVICES": "1"}]}})
    r = run_cli("--preset", "demo", "--target-n", "1", "--config", str(over), "--dry-run",
                "--state-dir", str(tmp_path / "s"))
    assert r.returncode == 0, r.stderr
    assert "replica 0: this machine, port 18100, 3 slot(s), env CUDA_VISIBLE_DEVICES=0" \
        in r.stdout
    assert "replica 1: this machine, port 18101, 3 slot(s), env CUDA_VISIBLE_DEVICES=1" \
        in r.stdout


def test_docker_replicas_get_their_own_gpus_name_and_port(tmp_path: Path) -> None:
    from autopilot.endpoints import make_endpoint
    from autopilot.loader import load_preset

    over = write_overlay(tmp_path / "o.json", {"endpoint": {
        "engine": "llamacpp", "mode": "docker", "model_path": "/models/m.gguf", "port": 18200,
        "replicas": 2, "docker": {"image": "img", "container_name": "llm", "gpus": "all"},
        "replica_env": [{"CUDA_VISIBLE_DEVICES": "0,1"}, {"CUDA_VISIBLE_DEVICES": "2",
                                                          "EXTRA": "x"}]}})
    preset = load_preset("demo", overlay=str(over))
    one, two = (make_endpoint(preset, tmp_path / "s", i) for i in (0, 1))
    assert (one.container_name(), two.container_name()) == ("llm", "llm-1")
    assert (one.port, two.port) == (18200, 18201)
    c1, c2 = one.container_config(), two.container_config()
    assert c1["HostConfig"]["DeviceRequests"][0]["DeviceIDs"] == ["0", "1"]
    assert c2["HostConfig"]["DeviceRequests"][0]["DeviceIDs"] == ["2"]
    assert "EXTRA=x" in c2["Env"] and not any(e.startswith("CUDA_VISIBLE") for e in c2["Env"])
    assert c2["Labels"]["autopilot.replica"] == "1"
    assert two.log_path.name == "endpoint-1.log"


@pytest.mark.slow
def test_a_replica_dying_mid_cell_costs_a_request_not_the_cell(tmp_path: Path) -> None:
    # Replica 0 dies in the middle of its 4th request (each cell talks to the model in
    # several turns): the gateway sends that request, and the cell's next ones, to
    # replica 1; no cell loses its conversation, no attempt is INVALID.
    state, prom = tmp_path / "state", tmp_path / "autopilot.prom"
    over = write_overlay(tmp_path / "o.json", {
        "vars": {"think_secs": "0.05"},
        "endpoint": {"replicas": 2, "replica_env": [CRASHY, {}], "down_restart_secs": 30},
        "tasks": [{"id": "p1_bugfix"}, {"id": "p2_extract"}],
        "run": {"concurrency": 2}, "trust": {"infra_retries": 0}})
    code = run_cli("--preset", "demo", "--target-n", "2", "--config", str(over),
                   "--state-dir", str(state), "--quiet", "--metrics-textfile",
                   str(prom)).returncode
    evs = events(state)
    assert code == 0, [e for e in evs if e["event"] == "cell_verdict"]
    failovers = [e for e in evs if e["event"] == "request_failover"]
    assert failovers and all((e["replica"], e["to"]) == (0, 1) for e in failovers)
    verdicts = [e for e in evs if e["event"] == "cell_verdict"]
    assert len(verdicts) == 8 and all(e["verdict"] in ("PASS", "FAIL") for e in verdicts)
    moved = {e["cell"] for e in failovers}
    metered = {e["cell"]: e for e in evs if e["event"] == "cell_metered"}
    assert all(metered[c]["failovers"] >= 1 for c in moved)
    status = json.loads((state / "status.json").read_text())
    assert status["gateway"]["failovers"] == len(failovers)
    text = prom.read_text()
    assert f'autopilot_request_failovers_total{{preset="demo"}} {len(failovers)}.0' in text
