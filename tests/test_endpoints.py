"""Self-healing endpoints with real processes: restart after SIGKILL, never-ready
timeout, crash loop -> INCOMPLETE, attach never kills, the reasoning-format rule, and a
fake vLLM proving that engine's argv and lifecycle."""

from __future__ import annotations

import json
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest
from conftest import (
    FAKEBIN,
    ROOT,
    events,
    run_cli,
    spawn_cli,
    wait_for,
    write_overlay,
)
from provider_fake import free_port

from autopilot.cell.procs import RUN_TOKEN_ENV, run_token
from autopilot.endpoints import make_endpoint
from autopilot.errors import EndpointCrashed
from autopilot.loader import load_preset
from autopilot.state.fsutil import parse_iso

pytestmark = pytest.mark.slow


def overlay(tmp: Path, doc: dict) -> str:
    return str(write_overlay(tmp / "o.json", doc))


def test_endpoint_sigkilled_mid_run_is_restarted(state_dir: Path, tmp_path: Path) -> None:
    args = ["--preset", "demo", "--target-n", "2", "--state-dir", str(state_dir), "--quiet",
            "--config", overlay(tmp_path, {"vars": {"think_secs": "0.2"}})]
    proc = spawn_cli(*args, log=tmp_path / "run.log")
    first = wait_for(lambda: next((e for e in events(state_dir)
                                   if e["event"] == "endpoint_started"), None), 60, "endpoint")
    wait_for(lambda: sum(e["event"] == "cell_verdict" for e in events(state_dir)) >= 3, 60,
             "three verdicts")
    victim = psutil.Process(first["pid"])
    assert abs(victim.create_time() - first["create_time"]) < 0.05
    victim.send_signal(signal.SIGKILL)
    assert proc.wait(180) == 0
    evs = events(state_dir)
    assert any(e["event"] == "endpoint_down" for e in evs)
    restarts = [e for e in evs if e["event"] == "endpoint_restart"]
    assert len(restarts) == 1
    started = [e for e in evs if e["event"] == "endpoint_started"]
    assert len(started) == 2 and started[1]["pid"] != first["pid"]
    verdicts = [e for e in evs if e["event"] == "cell_verdict"]
    assert all(e["reason"] in (None, "endpoint_down", "harness_crash") for e in verdicts)
    valid = {e["cell"] for e in verdicts if e["verdict"] in ("PASS", "FAIL")}
    assert len(valid) == 24
    assert not psutil.pid_exists(started[1]["pid"]) or \
        psutil.Process(started[1]["pid"]).status() == "zombie"


def test_never_ready_fails_clearly_after_timeout(state_dir: Path, tmp_path: Path) -> None:
    over = overlay(tmp_path, {"endpoint": {"never_ready": True, "startup_timeout_secs": 1.5}})
    r = run_cli("--preset", "demo", "--target-n", "1", "--config", over,
                "--state-dir", str(state_dir), "--quiet")
    assert r.returncode == 1
    assert "AUTOPILOT_INCOMPLETE endpoint failed to start" in r.stdout
    assert "not ready after 2s (/health answered 503)" in r.stdout
    evs = events(state_dir)
    assert not any(e["event"] == "cell_started" for e in evs)
    assert [e["kind"] for e in evs if e["event"] == "milestone"] == [
        "endpoint_failed", "run_incomplete"]


def test_crash_loop_gives_up_without_hot_loop(state_dir: Path, tmp_path: Path) -> None:
    over = overlay(tmp_path, {"endpoint": {
        "crash_after_requests": 3, "crash_every_generation": True, "max_restarts": 2,
        "down_restart_secs": 0.2, "restart_backoff_secs": 0.3}})
    r = run_cli("--preset", "demo", "--target-n", "2", "--config", over,
                "--state-dir", str(state_dir), "--quiet")
    assert r.returncode == 1 and "AUTOPILOT_INCOMPLETE" in r.stdout
    evs = events(state_dir)
    restarts = [e for e in evs if e["event"] == "endpoint_restart"]
    assert len(restarts) == 2
    assert [e["kind"] for e in evs if e["event"] == "milestone"].count("endpoint_failed") == 1
    status = json.loads((state_dir / "status.json").read_text())
    assert status["phase"] == "INCOMPLETE" and status["endpoint"]["state"] == "failed"
    assert "restarted 2 times" in status["outcome_reason"]
    assert status["totals"]["fail"] == sum(
        e["event"] == "cell_verdict" and e["verdict"] == "FAIL" for e in evs)


def test_attach_mode_never_kills_what_it_did_not_start(state_dir: Path, tmp_path: Path) -> None:
    port = free_port()
    ours = subprocess.Popen([sys.executable, "-m", "autopilot.demo.endpoint", "--port",
                             str(port), "--model", "demo-sim-1"], cwd=ROOT,
                            stdout=subprocess.PIPE, text=True)
    try:
        assert "listening" in ours.stdout.readline()
        over = overlay(tmp_path, {"endpoint": {"attach": True, "port": port},
                                  "vars": {"think_secs": "0"}})
        r = run_cli("--preset", "demo", "--target-n", "1", "--config", over,
                    "--state-dir", str(state_dir), "--quiet")
        assert r.returncode == 0, r.stderr[-2000:]
        assert ours.poll() is None  # still alive
        evs = events(state_dir)
        started = [e for e in evs if e["event"] == "endpoint_started"]
        assert started[0]["attached"] is True and started[0]["pid"] is None
        assert not (state_dir / "endpoint.log").exists()
    finally:
        ours.kill()
        ours.wait()


def test_attached_endpoint_down_alerts_and_is_not_restarted(state_dir: Path,
                                                              tmp_path: Path) -> None:
    port = free_port()
    ours = subprocess.Popen([sys.executable, "-m", "autopilot.demo.endpoint", "--port",
                             str(port), "--model", "demo-sim-1"], cwd=ROOT,
                            stdout=subprocess.PIPE, text=True)
    assert "listening" in ours.stdout.readline()
    over = overlay(tmp_path, {"endpoint": {"attach": True, "port": port,
                                           "down_restart_secs": 0.5},
                              "vars": {"think_secs": "0.3"}})
    proc = spawn_cli("--preset", "demo", "--target-n", "1", "--config", over,
                     "--state-dir", str(state_dir), "--quiet")
    try:
        wait_for(lambda: any(e["event"] == "cell_started" for e in events(state_dir)), 60)
        ours.kill()
        ours.wait()
        wait_for(lambda: any(e.get("kind") == "endpoint_failed" for e in events(state_dir)),
                 60, "attached-down alert")
        evs = events(state_dir)
        assert not any(e["event"] == "endpoint_restart" for e in evs)
        alert = next(e for e in evs if e.get("kind") == "endpoint_failed")
        assert "attached endpoint down" in alert["why"]
    finally:
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(60) == 143


def listener(port: int) -> socket.socket:
    s = socket.socket()
    s.bind(("127.0.0.1", port))
    s.listen()
    return s


async def test_a_picked_port_taken_before_the_engine_binds_is_picked_again(
        tmp_path: Path) -> None:
    # The race a busy machine runs: the port was free when picked and a stranger bound it
    # before the engine did. The endpoint starts on another port; the stranger is untouched.
    ep = make_endpoint(load_preset("demo"), tmp_path)
    taken = ep.port
    stranger = listener(taken)
    try:
        await ep.start()
        assert ep.port != taken and ep.url.endswith(f":{ep.port}")
        assert await ep.probe(check_model=True) == (True, "ok")
        with socket.create_connection(("127.0.0.1", taken), timeout=5):
            pass  # still the stranger's: listening, answering
        assert "Address already in use" in (tmp_path / "endpoint.log").read_text()
    finally:
        await ep.stop()
        await ep.aclose()
        stranger.close()


async def test_a_port_the_config_names_is_never_swapped(tmp_path: Path) -> None:
    port = free_port()
    ep = make_endpoint(load_preset("demo", overlay=overlay(
        tmp_path, {"endpoint": {"port": port}})), tmp_path)
    stranger = listener(port)
    try:
        with pytest.raises(EndpointCrashed, match="Address already in use"):
            await ep.start()
        assert ep.port == port
        assert (tmp_path / "endpoint.log").read_text().count("--- start generation") == 1
    finally:
        await ep.stop()
        await ep.aclose()
        stranger.close()


def test_reasoning_format_rule(tmp_path: Path) -> None:
    base = {"endpoint": {"engine": "llamacpp", "model_path": "/m/x.gguf"}}
    def argv(extra: dict) -> list[str]:
        doc = json.loads(json.dumps(base))
        doc["endpoint"].update(extra)
        preset = load_preset("demo", overlay=overlay(tmp_path, doc))
        return make_endpoint(preset, tmp_path).argv()
    a = argv({})
    assert a[a.index("--reasoning-format") + 1] == "none"
    assert a[a.index("--alias") + 1] == "demo-sim-1"
    a = argv({"reasoning_format": "deepseek"})
    assert a[a.index("--reasoning-format") + 1] == "deepseek"
    a = argv({"args": ["--reasoning-format", "auto", "--jinja"]})
    assert a.count("--reasoning-format") == 1 and a[a.index("--reasoning-format") + 1] == "auto"


def test_llamacpp_process_argv_logged_and_run_completes(state_dir: Path, tmp_path: Path) -> None:
    argv_log = tmp_path / "argv.jsonl"
    over = overlay(tmp_path, {
        "endpoint": {"engine": "llamacpp", "binary": str(FAKEBIN / "llama-server"),
                     "model_path": str(FAKEBIN / "llama-server"), "startup_timeout_secs": 20,
                     "env": {"FAKE_ARGV_LOG": str(argv_log), "FAKE_STARTUP_DELAY": "1"}},
        "vars": {"think_secs": "0"}})
    r = run_cli("--preset", "demo", "--target-n", "1", "--config", over,
                "--state-dir", str(state_dir), "--quiet")
    assert r.returncode == 0, r.stderr[-2000:]
    served = json.loads(argv_log.read_text().splitlines()[0])
    assert served[served.index("--reasoning-format") + 1] == "none"
    log = [json.loads(x) for x in (state_dir / "autopilot.log").read_text().splitlines()]
    logged = next(e for e in log if e["event"] == "endpoint_argv")
    assert logged["engine"] == "llamacpp" and "--reasoning-format" in logged["argv"]


def test_endpoint_dying_by_a_signal_is_named(state_dir: Path, tmp_path: Path) -> None:
    over = overlay(tmp_path, {
        "endpoint": {"engine": "llamacpp", "binary": str(FAKEBIN / "llama-server"),
                     "model_path": str(FAKEBIN / "llama-server"), "startup_timeout_secs": 20,
                     "env": {"FAKE_DIE_SIGNAL": "SIGILL"}}})
    r = run_cli("--preset", "demo", "--target-n", "1", "--config", over,
                "--state-dir", str(state_dir), "--quiet")
    assert r.returncode == 1
    line = r.stdout.strip().splitlines()[-1]
    assert "AUTOPILOT_INCOMPLETE endpoint failed to start" in line
    assert "llamacpp endpoint killed by SIGILL while starting" in line, line
    assert "llama threadpool init" in line  # the log tail says where it died


def test_fake_vllm_argv_and_lifecycle(state_dir: Path, tmp_path: Path) -> None:
    argv_log = tmp_path / "argv.jsonl"
    over = overlay(tmp_path, {
        "model": "step-3p7",
        "endpoint": {"engine": "vllm", "binary": str(FAKEBIN / "vllm"),
                     "model_path": str(tmp_path), "tool_call_parser": "hermes",
                     "reasoning_parser": "deepseek_r1", "max_model_len": 65536,
                     "startup_timeout_secs": 20,
                     "env": {"FAKE_ARGV_LOG": str(argv_log), "FAKE_STARTUP_DELAY": "1"}},
        "trust": {"arm_checks": [{"file": "{output_dir}/receipt.json", "field": "model",
                                  "expect": "step-3p7"}]},
        "vars": {"think_secs": "0"}})
    r = run_cli("--preset", "demo", "--target-n", "1", "--config", over,
                "--state-dir", str(state_dir), "--quiet")
    assert r.returncode == 0, r.stderr[-2000:]
    a = json.loads(argv_log.read_text().splitlines()[0])
    assert a[:2] == ["serve", str(tmp_path)]
    assert a[a.index("--served-model-name") + 1] == "step-3p7"
    assert a[a.index("--tool-call-parser") + 1] == "hermes"
    assert a[a.index("--reasoning-parser") + 1] == "deepseek_r1"
    assert a[a.index("--max-model-len") + 1] == "65536"
    started = next(e for e in events(state_dir) if e["event"] == "endpoint_started")
    assert started["engine"] == "vllm"
    assert not psutil.pid_exists(started["pid"]) or \
        psutil.Process(started["pid"]).status() == "zombie"


def test_stop_signal_does_not_wait_for_a_slow_endpoint(state_dir: Path, tmp_path: Path) -> None:
    over = overlay(tmp_path, {"endpoint": {"never_ready": True, "startup_timeout_secs": 600}})
    proc = spawn_cli("--preset", "demo", "--target-n", "1", "--config", over,
                     "--state-dir", str(state_dir), "--quiet")
    wait_for(lambda: any(e["event"] == "endpoint_spawned" for e in events(state_dir)), 60,
             "endpoint spawn")
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(60) == 143  # not after the 600 s startup timeout
    evs = events(state_dir)
    assert [e for e in evs if e["event"] == "run_finished"][-1]["outcome"] == "stopped"
    assert not any(e["event"] == "cell_started" for e in evs)
    spawned = next(e for e in evs if e["event"] == "endpoint_spawned")
    try:  # the endpoint process it had spawned is gone
        p = psutil.Process(spawned["pid"])
        assert abs(p.create_time() - spawned["create_time"]) > 0.05 or p.status() == "zombie"
    except psutil.NoSuchProcess:
        pass


def test_endpoint_still_loading_when_supervisor_dies_is_swept(state_dir: Path,
                                                               tmp_path: Path) -> None:
    slow = overlay(tmp_path, {"endpoint": {"startup_delay_secs": 120,
                                           "startup_timeout_secs": 600}})
    proc = spawn_cli("--preset", "demo", "--target-n", "1", "--config", slow,
                     "--state-dir", str(state_dir), "--quiet")
    spawned = wait_for(lambda: next((e for e in events(state_dir)
                                     if e["event"] == "endpoint_spawned"), None), 60)
    proc.send_signal(signal.SIGKILL)
    proc.wait(30)
    orphan = psutil.Process(spawned["pid"])
    assert orphan.is_running()  # loading, never reported ready, left behind
    # it carries the run's marker, so even an unjournaled spawn would be found
    assert orphan.environ()[RUN_TOKEN_ENV] == run_token(state_dir)
    # The successor waits for a load only within the start-up timeout counted from the
    # spawn (autopilot.endpoints.keeper: a model mid-load is not loaded twice); past it,
    # the load is stuck and this one is killed by its identity and started afresh.
    fast = write_overlay(tmp_path / "fast.json", {"endpoint": {"startup_delay_secs": 0,
                                                               "startup_timeout_secs": 2}})
    born = parse_iso(spawned["ts"])
    assert born is not None
    wait_for(lambda: time.time() > born + 2.5, 30, "its load past the start-up timeout")
    try:
        r = run_cli("--preset", "demo", "--target-n", "1", "--config", str(fast),
                    "--state-dir", str(state_dir), "--quiet")
        assert r.returncode == 0, r.stderr[-2000:]
        swept = not orphan.is_running() or orphan.status() == "zombie"
    finally:
        if orphan.is_running():  # psutil re-checks identity: never a recycled pid
            orphan.kill()
    assert swept
    evs = events(state_dir)
    [refused] = [e for e in evs if e["event"] == "endpoint_not_readopted"]
    assert refused["pid"] == spawned["pid"] and "does not answer" in refused["why"]
    assert sum(e["event"] == "endpoint_spawned" for e in evs) == 2  # started afresh
