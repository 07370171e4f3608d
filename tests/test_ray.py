"""The Ray backend (autopilot.backends.ray.head) against a real Ray cluster, no mocks.

On this 2-core machine the cluster's "nodes" are three raylets on one host, each with its
own custom resource so that replica i lands on node i (tests/ray_scenario.py). Every
cluster, and the supervisor under test, runs inside a fresh network namespace with only
loopback (``unshare -n``, then ``ip link set lo up``): Ray binds its services to the
host's interface and probes a public address to find it, and here it finds 127.0.0.1
and nothing else, so no Ray traffic can leave the machine.
"""

from __future__ import annotations

import json
import subprocess
import sys
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
from conftest import ROOT, cli_env, events, run_cli, write_overlay
from test_run import assert_each_cell_once_and_never_rerun

from autopilot.errors import EXIT_HANDOVER, EXIT_INCOMPLETE, EXIT_SIGTERM
from autopilot.state.fsutil import parse_iso


@pytest.fixture(scope="module")
def scenarios(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict[str, Any]]:
    """One 3-node cluster; first a node is lost mid-run, then a supervisor is SIGKILLed
    mid-run and resumed, then one is SIGKILLed and cleaned up after (a fresh state dir
    each)."""
    out = tmp_path_factory.mktemp("ray")
    r = subprocess.run(
        ["unshare", "-n", "--", sys.executable, str(ROOT / "tests" / "ray_scenario.py"),
         "node-loss,sigkill,handover,cleanup,sigterm,ship,recreate,failover", str(out)],
        capture_output=True, text=True, timeout=1500, env=cli_env(), cwd=ROOT)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    return out, json.loads((out / "result.json").read_text())


def _valid_on(evs: list[dict[str, Any]]) -> dict[str, int]:
    """The replica each cell's valid attempt ran on."""
    started = {(e["cell"], e["attempt"]): e.get("replica") for e in evs
               if e["event"] == "cell_started"}
    return {e["cell"]: started[(e["cell"], e["attempt"])] for e in evs
            if e["event"] == "cell_verdict" and e["verdict"] in ("PASS", "FAIL")}


def _completed(scenarios: tuple[Path, dict[str, Any]], name: str
               ) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """What scenario ``name`` reported, and its journal; it must have ended COMPLETE."""
    out, result = scenarios
    got = result[name]
    assert got["code"] == 0, got["output"]
    return got, events(out / name)


def test_node_lost_mid_run_ends_complete_with_its_cells_rerun_elsewhere(
        scenarios: tuple[Path, dict[str, Any]]) -> None:
    out = scenarios[0]
    got, evs = _completed(scenarios, "node-loss")
    placed = {e["replica"]: e["node"] for e in evs if e["event"] == "ray_replica_started"}
    assert sorted(placed) == [0, 1, 2] and len(set(placed.values())) == 3  # a node each
    lost = [e for e in evs if e["event"] == "milestone" and e["kind"] == "node_lost"]
    assert [e["replica"] for e in lost] == [2]
    lost_cells = {e["cell"] for e in evs if e["event"] == "cell_verdict"
                  and e.get("reason") == "node_lost"}
    assert lost_cells, "the node was removed while replica 2 ran cells"
    assert all(e["verdict"] == "INVALID" for e in evs
               if e["event"] == "cell_verdict" and e.get("reason") == "node_lost")
    on = _valid_on(evs)
    assert all(on[c] != 2 for c in lost_cells), "re-run on a replica that still exists"
    assert_each_cell_once_and_never_rerun(evs, 24)
    # nothing of the lost lease outlived it: its harnesses and endpoint were swept
    assert got["leftover"] == [] and got["marked"] == []
    assert any(e["event"] == "lease_swept" and e["lease"] == got["lost_lease"] for e in evs)
    status = json.loads((out / "node-loss" / "status.json").read_text())
    assert status["phase"] == "COMPLETE"
    assert status["trust"]["invalid_by_reason"] == {"node_lost": len(lost_cells)}
    ends = {e["replica"]: e for e in status["endpoints"]}
    assert ends[2]["state"] in ("lost", "failed") and ends[0]["state"] == "stopped"
    assert ends[0]["backend"] == "ray" and ends[1]["node"] == placed[1]
    # every view shows the replicas and their nodes (the terminal grid, the html page)
    grid = run_cli("--state-dir", str(out / "node-loss"), "--no-color", prog="dashboard",
                   env=cli_env(COLUMNS="400"))
    assert grid.returncode == 0, grid.stderr
    line = next(x for x in grid.stdout.splitlines() if x.startswith("replicas: "))
    assert f"0 stopped 0/2 slots on {ends[0]['host']} node {placed[0]}" in line
    assert f"2 {ends[2]['state']} 0/2 slots" in line


def test_a_supervisor_sigkilled_again_and_again_reattaches_and_loses_nothing(
        scenarios: tuple[Path, dict[str, Any]]) -> None:
    got, evs = _completed(scenarios, "sigkill")
    kills = len(got["at_kill"])
    assert kills >= 5, got["at_kill"]
    assert sum(e["event"] == "run_started" for e in evs) >= kills  # (a kill may beat it)
    # Each successor proved the actors its own and re-attached to every one of them:
    # none reaped, no model loaded twice, and the first session's leases served it all.
    assert not [e for e in evs if e["event"] == "ray_actor_reaped"]
    assert sorted(e["replica"] for e in evs if e["event"] == "endpoint_spawned") == [0, 1, 2]
    assert len(got["leases"]) == 3
    reattached = [e for e in evs if e["event"] == "ray_actor_reattached"]
    assert len(reattached) >= 3 * (kills - 1) and {e["lease"] for e in reattached} == set(
        got["leases"])
    # Every attempt running at a kill ended as that same attempt, judged once.
    judged = Counter((e["cell"], e["attempt"]) for e in evs if e["event"] == "cell_verdict")
    for running in got["at_kill"]:
        for cell, attempt in running:
            assert judged[(cell, attempt)] == 1, (cell, attempt)
    assert not [e for e in evs if e["event"] in ("cell_abandoned", "orphan_killed")]
    # A node's report is journaled once, whichever supervisor read it.
    started = Counter((e["cell"], e["attempt"]) for e in evs if e["event"] == "cell_started")
    assert set(started.values()) == {1}
    assert_each_cell_once_and_never_rerun(evs, 24)
    assert got["leftover"] == []  # the run's end stopped what its leases ran


def test_a_hand_over_leaves_the_nodes_cells_running_for_the_successor(
        scenarios: tuple[Path, dict[str, Any]]) -> None:
    got, evs = _completed(scenarios, "handover")
    assert got["codes"] == [EXIT_HANDOVER, EXIT_HANDOVER]
    assert got["alive_between"]  # the actors (and what they ran) outlived the supervisor
    assert not [e for e in evs if e["event"] == "ray_actor_reaped"]
    assert sorted(e["replica"] for e in evs if e["event"] == "endpoint_spawned") == [0, 1, 2]
    assert len(got["leases"]) == 3
    judged = Counter((e["cell"], e["attempt"]) for e in evs if e["event"] == "cell_verdict")
    for running in got["at_handover"]:
        for cell, attempt in running:
            assert judged[(cell, attempt)] == 1, (cell, attempt)
    # nothing of a node's attempt was taken for a predecessor's orphan: not its harness,
    # not its grader (which carries the lease as its harness does)
    assert not [e for e in evs
                if e["event"] in ("cell_abandoned", "orphan_killed", "grade_retry")]
    assert_each_cell_once_and_never_rerun(evs, 24)
    assert got["leftover"] == []


def test_cleanup_reaches_every_node_after_a_sigkilled_supervisor(
        scenarios: tuple[Path, dict[str, Any]]) -> None:
    _, result = scenarios
    got = result["cleanup"]
    assert got["code"] == 0, got["output"]
    assert got["alive_before"], "the killed supervisor's actors were running cells"
    assert got["leftover"] == []
    stopped = [x for x in got["output"].splitlines() if x.startswith("removed ray actor ")]
    assert len(stopped) == 3, got["output"]
    assert "removed ray placement group " in got["output"]
    assert "nothing to clean up" in got["again"]  # nothing of the run is left anywhere


def test_sigterm_abandons_the_cells_on_every_node(
        scenarios: tuple[Path, dict[str, Any]]) -> None:
    out, result = scenarios
    got = result["sigterm"]
    assert got["code"] == EXIT_SIGTERM, got["output"]
    assert "--state-dir" in got["output"]  # the line that says how to resume
    evs = events(out / "sigterm")
    abandoned = {(e["cell"], e["attempt"]) for e in evs if e["event"] == "cell_abandoned"}
    on = {(e["cell"], e["attempt"]): e.get("replica") for e in evs
          if e["event"] == "cell_started"}
    assert len({on[k] for k in abandoned}) >= 2, "cells of two nodes were abandoned"
    judged = {(e["cell"], e["attempt"]) for e in evs if e["event"] == "cell_verdict"}
    assert not abandoned & judged  # abandoned, never judged (no FAIL, no INVALID)
    assert got["leftover"] == []


def test_without_shared_storage_nodes_ship_each_attempts_files_back(
        scenarios: tuple[Path, dict[str, Any]]) -> None:
    out = scenarios[0]
    got, evs = _completed(scenarios, "ship")
    state = out / "ship"
    valid = {e["cell"] for e in evs
             if e["event"] == "cell_verdict" and e["verdict"] in ("PASS", "FAIL")}
    assert len(valid) == 24
    for cell in valid:  # where a local run puts them, before its verdict was journaled
        for name in ("transcript.jsonl", "summary.json", "grade.json", "answer.txt"):
            assert (state / "cells" / cell / name).is_file(), (cell, name)
        assert (state / "logs" / f"{cell}.launcher.log").is_file()
    order = [(e["event"], e["cell"]) for e in evs
             if e["event"] in ("cell_files_received", "cell_verdict")]
    for cell in valid:
        got_at = order.index(("cell_files_received", cell))
        assert got_at < order.index(("cell_verdict", cell))
    # they ran in the nodes' private mirrors, not in the head's state dir
    mirrors = list(Path(got["node_dir"]).iterdir())
    assert len(mirrors) == 1 and len(list((mirrors[0] / "cells").iterdir())) == 24
    assert (mirrors[0].stat().st_mode & 0o777) == 0o700
    report = run_cli("report", "--state-dir", str(state))
    assert report.returncode == 0 and "24" in report.stdout, report.stderr


def test_a_lost_replica_is_recreated_where_its_resources_come_back(
        scenarios: tuple[Path, dict[str, Any]]) -> None:
    _, evs = _completed(scenarios, "recreate")
    starts = [i for i, e in enumerate(evs)
              if e["event"] == "ray_replica_started" and e["replica"] == 2]
    assert len(starts) == 2, "replica 2: started, lost, recreated"
    first, second = (evs[i] for i in starts)
    assert first["lease"] != second["lease"] and first["node"] != second["node"]
    kinds = [(e["kind"], e.get("replica")) for e in evs if e["event"] == "milestone"]
    assert ("node_lost", 2) in kinds and ("endpoint_restart", 2) in kinds
    # the pinned arm ran only on replica 2, and finished on its second incarnation
    on = _valid_on(evs)
    think = {c: r for c, r in on.items() if "demo-think" in c}
    assert len(think) == 12 and set(think.values()) == {2}
    after = {e["cell"] for e in evs[starts[1]:] if e["event"] == "cell_started"}
    assert after & set(think)
    assert_each_cell_once_and_never_rerun(evs, 24)


def test_a_request_fails_over_to_a_replica_on_another_node(
        scenarios: tuple[Path, dict[str, Any]]) -> None:
    _, evs = _completed(scenarios, "failover")
    failovers = [e for e in evs if e["event"] == "request_failover"]
    # replica 1's node sent them on: to replica 0 or 2, each on a node of its own
    assert failovers and {(e["replica"], e["to"]) for e in failovers} <= {(1, 0), (1, 2)}
    nodes = {e["replica"]: e["node"] for e in evs if e["event"] == "ray_replica_started"}
    assert len(set(nodes.values())) == 3
    verdicts = [e for e in evs if e["event"] == "cell_verdict"]
    assert verdicts and all(e["verdict"] in ("PASS", "FAIL") for e in verdicts), verdicts
    moved = {e["cell"] for e in failovers}
    metered = {e["cell"]: e for e in evs if e["event"] == "cell_metered"}
    assert all(metered[c]["failovers"] >= 1 for c in moved)


def test_a_node_cut_off_is_fenced_before_its_cells_run_elsewhere_and_counts_once(
        tmp_path: Path) -> None:
    """Three nodes in network namespaces of their own (tests/netns.py); replica 2's link
    is cut mid-cell for longer than its lease (6 s), then healed."""
    r = subprocess.run([sys.executable, str(ROOT / "tests" / "ray_scenario.py"), "partition",
                        str(tmp_path)], capture_output=True, text=True, timeout=900,
                       env=cli_env(), cwd=ROOT)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    got = json.loads((tmp_path / "result.json").read_text())["partition"]
    assert got["code"] == 0 and "AUTOPILOT_COMPLETE" in got["output"], got["output"]
    evs = events(tmp_path / "partition")
    assert got["cut_off"], "replica 2 was running a cell when it was cut off"
    lost = [e for e in evs if e["event"] == "milestone" and e["kind"] == "node_lost"]
    assert [e["replica"] for e in lost] == [2]
    # Unreachable, so no sweep could end its processes: its cells waited for the lease
    # to expire, by which time the actor had fenced itself ...
    fenced = [e for e in evs if e["event"] == "lease_fenced"]
    assert [(e["lease"], e["how"]) for e in fenced] == [(got["lease"], "expired")]
    assert got["fenced_at"] is not None
    cut = [(c, a) for c, a in got["cut_off"]  # (one that ended just before the cut: not)
           if any(e["event"] == "cell_verdict" and (e["cell"], e["attempt"]) == (c, a)
                  and e["reason"] == "node_lost" for e in evs)]
    assert cut, got["cut_off"]
    for cell, attempt in cut:
        rerun = next(e for e in evs if e["event"] == "cell_spawning" and e["cell"] == cell
                     and e["attempt"] > attempt)
        # ... and no process of its lease was left on the node when the cell ran again
        assert got["fenced_at"] <= parse_iso(rerun["ts"]), (got["fenced_at"], rerun["ts"])
    assert_each_cell_once_and_never_rerun(evs, 24)
    totals = json.loads((tmp_path / "partition" / "status.json").read_text())["totals"]
    assert totals["done"] == totals["total"] == totals["pass"] + totals["fail"] == 24
    assert totals["invalid"] == 0  # the cut attempt is not a cell: the board counts 24
    assert got["leftover"] == []  # after the heal, nothing of the old lease runs


def test_docker_endpoints_and_sandboxes_live_on_their_own_nodes_daemon(
        tmp_path: Path) -> None:
    """Two nodes, a private dockerd each (the raylet's DOCKER_HOST): the MMBT shape, a
    Docker-mode endpoint per replica and a sandbox container per cell; node 1 is lost
    mid-run (its raylet killed), leaving its endpoint and sandboxes on its daemon."""
    r = subprocess.run(["unshare", "-n", "--", sys.executable,
                        str(ROOT / "tests" / "ray_scenario.py"), "docker", str(tmp_path)],
                       capture_output=True, text=True, timeout=900, env=cli_env(), cwd=ROOT)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    got = json.loads((tmp_path / "result.json").read_text())["docker"]
    assert got["code"] == 0 and "AUTOPILOT_COMPLETE" in got["output"], got["output"]
    created = [set(names) for names in got["created"]]
    name = got["name"]
    # each replica's endpoint container on its own node's daemon, and only there
    assert name in created[0] and name not in created[1]
    assert f"{name}-1" in created[1] and f"{name}-1" not in created[0]
    evs = events(tmp_path / "docker")
    ran: dict[str, set[int]] = {}
    started: dict[tuple[str, int], int] = {}
    for e in evs:
        if e["event"] == "cell_started":
            ran.setdefault(e["cell"], set()).add(e["replica"])
            started[(e["cell"], e["attempt"])] = e["replica"]
        elif e["event"] == "cell_verdict" and e["reason"] == "node_lost":
            # ran on the lost node 1, whose report of the start may have died with it
            ran.setdefault(e["cell"], set()).add(1)
    assert len(ran) == 12 and set().union(*ran.values()) == {0, 1}
    finished = {e["cell"]: started[(e["cell"], e["attempt"])] for e in evs
                if e["event"] == "cell_verdict" and e["verdict"] in ("PASS", "FAIL")}
    assert set(finished) == set(ran)
    for cell, replicas in ran.items():
        # A cell's sandbox only on a node where its harness ran, and there on the node
        # whose attempt finished it; a harness lost with node 1 may have gone before
        # it made one (launched as the node went).
        boxes = {k for k in (0, 1) if f"bench-sandbox-{cell}" in created[k]}
        assert finished[cell] in boxes and boxes <= replicas, (cell, boxes, replicas)
    # The lost node's cells ran again on replica 0, once; what it left on its daemon
    # (its endpoint container, the sandboxes of the cells it ran) went with its lease's
    # sweep, from the live node of the same machine, on the lost actor's own daemon.
    lost = [e for e in evs if e["event"] == "cell_verdict" and e["reason"] == "node_lost"]
    assert lost, got["running_at_loss"]  # (a cell launched as the node went is lost too)
    assert [(e["replica"], e["how"]) for e in evs if e["event"] == "lease_fenced"] == [
        (1, "swept")]
    assert_each_cell_once_and_never_rerun(evs, 12)
    assert got["left"] == [[], []]  # each daemon: nothing of the run left
    # `autopilot cleanup` after a SIGKILLed supervisor whose replica 1 actor died too:
    # what that actor left on node 1's daemon is found and removed there, by exact name
    assert f"{name}-1" in got["before_cleanup"], got["before_cleanup"]
    assert any(n.startswith("bench-sandbox-") for n in got["before_cleanup"])
    assert f"container {name}-1 on node" in got["cleanup"], got["cleanup"]
    assert got["after_cleanup"] == [[], []], got["cleanup"]


def test_ray_backend_config_errors_are_one_line_exit_2(tmp_path: Path) -> None:
    state = tmp_path / "state"
    cases = [
        ({"endpoint": {"replicas": 2}, "backend": {"kind": "ray", "shared_state_dir": True,
                                                    "resources": [{}, {}, {}]}},
         "backend.resources has 3 entries for 2 replica(s)"),
        ({"backend": {"resources": [{"GPU": 1}]}}, "backend.resources is for"),
        ({"backend": {"kind": "ray"}, "harness": {"output_dir": "/tmp/elsewhere/{cell}"}},
         "harness.output_dir: '/tmp/elsewhere/{cell}' is outside {state_dir}"),
        ({"backend": {"kind": "ray", "node_dir": "rel"}}, "must be an absolute path"),
        ({"backend": {"kind": "ray", "address": "\x1b[2J[red]x:1"}},
         "is not 'auto' or HOST:PORT"),
        ({"backend": {"kind": "ray", "resources": [{"GPU": -1}]}},
         "backend.resources[0]: amounts must be positive"),
        ({"backend": {"kind": "ray", "poll_secs": 1, "lease_secs": 3}},
         "lease_secs (3) must be at least 4 polls"),
        ({"backend": {"kind": "ray", "lease_secs": 1e309}},  # JSON's inf: never fenced
         "backend.lease_secs: Input should be a finite number"),
        ({"backend": {"kind": "ray"}, "harness": {"compose_projects": "{output_dir}/p.txt"}},
         "does not sweep Compose projects on the nodes yet"),
    ]
    for doc, words in cases:
        over = write_overlay(tmp_path / "o.json", doc)
        r = run_cli("--preset", "demo", "--config", str(over), "--state-dir", str(state),
                    "--dry-run")
        assert r.returncode == 2, r.stderr
        assert words in r.stderr and len(r.stderr.strip().splitlines()) == 1, r.stderr
    assert not state.exists()


def test_an_unreachable_cluster_ends_the_run_in_one_line(tmp_path: Path) -> None:
    # Nothing listens on 127.0.0.1:1: found out by a TCP connect, before Ray is asked.
    over = write_overlay(tmp_path / "o.json", {"backend": {
        "kind": "ray", "address": "127.0.0.1:1", "shared_state_dir": True}})
    r = run_cli("--preset", "demo", "--target-n", "1", "--config", str(over),
                "--state-dir", str(tmp_path / "s"), "--quiet", timeout=120)
    assert r.returncode == EXIT_INCOMPLETE, r.stderr[-2000:]
    assert ("endpoint failed to start: cannot reach the Ray cluster at 127.0.0.1:1 "
            "(backend.address)") in r.stdout + r.stderr
    assert "Traceback" not in r.stderr


def test_dry_run_prints_the_ray_placement(tmp_path: Path) -> None:
    over = write_overlay(tmp_path / "o.json", {
        "endpoint": {"replicas": 2, "slots": 3},
        "backend": {"kind": "ray", "address": "127.0.0.1:6379", "shared_state_dir": True,
                    "placement": "strict_spread", "resources": [{"GPU": 1}]}})
    r = run_cli("--preset", "demo", "--config", str(over), "--state-dir",
                str(tmp_path / "s"), "--dry-run")
    assert r.returncode == 0, r.stderr
    lines = r.stdout.splitlines()
    assert "ray cluster 127.0.0.1:6379: 2 replica actor(s), placement STRICT_SPREAD" in lines
    assert "  replica 1 -> a node with GPU=1 (Ray places it at start)" in lines
    assert any(x.startswith("replica 1: its Ray node, port free port, 3 slot(s)")
               for x in lines), lines
    # a dry run connects to nothing: no cluster is reachable at that address here
    assert "dry run: nothing launched" in lines


def test_only_a_replica_a_node_can_reach_is_offered_to_it() -> None:
    from autopilot.backends.ray.head import peer_origin

    lo = "http://127.0.0.1:8080/v1"
    assert peer_origin(lo, True, "10.0.0.2", "10.0.0.2") == "http://127.0.0.1:8080"
    assert peer_origin(lo, True, "10.0.0.2", "10.0.0.3") == ""  # another machine's loopback
    assert peer_origin("http://localhost:9/v1", True, "a", "b") == ""
    assert peer_origin("http://[::1]:9/v1", True, "a", "b") == ""
    assert peer_origin("http://10.0.0.2:8080/v1", True, "10.0.0.2", "10.0.0.3") \
        == "http://10.0.0.2:8080"
    assert peer_origin("http://gpu-2.lan:8080/v1", True, None, "x") == "http://gpu-2.lan:8080"
    assert peer_origin("http://10.0.0.2:8080/v1", False, "10.0.0.2", "10.0.0.2") == ""
    assert peer_origin("", True, "a", "a") == ""
