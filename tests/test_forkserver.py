"""The fork server of data paths outlives its loop and is re-attached like a data path
(issue #46): a successor forks from the server its predecessor started instead of
paying its imports again; a caller of another uid or without the secret gets nothing;
the run's end (``bye``), or no loop for its idle time, ends it. Real processes, a real
SOCK_SEQPACKET socket, real uids (root and setpriv, as tools/test runs)."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
from pathlib import Path

import anyio
import psutil
import pytest
from conftest import cli_env, events, run_cli, spawn_cli, wait_for, write_overlay

from autopilot.datapath import wire
from autopilot.datapath.forks import (
    FORKSERVER_RECORD,
    FORKSERVER_SECRET,
    FORKSERVER_SOCK,
    ForkServer,
    live_forkserver,
)


def server_gone(pid: int, timeout: float = 30) -> bool:
    try:
        psutil.Process(pid).wait(timeout)
    except psutil.NoSuchProcess:
        pass
    except psutil.TimeoutExpired:
        return False
    return True


def end(pid: int | None) -> None:
    """A server a test started is not left behind, whatever the test did."""
    if pid is not None:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            return
        server_gone(pid)


def test_a_successor_re_attaches_to_the_server_its_predecessor_left(tmp_path: Path) -> None:
    pid = None
    try:
        async def first() -> int:
            forks = ForkServer(tmp_path, "run-token")
            await forks.warm()
            assert forks.ident is not None and not forks.attached and not forks.broken
            await forks.aclose(keep=True)  # a hand-over (a crash leaves it the same way)
            return forks.ident.pid

        pid = anyio.run(first)
        assert psutil.Process(pid).is_running() and live_forkserver(tmp_path) == pid

        async def second() -> None:
            forks = ForkServer(tmp_path, "run-token")
            await forks.warm()
            assert forks.attached and forks.ident is not None and forks.ident.pid == pid
            await forks.aclose()  # the run's end: bye

        anyio.run(second)
        assert server_gone(pid)
        assert not (tmp_path / "datapath" / FORKSERVER_RECORD).exists()
        assert live_forkserver(tmp_path) is None
    finally:
        end(pid)


def started_server(tmp_path: Path) -> tuple[int, str]:
    async def go() -> int:
        forks = ForkServer(tmp_path, "run-token")
        await forks.warm()
        assert forks.ident is not None
        await forks.aclose(keep=True)
        return forks.ident.pid

    pid = anyio.run(go)
    secret = wire.read_private_json(tmp_path / "datapath" / FORKSERVER_SECRET)
    assert secret is not None
    return pid, secret["secret"]


# A caller of the server: says hello with a secret, prints what came back (or EOF).
CALLER = r'''
import json, socket, sys
s = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
s.settimeout(10)
s.connect(sys.argv[1])
try:
    s.send(json.dumps({"op": "hello", "secret": sys.argv[2], "version": 1}).encode())
    print(repr(s.recv(4096)))
except OSError as e:
    print("refused:", type(e).__name__)
'''


def test_a_caller_without_the_secret_gets_nothing(tmp_path: Path) -> None:
    pid, secret = started_server(tmp_path)
    try:
        sock = str(tmp_path / "datapath" / FORKSERVER_SOCK)
        r = subprocess.run([sys.executable, "-c", CALLER, sock, "0" * 32], capture_output=True,
                           text=True, timeout=30)
        assert r.stdout.strip() == "b''", r.stdout + r.stderr  # closed, not answered
        r = subprocess.run([sys.executable, "-c", CALLER, sock, secret], capture_output=True,
                           text=True, timeout=30)
        answer = json.loads(eval(r.stdout.strip()))
        assert answer == {"ok": True, "pid": pid}
    finally:
        end(pid)


def test_a_spec_the_server_cannot_trust_forks_nothing(tmp_path: Path) -> None:
    # A caller with the secret (the run's own user) that sends a spec of another
    # version, or a gateway without the listener it is to serve: answered "bad spec",
    # and no data path is forked to run half of it.
    import socket

    from autopilot.attemptspec import AttemptSpec, GatewayLimits, GatewaySpec, HarnessSpec

    pid, secret = started_server(tmp_path)
    spec = AttemptSpec("t_a_v1", 1, HarnessSpec(("/bin/true",), {}, str(tmp_path / "spool")),
                       gateway=GatewaySpec((), str(tmp_path / "gw.jsonl"), GatewayLimits()),
                       dir=str(tmp_path), secret="s" * 32)
    try:
        with socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET) as s:
            s.settimeout(10)
            s.connect(str(tmp_path / "datapath" / FORKSERVER_SOCK))
            s.send(json.dumps({"op": "hello", "secret": secret,
                               "version": wire.VERSION}).encode())
            assert json.loads(s.recv(4096)) == {"ok": True, "pid": pid}
            other = {**json.loads(wire.encode_spec(spec)), "gateway": None,
                     "version": wire.VERSION + 1}
            for data in (wire.encode_spec(spec), json.dumps(other).encode()):
                r, w = os.pipe()
                try:
                    socket.send_fds(s, [data], [w, w])  # (ready pipe, log): no listener
                    assert json.loads(s.recv(4096)) == {"ok": False, "why": "bad spec"}
                finally:
                    os.close(r)
                    os.close(w)
        assert psutil.Process(pid).children() == []
    finally:
        end(pid)


@pytest.mark.skipif(os.geteuid() != 0 or not shutil.which("setpriv"),
                    reason="needs root and setpriv (tools/test runs as root)")
def test_a_caller_of_another_uid_is_dropped_before_a_byte_is_read() -> None:
    tmp_path = Path(tempfile.mkdtemp(prefix="autopilot-forks-", dir="/tmp"))
    pid, secret = started_server(tmp_path)
    try:
        # The dir and socket opened up (as a misconfigured host might): the uid check
        # alone stands, so even the right secret from another uid gets nothing.
        for p in (tmp_path, tmp_path / "datapath"):
            p.chmod(0o711)
        (tmp_path / "datapath" / FORKSERVER_SOCK).chmod(0o666)
        r = subprocess.run(["setpriv", "--reuid=61300", "--regid=61300", "--clear-groups",
                            sys.executable, "-c", CALLER,
                            str(tmp_path / "datapath" / FORKSERVER_SOCK), secret],
                           capture_output=True, text=True, timeout=30, cwd="/")
        assert r.stdout.strip() in ("b''", "refused: ConnectionResetError",
                                    "refused: BrokenPipeError"), r.stdout + r.stderr
        assert psutil.Process(pid).is_running()  # and it serves on
    finally:
        end(pid)
        shutil.rmtree(tmp_path, ignore_errors=True)


def test_a_server_no_loop_comes_back_to_ends_by_itself(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("AUTOPILOT_FORKSERVER_IDLE_SECS", "1")
    pid, _ = started_server(tmp_path)
    try:
        assert server_gone(pid, 30)
    finally:
        end(pid)


@pytest.mark.slow
def test_a_supervisor_killed_mid_run_leaves_its_fork_server_to_the_successor(
        tmp_path: Path) -> None:
    over = write_overlay(tmp_path / "slow.json", {
        "vars": {"think_secs": "0.3"}, "endpoint": {"latency_secs": 0.9},
        "run": {"concurrency": 2}})
    state = tmp_path / "state"
    args = ("--preset", "demo", "--target-n", "2", "--config", str(over),
            "--state-dir", str(state), "--quiet")
    p = spawn_cli(*args, log=tmp_path / "first.log")
    pid = None
    try:
        wait_for(lambda: any(e["event"] == "cell_started" for e in events(state)), 120,
                 "a cell started")
        pid = live_forkserver(state)
        assert pid is not None
        p.kill()
        p.wait(timeout=30)
        assert psutil.Process(pid).is_running()  # it outlives its loop
        before = len(events(state))
        p = spawn_cli(*args, log=tmp_path / "second.log")

        def forked_after_resume() -> int | None:
            for e in events(state)[before:]:
                if e["event"] == "cell_started" and e.get("datapath_pid"):
                    return int(e["datapath_pid"])
            return None

        dp = wait_for(forked_after_resume, 120, "a cell launched by the successor")
        try:
            assert psutil.Process(dp).ppid() == pid  # forked by the same server
        except psutil.NoSuchProcess:
            pytest.fail("the successor's data path ended before it could be looked at")
        assert p.wait(timeout=400) == 0
        assert server_gone(pid, 30)  # the run's end says bye
        assert live_forkserver(state) is None
    finally:
        if p.poll() is None:
            p.kill()
            p.wait(timeout=30)
        end(pid)
    r = run_cli("validate", "--state-dir", str(state), env=cli_env())
    assert r.returncode == 0, r.stdout + r.stderr[-2000:]
