"""An attempt's data path process: ``python -m autopilot.datapath.process`` (its spec
on stdin).

What it does, and nothing else (STYLE 18: what must not stop is small, and decides
nothing):
  1. becomes a child subreaper, so whatever the harness double-forks re-parents here
     and is reaped here;
  2. listens on the attempt's channel (``wire``): a caller of another uid is dropped
     before a byte is read, one without the attempt's secret after its first line;
  3. serves the attempt's gateway listener (a socket the loop bound and passed in, so
     the port the harness was told is open before the harness starts) with the same
     code the loop used to run (autopilot.gateway.proxy), writing each request's record
     into the state dir itself;
  4. spawns the harness (argv list, its own session, stdout and stderr to the cell's
     launcher log), writes ``datapath.json``, and tells the loop on stdout;
  5. when the harness has ended, lets the requests still open finish for a moment,
     closes the listener (what is still open is recorded as cut), writes ``exit.json``
     with the exit status and the final meter, and exits.
The loop may die, freeze or be replaced at any time in between: nothing here waits on
it. Its requests change nothing but the upstream list the gateway forwards to.

Imports are the stdlib, the gateway (aiohttp) only when the attempt has one, and this
package: it starts once per attempt.
"""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import errno
import hmac
import os
import signal
import socket
import subprocess
import sys
import time
from dataclasses import asdict, replace
from pathlib import Path
from typing import Any

from autopilot.attemptspec import AttemptSpec, GatewaySpec
from autopilot.datapath import callers, wire
from autopilot.datapath.messages import Attempt, Hello, Poll, Refusal, Status

DRAIN_SECS = 2.0  # how long requests still open when the harness ends may finish
_PR_SET_CHILD_SUBREAPER = 36


class DataPathProcess:
    def __init__(self, spec: AttemptSpec) -> None:
        self.spec = spec
        self.dir = Path(spec.dir)
        self.secret = spec.secret.encode()
        self.harness_ticks: int | None = None
        self.proc: subprocess.Popen[bytes] | None = None
        self.code: int | None = None
        self.exited = asyncio.Event()  # the harness has ended
        self.done = asyncio.Event()  # ... and its evidence is final (exit.json written)
        self.waiting = 0  # callers in a wait, to be answered before we go
        self.ended: float | None = None
        self.att: Any = None  # the gateway's Attempt (autopilot.gateway.proxy)
        self.upstream: list[tuple[str, str]] = list(spec.gateway.upstream if spec.gateway
                                                    else ())
        self.throttled = 0
        self.failovers: list[dict[str, Any]] = []
        self.spawn_error: str | None = None
        self._tasks: set[asyncio.Future[None]] = set()

    # ------------------------------------------------------------------ children

    def _reap(self) -> None:
        """Every child that has ended (the harness, and what it orphaned here)."""
        while True:
            try:
                pid, status = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                return
            if pid == 0:
                return
            if self.proc is not None and pid == self.proc.pid and self.code is None:
                self.code = os.waitstatus_to_exitcode(status)
                self.proc.returncode = self.code  # Popen must not wait for it again
                self.ended = time.time()
                self.exited.set()

    def _spawn(self) -> None:
        harness = self.spec.harness
        out = os.open(harness.spool, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_NOFOLLOW
                      | os.O_CLOEXEC, 0o600)
        try:
            # restore_signals (Popen's default) gives the harness SIGPIPE's default back.
            self.proc = subprocess.Popen(
                harness.argv, cwd=harness.cwd, env=harness.env,
                stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT,
                start_new_session=True, close_fds=True)
        except OSError as e:
            self.spawn_error = f"spawn failed: {e.strerror}: {harness.argv[0]}"
            self.code, self.ended = None, time.time()
            self.exited.set()
        finally:
            os.close(out)

    # ------------------------------------------------------------------ the channel

    def _attempt(self) -> Attempt:
        proc = self.proc
        return Attempt(pid=os.getpid(), harness_pid=proc.pid if proc else None,
                       harness_ticks=self.harness_ticks,
                       port=self.att.port if self.att is not None else None,
                       meta=self.spec.meta, ticks=wire.proc_ticks(os.getpid()),
                       spawn_error=self.spawn_error)

    def _status(self) -> Status:
        meter: dict[str, Any] | None = None
        failovers: tuple[dict[str, Any], ...] = ()
        if self.att is not None:
            meter = asdict(self.att.meter)
            failovers, self.failovers = tuple(self.failovers), []
        return Status(exited=self.done.is_set(), code=self.code, ended=self.ended,
                      spawn_error=self.spawn_error, throttled=self.throttled, meter=meter,
                      failovers=failovers)

    async def _serve(self, reader: asyncio.StreamReader,
                     writer: asyncio.StreamWriter) -> None:
        try:
            line = await asyncio.wait_for(reader.readline(), wire.HELLO_SECS)
            hello = Hello.of(wire.decode(line))
            if hello is None or not hmac.compare_digest(hello.secret.encode(), self.secret):
                return
            if hello.version != wire.VERSION:
                writer.write(wire.encode(Refusal(wire.VERSION).to_wire()))
                await writer.drain()
                return
            writer.write(wire.encode(self._attempt().hello()))
            await writer.drain()
            while True:
                poll = Poll.of(wire.decode(await reader.readline()))
                if poll is None:
                    return
                if poll.upstream is not None:
                    self.upstream = list(poll.upstream)
                if poll.wait is not None:
                    self.waiting += 1
                    try:
                        with contextlib.suppress(TimeoutError):
                            await asyncio.wait_for(self.done.wait(), poll.wait)
                    finally:
                        self.waiting -= 1
                writer.write(wire.encode(self._status().to_wire()))
                await writer.drain()
        except (OSError, TimeoutError, ValueError, asyncio.LimitOverrunError):
            return
        finally:
            writer.close()

    async def _accept(self, server: socket.socket) -> None:
        loop = asyncio.get_running_loop()
        while True:
            conn, _ = await loop.sock_accept(server)
            try:
                trusted = wire.trusted_peer(wire.peer_uid(conn))
            except OSError:
                trusted = False
            if not trusted:  # before a byte of it is read
                conn.close()
                continue
            reader, writer = await asyncio.open_unix_connection(sock=conn,
                                                                limit=wire.LINE_CAP)
            task = asyncio.ensure_future(self._serve(reader, writer))
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)

    # ------------------------------------------------------------------ the attempt

    async def run(self) -> int:
        loop = asyncio.get_running_loop()
        loop.add_signal_handler(signal.SIGCHLD, self._reap)
        dirfd = os.open(self.dir, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
        server = wire.listen_private(dirfd, wire.SOCK, socket.SOCK_STREAM, 16)
        path = wire.fd_path(dirfd, wire.SOCK)
        server.setblocking(False)
        accepting = asyncio.ensure_future(self._accept(server))
        gateway = self.spec.gateway
        async with contextlib.AsyncExitStack() as stack:
            if gateway is not None:
                self.att = await stack.enter_async_context(self._gateway(gateway))
            self._spawn()
            self._reap()  # a harness that ended before the handler was looking
            self.harness_ticks = wire.proc_ticks(self.proc.pid) if self.proc else None
            said = replace(self._attempt(), started=time.time())
            wire.write_private_json(self.dir / wire.RECORD, said.record())
            self._tell(said.ready())
            await self.exited.wait()
            if self.att is not None:
                deadline = time.monotonic() + DRAIN_SECS
                while self.att.meter.in_flight and time.monotonic() < deadline:
                    await asyncio.sleep(0.05)
        # The listener is closed (what was still open is recorded as cut): the meter is
        # final now.
        final: dict[str, Any] = {"version": wire.VERSION, "code": self.code,
                                 "ended": self.ended, "spawn_error": self.spawn_error}
        if self.att is not None:
            final["meter"] = self.att.meter.summary()
            final["records"], final["dropped"] = self.att.records, self.att.dropped
            final["unwritten"] = self.att.unwritten
        await _when_space(lambda: wire.write_private_json(self.dir / wire.EXIT, final))
        self.done.set()
        # A loop waiting on us reads the end from the channel before we go (bounded: a
        # frozen reader is told by exit.json instead).
        deadline = time.monotonic() + 1.0
        await asyncio.sleep(0)
        while self.waiting and time.monotonic() < deadline:
            await asyncio.sleep(0.005)
        await asyncio.sleep(0)
        accepting.cancel()
        server.close()
        with contextlib.suppress(OSError):
            os.unlink(path)
        os.close(dirfd)
        return 0

    def _gateway(self, spec: GatewaySpec) -> contextlib.AbstractAsyncContextManager[Any]:
        from autopilot.gateway.proxy import Gateway
        from autopilot.logsetup import Redactor

        redactor = Redactor(spec.secrets)

        def failover(cell: str, attempt: int, frm: str, to: str, why: str) -> None:
            if len(self.failovers) < 1000:
                self.failovers.append({"replica": frm, "to": to, "why": why})

        def throttled() -> None:
            self.throttled += 1

        gateway = Gateway(redactor.scrub, spec.limits, on_throttled=throttled,
                          on_failover=failover)
        upstream_key = spec.upstream_key
        if upstream_key is not None:
            gateway.key = lambda: upstream_key
        sock = socket.socket(fileno=spec.fd)
        sock.setblocking(False)
        local = sock.getsockname()[:2]
        own_pid = os.getpid()

        def caller(peer: tuple[str, int]) -> bool:
            # A keyless request: admitted only from a connection our own tree opened.
            return callers.opened_by_tree(peer, local, own_pid)

        attempt = gateway.attempt(self.spec.cell, self.spec.attempt, spec.settings,
                                  lambda: self.upstream, Path(spec.log_path), sock=sock,
                                  key=spec.key or None, caller=caller, model=spec.model,
                                  rewrite=spec.rewrite, dialects=frozenset(spec.dialects),
                                  dialect_settings=spec.dialect_settings)
        return _closing(gateway, attempt)

    def _tell(self, msg: dict[str, Any]) -> None:
        """One line to the loop that started us, if it is still there."""
        with contextlib.suppress(OSError):
            os.write(1, wire.encode(msg))
        with contextlib.suppress(OSError):
            os.close(1)


@contextlib.asynccontextmanager
async def _closing(gateway: Any, attempt: Any) -> Any:
    try:
        async with attempt as att:
            yield att
    finally:
        await gateway.close()


def _subreaper() -> None:
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0)


def main() -> int:
    # The loop's signals are not ours: a Ctrl-C in the loop's terminal, or the loop's
    # process group ended, must not end an attempt that is meant to outlive it.
    # A handler, not SIG_IGN: an ignored signal would stay ignored in the harness across
    # exec, and a harness stopped with SIGINT must get its default disposition.
    for sig in (signal.SIGINT, signal.SIGHUP):
        signal.signal(sig, lambda *_: None)
    raw = sys.stdin.buffer.read(16 << 20)
    spec = wire.spec_of(wire.decode(raw.strip()))
    if spec is None:
        print("autopilot data path: no spec of version", wire.VERSION, "on stdin",
              file=sys.stderr)
        return 2
    return run_spec(spec)


SPACE_RETRY_SECS = 2.0  # how often a data path on a full disk tries its last write again


async def _when_space(write: Any) -> None:
    """The attempt's last word (exit.json: its end and its meter) is never given up for
    a full disk: the data path waits, alive (a successor re-attaches to it meanwhile),
    and writes it once space is back."""
    said = False
    while True:
        try:
            write()
            return
        except OSError as e:
            if e.errno not in (errno.ENOSPC, errno.EDQUOT):
                raise
            if not said:  # its log is on that disk too: said where it fits
                with contextlib.suppress(OSError):
                    print("autopilot data path: disk full: waiting for space to record "
                          "the attempt's end", file=sys.stderr, flush=True)
                said = True
            await asyncio.sleep(SPACE_RETRY_SECS)


def run_spec(spec: AttemptSpec) -> int:
    """Be the data path of ``spec`` (here, or in a fork of autopilot.datapath.forkserver)."""
    if spec.gateway is not None and spec.gateway.fd is None:
        print("autopilot data path: a gateway without its listener", file=sys.stderr)
        return 2
    _subreaper()
    _title(spec)
    return asyncio.run(DataPathProcess(spec).run())


def _title(spec: AttemptSpec) -> None:
    """What ``ps`` shows of this process: the runbook's name for it and its attempt (a
    forked data path would otherwise show as its fork server's command line)."""
    try:
        from setproctitle import setproctitle
    except ImportError:  # a title is a courtesy, never a reason not to run
        return
    setproctitle(f"autopilot data path {spec.cell[:200]} attempt {spec.attempt}")


if __name__ == "__main__":
    sys.exit(main())
