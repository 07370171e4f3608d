"""Which endpoint replica gets the next cell: a pure decision, table-tested.

The supervisor asks with what it knows (each replica's state and free slots, the arm's
pins) and acts on the answer; the executor then runs the cell there. The same policy
serves local replicas and Ray nodes.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal


@dataclass(frozen=True)
class ReplicaView:
    up: bool  # answering: cells may start on it
    failed: bool  # given up: it will never serve again
    free: int  # slots free now


Choice = int | Literal["wait", "none"]


def choose_replica(replicas: Sequence[ReplicaView], allowed: Sequence[int] | None) -> Choice:
    """Among the replicas ``allowed`` (the arm's pins; None = any): the one up with the
    most free slots (the lowest index on a tie, so a run is reproducible); "wait" while
    one that has not failed may still serve (down, restarting, lost, or full); "none"
    when every allowed replica has failed."""
    pool = range(len(replicas)) if allowed is None else allowed
    live = [i for i in pool if not replicas[i].failed]
    if not live:
        return "none"
    ready = [i for i in live if replicas[i].up and replicas[i].free > 0]
    if not ready:
        return "wait"
    return max(ready, key=lambda i: (replicas[i].free, -i))
