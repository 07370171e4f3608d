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
  detached actors keep running) and the same command run again, up to KILLS times.
- ``handover``: SIGUSR2 mid-run twice, the same command run again after each.
- ``cleanup``: the same SIGKILL, then ``autopilot cleanup`` (twice) instead.
- ``sigterm``: SIGTERM mid-run: the cells are abandoned on every node, nothing is left.
- ``ship``: no shared storage: the nodes ship each attempt's files back.
- ``recreate``: an arm pinned to replica 2, whose node is removed mid-run; a node with
  the same resource joins; the replica must be recreated there for the run to finish.
- ``partition`` (alone: a cluster of its own, each node in a network namespace of its
  own): replica 2's node is cut off from the others for longer than its lease, then
  healed.
- ``docker`` (alone: two nodes with a Docker daemon each): Docker-mode endpoints and a
  sandbox container per cell, each on its own node's daemon.
- ``failover``: replica 1's endpoint dies and stays down; its node's requests go to
  another node's replica before their response begins.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from conftest import ROOT, env_holders, events, wait_for

from autopilot.cell.procs import grade_marker


def overlay(out: Path, address: str, arms: list[dict[str, Any]] | None = None,
            think: str = "0.25", **backend: Any) -> Path:
    path = out / f"ray{len(backend)}{'-pinned' if arms else ''}-{think}.json"
    path.write_text(json.dumps({
        **({"arms": arms} if arms else {}),
        "vars": {"think_secs": think},  # cells of a few seconds: a node dies mid-cell
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


KILLS = 10


def verdicts(state: Path) -> int:
    return sum(e["event"] == "cell_verdict" for e in events(state))


def running_attempts(state: Path) -> set[tuple[str, int]]:
    """Attempts the journal shows started and not yet judged."""
    evs = events(state)
    started = {(e["cell"], e["attempt"]) for e in evs if e["event"] == "cell_started"}
    return started - {(e["cell"], e["attempt"]) for e in evs if e["event"] == "cell_verdict"}


def sigkill(cluster: Any, nodes: list[Any], out: Path) -> dict[str, Any]:
    """The supervisor SIGKILLed up to KILLS times, each time once it has journaled a
    verdict of its own and cells run on the nodes (a kill may land anywhere in a
    successor's start: its survey, its replay, its sweep), and the same command run
    again: each successor re-attaches to the detached actors."""
    nodes[2] = cluster.add_node(num_cpus=2, resources={"node2": 1},
                                object_store_memory=80 * 2**20)
    cluster.wait_for_nodes()
    state = out / "sigkill"
    over = overlay(out, cluster.address, think="0.6")  # cells of several seconds
    at_kill: list[list[tuple[str, int]]] = []
    seen = 0
    for _ in range(KILLS):
        proc = subprocess.Popen(cli(state, over), cwd=ROOT, stdout=subprocess.DEVNULL,
                                stderr=subprocess.DEVNULL)
        try:
            wait_for(lambda: proc.poll() is not None or (
                verdicts(state) > seen and bool(running_attempts(state))), 240,
                "a verdict of this supervisor's, and cells running")
        finally:
            if proc.poll() is None:
                os.kill(proc.pid, signal.SIGKILL)
            proc.wait()
        if proc.returncode != -signal.SIGKILL:
            break  # the run ended first
        at_kill.append(sorted(running_attempts(state)))
        seen = verdicts(state)
    last = subprocess.run(cli(state, over), cwd=ROOT, capture_output=True, text=True,
                          timeout=400)
    leases = {e["lease"] for e in events(state) if e["event"] == "ray_replica_started"}
    return {"code": last.returncode, "output": (last.stdout + last.stderr)[-4000:],
            "at_kill": at_kill, "leases": sorted(leases),
            "leftover": env_holders("AUTOPILOT_RAY_LEASE", leases)}


def handover(cluster: Any, nodes: list[Any], out: Path) -> dict[str, Any]:
    """SIGUSR2 mid-run, twice: the supervisor hands over (its cells run on, on their
    nodes), and the same command is run again each time and re-attaches."""
    state = out / "handover"
    over = overlay(out, cluster.address, think="0.6")
    codes: list[int] = []
    at_handover: list[list[tuple[str, int]]] = []
    seen = 0
    for _ in range(2):
        proc = subprocess.Popen(cli(state, over), cwd=ROOT, stdout=subprocess.DEVNULL,
                                stderr=subprocess.DEVNULL)
        try:
            wait_for(lambda: verdicts(state) > seen and bool(running_attempts(state)), 240,
                     "a verdict of this supervisor's, and cells running")
            at_handover.append(sorted(running_attempts(state)))
            os.kill(proc.pid, signal.SIGUSR2)
            codes.append(proc.wait(timeout=120))
        finally:
            if proc.poll() is None:
                os.kill(proc.pid, signal.SIGKILL)
                proc.wait()
        # what the actors ran while no supervisor watched: still running, on their nodes
        seen = verdicts(state)
    leases = {e["lease"] for e in events(state) if e["event"] == "ray_replica_started"}
    alive = env_holders("AUTOPILOT_RAY_LEASE", leases)
    last = subprocess.run(cli(state, over), cwd=ROOT, capture_output=True, text=True,
                          timeout=400)
    return {"code": last.returncode, "output": (last.stdout + last.stderr)[-4000:],
            "codes": codes, "at_handover": at_handover, "leases": sorted(leases),
            "alive_between": alive,
            "leftover": env_holders("AUTOPILOT_RAY_LEASE", leases)}


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


def partition(out: Path, cut: bool = True) -> dict[str, Any]:
    """Three Ray nodes, each in a network namespace of its own (tests/netns.py): once
    replica 2 runs cells, its node's link to the others is cut for longer than its lease,
    then healed. Its cells must be re-run elsewhere only after its actor fenced itself,
    and counted once. (``cut=False``: the same run, uncut: tools/bench.py's baseline.)"""
    from netns import Topology

    out.mkdir(parents=True, exist_ok=True)
    state = out / ("partition" if cut else "uncut")
    with Topology(3, out) as topo:
        topo.start_ray()
        over = overlay(out, topo.address, think="0.6", lease_secs=6)
        proc = topo.popen(0, cli(state, over), cwd=ROOT, stdout=subprocess.PIPE,
                          stderr=subprocess.STDOUT, text=True, start_new_session=True)
        try:
            wait_for(lambda: running_on(state, 2) and verdicts(state) >= 3, 240,
                     "replica 2 running cells")
            lease = next(e["lease"] for e in events(state)
                         if e["event"] == "ray_replica_started" and e["replica"] == 2)
            if not cut:
                output, _ = proc.communicate(timeout=400)
                return {"code": proc.returncode, "output": output[-4000:]}
            cut_off = sorted(a for a in running_attempts(state)
                             if any(e["event"] == "cell_started" and e.get("replica") == 2
                                    and (e["cell"], e["attempt"]) == a
                                    for e in events(state)))
            topo.cut(2)
            cut_at = time.time()
            # The moment the last process of the cut-off lease is gone, seen from here
            # (every namespace shares this machine's process table).
            fenced_at = None
            deadline = time.monotonic() + 120
            while time.monotonic() < deadline:
                if fenced_at is None and not env_holders("AUTOPILOT_RAY_LEASE", {lease}):
                    fenced_at = time.time()
                rerun = [e for e in events(state) if e["event"] == "cell_spawning"
                         and any(e["cell"] == c and e["attempt"] > a for c, a in cut_off)]
                if fenced_at is not None and rerun:
                    break
                time.sleep(0.05)
            time.sleep(3)  # cut for longer than the lease (6 s) and its expiry
            topo.heal(2)
            healed_at = time.time()
            output, _ = proc.communicate(timeout=400)
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
        leftover = env_holders("AUTOPILOT_RAY_LEASE", {lease})
    return {"code": proc.returncode, "output": output[-4000:], "lease": lease,
            "cut_off": cut_off, "cut_at": cut_at, "fenced_at": fenced_at,
            "healed_at": healed_at, "leftover": leftover}


SANDBOX_HARNESS = (
    "import os, subprocess, sys\n"
    "cell, image = sys.argv[1], sys.argv[2]\n"
    "# as MMBT's harness does: one sandbox container per cell, on the daemon it is given\n"
    "subprocess.run(['docker', 'run', '-d', '--network', 'none', '--name',\n"
    "                'bench-sandbox-' + cell, image, 'sleep', '3600'], check=True)\n"
    "os.execv(sys.executable, [sys.executable, '-m', 'autopilot.demo.harness', cell,\n"
    "                          *sys.argv[3:]])\n"
)


def created(host: str, since: float) -> list[str]:
    """The names of the containers created on the daemon at ``host`` since ``since``."""
    from conftest import docker_cli

    out = docker_cli(host, "events", "--since", f"{since:.3f}", "--until",
                     f"{time.time():.3f}", "--filter", "event=create", "--format",
                     "{{.Actor.Attributes.name}}").stdout.decode()
    return out.split()


def docker(out: Path) -> dict[str, Any]:
    """Two Ray nodes, each with a Docker daemon of its own (its raylet's DOCKER_HOST):
    the endpoint runs in a container of its node's daemon, and every cell's harness
    makes a sandbox container there (the MMBT shape). Node 1 is lost mid-run; then a
    second run is SIGKILLed with its replica 1's actor, and cleaned up."""
    from conftest import container_names, fake_llama_binds, import_test_images
    from ray.cluster_utils import Cluster

    hosts, dirs = [], []
    for k in range(2):
        d = Path(f"/tmp/ap-raydock-{os.getpid()}-{k}")
        r = subprocess.run([str(ROOT / "tools" / "dockerd"), "start", str(d)],
                           capture_output=True, text=True, timeout=180)
        dirs.append(d)
        assert r.returncode == 0, r.stderr
        hosts.append(r.stdout.strip().split("=", 1)[1])
    cluster = None
    try:
        for h, d in zip(hosts, dirs, strict=True):
            images = import_test_images(h, d / "img")  # the same names on each daemon
        common = {"num_cpus": 2, "object_store_memory": 80 * 2**20}
        cluster = Cluster(initialize_head=True, head_node_args={
            **common, "resources": {"node0": 1}, "include_dashboard": False,
            "env_vars": {"DOCKER_HOST": hosts[0]}})
        node1 = cluster.add_node(**common, resources={"node1": 1},
                                 env_vars={"DOCKER_HOST": hosts[1]})
        cluster.wait_for_nodes()
        state = out / "docker"
        script = out / "sandbox_harness.py"
        script.write_text(SANDBOX_HARNESS)
        name = f"llama-autopilot-ray-{os.getpid()}"
        py, binds = os.path.realpath(sys.executable), fake_llama_binds()
        over = out / "ray-docker.json"
        over.write_text(json.dumps({
            "tasks": [{"id": "p1_bugfix"}, {"id": "p2_extract"}, {"id": "p3_market"}],
            "endpoint": {
                "engine": "llamacpp", "mode": "docker", "model_path": "/models/fake.gguf",
                "replicas": 2, "slots": 2, "startup_timeout_secs": 60,
                "probe_interval_secs": 0.5,
                "docker": {"image": images["llama"], "container_name": name, "gpus": "none",
                           "binds": binds},
                "env": {"FAKE_PYTHON": py, "FAKE_AUTOPILOT_ROOT": "/repo"}},
            "harness": {"argv": ["{python}", str(script), "{cell}", images["busybox"],
                                 "--task", "{task}", "--arm", "{arm}", "--n", "{n}",
                                 "--attempt", "{attempt}", "--host", "{host}", "--port",
                                 "{port}", "--model", "{model}", "--out", "{output_dir}",
                                 "--think-secs", "0.1"],
                        "sandbox_container": "bench-sandbox-{cell}"},
            "run": {"concurrency": 4},
            "backend": {"kind": "ray", "address": cluster.address, "shared_state_dir": True,
                        "resources": [{"node0": 1}, {"node1": 1}], "poll_secs": 0.2,
                        "start_timeout_secs": 60}}))
        since = time.time() - 1
        proc = subprocess.Popen(cli(state, over), cwd=ROOT, stdout=subprocess.PIPE,
                                stderr=subprocess.STDOUT, text=True)
        try:
            # Node 1 lost mid-cell (its raylet and actor killed, as a crashed machine's):
            # what it left on its daemon goes with its lease's sweep.
            wait_for(lambda: running_on(state, 1) and verdicts(state) >= 3, 240,
                     "replica 1 running cells")
            left_running = sorted(running_attempts(state))
            cluster.remove_node(node1)
            output, _ = proc.communicate(timeout=600)
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
        result = {"code": proc.returncode, "output": output[-4000:], "name": name,
                  "running_at_loss": left_running,
                  "created": [created(h, since) for h in hosts],
                  "left": [sorted(container_names(h)) for h in hosts]}
        # Then `autopilot cleanup` after a supervisor SIGKILLed and replica 1's actor
        # killed with it (its lease guard ends its processes; its containers stay): the
        # node's sweep removes them from that node's daemon.
        cluster.add_node(**common, resources={"node1": 1}, env_vars={"DOCKER_HOST": hosts[1]})
        cluster.wait_for_nodes()
        state = out / "docker-cleanup"
        proc = subprocess.Popen(cli(state, over), cwd=ROOT, stdout=subprocess.DEVNULL,
                                stderr=subprocess.DEVNULL)
        try:
            wait_for(lambda: running_on(state, 1) and any(
                n.startswith("bench-sandbox-") for n in container_names(hosts[1])), 240,
                "replica 1 running cells, a sandbox made")
        finally:
            os.kill(proc.pid, signal.SIGKILL)
            proc.wait()
        actor = next(e["actor_pid"] for e in events(state)
                     if e["event"] == "ray_replica_started" and e["replica"] == 1)
        os.kill(actor, signal.SIGKILL)
        lease = next(e["lease"] for e in events(state)
                     if e["event"] == "ray_replica_started" and e["replica"] == 1)
        wait_for(lambda: not env_holders("AUTOPILOT_RAY_LEASE", {lease}), 60,
                 "the lease guard ending replica 1's processes")
        result["before_cleanup"] = sorted(container_names(hosts[1]))
        r = subprocess.run([sys.executable, "-m", "autopilot.cli", "cleanup", "--endpoint",
                            "--state-dir", str(state), "--preset", "demo", "--config",
                            str(over)], cwd=ROOT, capture_output=True, text=True, timeout=300)
        result["cleanup"] = r.stdout + r.stderr[-3000:]
        result["after_cleanup"] = [sorted(container_names(h)) for h in hosts]
        return result
    finally:
        if cluster is not None:
            cluster.shutdown()
        for d in dirs:
            subprocess.run([str(ROOT / "tools" / "dockerd"), "stop", str(d)], timeout=120)


def main() -> int:
    scenario, out = sys.argv[1], Path(sys.argv[2])
    if scenario == "docker":  # its own cluster and daemons, in this namespace
        subprocess.run(["ip", "link", "set", "lo", "up"], check=True)
        os.environ["RAY_USAGE_STATS_ENABLED"] = "0"
        (out / "result.json").write_text(json.dumps({"docker": docker(out)}))
        return 0
    if scenario in ("partition", "uncut"):  # its own cluster, in namespaces it makes
        os.environ["RAY_USAGE_STATS_ENABLED"] = "0"
        (out / "result.json").write_text(json.dumps(
            {scenario: partition(out, cut=scenario == "partition")}))
        return 0
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
            fn = {"node-loss": node_loss, "sigkill": sigkill, "handover": handover,
                  "cleanup": cleanup,
                  "sigterm": sigterm, "ship": ship, "recreate": recreate,
                  "failover": failover}[name]
            result[name] = fn(cluster, nodes, out)
        (out / "result.json").write_text(json.dumps(result))
    finally:
        cluster.shutdown()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
