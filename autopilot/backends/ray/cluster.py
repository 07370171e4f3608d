"""Joining a Ray cluster, naming a run's actors, asking for their resources, and
sweeping a run off every node (``autopilot cleanup``): the cluster-wide helpers of the
Ray backend (autopilot.backends.ray.head). Nothing here imports Ray at module load."""

from __future__ import annotations

import socket
from pathlib import Path
from typing import TYPE_CHECKING, Any

from autopilot.backends.ray.node import Containers, sweep_run
from autopilot.errors import ConfigError, EndpointError

if TYPE_CHECKING:
    from autopilot.config import Backend as BackendConfig
    from autopilot.config import Preset

STRATEGY = {"spread": "SPREAD", "pack": "PACK", "strict_spread": "STRICT_SPREAD",
            "strict_pack": "STRICT_PACK"}


def import_ray() -> Any:
    try:
        import ray
    except ImportError as e:
        raise ConfigError("backend.kind = 'ray' needs Ray on this machine and every node: "
                          "pip install 'bench-autopilot[ray]'") from e
    return ray


def actor_name(token: str, what: str) -> str:
    """A run's Ray names (``r<i>`` per replica actor, ``pg``): derived from the run's
    marker, so a successor, and ``autopilot cleanup``, find what a predecessor left."""
    return f"autopilot-{token[:16]}-{what}"


CONNECT_TIMEOUT_SECS = 10.0


def connect(cfg: BackendConfig) -> Any:
    """Join the cluster as a driver, or raise EndpointError in one line. An address
    that does not answer is found out by a plain TCP connect first: ``ray.init`` itself
    retries for minutes before giving up."""
    ray = import_ray()
    if ray.is_initialized():
        return ray
    host, sep, port = cfg.address.rpartition(":")
    if sep and port.isdigit():
        try:
            socket.create_connection((host.strip("[]"), int(port)),
                                     timeout=CONNECT_TIMEOUT_SECS).close()
        except OSError as e:
            raise EndpointError(f"cannot reach the Ray cluster at {cfg.address} "
                                f"(backend.address): {e.strerror or e}") from None
    try:
        ray.init(address=cfg.address, namespace=cfg.namespace, log_to_driver=False,
                 logging_level="WARNING")
    except Exception as e:  # ConnectionError, RuntimeError: said in one line
        ray.shutdown()
        raise EndpointError(f"cannot join the Ray cluster at {cfg.address} "
                            f"(backend.address): {short_error(e)}") from None
    return ray


def node_state_dir(preset: Preset, token: str, state_dir: Path) -> Path:
    """Where a node keeps the run's files: the state dir itself on shared storage, else
    its private mirror (autopilot.backends.ray.node.NodeAgent)."""
    backend = preset.backend
    return state_dir if backend.shared_state_dir else Path(backend.node_dir) / token[:16]


def endpoint_containers(preset: Preset) -> tuple[str, ...]:
    """Each replica's endpoint container name (Endpoint.container_name), in Docker mode."""
    from autopilot.endpoints import ENGINES

    container = preset.endpoint.container()
    if container is None:
        return ()
    name = container.container_name or ENGINES[preset.endpoint.engine].default_container
    return tuple(name if i == 0 else f"{name}-{i}" for i in range(preset.endpoint.replicas))


def node_containers(preset: Preset, token: str, state_dir: Path, *,
                    endpoints: tuple[str, ...] = (), sandboxes: tuple[str, ...] = (),
                    since: float | None = None, docker_host: str | None = None
                    ) -> Containers | None:
    """What of the run a node's daemon may hold, to remove by exact name."""
    from autopilot.state.fsguard import run_roots

    if not endpoints and not sandboxes:
        return None
    where = node_state_dir(preset, token, state_dir)
    return Containers(str(where), endpoints, sandboxes,
                      tuple(str(root) for root in run_roots(preset, where)), since, docker_host)


def cleanup_cluster(preset: Preset, token: str, grace: float, endpoint: bool,
                    state_dir: Path | None = None, sandboxes: tuple[str, ...] = (),
                    since: float | None = None) -> list[str]:
    """``autopilot cleanup`` on every node: stop the run's actors (each kills what it runs
    and its endpoint), free its placement group, then kill what still carries the run's
    marker on every live node and remove the run's containers from its daemon (its
    endpoints' by label, the plan's ``sandboxes`` by name). Blocking; the lock is free
    (no supervisor runs)."""
    cfg = preset.backend
    containers = None if state_dir is None else node_containers(
        preset, token, state_dir, endpoints=endpoint_containers(preset) if endpoint else (),
        sandboxes=sandboxes, since=since)
    ray = connect(cfg)
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    done: list[str] = []
    try:
        for i in range(preset.endpoint.replicas):
            name = actor_name(token, f"r{i}")
            try:
                actor = ray.get_actor(name, namespace=cfg.namespace)
            except ValueError:
                continue
            try:
                cells = ray.get(actor.stop.remote(), timeout=60)
            except Exception as e:  # dead or hung: killed below either way
                cells = [f"(stop failed: {short_error(e)})"]
            ray.kill(actor, no_restart=True)
            done.append(f"ray actor {name} (its cells: {', '.join(cells) or 'none'})")
        try:
            ray.util.remove_placement_group(ray.util.get_placement_group(actor_name(token, "pg")))
            done.append(f"ray placement group {actor_name(token, 'pg')}")
        except ValueError:
            pass
        sweep = ray.remote(sweep_run)
        for node in ray.nodes():
            if not node.get("Alive"):
                continue
            found = ray.get(sweep.options(
                num_cpus=0, max_retries=0,
                scheduling_strategy=NodeAffinitySchedulingStrategy(node["NodeID"], soft=False),
            ).remote(token, grace, endpoint, containers), timeout=120)
            where = f"on node {node['NodeID'][:12]} ({node.get('NodeManagerAddress')})"
            done += [f"container {f['container']} {where}" if "container" in f else
                     f"processes {' '.join(map(str, f['pids']))} "
                     f"({'cell ' + f['cell'] if f['cell'] else 'endpoint'}) {where}"
                     for f in found]
    finally:
        ray.shutdown()
    return done


def bundle_of(resources: dict[str, float]) -> dict[str, float]:
    """A replica's placement bundle; a replica that asks for nothing takes one CPU."""
    return dict(resources) or {"CPU": 1.0}


def actor_options(bundle: dict[str, float]) -> dict[str, Any]:
    """Ray actor options asking for exactly the bundle (GPUs by ``num_gpus``, so Ray
    sets the actor's CUDA_VISIBLE_DEVICES, which the endpoint then inherits)."""
    custom = {k: v for k, v in bundle.items() if k not in ("CPU", "GPU")}
    return {"num_cpus": bundle.get("CPU", 0), "num_gpus": bundle.get("GPU", 0),
            "resources": custom or None}


def placement_lines(resources: list[dict[str, float]], replicas: int, placement: str,
                    address: str) -> list[str]:
    """What --dry-run says about where replicas go (Ray places them at run time)."""
    lines = [f"ray cluster {address}: {replicas} replica actor(s), placement "
             f"{STRATEGY[placement]}"]
    for i in range(replicas):
        res = resources[i] if len(resources) > 1 else (resources[0] if resources else {})
        want = ", ".join(f"{k}={v:g}" for k, v in bundle_of(res).items())
        lines.append(f"  replica {i} -> a node with {want} (Ray places it at start)")
    return lines


def short_error(e: BaseException) -> str:
    """The first line of a Ray error (they run to pages)."""
    text = str(e).strip().splitlines()
    return (text[0] if text else type(e).__name__)[:300]
