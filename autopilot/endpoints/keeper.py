"""The endpoint keeper: start, probe, restart with backoff, or give up.

Runs as one task in the supervisor's task group. The endpoint is *down* from the first
failed probe; down longer than ``down_restart_secs`` it is restarted (only if we own it;
an attached endpoint is watched and alerted on, never killed). While it is down no new
cell is launched: ``wait_up`` blocks the workers. Cells that end during an outage are
classified INVALID(endpoint_down), never FAIL — ``outage_overlaps`` tells the runner.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import anyio

from autopilot.config import ArmEndpoint
from autopilot.endpoints.base import Endpoint
from autopilot.endpoints.policy import restart_action
from autopilot.errors import EndpointError, EndpointFailed
from autopilot.logsetup import get_logger
from autopilot.state.fsutil import iso
from autopilot.state.runevents import (
    EndpointDown,
    EndpointNotReadopted,
    EndpointReconfigure,
    EndpointRestart,
    EndpointSpawned,
    EndpointStarted,
    EndpointThrottled,
    EndpointUp,
    MilestoneSink,
)
from autopilot.state.runevents import EndpointFailed as EndpointFailedEvent

log = get_logger(__name__)

Emit = Callable[..., Any]


class KeeperBase:
    """What every keeper is to the loop, wherever its endpoint runs: a state (starting,
    up, down, restarting, failed, lost, stopped...), why it failed for good, and the
    hook a provider's throttling calls. autopilot.backends.ray.head.RemoteKeeper mirrors
    a node's keeper on this base."""

    def __init__(self) -> None:
        self.state = "starting"
        self.failed: str | None = None
        # A hosted provider answering 429: up, but throttled (see autopilot.run.throttle).
        self.on_throttled: Callable[[], None] = lambda: None

    @property
    def is_up(self) -> bool:
        return self.state == "up"

    async def decoding(self, max_age: float) -> int | None:
        """The endpoint's decoded-token counter while busy; None where it is not seen."""
        return None

    def outage_overlaps(self, start: float, end: float) -> bool:
        return False


class Keeper(KeeperBase):
    def __init__(
        self,
        endpoint: Endpoint,
        emit: Emit,
        milestone: MilestoneSink,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        super().__init__()
        self.ep = endpoint
        self.cfg = endpoint.cfg
        self.emit = emit
        self.milestone = milestone
        self.clock = clock
        self.down_since: float | None = None
        self._down_since_wall: str | None = None  # the same instant, UTC, for readers
        self.restarts: list[float] = []
        self.outages: list[tuple[float, float | None]] = []  # (down, up) on self.clock
        self.reconfiguring = False
        self._up = anyio.Event()
        self._decoding: tuple[float, int | None] = (float("-inf"), None)
        self._decoding_lock = anyio.Lock()
        # An endpoint a predecessor left serving (its endpoint_started record): tried
        # first at start, so a supervisor's crash or hand-over costs no model load.
        self.readopt_record: dict[str, Any] | None = None
        endpoint.on_spawn = lambda **kw: self.emit(EndpointSpawned(**kw))

    def describe(self) -> dict[str, Any]:
        return {
            **self.ep.describe(),
            "state": self.state,
            "restarts": len(self.restarts),
            "down_secs": round(self.clock() - self.down_since, 1) if self.down_since else None,
            "down_since": self._down_since_wall,
            "failed": self.failed,
        }

    def outage_overlaps(self, start: float, end: float) -> bool:
        return any(down <= end and (back is None or back >= start) for down, back in self.outages)

    async def wait_up(self) -> None:
        while not self.is_up:
            if self.failed:
                raise EndpointFailed(self.failed)
            await self._up.wait()

    def _mark_up(self) -> None:
        if self.down_since is not None and self.outages and self.outages[-1][1] is None:
            self.outages[-1] = (self.outages[-1][0], self.clock())
        self.down_since = None
        self._down_since_wall = None
        self.state = "up"
        self._up.set()

    def _mark_down(self, why: str) -> None:
        if self.down_since is None:
            self.down_since = self.clock()
            self._down_since_wall = iso()
            self.outages.append((self.down_since, None))
            self.state = "down"
            self._up = anyio.Event()
            self.emit(EndpointDown(why=why))

    async def start(self) -> None:
        """Start (or attach to, or re-adopt) the endpoint; raises EndpointError if it
        cannot."""
        rec, self.readopt_record = self.readopt_record, None
        if rec is not None:
            if rec.get("loading"):
                await self._loaded(rec)
            why = await self.ep.readopt(rec)
            if why is None:
                self._mark_up()
                self.emit(EndpointStarted(**self.ep.describe(), readopted=True,
                          readiness={}))
                return
            self.emit(EndpointNotReadopted(pid=rec.get("pid"), why=why))
        await self.ep.start()
        self._mark_up()
        self.emit(EndpointStarted(**self.ep.describe(), readiness=self.ep.readiness))

    async def _loaded(self, rec: dict[str, Any]) -> None:
        """Wait for an endpoint a predecessor was killed while loading to answer, while
        its exact process lives and its load is within the start-up timeout counted
        from its spawn (a load stuck that long is not waited for again); ``readopt``
        then judges it as any other."""
        from urllib.parse import urlsplit

        from autopilot.cell.procs import journaled_identity, verify
        from autopilot.state.fsutil import parse_iso

        ident, port = journaled_identity(rec), urlsplit(str(rec.get("url") or "")).port
        spawned = parse_iso(rec.get("ts"))
        if ident is None or not port or spawned is None:
            return
        before, self.ep.port = self.ep.port, port
        try:
            deadline = spawned + self.ep.cfg.startup_timeout_secs
            while verify(ident) is not None and time.time() < deadline:
                if (await self.ep.probe())[0]:
                    return
                await anyio.sleep(min(self.ep.cfg.probe_interval_secs, 1.0))
        except EndpointError:
            return
        finally:
            self.ep.port = before

    async def decoding(self, max_age: float) -> int | None:
        """The endpoint's decoded-token counter while busy (see Endpoint.decoding), asked
        at most once per ``max_age`` seconds however many cells want it."""
        async with self._decoding_lock:
            when, value = self._decoding
            if self.clock() - when >= max_age:
                value = await self.ep.decoding() if self.is_up else None
                self._decoding = (self.clock(), value)
            return value

    async def reconfigure(self, setting: ArmEndpoint, arms: tuple[str, ...]) -> None:
        """Restart the endpoint with another arm's settings (no cell is running: the
        supervisor runs one arm group at a time). Not an outage and not a restart of
        the crash budget; raises EndpointError when the new start fails."""
        self.reconfiguring = True
        self.state = "reconfiguring"
        self._up = anyio.Event()
        try:
            self.emit(EndpointReconfigure(arms=list(arms), arm_args=list(setting.args),
                      previous=list(self.ep.arm_group)))
            await self.ep.stop()
            self.ep.arm_setting, self.ep.arm_group = setting, arms
            self.ep.generation += 1
            await self.ep.start()
        finally:
            self.reconfiguring = False
        self._mark_up()
        self.emit(EndpointStarted(**self.ep.describe(), readiness=self.ep.readiness))

    async def watch(self) -> None:
        """Keep it alive until cancelled or the restart budget is spent."""
        try:
            await self._watch()
        finally:
            self._up.set()  # release any waiter so it can see `failed`

    async def _watch(self) -> None:
        while True:
            await anyio.sleep(self.cfg.probe_interval_secs if self.is_up else
                              min(self.cfg.probe_interval_secs, 1.0))
            if self.reconfiguring:
                continue
            try:
                ok, why = await self.ep.probe()
            except EndpointError as e:
                ok, why = False, str(e)
            if ok and why.startswith("throttled"):
                self.emit(EndpointThrottled(why=why))
                self.on_throttled()
            if ok:
                if self.state != "up":
                    down = self.clock() - (self.down_since or self.clock())
                    self._mark_up()
                    self.emit(EndpointUp(down_secs=round(down, 1)))
                continue
            self._mark_down(why)
            action = restart_action(self.down_since, self.clock(), self.restarts, self.cfg)
            if action == "restart" and not self.ep.attached:
                await self._restart()
            elif action == "give_up" or (action == "restart" and self.ep.attached):
                if self.ep.attached:
                    # Never kill what we did not start: alert once per outage and wait on.
                    if self.state != "alerted":
                        self.state = "alerted"
                        self.milestone("endpoint_failed", why=f"attached endpoint down: {why}")
                    continue
                self.failed = (
                    f"endpoint restarted {len(self.restarts)} times within "
                    f"{self.cfg.restart_window_secs:.0f}s and is still down ({why})"
                )
                self.state = "failed"
                self.emit(EndpointFailedEvent(why=self.failed))
                self.milestone("endpoint_failed", why=self.failed)
                return

    async def _restart(self) -> None:
        now = self.clock()
        down = now - (self.down_since or now)
        self.restarts.append(now)
        self.state = "restarting"
        self.emit(EndpointRestart(down_secs=round(down, 1), restarts=len(self.restarts)))
        self.milestone("endpoint_restart", down_secs=round(down, 1), restarts=len(self.restarts))
        try:
            await self.ep.restart()
        except EndpointError as e:
            log.warning("endpoint_restart_failed", error=str(e))
            self.state = "down"
            return
        self._mark_up()
        self.emit(EndpointStarted(**self.ep.describe(), readiness=self.ep.readiness))
