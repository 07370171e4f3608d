"""The journal's group commit (issue #46): an append is written at once, in order, and
made durable by one commit thread off the event loop, many appends to one fsync; every
event is on disk before an effect that outlives the machine (a notification, a
publish); a failed commit is the next append's error."""

from __future__ import annotations

import errno
import json
import signal
import subprocess
import sys
import threading
from pathlib import Path

import anyio
import pytest
from conftest import ROOT
from receiver import Receiver

from autopilot.run.notify import Notifier
from autopilot.state import journal as journal_mod
from autopilot.state.journal import Journal, read_events


class GatedFsync:
    """os.fsync for the journal, held at a gate: which thread called it, and how often."""

    def __init__(self) -> None:
        self.gate = threading.Event()
        self.entered = threading.Event()
        self.calls: list[str] = []
        self.fail: OSError | None = None

    def __call__(self, fd: int) -> None:
        self.calls.append(threading.current_thread().name)
        self.entered.set()
        self.gate.wait(30)
        if self.fail is not None:
            raise self.fail


@pytest.fixture
def fsync(monkeypatch: pytest.MonkeyPatch) -> GatedFsync:
    gated = GatedFsync()
    monkeypatch.setattr(journal_mod.os, "fsync", gated)
    return gated


def test_appends_are_committed_off_the_caller_many_to_one_fsync(
        tmp_path: Path, fsync: GatedFsync) -> None:
    j = Journal(tmp_path / "journal.jsonl", group=True)
    try:
        j.append("run_started")
        assert fsync.entered.wait(10)  # the commit thread is inside its first fsync
        for i in range(50):  # appended meanwhile: written at once, committed together
            j.append("cell_started", cell=f"c{i}", attempt=1)
        assert len(read_events(j.path).events) == 51
        with pytest.raises(TimeoutError):
            j.durable(timeout=0.05)  # not on disk yet: the gate holds the commit
        fsync.gate.set()
        j.durable(timeout=10)
        assert fsync.calls == ["journal-commit", "journal-commit"]
    finally:
        fsync.gate.set()
        j.close()


def test_a_failed_commit_is_the_next_appends_error(tmp_path: Path, fsync: GatedFsync) -> None:
    fsync.fail = OSError(errno.EIO, "I/O error")
    fsync.gate.set()
    j = Journal(tmp_path / "journal.jsonl", group=True)
    try:
        j.append("run_started")
        with pytest.raises(OSError) as e:
            j.durable(timeout=10)
        assert e.value.errno == errno.EIO
        with pytest.raises(OSError):
            j.append("cell_started", cell="c", attempt=1)
        assert [e["event"] for e in read_events(j.path).events] == ["run_started"]
    finally:
        j.close()


# A supervisor's journal whose commit never comes (fsync hangs), killed by SIGKILL:
# everything it appended is there, since the bytes are the kernel's once written.
KILLED = r'''
import os, signal, sys, threading
from pathlib import Path
from autopilot.state import journal
journal.os.fsync = lambda fd: threading.Event().wait()
j = journal.Journal(Path(sys.argv[1]), group=True)
for i in range(200):
    j.append("cell_started", cell=f"c{i}", attempt=1)
os.kill(os.getpid(), signal.SIGKILL)
'''


def test_a_supervisor_killed_before_its_commit_loses_no_appended_event(tmp_path: Path) -> None:
    path = tmp_path / "journal.jsonl"
    r = subprocess.run([sys.executable, "-c", KILLED, str(path)], cwd=ROOT, timeout=60,
                       capture_output=True, text=True)
    assert r.returncode == -signal.SIGKILL, r.stderr[-2000:]
    got = [json.loads(line)["cell"] for line in path.read_text().splitlines()]
    assert got == [f"c{i}" for i in range(200)]


def test_a_milestone_leaves_the_machine_only_once_the_journal_is_on_disk() -> None:
    order: list[str] = []
    committed = anyio.Event()

    async def before_send() -> None:
        order.append("asked")
        await committed.wait()
        order.append("on disk")

    async def main(rx: Receiver) -> None:
        n = Notifier([rx.url], before_send=before_send, timeout_secs=10)
        async with anyio.create_task_group() as tg:
            tg.start_soon(n.run)
            assert n.submit("run_started", {"preset": "p"})
            with anyio.fail_after(10):
                while order != ["asked"]:
                    await anyio.sleep(0.01)
            assert rx.messages == []  # held until the commit
            committed.set()
            with anyio.fail_after(10):
                while not rx.messages:
                    await anyio.sleep(0.01)
            tg.cancel_scope.cancel()
        assert order == ["asked", "on disk"]

    with Receiver() as rx:
        anyio.run(main, rx)
