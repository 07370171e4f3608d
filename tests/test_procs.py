"""Exact-PID kill against adversarial process trees; a recycled pid is never signalled."""

from __future__ import annotations

import os
import subprocess
import sys
import uuid
from pathlib import Path

import psutil
import pytest

from autopilot.cell.procs import (
    TOKEN_ENV,
    ProcIdentity,
    Tracker,
    describe_exit,
    identify,
    kill_tree,
    verify,
)

HERE = Path(__file__).parent


def gone(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return True


def test_kills_term_ignoring_double_forked_setsid_tree() -> None:
    token = uuid.uuid4().hex
    env = {**os.environ, TOKEN_ENV: token}
    proc = subprocess.Popen([sys.executable, str(HERE / "adversaries" / "unkillable_tree.py")],
                            stdout=subprocess.PIPE, text=True, env=env, start_new_session=True)
    line = proc.stdout.readline().split()  # handshake: the tree is fully built
    assert line[0] == "READY"
    root_pid, grandchild = int(line[1]), int(line[2])
    assert psutil.Process(grandchild).ppid() != root_pid  # it escaped the parent chain
    tracker = Tracker(identify(root_pid), token)
    killed = kill_tree(tracker, grace=0.5)
    proc.wait(10)
    assert {root_pid, grandchild} <= set(killed)
    assert gone(root_pid) and gone(grandchild)
    assert tracker.collect() == {}


def test_recycled_pid_is_never_signalled() -> None:
    victim = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        real = identify(victim.pid)
        stale = ProcIdentity(victim.pid, real.create_time - 1000)  # same pid, older process
        assert verify(stale) is None
        assert kill_tree(Tracker(stale), grace=0.1) == []
        assert victim.poll() is None and psutil.Process(victim.pid).is_running()
    finally:
        victim.kill()
        victim.wait()


def test_dead_identity_is_a_no_op() -> None:
    p = subprocess.Popen([sys.executable, "-c", "pass"])
    ident = identify(p.pid)
    p.wait()
    assert ident is None or kill_tree(Tracker(ident), grace=0.1) == []


def test_token_match_is_exact() -> None:
    n = 3
    token = uuid.uuid4().hex
    others = [subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"],
                               env={**os.environ, TOKEN_ENV: token + "x"}) for _ in range(n)]
    mine = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"],
                            env={**os.environ, TOKEN_ENV: token})
    try:
        killed = kill_tree(Tracker(identify(mine.pid), token), grace=0.5)
        assert killed == [mine.pid]
        assert all(o.poll() is None for o in others)
    finally:
        for o in others:
            o.kill()
            o.wait()
        mine.wait()


async def test_spawned_children_read_eof_from_stdin() -> None:
    # A harness that reads stdin must see EOF, not block forever on a pipe nobody writes.
    import anyio

    from autopilot.cell.procs import OWNED, spawn

    proc = await spawn([sys.executable, "-c", "import sys; print(len(sys.stdin.read()))"],
                       stdout=subprocess.PIPE)
    try:
        with anyio.fail_after(30):
            out = await proc.stdout.receive()
            assert await proc.wait() == 0
        assert out.strip() == b"0"
    finally:
        OWNED.discard(proc.pid)


@pytest.mark.parametrize("pidfds", [True, False])
async def test_until_gone_returns_when_the_process_ends_and_not_before(
        pidfds: bool, monkeypatch: pytest.MonkeyPatch) -> None:
    # How a loop waits for a data path (not its child) to end: woken by its pidfd, or by
    # a poll where there are none.
    import anyio

    from autopilot.cell.procs import until_gone

    if not pidfds:
        monkeypatch.delattr(os, "pidfd_open")
    proc = subprocess.Popen(["sleep", "60"])
    try:
        ident = identify(proc.pid)
        assert ident is not None
        ended = anyio.Event()

        async def wait() -> None:
            await until_gone(ident, poll=3600 if pidfds else 0.01)
            ended.set()

        with anyio.fail_after(30):
            async with anyio.create_task_group() as tg:
                tg.start_soon(wait)
                await anyio.wait_all_tasks_blocked()
                assert not ended.is_set()  # alive: still waiting
                proc.kill()  # (a zombie until reaped: ended all the same)
                await ended.wait()
        # A recycled identity is no process of ours: nothing to wait for.
        with anyio.fail_after(30):
            await until_gone(ProcIdentity(os.getpid(), 0.0, 1))
    finally:
        proc.kill()
        proc.wait()


@pytest.mark.parametrize(("code", "words"), [
    (-4, "killed by SIGILL"), (-9, "killed by SIGKILL"), (1, "exit code 1"), (0, "exit code 0"),
    (None, "still running"), (-200, "killed by signal 200")])
def test_describe_exit_names_the_signal(code: int | None, words: str) -> None:
    assert describe_exit(code) == words
