"""A successor re-attaching to what its predecessor left on the Ray nodes.

A supervisor SIGKILLed (or handing over) leaves its detached actors running, each with
its endpoint and the attempts it runs. Its successor, with the run's lock held and before
its start-up sweep, asks each replica's actor who it is (``hello``): one of this run, of
that replica, is a survivor. Its reports that no head journaled are journaled first
(each carries its number, journaled with it as ``report_seq``; the highest per lease is
what was acknowledged), so the ledger knows every attempt it started; then each attempt
it holds is sorted by the journal: the one the ledger shows running is re-attached to
(``RayBackend.resume``), a result the journal already has is let go, and anything else
is killed there. The sweep spares a survivor's leases, endpoint and groups.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import anyio

from autopilot.backends.base import Port, Survivors
from autopilot.backends.ray.cluster import actor_name, connect, short_error
from autopilot.backends.ray.node import GradeFailureReport, Hello, MilestoneReport, Polled
from autopilot.cell.cgroups import group_name
from autopilot.errors import EndpointError
from autopilot.logsetup import get_logger

if TYPE_CHECKING:
    from autopilot.config import Preset
    from autopilot.state.ledger import Ledger

log = get_logger(__name__)


@dataclass(frozen=True)
class RayAttempt:
    """An attempt a predecessor started on a replica's actor, re-attached to: what the
    passes hand back to ``RayBackend.resume``."""

    replica: int
    lease: str

    @property
    def meta(self) -> dict[str, Any]:
        return {"replica": self.replica}


@dataclass
class Survivor:
    """A predecessor's actor that proved to be this run's replica (``RayBackend.survey``)."""

    actor: Any
    hello: Hello
    acked: int  # its reports journaled, up to this number
    replayed: int = 0  # of them, journaled by this successor (no head had)
    running: list[tuple[str, int]] = field(default_factory=list)  # re-attached to
    taken: list[tuple[str, int]] = field(default_factory=list)  # results journaled already
    revoked: list[tuple[str, int]] = field(default_factory=list)  # unknown to the journal


def acked_reports(journal: Path) -> dict[str, int]:
    """Lease -> the highest report number journaled from it (``report_seq``)."""
    from autopilot.state.journal import iter_events

    out: dict[str, int] = {}
    for event in iter_events(journal):
        lease, seq = event.get("lease"), event.get("report_seq")
        if isinstance(lease, str) and type(seq) is int:
            out[lease] = max(out.get(lease, 0), seq)
    return out


def apply_polled(port: Port, replica: int, node: str, lease: str, acked: int,
                 got: Polled) -> int:
    """Journal what an actor reported after ``acked`` (each line carries its lease and
    number), pass its ticks on; the number now acknowledged."""
    for note in got.reports:
        if note.seq <= acked:
            continue  # journaled already (by a predecessor, or an earlier poll)
        acked = note.seq
        report = note.report
        tag = {"replica": replica, "node": node[:12], "lease": lease, "report_seq": note.seq}
        if isinstance(report, MilestoneReport):
            port.milestone(report.kind, **{**report.info, **tag})
        elif isinstance(report, GradeFailureReport):
            port.grade_failure(report.cell, report.classification)
        else:
            port.emit(report.event, **{**report.extra, **tag})
    for cid, tick in got.ticks.items():
        port.tick(cid, tick.frozen_secs, tick.tier, tick.last_signal)
    return acked


def hellos(preset: Preset, token: str) -> dict[int, tuple[Any, Hello]]:
    """Blocking: each replica actor of this run that answers who it is in time."""
    cfg = preset.backend
    ray = connect(cfg)
    found: dict[int, tuple[Any, Hello]] = {}
    for i in range(preset.endpoint.replicas):
        try:
            actor = ray.get_actor(actor_name(token, f"r{i}"), namespace=cfg.namespace)
        except ValueError:
            continue
        try:
            hello = ray.get(actor.hello.remote(), timeout=30)
        except Exception as e:  # dead, hung, or of an older version: reaped by ready()
            log.warning("ray_survivor_silent", replica=i, error=short_error(e))
            continue
        if isinstance(hello, Hello) and hello.run_token == token and hello.replica == i \
                and not hello.fenced:
            found[i] = (actor, hello)
    return found


async def survey(preset: Preset, run_token: str, state_dir: Path, port: Port,
                 ledger: Ledger) -> Survivors:
    """Each replica actor a predecessor left that proves to be this run's: its
    unjournaled reports journaled (so the ledger knows what it started), then each
    attempt it holds sorted by the journal: the attempt the ledger shows running is
    re-attached to, a result already journaled is let go, anything else is killed
    there. An unreachable cluster is said by ``ready`` in one line, as before."""
    try:
        found = await anyio.to_thread.run_sync(hellos, preset, run_token)
    except EndpointError:
        return Survivors()
    if not found:
        return Survivors()
    acked = await anyio.to_thread.run_sync(acked_reports, state_dir / "journal.jsonl")
    out: dict[int, Survivor] = {}
    for i, (actor, hello) in found.items():
        try:
            with anyio.fail_after(60):
                got: Polled = await actor.poll.remote(None, False, False, None,
                                                      acked.get(hello.lease, 0))
        except Exception as e:  # gone since it said hello: reaped by ready()
            log.warning("ray_survivor_lost", replica=i, error=short_error(e))
            continue
        before = acked.get(hello.lease, 0)
        after = apply_polled(port, i, str(hello.where.get("node", "")), hello.lease, before,
                             got)
        survivor = out[i] = Survivor(actor, hello, after, replayed=after - before)
        still = {(str(name), int(number)) for name, number in got.running}
        for cid, attempt in dict.fromkeys(
                (str(name), int(number))
                for name, number in [*hello.running, *got.running, *hello.finished]):
            state = ledger.cells.get(cid)
            if state is not None and state.status == "running" and state.attempts == attempt:
                survivor.running.append((cid, attempt))
            elif (cid, attempt) not in still:  # ended: its verdict is journaled already
                survivor.taken.append((cid, attempt))
            else:  # an attempt the journal does not know (or knows as ended): killed
                survivor.revoked.append((cid, attempt))
    return Survivors(
        attempts=tuple((cid, number, RayAttempt(i, survivor.hello.lease))
                       for i, survivor in out.items() for cid, number in survivor.running),
        leases=frozenset(survivor.hello.lease for survivor in out.values()),
        pids=frozenset(survivor.hello.endpoint_pid for survivor in out.values()
                       if survivor.hello.endpoint_pid is not None),
        groups=frozenset({f"endpoint-{i}" for i in out} | {
            group_name(kind, cid, number)
            for survivor in out.values() for cid, number in survivor.running
            for kind in ("cell", "grade")}),
        replicas=out)


__all__ = ["RayAttempt", "Survivor", "acked_reports", "apply_polled", "hellos", "survey"]
