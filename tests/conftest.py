"""Shared helpers: run the real CLI as a subprocess, wait on handshakes (file contents,
journal events), never on fixed sleeps."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import psutil
import pytest

ROOT = Path(__file__).resolve().parent.parent

# Children get SIGINT's default disposition: a CI runner or a background shell may run the
# suite with SIGINT ignored, and an ignored signal stays ignored in every child across exec,
# so a child a test stops with SIGINT would never stop. A handler here becomes SIG_DFL in
# each child at exec.
if signal.getsignal(signal.SIGINT) is signal.SIG_IGN:
    signal.signal(signal.SIGINT, signal.default_int_handler)


def reap_or_kill(pid: int, timeout: float) -> int:
    """Our child's wait status, within ``timeout``; killed first if it is still running
    then (a test that fails must not leave, or wait for ever on, its child)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        done, status = os.waitpid(pid, os.WNOHANG)
        if done:
            return status
        time.sleep(0.05)
    os.kill(pid, signal.SIGKILL)
    return os.waitpid(pid, 0)[1]


def cli_env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("AUTOPILOT_", "NOTIFY_SOCKET", "WATCHDOG_"))}
    env["PYTHONUNBUFFERED"] = "1"
    env.update(extra)
    return env


def run_cli(*args: str, timeout: float = 180, env: dict[str, str] | None = None,
            prog: str = "autopilot", cwd: Path | None = None
            ) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m",
         "autopilot" if prog == "autopilot" else "autopilot.views.dashboard.cli", *args],
        capture_output=True, text=True, timeout=timeout, env=env or cli_env(),
        cwd=cwd or ROOT,
    )


def spawn_cli(*args: str, env: dict[str, str] | None = None,
              log: Path | None = None) -> subprocess.Popen[bytes]:
    out = log.open("ab") if log else subprocess.DEVNULL
    return subprocess.Popen(
        [sys.executable, "-m", "autopilot", *args], env=env or cli_env(), cwd=ROOT,
        stdout=out, stderr=subprocess.STDOUT,
    )


def wait_for(pred: Callable[[], Any], timeout: float = 60, what: str = "condition") -> Any:
    """Poll a predicate on observable state (a handshake), failing loudly on timeout."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = pred()
        if value:
            return value
        time.sleep(0.05)
    raise AssertionError(f"timed out waiting for {what}")


def events(state_dir: Path) -> list[dict[str, Any]]:
    """A run's journal, each record held to its kind's type (autopilot.state.events):
    every test that reads a journal checks that what the run wrote is typed."""
    from autopilot.state.events import mistyped

    path = state_dir / "journal.jsonl"
    if not path.exists():
        return []
    out = []
    for line in path.read_text().splitlines():
        try:
            out.append(json.loads(line))
        except ValueError:
            pass
    bad = [why for ev in out if isinstance(ev, dict) and (why := mistyped(ev))]
    assert bad == [], f"{path}: events that fit no type: {bad[:5]}"
    return out


@pytest.fixture
def reachable() -> Iterator[Path]:
    """A dir other users can search (pytest's own tmp dirs are root's 0700): for cells
    that run as a user of their own."""
    d = Path(tempfile.mkdtemp(prefix="autopilot-reach-", dir="/tmp"))
    os.chmod(d, 0o711)
    try:
        yield d
    finally:
        shutil.rmtree(d, ignore_errors=True)


def write_overlay(path: Path, doc: dict[str, Any]) -> Path:
    path.write_text(json.dumps(doc))
    return path




def env_holders(key: str, values: set[str]) -> list[int]:
    """Live processes whose environment has ``key`` set to one of ``values``."""
    found = []
    for p in psutil.process_iter():
        try:
            if p.environ().get(key) in values and p.status() != psutil.STATUS_ZOMBIE:
                found.append(p.pid)
        except (psutil.Error, OSError):
            pass
    return found


def token_holders(tokens: set[str]) -> list[int]:
    return env_holders("AUTOPILOT_CELL_TOKEN", tokens)


@pytest.fixture
async def upstream() -> Any:
    """A FAKE OpenAI-compatible upstream on 127.0.0.1 (tests/gateway_fake.py)."""
    from gateway_fake import FakeUpstream

    up = FakeUpstream()
    await up.start()
    try:
        yield up
    finally:
        await up.close()


@pytest.fixture
def state_dir(tmp_path: Path) -> Path:
    return tmp_path / "state"


@pytest.fixture(autouse=True)
def _end_what_the_test_left(request: pytest.FixtureRequest) -> Any:
    """After a test, whatever a run of its own left behind (a supervisor it SIGKILLed and
    never resumed leaves its endpoint and cells): the processes carrying the marker of a
    run whose state dir lies in the test's tmp_path, and that run's cgroups. Exact: only
    runs this test made, found by their marker, killed by pid."""
    # Asked for now, so that tmp_path is torn down after this (its dependent) is.
    tmp = request.getfixturevalue("tmp_path") if "tmp_path" in request.fixturenames else None
    yield
    if tmp is not None:
        end_runs_under(tmp)


def end_runs_under(tmp: Path) -> None:
    """Kill, by pid, what the runs whose state dirs lie under ``tmp`` left running (their
    marker, their fork server by its record), and sweep their cgroups."""
    tokens = set()
    for f in tmp.rglob("run.token"):
        with contextlib.suppress(OSError):
            tokens.add(f.read_text().strip())
        # its fork server of data paths (no marker: its record names it), which would
        # otherwise wait out its idle time with no loop to serve
        from autopilot.datapath.forks import end_forkserver

        with contextlib.suppress(OSError):
            end_forkserver(f.parent)
    tokens.discard("")
    if not tokens:
        return
    from autopilot.cell import cgroups
    from autopilot.cell.procs import RUN_TOKEN_ENV

    for pid in env_holders(RUN_TOKEN_ENV, tokens):
        with contextlib.suppress(psutil.Error, OSError):
            psutil.Process(pid).kill()
    parent, _ = cgroups.where()
    for token in tokens:
        base = parent / f"autopilot-{token[:16]}" if parent is not None else None
        if base is not None and base.is_dir():
            run = cgroups.Containment(base)
            with contextlib.suppress(OSError):
                run.sweep(timeout=2)
            run.close()


FAKEBIN = ROOT / "tests" / "fakebin"


def _start_private_dockerd(tmp: Path) -> str | None:
    r = subprocess.run([str(ROOT / "tools" / "dockerd"), "start", str(tmp)],
                       capture_output=True, text=True, timeout=180)
    if r.returncode != 0:
        return None
    return r.stdout.strip().split("=", 1)[1]


@pytest.fixture(scope="session")
def docker_host(tmp_path_factory: pytest.TempPathFactory):
    """A Docker engine for the tests: $AUTOPILOT_TEST_DOCKER_HOST, else a private dockerd
    started with tools/dockerd (root only). Skips, with the reason, where neither works."""
    host = os.environ.get("AUTOPILOT_TEST_DOCKER_HOST")
    started: Path | None = None
    if not host:
        if os.geteuid() != 0:
            pytest.skip("Docker tests need root to start a private dockerd "
                        "(or set AUTOPILOT_TEST_DOCKER_HOST)")
        started = Path("/tmp") / f"ap-dockerd-{os.getpid()}"
        host = _start_private_dockerd(started)
        if host is None:
            log = (started / "dockerd.log").read_text()[-800:] if started.exists() else ""
            pytest.skip(f"could not start a private dockerd: {log}")
    yield host
    if started is not None:
        subprocess.run([str(ROOT / "tools" / "dockerd"), "stop", str(started)], timeout=120)


def docker_cli(host: str, *args: str, check: bool = True,
               input: bytes | None = None) -> subprocess.CompletedProcess[bytes]:
    return subprocess.run(["docker", *args], env={**os.environ, "DOCKER_HOST": host},
                          capture_output=True, check=check, input=input, timeout=120)


@pytest.fixture(scope="session")
def test_images(docker_host: str, tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    """Images built on the spot with `docker import` (no registry here): a static
    busybox, and a FAKE llama-server whose entrypoint runs tests/fakebin/llama-server
    with the host's Python bind-mounted read-only."""
    import shutil

    if shutil.which("busybox") is None:
        pytest.skip("busybox (Debian's busybox-static) is not installed")
    return import_test_images(docker_host, tmp_path_factory.mktemp("rootfs"))


def fake_llama_binds() -> list[str]:
    """What the FAKE llama-server image needs bind-mounted (read-only): this checkout at
    /repo, and the host's Python and the libraries it loads."""
    base = sys.base_prefix
    binds = [f"{ROOT}:/repo:ro", f"{base}:{base}:ro", "/usr:/usr:ro", "/lib:/lib:ro"]
    if Path("/lib64").exists():
        binds.append("/lib64:/lib64:ro")
    return binds


def import_test_images(host: str, tmp: Path) -> dict[str, str]:
    """``test_images`` into the daemon at ``host`` (tmp: an empty dir of the caller's)."""
    import shutil
    import tarfile

    busybox = shutil.which("busybox")
    assert busybox is not None, "busybox (Debian's busybox-static) is not installed"
    root = tmp / "root"
    (root / "bin").mkdir(parents=True)
    shutil.copy2(busybox, root / "bin" / "busybox")
    for applet in ("sh", "sleep", "cat", "ls", "echo", "true", "find", "rm", "mkdir", "id"):
        (root / "bin" / applet).symlink_to("busybox")
    (root / "entry").mkdir()
    entry = root / "entry" / "llama-server"
    entry.write_text('#!/bin/sh\nexec "$FAKE_PYTHON" /repo/tests/fakebin/llama-server "$@"\n')
    entry.chmod(0o755)
    (root / "tmp").mkdir()
    tar = tmp / "rootfs.tar"
    with tarfile.open(tar, "w") as tf:
        tf.add(root, arcname=".")
    data = tar.read_bytes()
    docker_cli(host, "import", "-", "autopilot-test/busybox:1", input=data)
    docker_cli(host, "import", "--change", 'ENTRYPOINT ["/entry/llama-server"]',
               "-", "autopilot-test/fake-llama:1", input=data)
    return {"busybox": "autopilot-test/busybox:1", "llama": "autopilot-test/fake-llama:1"}


def container_names(host: str) -> set[str]:
    out = docker_cli(host, "ps", "-a", "--format", "{{.Names}}").stdout.decode()
    return set(out.split())


# The demo harness's arguments after its cell id, for tests that wrap it in an adversary.
DEMO_ARGS = ["{cell}", "--task", "{task}", "--arm", "{arm}", "--n", "{n}", "--attempt",
             "{attempt}", "--host", "{host}", "--port", "{port}", "--model", "{model}",
             "--out", "{output_dir}", "--think-secs", "0"]


def chromium(tmp_path: Path, url: str, *extra: str,
             width: str = "1280,900") -> subprocess.CompletedProcess[str]:
    """Debian's headless Chromium on ``url`` (--dump-dom, --screenshot=...), offline and
    with a fresh profile; the test is skipped, saying why, where it is not installed."""
    exe = shutil.which("chromium") or shutil.which("chromium-browser")
    if exe is None:
        pytest.skip("Debian's chromium is not installed (tools/test installs it)")
    return subprocess.run(
        [exe, "--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
         "--disable-component-update", "--no-first-run", f"--window-size={width}",
         f"--user-data-dir={tmp_path / 'chromium-profile'}", *extra, url],
        capture_output=True, text=True, timeout=120)
