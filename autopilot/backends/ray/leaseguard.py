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
    parser = argparse.ArgumentParser(description="kill a lost actor's lease processes")
    parser.add_argument("--pid", type=int, required=True)
    parser.add_argument("--ticks", type=int, required=True, help="the actor's start ticks")
    parser.add_argument("--token", required=True)
    parser.add_argument("--lease", required=True)
    parser.add_argument("--poll", type=float, default=1.0)
    parser.add_argument("--grace", type=float, default=2.0)
    args = parser.parse_args(argv)
    watch(ProcIdentity(args.pid, 0.0, args.ticks), args.poll)  # exact: a recycled pid is not it
    from autopilot.backends.ray.node import sweep_lease  # after the wait: keep the guard small

    killed = sweep_lease(args.token, args.lease, args.grace)
    if killed:
        print(f"leaseguard: lease {args.lease}: killed {killed}", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
