"""The lease guard: kills a lost actor's processes on its own machine.

A node's actor (autopilot.backends.ray.node) starts its cells and endpoint in their own sessions,
so they outlive the actor if its worker dies: a crashed worker, a raylet killed, or a
raylet that exits after a network partition (Ray shuts a node down once it cannot reach
the cluster). The supervisor re-queues those cells elsewhere; they must not run on. The
supervisor sweeps the lease from a live node on the same machine when it can, but after
a partition there is none. So each actor starts this guard beside it: a tiny process
outside the actor's process group that watches the actor by its exact identity and,
once the actor is gone, kills every process carrying the run's marker and the actor's
lease, then exits. It carries neither marker itself.

    python -m autopilot.backends.ray.leaseguard --pid PID --ticks START_TICKS --token T --lease L
"""

from __future__ import annotations

import argparse
import time

from autopilot.cell.procs import ProcIdentity, verify


def watch(actor: ProcIdentity, poll: float) -> None:
    """Return once ``actor`` (exactly that process, not a recycled pid) is gone."""
    while verify(actor) is not None:
        time.sleep(poll)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description="kill a lost actor's lease processes")
    ap.add_argument("--pid", type=int, required=True)
    ap.add_argument("--ticks", type=int, required=True, help="the actor's start ticks")
    ap.add_argument("--token", required=True)
    ap.add_argument("--lease", required=True)
    ap.add_argument("--poll", type=float, default=1.0)
    ap.add_argument("--grace", type=float, default=2.0)
    a = ap.parse_args(argv)
    watch(ProcIdentity(a.pid, 0.0, a.ticks), a.poll)  # exact: a recycled pid is not it
    from autopilot.backends.ray.node import sweep_lease  # after the wait: keep the guard small

    killed = sweep_lease(a.token, a.lease, a.grace)
    if killed:
        print(f"leaseguard: lease {a.lease}: killed {killed}", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
