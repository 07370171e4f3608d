"""The supervisor's mirror of a replica that runs on a Ray node: its endpoint as the
templates and the status see it, and its keeper (up, down, lost, failed), kept by the
Ray backend's polls (autopilot.backends.ray.head)."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Protocol

import anyio

from autopilot.endpoints.keeper import KeeperBase
from autopilot.errors import EndpointFailed


class Replicas(Protocol):
    """What a mirror asks of the backend that keeps it (RayBackend)."""

    remote: list[RemoteKeeper]
    poll_secs: float
    w: Any

    async def start_replica(self, i: int) -> None: ...
    async def stop_replica(self, i: int) -> None: ...
    async def watch(self, i: int) -> None: ...


class RemoteEndpoint:
    """What the supervisor touches of a replica's endpoint when it runs on a node."""

    attached = False

    def __init__(self, executor: Replicas, replica: int, log_path: Path,
                 arm_group: tuple[str, ...]) -> None:
        self.executor = executor
        self.replica = replica
        self.log_path = log_path
        self.arm_group = arm_group

    # Where the node's endpoint answers (as its actor last reported): for templates of
    # work done here, e.g. grading centrally what a predecessor's cell left finished.
    @property
    def port(self) -> int:
        return int(self.executor.remote[self.replica].seen.get("port") or 0)

    @property
    def host(self) -> str:
        return str(self.executor.remote[self.replica].seen.get("host") or "127.0.0.1")

    @property
    def api_base(self) -> str:
        return str(self.executor.remote[self.replica].seen.get("api_base") or "")

    @property
    def served_model(self) -> str:
        return str(self.executor.remote[self.replica].seen.get("model") or "")

    async def stop(self) -> None:
        await self.executor.stop_replica(self.replica)

    async def aclose(self) -> None:
        return None

    def describe(self) -> dict[str, Any]:
        return {"engine": self.executor.w.preset.endpoint.engine, "replica": self.replica}


def peer_origin(api_base: str, up: bool, its_ip: str | None, here: str | None) -> str:
    """A replica's endpoint (``scheme://host:port``) as another node reaches it, or ""
    where it cannot: the replica is not up, or it listens on a loopback address of
    another machine."""
    import ipaddress
    from urllib.parse import urlsplit

    parts = urlsplit(api_base)
    if not up or not parts.netloc:
        return ""
    try:
        loopback = (parts.hostname == "localhost"
                    or ipaddress.ip_address(parts.hostname or "").is_loopback)
    except ValueError:
        loopback = False  # a name: the node resolves it
    return f"{parts.scheme}://{parts.netloc}" if not loopback or its_ip == here else ""


class RemoteKeeper(KeeperBase):
    """The supervisor's view of a keeper that runs in a node's actor."""

    def __init__(self, executor: Replicas, replica: int, endpoint: RemoteEndpoint) -> None:
        super().__init__()
        self.x = executor
        self.i = replica
        self.ep = endpoint
        self.lost_since: float | None = None
        self.seen: dict[str, Any] = {}  # the actor's keeper, as last polled
        self.where: dict[str, Any] = {}  # node, host, ip, devices of the live actor
        self.incarnation = 0
        self.lease = ""  # the lease of the actor it mirrors (a predecessor's, re-attached)
        self.acked = 0  # that actor's reports journaled, up to this number
        self.restarts: list[float] = []  # recreations after a loss, on the monotonic clock

    def describe(self) -> dict[str, Any]:
        return {**self.seen, **self.ep.describe(), "state": self.state,
                "failed": self.failed,
                "restarts": len(self.restarts) + int(self.seen.get("restarts", 0)),
                "node": self.where.get("node", "")[:12], "host": self.where.get("host"),
                "ip": self.where.get("ip"), "devices": self.where.get("devices"),
                "lease": self.where.get("lease"), "backend": "ray"}

    async def start(self) -> None:
        await self.x.start_replica(self.i)

    async def wait_up(self) -> None:
        while not self.is_up:
            if self.failed:
                raise EndpointFailed(self.failed)
            await anyio.sleep(self.x.poll_secs)

    async def watch(self) -> None:
        await self.x.watch(self.i)


__all__ = ["RemoteEndpoint", "RemoteKeeper", "Replicas", "peer_origin"]
