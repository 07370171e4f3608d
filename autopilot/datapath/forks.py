"""The loop's side of the fork server of data paths (autopilot.datapath.forkserver):
the ``Launcher`` a backend hands its cells, which holds the run's ``ForkServer`` by
name; re-attached where a predecessor left one serving, as a data path is."""

from __future__ import annotations

import contextlib
import json
import os
import secrets
import signal
import socket
import subprocess
import sys
from pathlib import Path
from typing import Any

import anyio
import psutil
from anyio.abc import Process
from anyio.streams.buffered import BufferedByteReceiveStream

from autopilot.attemptspec import AttemptSpec
from autopilot.cell.procs import (
    OWNED,
    ProcIdentity,
    spawn,
    start_ticks,
    until_gone,
    verify,
)
from autopilot.datapath import wire
from autopilot.datapath.client import (
    ANSWER_SECS,
    READY_SECS,
    DataPath,
    DataPathError,
    datapath_env,
    end_child,
)
from autopilot.datapath.forkserver import ENDS_WITH_LOOP_ENV
from autopilot.datapath.messages import Attempt, Forked, Hello
from autopilot.state.fsutil import log_tail
from autopilot.state.statedir import ensure_private_dir, open_append

FORKSERVER_RECORD = "forkserver.json"  # its pid and start ticks: what a successor checks
FORKSERVER_SECRET = "forkserver.secret"  # noqa: S105 - a file name
FORKSERVER_SOCK = "forkserver.sock"
FORKSERVER_MARK = "forkserver"  # its DATAPATH_ENV: the start-up sweep spares it


class ForkServer:
    """The run's fork server of data paths (autopilot.datapath.forkserver): re-attached
    where a predecessor left one serving (its record names it by pid and start ticks),
    else started, at the run's start. It outlives this loop as the data paths do. Broken
    (it would not start, or died and would not start again): every launch falls back to
    a process of its own, which costs only time."""

    def __init__(self, state_dir: Path, run_token: str, outlives: bool = True,
                 name: str = "forkserver") -> None:
        self.state_dir = state_dir
        # False: it ends with this loop (a Ray node's actor, whose attempts do too)
        self.outlives = outlives
        # its files' names: a Ray node's own (nodes may share the state dir)
        self.record, self.secret = f"{name}.json", f"{name}.secret"
        self.sock_name, self.log_name = f"{name}.sock", f"{name}.log"
        self.dir = state_dir / "datapath"
        self.run_token = run_token
        self.proc: Process | None = None  # our child, when this loop started it
        self.ident: ProcIdentity | None = None  # the server's, once connected
        self.attached = False  # a predecessor's, re-attached to
        self.sock: socket.socket | None = None
        self.broken = False
        self._lock = anyio.Lock()

    async def warm(self) -> None:
        """Re-attach or start it now (at the run's start, beside the endpoint's load); a
        server that will not start leaves every launch to a process of its own."""
        async with self._lock:
            if self.sock is None and not self.broken:
                try:
                    # whole or not at all: a server started is a server held (aclose
                    # ends it), never one a cancelled start left behind
                    with anyio.CancelScope(shield=True):
                        await self._start()
                except (OSError, TimeoutError, ValueError, anyio.EndOfStream,
                        anyio.IncompleteRead, anyio.DelimiterNotFound):
                    await self.aclose()
                    self.broken = True

    async def _start(self) -> None:
        ensure_private_dir(self.dir)
        rec = wire.read_private_json(self.dir / self.record) if self.outlives else None
        saved = wire.read_private_json(self.dir / self.secret)
        if rec is not None and saved is not None and isinstance(saved.get("secret"), str):
            pid, ticks = rec.get("pid"), rec.get("ticks")
            if type(pid) is int and pid > 1 and type(ticks) is int and verify(
                    ProcIdentity(pid, 0.0, ticks)) is not None:
                try:
                    await self._connect(saved["secret"].encode(), ProcIdentity(pid, 0.0, ticks))
                    self.attached = True
                    return
                except (OSError, TimeoutError, ValueError):
                    self._end_stranger(ProcIdentity(pid, 0.0, ticks))
        await self._spawn()

    def _end_stranger(self, ident: ProcIdentity) -> None:
        """A recorded server that does not answer as ours (another version, wedged):
        ended by its exact identity, so a new one can take its socket."""
        proc = verify(ident)
        if proc is not None:
            with contextlib.suppress(psutil.Error):
                proc.kill()

    async def _spawn(self) -> None:
        secret = secrets.token_hex(16)
        dirfd = os.open(self.dir, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
        try:
            listener = wire.listen_private(dirfd, self.sock_name, socket.SOCK_SEQPACKET, 4)
        except BaseException:
            os.close(dirfd)
            raise
        try:
            wire.write_private_json(self.dir / self.secret, {"secret": secret})
            with open_append(self.dir / self.log_name) as log:
                self.proc = await spawn(
                    [sys.executable, "-m", "autopilot.datapath.forkserver",
                     str(listener.fileno())], stdin=subprocess.PIPE,
                    stdout=subprocess.PIPE, stderr=log, start_new_session=True,
                    env={**datapath_env(self.run_token, FORKSERVER_MARK),
                         **({} if self.outlives else {ENDS_WITH_LOOP_ENV: "1"})},
                    pass_fds=(listener.fileno(),))
        finally:
            listener.close()
            os.close(dirfd)
        assert self.proc.stdin is not None and self.proc.stdout is not None
        await self.proc.stdin.send(secret.encode() + b"\n")
        await self.proc.stdin.aclose()
        with anyio.fail_after(READY_SECS):
            line = await BufferedByteReceiveStream(self.proc.stdout).receive_until(b"\n", 64)
        if line != b"ready":
            raise OSError("the fork server did not start")
        wire.write_private_json(self.dir / self.record, {
            "version": wire.VERSION, "pid": self.proc.pid,
            "ticks": start_ticks(self.proc.pid)})
        await self._connect(secret.encode(), ProcIdentity(
            self.proc.pid, 0.0, start_ticks(self.proc.pid)))

    async def _connect(self, secret: bytes, ident: ProcIdentity) -> None:
        """The channel to the server: its secret, then its pid back (ours: no other)."""
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        sock.setblocking(False)
        dirfd = os.open(self.dir, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
        try:
            sock.connect(wire.fd_path(dirfd, self.sock_name))
            sock.send(json.dumps(Hello(secret.decode()).to_wire()).encode())
            with anyio.fail_after(ANSWER_SECS):
                await anyio.wait_readable(sock)
            answer = Forked.of(json.loads(sock.recv(4096) or b"{}"))
        except BaseException:
            sock.close()
            raise
        finally:
            os.close(dirfd)
        if answer is None or answer.pid != ident.pid:
            sock.close()
            raise OSError(f"the fork server did not answer as {ident.pid}")
        self.sock, self.ident = sock, ident

    async def fork(self, attempt_dir: Path, spec: AttemptSpec, listen: Any | None
                   ) -> Attempt | None:
        """The data path's ready line, forked from the server; None: spawn instead."""
        if self.broken:
            return None
        data = wire.encode_spec(spec)
        if len(data) > (1 << 20) - 1024:
            return None
        r, w = os.pipe()
        os.set_blocking(r, False)
        try:
            with open_append(attempt_dir / wire.LOG) as log:
                fds = [w, log.fileno()] + ([listen.fileno()] if listen is not None else [])
                async with self._lock:
                    pid = await self._send(data, fds)
            os.close(w)
            w = -1
            if pid is None:
                return None
            line = b""
            with anyio.move_on_after(READY_SECS):
                while not line.endswith(b"\n") and len(line) < wire.LINE_CAP:
                    await anyio.wait_readable(r)
                    chunk = os.read(r, 65536)
                    if not chunk:
                        break
                    line += chunk
            doc = wire.decode(line.strip())
            info = Attempt.of(doc) if Attempt.is_ready(doc) else None
            if info is None:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
                raise DataPathError(f"the attempt's data path did not start: "
                                    f"{log_tail(attempt_dir / wire.LOG, 3) or 'no output'}")
            return info
        finally:
            if w >= 0:
                os.close(w)
            os.close(r)

    async def _send(self, data: bytes, fds: list[int]) -> int | None:
        for _ in range(2):  # a server that died is started once more
            try:
                if self.sock is None:
                    await self._start()
                assert self.sock is not None
                socket.send_fds(self.sock, [data], fds)
                with anyio.fail_after(READY_SECS):
                    await anyio.wait_readable(self.sock)
                    forked = Forked.of(json.loads(self.sock.recv(4096) or b"{}"))
                return forked.pid if forked is not None else None
            except (OSError, TimeoutError, ValueError):
                await self.aclose()
        self.broken = True
        return None

    async def aclose(self, keep: bool = False) -> None:
        """Let go of the fork server: left serving for a successor (``keep``: a
        hand-over), or ended (the run's end: its data paths go on)."""
        sock, self.sock = self.sock, None
        if sock is not None and not keep:
            with contextlib.suppress(OSError):
                sock.send(json.dumps({"op": "bye"}).encode())
        if sock is not None:
            sock.close()
        if self.proc is not None:
            if keep:
                OWNED.discard(self.proc.pid)  # (no longer ours to wait for: it goes on)
            else:
                await end_child(self.proc, 5.0)
            self.proc = None
        elif self.ident is not None and not keep:  # a predecessor's: ends after bye
            with anyio.move_on_after(5.0):
                await until_gone(self.ident)
            self._end_stranger(self.ident)
        if not keep:
            for name in (self.record, self.secret, self.sock_name):
                with contextlib.suppress(OSError):
                    (self.dir / name).unlink()


def end_forkserver(state_dir: Path) -> int | None:
    """End the run's fork server, if one is left serving (a stop, not a hand-over): by
    its recorded identity, never by a name; its files removed. The pid it had, or None."""
    pid = live_forkserver(state_dir)
    if pid is not None:
        with contextlib.suppress(psutil.Error):
            proc = psutil.Process(pid)
            proc.terminate()
            try:
                proc.wait(5.0)
            except psutil.TimeoutExpired:
                proc.kill()
    for name in (FORKSERVER_RECORD, FORKSERVER_SECRET, FORKSERVER_SOCK):
        with contextlib.suppress(OSError):
            (state_dir / "datapath" / name).unlink()
    return pid


def live_forkserver(state_dir: Path) -> int | None:
    """The pid of the fork server a predecessor left serving this run, if its record
    names a live process (the start-up sweep spares it: the successor re-attaches)."""
    rec = wire.read_private_json(state_dir / "datapath" / FORKSERVER_RECORD)
    if rec is None:
        return None
    pid, ticks = rec.get("pid"), rec.get("ticks")
    if type(pid) is not int or pid <= 1 or type(ticks) is not int:
        return None
    return pid if verify(ProcIdentity(pid, 0.0, ticks)) is not None else None


class Launcher:
    """How a loop starts its attempts' data paths: each forked from its fork server (held
    here, by name: warmed beside the endpoint's load, closed at the run's end, when the
    data paths it forked go on), or each a process of its own."""

    def __init__(self, forks: ForkServer | None = None) -> None:
        self.forks = forks

    async def __call__(self, state_dir: Path, spec: AttemptSpec, *, listen: Any | None,
                       run_token: str, token: str) -> DataPath:
        return await DataPath.launch(state_dir, spec, listen=listen, run_token=run_token,
                                     token=token, forks=self.forks)

    async def warm(self) -> None:
        if self.forks is not None:
            await self.forks.warm()

    async def aclose(self, keep: bool = False) -> None:
        if self.forks is not None:
            await self.forks.aclose(keep)


__all__ = ["ForkServer", "Launcher", "end_forkserver", "live_forkserver"]
