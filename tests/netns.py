"""Network namespaces for a Ray cluster whose nodes can be cut apart for real.

Each node gets a namespace of its own (``ip netns add``), joined to a bridge in a
namespace of the test's by a veth pair, with 10.77.0.<k>/24 addresses the test assigns:
nothing in them reaches any address outside them (no route, no other link). ``cut``
and ``heal`` set a node's bridge port down and up.
Everything started in a namespace is ended by its pid: the processes the test started,
then whatever ``ip netns pids`` still finds in the test's own namespaces.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

RAY = str(Path(sys.executable).parent / "ray")
# The head's control store declares a silent node dead within seconds, and a cut-off
# raylet gives up on it as fast: a partition is seen in a test's time, not minutes.
RAY_ENV = {"RAY_USAGE_STATS_ENABLED": "0", "RAY_health_check_period_ms": "500",
           "RAY_health_check_timeout_ms": "500", "RAY_health_check_failure_threshold": "4",
           "RAY_gcs_rpc_server_reconnect_timeout_s": "5"}


def ip(*args: str) -> None:
    subprocess.run(["ip", *args], check=True, capture_output=True)


class Topology:
    """``n`` node namespaces (node 0 is the Ray head, where the supervisor runs too)."""

    def __init__(self, n: int, tmp: Path) -> None:
        self.prefix = f"apn{os.getpid()}"
        self.bridge = f"{self.prefix}-br"
        self.nodes = [f"{self.prefix}-n{k}" for k in range(n)]
        self.tmp = tmp
        self.procs: list[subprocess.Popen[Any]] = []
        ip("netns", "add", self.bridge)
        ip("-n", self.bridge, "link", "add", "br0", "type", "bridge")
        ip("-n", self.bridge, "link", "set", "br0", "up")
        for k, ns in enumerate(self.nodes):
            ip("netns", "add", ns)
            # created inside the node's namespace, its peer put straight into the bridge's
            ip("-n", ns, "link", "add", "v0", "type", "veth", "peer", "name", f"p{k}",
               "netns", self.bridge)
            ip("-n", self.bridge, "link", "set", f"p{k}", "master", "br0")
            ip("-n", self.bridge, "link", "set", f"p{k}", "up")
            ip("-n", ns, "addr", "add", f"{self.addr(k)}/24", "dev", "v0")
            ip("-n", ns, "link", "set", "v0", "up")
            ip("-n", ns, "link", "set", "lo", "up")

    @staticmethod
    def addr(k: int) -> str:
        return f"10.77.0.{k + 1}"

    @property
    def address(self) -> str:
        return f"{self.addr(0)}:6379"

    def popen(self, k: int, argv: list[str], **kw: Any) -> subprocess.Popen[Any]:
        """``argv`` in node ``k``'s namespace (``ip netns exec`` execs it: the pid is its)."""
        p = subprocess.Popen(["ip", "netns", "exec", self.nodes[k], *argv], **kw)
        self.procs.append(p)
        return p

    def start_ray(self) -> None:
        env = {**os.environ, **RAY_ENV}
        for k in range(len(self.nodes)):
            where = (["--head", "--port", "6379", "--include-dashboard", "false"] if k == 0
                     else ["--address", self.address])
            # A temp dir per node: raylets of one host must not share socket names.
            with open(self.tmp / f"ray-n{k}.log", "w") as log:  # the child keeps its own
                self.popen(k, [RAY, "start", "--block", *where, "--node-ip-address",
                               self.addr(k), "--num-cpus", "2", "--resources",
                               json.dumps({f"node{k}": 1}), "--temp-dir",
                               f"/tmp/{self.prefix}-r{k}"],
                           env=env, stdout=log, stderr=subprocess.STDOUT,
                           start_new_session=True)
            if k == 0:
                self.wait_nodes(1)
        self.wait_nodes(len(self.nodes))

    def wait_nodes(self, count: int, timeout: float = 120) -> None:
        probe = ("import ray, sys, time\n"
                 f"ray.init(address={self.address!r}, logging_level='ERROR')\n"
                 "t = time.time() + float(sys.argv[1])\n"
                 "while sum(n['Alive'] for n in ray.nodes()) < int(sys.argv[2]):\n"
                 "    if time.time() > t:\n"
                 "        sys.exit(f'not all alive by the deadline: {ray.nodes()}')\n"
                 "    time.sleep(0.3)\n")
        deadline = time.monotonic() + timeout
        while True:  # the head's own control store may not answer yet
            r = subprocess.run(["ip", "netns", "exec", self.nodes[0], sys.executable, "-c",
                                probe, str(timeout), str(count)], capture_output=True,
                               text=True, env={**os.environ, **RAY_ENV}, timeout=timeout + 30)
            if r.returncode == 0:
                return
            if time.monotonic() > deadline:
                raise RuntimeError(f"{count} Ray node(s) not alive: {r.stderr[-2000:]}")
            time.sleep(1)

    def cut(self, k: int) -> None:
        ip("-n", self.bridge, "link", "set", f"p{k}", "down")

    def heal(self, k: int) -> None:
        ip("-n", self.bridge, "link", "set", f"p{k}", "up")

    def close(self) -> None:
        for p in self.procs:  # ray start --block ends its node's processes on SIGTERM
            if p.poll() is None:
                p.terminate()
        for p in self.procs:
            try:
                p.wait(timeout=40)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()
        for ns in [*self.nodes, self.bridge]:  # anything left in our own namespaces
            pids = subprocess.run(["ip", "netns", "pids", ns], capture_output=True,
                                  text=True).stdout.split()
            for pid in pids:
                with contextlib.suppress(ProcessLookupError, ValueError):
                    os.kill(int(pid), signal.SIGKILL)
            subprocess.run(["ip", "netns", "del", ns], capture_output=True)

    def __enter__(self) -> Topology:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
