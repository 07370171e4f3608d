"""Drives the Ray backend against a real local Ray cluster; run *inside* a loopback-only
network namespace (tests/test_ray.py starts it with ``unshare -n``).

On this 2-core machine the cluster's "nodes" are three raylets on one host
(``ray.cluster_utils.Cluster``), each started with its own custom resource (``node0``,
``node1``, ``node2``) so that replica i's bundle can only land on node i. Ray binds its
services to the namespace's only interface, 127.0.0.1: no Ray traffic leaves it.

Scenarios (each writes its state dir under OUT/<scenario>, and ``OUT/result.json`` what the
test asserts on beside the journal):
- ``node-loss``: the demo with 3 replicas; once replica 2 runs cells, its node is
  removed (its raylet and workers killed); the run must still end COMPLETE.
- ``sigkill``: the demo with 3 replicas; the supervisor is SIGKILLed mid-run (its
  detached actors keep running), then the same command is run again.
- ``cleanup``: the same SIGKILL, then ``autopilot cleanup`` (twice) instead.
- ``sigterm``: SIGTERM mid-run: the cells are abandoned on every node, nothing is left.
- ``ship``: no shared storage: the nodes ship each attempt's files back.
- ``recreate``: an arm pinned to replica 2, whose node is removed mid-run; a node with
  the same resource joins; the replica must be recreated there for the run to finish.
- ``failover``: replica 1's endpoint dies and stays down; its node's requests go to
  another node's replica before their response begins.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

from conftest import ROOT, env_holders, events, wait_for

from autopilot.cell.procs import grade_marker


def overlay(out: Path, address: str, arms: list[dict[str, Any]] | None = None,
            **backend: Any) -> Path:
    path = out / f"ray{len(backend)}{'-pinned' if arms else ''}.json"
    path.write_text(json.dumps({
        **({"arms": arms} if arms else {}),
        "vars": {"think_secs": "0.25"},  # cells of a few seconds: a node dies mid-cell
        "endpoint": {"replicas": 3, "slots": 2},
        "run": {"concurrency": 6},
        "backend": {"kind": "ray", "address": address, "shared_state_dir": True,
                    "resources": [{"node0": 1}, {"node1": 1}, {"node2": 1}],
                    "poll_secs": 0.2, "start_timeout_secs": 60, **backend},
    }))
    return path


def cli(state: Path, over: Path) -> list[str]:
    return [sys.executable, "-m", "autopilot.cli", "--preset", "demo", "--target-n", "2",
            "--config", str(over), "--state-dir", str(state), "--quiet"]


def running_on(state: Path, replica: int) -> bool:
    """A cell of ``replica`` started and not yet ended."""
    evs = events(state)
    started = {(e["cell"], e["attempt"]) for e in evs
               if e["event"] == "cell_started" and e.get("replica") == replica}
    ended = {(e["cell"], e["attempt"]) for e in evs if e["event"] == "cell_exited"}
    return bool(started - ended)


def node_loss(cluster: Any, nodes: list[Any], out: Path) -> dict[str, Any]:
    state = out / "node-loss"
    over = overlay(out, cluster.address)
    proc = subprocess.Popen(cli(state, over), cwd=ROOT, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True)
    wait_for(lambda: running_on(state, 2) and sum(
        e["event"] == "cell_verdict" for e in events(state)) >= 3, 240,
        "replica 2 running cells")
    lease = next(e["lease"] for e in events(state)
                 if e["event"] == "ray_replica_started" and e["replica"] == 2)
    cluster.remove_node(nodes[2])
    output, _ = proc.communicate(timeout=400)
    token = (state / "run.token").read_text().strip()
    return {"code": proc.returncode, "output": output[-4000:], "lost_lease": lease,
            "leftover": env_holders("AUTOPILOT_RAY_LEASE", {lease}),
            # and nothing of the run at all once it ended: the lost node's endpoint
            # (which once lacked the lease, so its guard spared it) included
            "marked": env_holders("AUTOPILOT_RUN_TOKEN", {token, grade_marker(token)})}


def sigkill(cluster: Any, nodes: list[Any], out: Path) -> dict[str, Any]:
    nodes[2] = cluster.add_node(num_cpus=2, resources={"node2": 1},
                                object_store_memory=80 * 2**20)
    cluster.wait_for_nodes()
    state = out / "sigkill"
    over = overlay(out, cluster.address)
    proc = subprocess.Popen(cli(state, over), cwd=ROOT, stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL)
    wait_for(lambda: sum(e["event"] == "cell_verdict" for e in events(state)) >= 4
             and running_on(state, 0), 240, "a few verdicts")
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()
    leases = [e["lease"] for e in events(state) if e["event"] == "ray_replica_started"]
    second = subprocess.run(cli(state, over), cwd=ROOT, capture_output=True, text=True,
                            timeout=400)
    return {"code": second.returncode, "output": (second.stdout + second.stderr)[-4000:],
            "first_leases": leases,
            "leftover": env_holders("AUTOPILOT_RAY_LEASE", set(leases))}


def cleanup(cluster: Any, nodes: list[Any], out: Path) -> dict[str, Any]:
    """A supervisor SIGKILLed mid-run, then ``autopilot cleanup`` instead of a resume."""
    state = out / "cleanup"
    over = overlay(out, cluster.address)
    proc = subprocess.Popen(cli(state, over), cwd=ROOT, stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL)
    wait_for(lambda: running_on(state, 1) and running_on(state, 2), 240,
             "cells running on two nodes")
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()
    leases = [e["lease"] for e in events(state) if e["event"] == "ray_replica_started"]
    alive_before = env_holders("AUTOPILOT_RAY_LEASE", set(leases))
    r = subprocess.run([sys.executable, "-m", "autopilot.cli", "cleanup", "--state-dir",
                        str(state), "--preset", "demo", "--config", str(over)],
                       cwd=ROOT, capture_output=True, text=True, timeout=300)
    again = subprocess.run([sys.executable, "-m", "autopilot.cli", "cleanup", "--state-dir",
                            str(state), "--preset", "demo", "--config", str(over)],
                           cwd=ROOT, capture_output=True, text=True, timeout=300)
    return {"code": r.returncode, "output": r.stdout + r.stderr[-3000:],
            "again": again.stdout + again.stderr[-3000:], "alive_before": alive_before,
            "leftover": env_holders("AUTOPILOT_RAY_LEASE", set(leases))}


def sigterm(cluster: Any, nodes: list[Any], out: Path) -> dict[str, Any]:
    """SIGTERM mid-run: the actors learn it at their next poll and abandon their cells,
    as a local run does; the supervisor exits with its signal code."""
    state = out / "sigterm"
    over = overlay(out, cluster.address)
    proc = subprocess.Popen(cli(state, over), cwd=ROOT, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True)
    wait_for(lambda: running_on(state, 0) and running_on(state, 1), 240,
             "cells running on two nodes")
    os.kill(proc.pid, signal.SIGTERM)
    output, _ = proc.communicate(timeout=300)
    leases = [e["lease"] for e in events(state) if e["event"] == "ray_replica_started"]
    return {"code": proc.returncode, "output": output[-4000:],
            "leftover": env_holders("AUTOPILOT_RAY_LEASE", set(leases))}


def recreate(cluster: Any, nodes: list[Any], out: Path) -> dict[str, Any]:
    """demo-think pinned to replica 2: its node is removed mid-cell, a node with the same
    resource joins, Ray re-places the bundle there, and the replica is recreated (a new
    lease); the pinned arm can only finish there, so the run ends COMPLETE only if it was."""
    state = out / "recreate"
    over = overlay(out, cluster.address, arms=[
        {"label": "demo-nothink", "mode": "nothink"},
        {"label": "demo-think", "mode": "think", "replicas": [2]}])
    proc = subprocess.Popen(cli(state, over), cwd=ROOT, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True)
    wait_for(lambda: running_on(state, 2) and sum(
        e["event"] == "cell_verdict" for e in events(state)) >= 2, 240,
        "replica 2 running cells")
    cluster.remove_node(nodes[2])
    wait_for(lambda: any(e["event"] == "milestone" and e["kind"] == "node_lost"
                         for e in events(state)), 120, "node_lost")
    nodes[2] = cluster.add_node(num_cpus=2, resources={"node2": 1},
                                object_store_memory=80 * 2**20)
    output, _ = proc.communicate(timeout=400)
    return {"code": proc.returncode, "output": output[-4000:]}


def failover(cluster: Any, nodes: list[Any], out: Path) -> dict[str, Any]:
    """Replica 1's endpoint dies after 3 requests and stays down (restart after 30 s):
    the requests its node's cells make meanwhile go to a replica on another node before
    their response begins; none of them is INVALID for it."""
    state = out / "failover"
    path = overlay(out, cluster.address)
    doc = json.loads(path.read_text())
    doc["endpoint"] |= {"replica_env": [{}, {"AUTOPILOT_DEMO_CRASH_AFTER": "3"}, {}],
                        "down_restart_secs": 30}
    doc["vars"] = {"think_secs": "0.05"}
    doc["tasks"] = [{"id": "p1_bugfix"}, {"id": "p2_extract"}, {"id": "p3_market"}]
    doc["trust"] = {"infra_retries": 0}
    path = out / "ray-failover.json"
    path.write_text(json.dumps(doc))
    r = subprocess.run(cli(state, path), cwd=ROOT, capture_output=True, text=True,
                       timeout=400)
    return {"code": r.returncode, "output": (r.stdout + r.stderr)[-4000:]}


def ship(cluster: Any, nodes: list[Any], out: Path) -> dict[str, Any]:
    """No shared storage: each node keeps its cells' files under its own node_dir and
    ships them back with every verdict."""
    state = out / "ship"
    over = overlay(out, cluster.address, shared_state_dir=False, node_dir=str(out / "nodes"))
    r = subprocess.run(cli(state, over), cwd=ROOT, capture_output=True, text=True,
                       timeout=400)
    return {"code": r.returncode, "output": (r.stdout + r.stderr)[-4000:],
            "node_dir": str(out / "nodes")}


def main() -> int:
    scenario, out = sys.argv[1], Path(sys.argv[2])
    subprocess.run(["ip", "link", "set", "lo", "up"], check=True)
    os.environ["RAY_USAGE_STATS_ENABLED"] = "0"
    from ray.cluster_utils import Cluster

    common = {"num_cpus": 2, "object_store_memory": 80 * 2**20}
    cluster = Cluster(initialize_head=True, head_node_args={
        **common, "resources": {"node0": 1}, "include_dashboard": False})
    try:
        nodes = [cluster.head_node]
        nodes += [cluster.add_node(**common, resources={f"node{i}": 1}) for i in (1, 2)]
        cluster.wait_for_nodes()
        result: dict[str, Any] = {}
        for name in scenario.split(","):
            fn = {"node-loss": node_loss, "sigkill": sigkill, "cleanup": cleanup,
                  "sigterm": sigterm, "ship": ship, "recreate": recreate,
                  "failover": failover}[name]
            result[name] = fn(cluster, nodes, out)
        (out / "result.json").write_text(json.dumps(result))
    finally:
        cluster.shutdown()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
