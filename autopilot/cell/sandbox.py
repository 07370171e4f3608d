"""Docker through aiodocker: endpoint containers, cell sandboxes, orphan sweeps.

Containers the autopilot creates carry labels (``autopilot.state_dir``,
``autopilot.role``, ``autopilot.cell``); sandbox containers a *harness* creates are
matched by the exact name template of this plan's cells, and removed only when they are
this run's (``Owner``): a harness names its sandbox after the cell (MMBT's
``bench-sandbox-<cell>``), so another run with the same cell ids on another checkout,
on the same daemon, has one under the same name. Nothing is ever removed by a name
prefix or pattern: a decoy named ``bench-sandbox-x-decoy`` survives a sweep of
``bench-sandbox-x``.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypedDict

import aiodocker
import anyio
from aiodocker.exceptions import DockerError

from autopilot.logsetup import get_logger
from autopilot.state.fsutil import parse_iso

if TYPE_CHECKING:
    from autopilot.config import Preset
    from autopilot.plan import Plan

log = get_logger(__name__)

LABEL_STATE = "autopilot.state_dir"
LABEL_ROLE = "autopilot.role"
LABEL_CELL = "autopilot.cell"


@dataclass(frozen=True)
class Owner:
    """Which harness sandboxes are this run's: one that bind-mounts anything is ours
    when a mount lies under the run's roots (MMBT mounts ``tooling/workspace/<cell>`` of
    its checkout, which this run owns: autopilot.state.claims); one that mounts nothing
    is ours unless it was created before the run's first launch (``since``)."""

    roots: tuple[Path, ...]
    since: float | None

    def why_not(self, info: Mapping[str, object]) -> str | None:
        """None when the container ``info`` (docker inspect, untrusted) is ours, else
        why not."""
        mounts = info.get("Mounts")
        binds = [str(mount.get("Source", "")) for mount in mounts if isinstance(mount, dict)
                 and mount.get("Type") == "bind"] if isinstance(mounts, list) else []
        if binds:
            if any(Path(bind).is_relative_to(root) for bind in binds for root in self.roots):
                return None
            return f"it mounts {binds[0]}, outside this run's roots: another run's"
        created = parse_iso(info.get("Created"))  # Docker's RFC 3339, to the ns
        if self.since is not None and created is not None and created < self.since - 1:
            return "it was created before this run began"
        return None


class Docker:
    """A thin, owned aiodocker client (``DOCKER_HOST`` honoured, or ``url``: a node's
    daemon named by the node's own ``DOCKER_HOST``)."""

    def __init__(self, url: str | None = None) -> None:
        self.client = aiodocker.Docker(url=url)
        self._activity: dict[str, tuple[float, int | None]] = {}
        self.spared: list[dict[str, str]] = []  # harness sandboxes not ours (Owner)

    async def close(self) -> None:
        await self.client.close()

    async def remove(self, name: str, owner: Owner | None = None) -> bool:
        """Force-remove the container with exactly this name (and, with ``owner``, only
        when it is the run's); False if there was none or it was spared."""
        try:
            container = await self.client.containers.get(name)
            # Docker also resolves an id prefix: make sure this is exactly that name.
            if str(container["Name"]).lstrip("/") != name:
                return False
            info = {k: container[k] for k in ("Mounts", "Created") if k in container}
            why = owner.why_not(info) if owner is not None else None
            if why:
                log.warning("sandbox_spared", name=name, why=why)
                self.spared.append({"container": name, "why": why})
                return False
            await container.delete(force=True, v=True)
        except DockerError as e:
            if e.status == 404:
                return False
            log.warning("container_remove_failed", name=name, error=str(e))
            return False
        log.info("container_removed", name=name)
        return True

    async def taken(self, name: str, owner: Owner) -> str | None:
        """Why the container named exactly ``name`` is another run's live sandbox (it
        runs, and ``owner`` says it is not ours), or None. A harness that names its
        sandbox after the cell removes any container of that name at its start (MMBT's
        ``docker rm -f bench-sandbox-<cell>``): launching it now would destroy that
        run's live work."""
        try:
            container = await self.client.containers.get(name)
        except DockerError:
            return None
        if str(container["Name"]).lstrip("/") != name \
                or not (container["State"] or {}).get("Running"):
            return None
        return owner.why_not({k: container[k] for k in ("Mounts", "Created") if k in container})

    async def names(self, *, all_: bool = True, label: str | None = None) -> dict[str, str]:
        kwargs: dict[str, Any] = {"all": "1" if all_ else "0"}
        if label:
            kwargs["filters"] = json.dumps({"label": [label]})
        out = {}
        for container in await self.client.containers.list(**kwargs):
            for name in container["Names"] or []:
                out[name.lstrip("/")] = container.id
        return out

    async def remove_exact(self, names: Iterable[str], owner: Owner | None = None) -> list[str]:
        """Remove each existing container whose name is exactly one of ``names`` (and,
        with ``owner``, is the run's)."""
        existing = await self.names()
        removed = []
        for name in names:
            if name in existing and await self.remove(name, owner):
                removed.append(name)
        return removed

    async def remove_endpoint(self, name: str, state_dir: str) -> bool:
        """Remove the endpoint container named exactly ``name`` when this run's state dir
        labelled it (a replica's on a node, its actor lost): never another's."""
        try:
            container = await self.client.containers.get(name)
        except DockerError:
            return False
        labels = container["Config"].get("Labels") or {}
        if labels.get(LABEL_STATE) != state_dir or labels.get(LABEL_ROLE) != "endpoint":
            return False
        return await self.remove(name)

    async def remove_labelled(self, state_dir: str, role: str | None = None) -> list[str]:
        removed = []
        for name in await self.names(label=f"{LABEL_STATE}={state_dir}"):
            container = await self.client.containers.get(name)
            if role and (container["Config"].get("Labels") or {}).get(LABEL_ROLE) != role:
                continue
            if await self.remove(name):
                removed.append(name)
        return removed

    async def activity(self, name: str, min_interval: float = 5.0) -> int | None:
        """A counter that grows while the sandbox does work (CPU time), cached per
        ``min_interval`` so polling stays cheap; None when there is no such container."""
        now = time.monotonic()
        cached = self._activity.get(name)
        if cached and now - cached[0] < min_interval:
            return cached[1]
        value: int | None = None
        try:
            stats = await self.client._query_json(
                f"containers/{name}/stats", params={"stream": "false", "one-shot": "true"})
            value = int(stats.get("cpu_stats", {}).get("cpu_usage", {}).get("total_usage", 0))
        except (DockerError, ValueError, TypeError):
            value = None
        self._activity[name] = (now, value)
        return value


SANDBOX_WAIT_SECS = 5.0  # how often a cell waiting on another run's live sandbox looks


class DockerSandboxes:
    """The run's Docker side of its cells (``context.Sandboxes``): each attempt's sandbox
    container and the Compose projects its harness listed, removed by exact name and
    only when this run's (``Owner``); a scratch dir a root-owned sandbox left, cleared
    through a container of the preset's image."""

    def __init__(self, docker: Docker, preset: Preset, state_dir: Path, owner: Owner
                 ) -> None:
        harness = preset.harness
        self.docker, self.owner, self.state_dir = docker, owner, str(state_dir)
        self.image, self.pattern = harness.scratch_remove_image, harness.compose_project_pattern
        self.containers = bool(harness.sandbox_container)
        self.clears = bool(self.image)
        self.projects = bool(harness.compose_projects)

    async def remove(self, name: str, launching: bool = False) -> bool:
        """Remove this run's sandbox ``name``. Before a launch, another run's live sandbox
        under the cell's name is waited out: the harness would remove it at its start."""
        while launching and (why := await self.docker.taken(name, self.owner)):
            log.warning("sandbox_taken", container=name, why=why,
                        note="the cell waits until that run's sandbox is gone")
            await anyio.sleep(SANDBOX_WAIT_SECS)
        return bool(await self.docker.remove(name, self.owner))

    async def activity(self, name: str) -> int | None:
        return await self.docker.activity(name)

    async def clear_dir(self, path: str) -> str | None:
        return await clear_dir(self.docker, path, self.image, self.state_dir)

    async def remove_projects(self, listed: str) -> list[str]:
        return await remove_projects(self.docker, listed_projects(listed, self.pattern))


COMPOSE_PROJECT = "com.docker.compose.project"  # the label Compose puts on what it makes


def listed_projects(path: str, pattern: str) -> list[str]:
    """The Compose projects a harness listed (an untrusted file: small, one name a
    line); only names matching ``pattern`` (a whole match), at most 64."""
    import re

    from autopilot.state.untrusted import read_tail

    try:
        data, _ = read_tail(path, 64 * 1024)
    except OSError:
        return []
    allowed = re.compile(pattern)
    names = [line.strip() for line in data.decode("utf-8", "replace").splitlines()]
    return list(dict.fromkeys(name for name in names
                              if len(name) <= 128 and allowed.fullmatch(name)))[:64]


async def remove_projects(docker: Docker, names: Iterable[str]) -> list[str]:
    """Remove every container, then every network, that Compose labelled with exactly
    one of these project names (the label's value, never a prefix)."""
    removed = []
    for name in names:
        flt = json.dumps({"label": [f"{COMPOSE_PROJECT}={name}"]})
        try:
            for container in await docker.client.containers.list(all=True, filters=flt):
                if (container["Labels"] or {}).get(COMPOSE_PROJECT) != name:
                    continue  # the engine's filter, checked again
                await container.delete(force=True, v=True)
                removed.append(f"container {str((container['Names'] or ['?'])[0]).lstrip('/')}")
            nets = await docker.client.networks.list(
                filters={"label": [f"{COMPOSE_PROJECT}={name}"]})
            for net in nets:
                if (net.get("Labels") or {}).get(COMPOSE_PROJECT) == name:
                    await (await docker.client.networks.get(net["Id"])).delete()
                    removed.append(f"network {net.get('Name')}")
        except DockerError as e:
            log.warning("compose_project_remove_failed", project=name, error=str(e))
    if removed:
        log.info("compose_projects_removed", removed=removed)
    return removed


async def sweep_listed_projects(docker: Docker, preset: Preset, plan: Plan,
                                state_dir: Path, keep: frozenset[str] = frozenset()
                                ) -> list[str]:
    """What every cell of the plan listed in ``harness.compose_projects`` (a killed
    predecessor's harnesses: at start-up and in `cleanup`), removed; never a cell's in
    ``keep`` (an attempt re-attached to: still running)."""
    from autopilot.plan import cell_context
    from autopilot.templates import render

    removed: list[str] = []
    for cell in plan.cells:
        if cell.id in keep:
            continue
        listing = render(preset.harness.compose_projects, cell_context(preset, cell, 1,
                                                                        state_dir))
        removed += await remove_projects(docker, listed_projects(
            listing, preset.harness.compose_project_pattern))
    return removed


async def clear_dir(docker: Docker, path: str, image: str, state_dir: str,
                    timeout: float = 120.0) -> str | None:
    """Empty ``path`` (already allowed by fsguard) from a throwaway container of
    ``image`` that mounts exactly that directory, as root, with no network and only the
    capabilities a removal needs; None when done, else why not. Labelled as ours, so a
    supervisor killed meanwhile leaves nothing a sweep would not remove."""
    import asyncio
    import secrets

    name = f"autopilot-scratch-{secrets.token_hex(6)}"
    config: dict[str, Any] = {
        "Image": image, "User": "0:0", "Entrypoint": ["find"],
        # busybox's find has no -delete; -exec rm works with GNU's and busybox's
        "Cmd": ["/scratch", "-mindepth", "1", "-maxdepth", "1", "-exec", "rm", "-rf", "{}",
                "+"],
        "NetworkDisabled": True,
        "Labels": {LABEL_STATE: state_dir, LABEL_ROLE: "scratch"},
        "HostConfig": {"Binds": [f"{path}:/scratch"], "NetworkMode": "none",
                       "CapDrop": ["ALL"], "CapAdd": ["DAC_OVERRIDE", "FOWNER"],
                       "ReadonlyRootfs": True, "SecurityOpt": ["no-new-privileges"]},
    }
    try:
        container = await docker.client.containers.run(config, name=name)
    except DockerError as e:  # aiodocker's word for a daemon that is not there, too
        return f"docker: {e.message if hasattr(e, 'message') else e}"[:300]
    try:
        result = await asyncio.wait_for(container.wait(), timeout)
        code = result.get("StatusCode") if isinstance(result, dict) else None
        if code != 0:
            tail = "".join(await container.log(stdout=True, stderr=True, tail=3))[-200:]
            return f"the removal container exited {code}: {tail.strip()}"
        return None
    except (TimeoutError, DockerError) as e:
        return f"the removal container did not finish: {type(e).__name__}"
    finally:
        try:
            await container.delete(force=True)
        except DockerError as e:
            log.warning("container_remove_failed", name=name, error=str(e))


class DeviceRequest(TypedDict, total=False):
    """One of Docker's ``HostConfig.DeviceRequests`` (its API's names)."""
    Driver: str
    Count: int
    DeviceIDs: list[str]
    Capabilities: list[list[str]]


def gpu_requests(gpus: str) -> list[DeviceRequest]:
    """``--gpus`` semantics: "all", "" / "none", or a comma list of device ids."""
    if not gpus or gpus == "none":
        return []
    if gpus == "all":
        return [{"Driver": "nvidia", "Count": -1, "Capabilities": [["gpu"]]}]
    return [{"Driver": "nvidia", "DeviceIDs": gpus.split(","), "Capabilities": [["gpu"]]}]
