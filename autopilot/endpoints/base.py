"""The endpoint interface and the process-backed implementation most engines share.

Adding an engine touches three files: its module (``autopilot/endpoints/<engine>.py``,
a subclass of ``Endpoint`` with the class hooks it needs), its config model in
``autopilot/config/endpoint.py`` (with the engine's traits: ``through_gateway``,
``names_model_exactly``, ``serves_here``, ``hosted``, ``key_env()``, ``container()``)
and its line in ``ENGINES`` (``autopilot/endpoints/__init__.py``). The rest of the
house asks the traits and hooks, never the engine's name.

Alive means answering (uvicorn's multiprocess supervisor): a process that exists but
whose ``/health`` does not answer is down. Readiness polls ``/health`` (llama.cpp answers
503 while it loads) and then ``/v1/models``, while checking that the process has not
exited, and gives up after ``startup_timeout_secs`` with the tail of the endpoint log.
"""

from __future__ import annotations

import subprocess
import time
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar, Literal

if TYPE_CHECKING:
    import httpx

    from autopilot.cell.sandbox import Docker

import anyio
from anyio.abc import Process

from autopilot import lazyimport
from autopilot.cell import cgroups
from autopilot.cell.childenv import child_env
from autopilot.cell.procs import (
    OWNED,
    RUN_TOKEN_ENV,
    Tracker,
    describe_exit,
    identify,
    kill_tree,
    run_token,
    spawn,
)
from autopilot.config import ArmEndpoint, EndpointCommon, Preset
from autopilot.endpoints.ports import (
    PORT_TAKEN,
    PORT_TRIES,
    free_port,
    port_taken,
    probe_pause,
)
from autopilot.endpoints.served import Pins
from autopilot.errors import EndpointCrashed, EndpointError, EndpointStartTimeout
from autopilot.logsetup import get_logger
from autopilot.state.fsutil import log_tail
from autopilot.state.statedir import open_append

log = get_logger(__name__)


class Endpoint:
    """Base: an endpoint we may own (start/stop/restart) or only watch (attach). What
    the rest of the house needs of an engine beyond running it, it asks these class
    hooks: ``preflight_problems`` (on the machine that starts it), ``capacity_problems``
    (whatever the backend), ``pins`` (what drift hashes) and ``checked_live``
    (preflight's authenticated probe)."""

    engine: ClassVar[str] = ""
    owns_lifecycle: ClassVar[bool] = True
    checked_live: ClassVar[bool] = False  # preflight probes it: the key, the exact model

    @classmethod
    def preflight_problems(cls, preset: Preset) -> list[str]:
        """Its program and model must resolve before anything launches."""
        return []

    @classmethod
    def capacity_problems(cls, preset: Preset) -> list[str]:
        """Whether it can serve what the harness asks (context, concurrency)."""
        return []

    @classmethod
    def pins(cls, preset: Preset) -> Pins:
        """What identifies the engine serving the run (recorded per launch)."""
        return Pins()

    def __init__(self, preset: Preset, state_dir: Path, replica: int = 0) -> None:
        self.preset = preset
        self.cfg: EndpointCommon = preset.endpoint
        self.state_dir = state_dir
        self.replica = replica
        # The run's marker for our processes: the state dir's, unless a Ray node runs this
        # endpoint from its private mirror of the state dir (autopilot.backends.ray.node).
        self.marker = run_token(state_dir)
        self.group: Path | None = None  # its cgroup, where it has one
        # Replica 0 keeps the single-endpoint names (endpoint.log, the port as given).
        self.log_path = state_dir / ("endpoint.log" if replica == 0
                                     else f"endpoint-{replica}.log")
        self.host = self.cfg.host
        self.port = (self.cfg.port + replica) if self.cfg.port else free_port(self.cfg.host)
        # A port we picked ourselves is free only when picked: anything on the machine
        # may bind it before the engine does (a campaign's other entries, every client's
        # ephemeral port). Such a port is re-picked; a port the config names never is.
        self.port_picked = not self.cfg.port
        self.served_model = preset.model
        # The arm settings this endpoint runs with (arms whose mode is an endpoint
        # setting run against differently started endpoints; see Keeper.reconfigure).
        self.arm_setting = ArmEndpoint()
        self.arm_group: tuple[str, ...] = ()
        self.generation = 0
        self.proc: Process | None = None
        self.tracker: Tracker | None = None
        self._client: httpx.AsyncClient | None = None
        self._docker: Docker | None = None
        self.container: Any = None
        self.readiness: dict[str, Any] = {}
        self.on_spawn: Callable[..., Any] = lambda **kw: log.info("endpoint_spawned", **kw)
        self.readopted = False  # a predecessor's process, taken over (no proc of ours)
        # Set by whoever starts it beyond the preset's env: a Ray node's lease, so that
        # its lease guard ends the endpoint too when the node's actor dies.
        self.extra_env: dict[str, str] = {}

    # ------------------------------------------------------------------ describe

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"

    @property
    def api_base(self) -> str:
        return f"{self.url}/v1"

    @property
    def attached(self) -> bool:
        return self.cfg.attach or not self.owns_lifecycle

    def describe(self) -> dict[str, Any]:
        return {
            "engine": self.engine,
            "url": self.api_base,
            "model": self.served_model,
            "pid": self.proc.pid if self.proc else (
                self.tracker.root.pid if self.readopted and self.tracker else None),
            "container": self.container_name() if self.mode == "docker" else None,
            "create_time": self.tracker.root.create_time if self.tracker else None,
            "attached": self.attached,
            "arms": list(self.arm_group),
            "arm_args": list(self.arm_setting.args),
            "replica": self.replica,
        }

    def argv(self) -> list[str]:
        raise NotImplementedError

    def full_argv(self) -> list[str]:
        """The engine's argv plus the current arm's endpoint settings."""
        return self.argv() + list(self.arm_setting.args)

    # docker mode -----------------------------------------------------------------

    default_image: ClassVar[str] = ""
    default_container: ClassVar[str] = "autopilot-endpoint"

    @property
    def mode(self) -> str:
        return str(getattr(self.cfg, "mode", "process"))

    def container_cmd(self) -> list[str]:
        """The container's command: the argv without the program (the image's entrypoint)."""
        return self.full_argv()[1:]

    def container_name(self) -> str:
        docker = getattr(self.cfg, "docker", None)
        name = docker.container_name if docker and docker.container_name else self.default_container
        return name if self.replica == 0 else f"{name}-{self.replica}"

    def container_config(self) -> dict[str, Any]:
        # aiodocker (and aiohttp under it) load only in docker mode: process-mode runs
        # start a tenth of a second faster.
        from autopilot.cell.sandbox import LABEL_ROLE, LABEL_STATE, gpu_requests

        docker = self.cfg.docker  # type: ignore[attr-defined]
        mine = dict(self.cfg.replica_env[self.replica]) \
            if self.replica < len(self.cfg.replica_env) else {}
        # A replica's CUDA_VISIBLE_DEVICES picks the GPUs handed to its container (Docker
        # DeviceRequests by id); inside, they are renumbered from 0, so the variable itself
        # stays outside.
        devices = mine.pop("CUDA_VISIBLE_DEVICES", None)
        gpus = devices if devices is not None and docker.gpus != "none" else docker.gpus
        env = {**getattr(self.cfg, "env", {}), **mine, **self.arm_setting.env}
        binds = [*(f"{docker.model_dir}:{docker.model_dir}:ro" for _ in [0] if docker.model_dir),
                 *docker.binds]
        host: dict[str, Any] = {"Binds": binds, "DeviceRequests": gpu_requests(gpus)}
        if docker.network == "host":
            host["NetworkMode"] = "host"
        else:
            host["PortBindings"] = {f"{self.port}/tcp": [
                {"HostIp": "127.0.0.1", "HostPort": str(self.port)}]}
        return {
            "Image": docker.image or self.default_image,
            "Cmd": self.container_cmd(),
            "Env": [f"{k}={v}" for k, v in env.items()],
            "Labels": {LABEL_STATE: str(self.state_dir), LABEL_ROLE: "endpoint",
                       "autopilot.replica": str(self.replica)},
            "ExposedPorts": {f"{self.port}/tcp": {}},
            "HostConfig": host,
        }

    async def _start_container(self) -> None:
        from aiodocker.exceptions import DockerError

        from autopilot.cell.sandbox import LABEL_STATE

        docker = self._docker_client()
        name = self.container_name()
        try:
            existing = await docker.client.containers.get(name)
        except DockerError as e:
            if e.status != 404:
                raise EndpointError(f"docker: cannot inspect {name}: {e}") from None
            existing = None
        if existing is not None:
            labels = existing["Config"].get("Labels") or {}
            if labels.get(LABEL_STATE) != str(self.state_dir):
                raise EndpointError(
                    f"container {name!r} exists and was not started by this run; remove it "
                    "or set attach = true to use it")
            await docker.remove(name)  # ours, from an earlier generation or a dead run
        config = self.container_config()
        log.info("endpoint_container", name=name, image=config["Image"], cmd=config["Cmd"],
                 generation=self.generation)
        try:
            self.container = await docker.client.containers.run(config, name=name)
        except DockerError as e:
            raise EndpointCrashed(f"docker: cannot start {name}: {e}") from None

    async def _container_exited(self) -> str | None:
        from aiodocker.exceptions import DockerError

        if self.container is None:
            return None
        try:
            await self.container.show()
        except DockerError:
            return "container is gone"
        state = self.container["State"]
        if state.get("Running"):
            return None
        return f"container exited with code {state.get('ExitCode')}"

    async def _dump_container_logs(self) -> None:
        from aiodocker.exceptions import DockerError

        if self.container is None:
            return
        try:
            lines = await self.container.log(stdout=True, stderr=True, tail=200)
        except DockerError:
            return
        with open_append(self.log_path, binary=False) as f:
            f.write(f"--- container {self.container_name()} generation {self.generation} ---\n")
            f.writelines(lines)

    def _docker_client(self) -> Docker:
        from autopilot.cell.sandbox import Docker

        if self._docker is None:
            self._docker = Docker()
        return self._docker

    def env(self) -> dict[str, str]:
        env = child_env(self.preset, "endpoint")
        if self.replica < len(self.cfg.replica_env):  # this replica's devices, e.g. GPUs
            env.update(self.cfg.replica_env[self.replica])
        return env

    def headers(self) -> dict[str, str]:
        return {}

    # ------------------------------------------------------------------ lifecycle

    def client(self) -> httpx.AsyncClient:
        if self._client is None:
            # httpx is imported here, at the first probe, not at start-up: by then the
            # endpoint process is booting on another core and the ~30 ms overlap with it
            # (and without its CLI: autopilot.lazyimport).
            httpx = lazyimport.httpx()

            # httpx loads the CA bundle for every client (~90 ms): pointless for a plain
            # http:// endpoint on loopback, which never negotiates TLS.
            tls = self.url.startswith("https://")
            self._client = httpx.AsyncClient(
                timeout=self.cfg.probe_timeout_secs, headers=self.headers(), trust_env=False,
                verify=tls,
            )
        return self._client

    async def aclose(self) -> None:
        if self._client is not None:
            await self._client.aclose()
            self._client = None
        if self._docker is not None:
            await self._docker.close()
            self._docker = None

    async def start(self) -> None:
        """Start and wait until ready. A start that failed because a port we picked was
        taken in the meantime is retried on a fresh one (the next cells get its URL)."""
        for tries in range(1, PORT_TRIES + 1):
            try:
                return await self._start_once()
            except EndpointCrashed as e:
                if not self._lost_port(str(e)) or tries == PORT_TRIES:
                    raise
                await self.stop()  # what the failed start left, by identity
                taken, self.port = self.port, free_port(self.host)
                log.warning("endpoint_port_taken", engine=self.engine, port=taken,
                            new_port=self.port, generation=self.generation)

    def _lost_port(self, why: str) -> bool:
        if self.attached or not self.port_picked:
            return False
        # The engine's words, or a bind of our own: a client's ephemeral port may have
        # been on it for the instant the engine bound and be gone by now.
        return bool(PORT_TAKEN.search(why)) or port_taken(self.host, self.port)

    async def _start_once(self) -> None:
        if not self.attached and self.mode == "docker":
            await self._start_container()
        elif not self.attached:
            argv = self.full_argv()
            log.info("endpoint_argv", engine=self.engine, argv=argv, generation=self.generation,
                     arms=list(self.arm_group))
            with open_append(self.log_path) as logf:
                logf.write(f"--- start generation {self.generation} ---\n".encode())
                logf.flush()
                # The run's marker: if we are killed before on_spawn journals it, the
                # next supervisor's sweep still knows this process is ours (and its port).
                env = {**self.env(), **self.arm_setting.env, **self.extra_env,
                       RUN_TOKEN_ENV: self.marker}
                # In a cgroup of its own where one can be made (autopilot.cell.cgroups):
                # whatever it forks, however it hides, ends with it.
                contain = cgroups.for_run(self.marker)[0]
                self.group = contain.group(f"endpoint-{self.replica}") if contain else None
                run_argv = contain.wrap(argv, self.group) if contain and self.group else argv
                self.proc = await spawn(
                    run_argv, stdout=logf, stderr=subprocess.STDOUT, env=env,
                    start_new_session=True,
                )
            ident = identify(self.proc.pid)
            if ident is not None:
                self.tracker = Tracker(ident)
                # Journaled before the (maybe long) load: a supervisor killed while the
                # endpoint loads must leave a record its successor can sweep.
                # With what a successor needs to re-adopt it still loading (its port).
                self.on_spawn(**self.describe(), start_ticks=ident.ticks,
                              generation=self.generation)
        await self.wait_ready()

    async def readopt(self, rec: dict[str, Any]) -> str | None:
        """Take over the endpoint process a predecessor started (its ``endpoint_started``
        record) if it is provably the one we would start now: the same live process
        (exact identity, the run's marker: checked by the caller), on the same host, for
        the same model and arm settings, and answering with that model. None when taken
        over; else why not, and the process is killed by its identity (it holds the port
        and the GPU memory a fresh start needs)."""
        from urllib.parse import urlsplit

        from autopilot.cell.procs import journaled_identity, verify

        ident = journaled_identity(rec)
        why = None
        if self.attached or self.mode != "process":
            why = "only a process endpoint of ours is re-adopted"
        elif ident is None or verify(ident) is None:
            why = "its process is gone"
        elif rec.get("model") != self.served_model:
            why = f"it serves {str(rec.get('model'))[:80]!r}, not {self.served_model!r}"
        elif list(rec.get("arm_args") or []) != list(self.arm_setting.args):
            why = "it runs with other arm settings"
        else:
            parts = urlsplit(str(rec.get("url") or ""))
            if parts.hostname != self.host or parts.port is None:
                why = f"it listens elsewhere ({str(rec.get('url'))[:80]})"
        if why is None and ident is not None:
            before, self.port = self.port, int(urlsplit(str(rec["url"])).port or 0)
            self.tracker, self.readopted = Tracker(ident), True
            try:
                ok, detail = await self.probe(check_model=True)
            except EndpointError as e:
                ok, detail = False, str(e)
            if ok:
                contain = cgroups.for_run(self.marker)[0]
                self.group = contain.base / f"endpoint-{self.replica}" if contain else None
                gen = rec.get("generation")
                self.generation = gen if type(gen) is int else self.generation
                log.info("endpoint_readopted", pid=ident.pid, url=self.api_base)
                return None
            self.port, self.readopted = before, False
            why = f"it does not answer as {self.served_model!r}: {detail}"
        if ident is not None and verify(ident) is not None:
            await anyio.to_thread.run_sync(kill_tree, Tracker(ident), 5.0)
        self.tracker = None
        return why

    async def wait_ready(self) -> None:
        began = time.monotonic()
        deadline = began + self.cfg.startup_timeout_secs
        why = "no answer yet"
        waited: Counter[str] = Counter()  # why probes failed (503 loading, refused...)
        while True:
            if self.proc is not None and self.proc.returncode is not None:
                raise EndpointCrashed(
                    f"{self.engine} endpoint {describe_exit(self.proc.returncode)} while "
                    f"starting; endpoint.log: {log_tail(self.log_path)}"
                )
            if self.mode == "docker" and not self.attached:
                gone = await self._container_exited()
                if gone:
                    await self._dump_container_logs()
                    raise EndpointCrashed(f"{self.engine} endpoint {gone} while starting; "
                                          f"endpoint.log: {log_tail(self.log_path)}")
            answer = await self._probe_while_alive()
            if answer is None:
                continue  # it exited mid-probe: said at the top
            ok, why = answer
            if ok:
                self.readiness = {"not_ready_probes": sum(waited.values()),
                                  "not_ready_reasons": dict(sorted(waited.items()))}
                log.info("endpoint_ready", engine=self.engine, url=self.api_base,
                         **self.readiness)
                return
            waited[why] += 1
            await anyio.sleep(probe_pause(time.monotonic() - began))
            if time.monotonic() >= deadline:
                if self.mode == "docker":
                    await self._dump_container_logs()
                raise EndpointStartTimeout(
                    f"{self.engine} endpoint not ready after {self.cfg.startup_timeout_secs:.0f}s"
                    f" ({why}); endpoint.log: {log_tail(self.log_path)}"
                )

    async def _probe_while_alive(self) -> tuple[bool, str] | None:
        """A readiness probe cut short (None) when our process exits meanwhile: whatever
        holds a port the engine failed to bind may accept and never answer, and the
        crash should not wait out the probe's timeout."""
        proc = self.proc
        if proc is None or self.attached:
            return await self.probe(check_model=True)
        answer: tuple[bool, str] | None = None
        async with anyio.create_task_group() as tg:
            async def exited() -> None:
                await proc.wait()
                tg.cancel_scope.cancel()

            tg.start_soon(exited)
            answer = await self.probe(check_model=True)
            tg.cancel_scope.cancel()
        return answer

    async def probe(self, check_model: bool = False) -> tuple[bool, str]:
        """(answering, why). Raises EndpointError for a permanent misconfiguration."""
        httpx = lazyimport.httpx()  # already loaded by client(); see there

        try:
            resp = await self.client().get(f"{self.url}/health")
            if resp.status_code != 200:
                return False, f"/health answered {resp.status_code}"
            if check_model:
                return await self._check_models()
            return True, "ok"
        except httpx.HTTPError as e:
            if self.proc is not None and self.proc.returncode is not None:
                return False, f"process {describe_exit(self.proc.returncode)}"
            if self.readopted and self.tracker is not None and not self.tracker.alive():
                return False, "re-adopted process is gone"
            return False, f"{type(e).__name__}"

    # Where the engine says it is decoding: llama-server's /slots, vLLM's /metrics.
    progress_api: ClassVar[Literal["", "slots", "metrics"]] = ""

    async def decoding(self) -> int | None:
        """The endpoint's count of tokens decoded so far while a request is in flight,
        None when it is idle or cannot tell."""
        if not self.progress_api:
            return None
        try:
            resp = await self.client().get(f"{self.url}/{self.progress_api}")
            if resp.status_code != 200:
                return None
            if self.progress_api == "slots":
                return slots_generation(resp.json())
            return metrics_generation(resp.text)
        except Exception:  # an answer we cannot read is "cannot tell", never an error
            return None

    async def _check_models(self) -> tuple[bool, str]:
        resp = await self.client().get(f"{self.api_base}/models")
        if resp.status_code != 200:
            return False, f"/v1/models answered {resp.status_code}"
        ids = [model.get("id") for model in resp.json().get("data", []) if isinstance(model, dict)]
        if self.served_model not in ids:
            raise EndpointError(
                f"served model {self.served_model!r} not in {self.api_base}/models "
                f"(there: {', '.join(map(str, ids)) or 'none'})"
            )
        return True, "ok"

    def alive(self) -> bool:
        if self.readopted:
            return self.tracker is not None and self.tracker.alive()
        return self.proc is not None and self.proc.returncode is None

    async def stop(self) -> None:
        """Exact-PID kill of the endpoint tree we started, or removal of the container we
        created. Never touches an attached endpoint."""
        if self.attached:
            return
        if self.mode == "docker":
            if self.container is not None:
                await self._dump_container_logs()
                await self._docker_client().remove(self.container_name())
                self.container = None
            return
        if self.proc is None:
            if self.readopted and self.tracker is not None:  # a predecessor's: by identity
                pids = await anyio.to_thread.run_sync(kill_tree, self.tracker, 5.0)
                contain = cgroups.for_run(self.marker)[0]
                if contain is not None and self.group is not None:
                    await anyio.to_thread.run_sync(contain.kill, self.group)
                log.info("endpoint_stopped", engine=self.engine, pids=pids, readopted=True)
                self.readopted, self.tracker = False, None
            return
        if self.tracker is not None:
            await anyio.to_thread.run_sync(kill_tree, self.tracker, 5.0)
        with anyio.CancelScope(shield=True):
            await self.proc.wait()
            contain = cgroups.for_run(self.marker)[0]
            if contain is not None and self.group is not None:  # what it left behind
                await anyio.to_thread.run_sync(contain.kill, self.group)
        OWNED.discard(self.proc.pid)
        log.info("endpoint_stopped", engine=self.engine, pid=self.proc.pid,
                 code=self.proc.returncode, how=describe_exit(self.proc.returncode))

    async def restart(self) -> None:
        await self.stop()
        self.generation += 1
        await self.start()


def slots_generation(slots: Any) -> int | None:
    """llama-server's ``/slots``: tokens decoded by all slots, None when none is busy.
    Shape-checked: anything unexpected reads as "cannot tell"."""
    if not isinstance(slots, list):
        return None
    busy, total = False, 0
    for slot in slots:
        if not isinstance(slot, dict):
            return None
        busy = busy or slot.get("is_processing") is True
        nxt = slot.get("next_token")
        first = nxt[0] if isinstance(nxt, list) and nxt else nxt
        decoded = first.get("n_decoded") if isinstance(first, dict) else None
        if isinstance(decoded, int) and not isinstance(decoded, bool):
            total += decoded
        processed = slot.get("n_prompt_tokens_processed")
        if isinstance(processed, int) and not isinstance(processed, bool):
            total += processed  # a long prompt being processed is work too
    return total if busy else None


# vLLM's counters of tokens (prompt and generated) and its gauge of running requests.
_TOKEN_SAMPLES = frozenset({"vllm:generation_tokens_total", "vllm:prompt_tokens_total"})
_RUNNING = "vllm:num_requests_running"


def metrics_generation(text: str) -> int | None:
    """vLLM's Prometheus ``/metrics`` (read by prometheus_client's own parser):
    generated + prompt tokens so far, None when no request is running or the text is
    not the exposition format ("cannot tell")."""
    from prometheus_client.parser import text_string_to_metric_families

    running = tokens = 0.0
    try:
        for family in text_string_to_metric_families(text):
            for sample in family.samples:
                if sample.name == _RUNNING:
                    running += sample.value
                elif sample.name in _TOKEN_SAMPLES:
                    tokens += sample.value
    except ValueError:  # an endpoint's text is untrusted: malformed is "cannot tell"
        return None
    return int(tokens) if running > 0 else None
