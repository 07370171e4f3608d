"""The loop's side of an attempt's data path: start one, or re-attach to one a
predecessor started, and read what it knows (the harness's exit, the gateway's meter).

A ``DataPath`` is a handle, not an owner: closing it leaves the data path running (the
loop may be handing over to a successor). The harness is still killed by the loop,
by its exact identity (autopilot.cell.procs), never through the data path.
"""

from __future__ import annotations

import contextlib
import os
import secrets
import subprocess
import sys
from dataclasses import dataclass, field, fields, replace
from pathlib import Path
from typing import Any, Literal, Protocol

import anyio
import psutil
from anyio.abc import ByteStream, Process
from anyio.streams.buffered import BufferedByteReceiveStream

from autopilot.attemptspec import AttemptSpec
from autopilot.cell.context import LaunchFailed
from autopilot.cell.procs import (
    DATAPATH_ENV,
    OWNED,
    RUN_TOKEN_ENV,
    ProcIdentity,
    spawn,
    start_ticks,
    until_gone,
    verify,
)
from autopilot.datapath import wire
from autopilot.datapath.messages import (
    Attempt,
    Hello,
    Poll,
    Refusal,
    Status,
    read_record,
)
from autopilot.gateway.evidence import Meter
from autopilot.state.fsutil import log_tail
from autopilot.state.statedir import ensure_private_dir, open_append

READY_SECS = 60.0  # a data path that has not spawned its harness by then is broken
ANSWER_SECS = 10.0  # beyond a wait's own timeout, for the data path to answer

_METER_FIELDS = {f.name: f.type for f in fields(Meter)}
_ABSENT_OK = frozenset({"cache_read_tokens", "cache_write_tokens"})
# A channel that is closed, cut or silent: the data path is read by its files instead.
CHANNEL_ERRORS = (OSError, TimeoutError, anyio.EndOfStream, anyio.BrokenResourceError,
                  anyio.ClosedResourceError, anyio.IncompleteRead, anyio.DelimiterNotFound)


class DataPathError(LaunchFailed):
    """The data path could not be started (its own log says why)."""


def meter_from(doc: Any) -> Meter | None:
    """A Meter from what a data path wrote (status or exit.json), shape-checked."""
    if not isinstance(doc, dict):
        return None
    kept: dict[str, Any] = {}
    for k, v in doc.items():
        if k not in _METER_FIELDS:
            continue
        if k in ("errors", "models"):
            if not isinstance(v, dict) or len(v) > 64:
                return None
            v = {str(name)[:200]: count for name, count in v.items()
                 if type(count) is int and count >= 0}
        elif k in ("first_error", "last_error"):
            v = None if v is None else str(v)[:300]
        elif v is None and k in _ABSENT_OK:
            pass  # a bucket no response reported
        elif type(v) is not int or v < 0:
            return None
        kept[k] = v
    return Meter(**kept)


class Forks(Protocol):
    """Where a data path can be forked rather than spawned (forks.ForkServer)."""

    async def fork(self, attempt_dir: Path, spec: AttemptSpec, listen: Any | None
                   ) -> Attempt | None: ...


Phase = Literal["talking", "watched", "exited", "lost"]
"""Where the loop stands with an attempt's data path, one state for what were flags:
``talking`` over its channel; ``watched`` by its files alone (a data path of another
version, to drain; or one whose channel closed, still alive); ``exited``: the harness's
end and the final meter are read; ``lost``: the data path is gone without recording
the harness's end."""


@dataclass
class DataPath:
    dir: Path
    secret: str
    pid: int
    ticks: int | None
    harness_pid: int | None
    harness_ticks: int | None
    port: int | None
    meta: dict[str, Any] = field(default_factory=dict)
    proc: Process | None = None  # our child, when this loop started it
    meter: Meter = field(default_factory=Meter)
    phase: Phase = "talking"
    code: int | None = None
    ended: float | None = None
    spawn_error: str | None = None
    why_lost: str | None = None
    drain: int | None = None  # a data path of this other version: watched, not talked to
    unjournaled: bool = False  # re-attached, its harness's start never journaled
    throttled: int = 0  # 429s its gateway saw, read so far
    failovers: list[dict[str, Any]] = field(default_factory=list)  # not yet journaled
    _stream: ByteStream | None = None
    _reader: BufferedByteReceiveStream | None = None
    _sent_upstream: tuple[tuple[str, str], ...] | None = None

    @property
    def exited(self) -> bool:
        """The harness's end and the gateway's final meter are read."""
        return self.phase == "exited"

    @property
    def lost(self) -> str | None:
        """Why the data path is gone without recording the harness's end, if it is."""
        return self.why_lost if self.phase == "lost" else None

    # ------------------------------------------------------------------ making one

    @classmethod
    async def launch(cls, state_dir: Path, spec: AttemptSpec, *, listen: Any | None,
                     run_token: str, token: str, forks: Forks | None = None) -> DataPath:
        """Start the data path of one attempt (a fork of ``forks``, else a process of its
        own) and wait until its harness is spawned. ``listen``: the gateway's listening
        socket (handed over, closed here)."""
        cell = spec.cell
        attempt_dir = wire.attempt_dir(state_dir, cell, spec.attempt)
        ensure_private_dir(attempt_dir.parent.parent)
        ensure_private_dir(attempt_dir.parent)
        ensure_private_dir(attempt_dir)
        # an earlier launch's
        for stale in (wire.RECORD, wire.LEGACY_RECORD, wire.EXIT, wire.SECRET):
            with contextlib.suppress(FileNotFoundError):
                (attempt_dir / stale).unlink()
        secret = secrets.token_hex(16)
        wire.write_private_json(attempt_dir / wire.SECRET, {"secret": secret})
        spec = replace(spec, dir=str(attempt_dir), secret=secret)
        fds: tuple[int, ...] = ()
        if listen is not None:  # (a spawned data path has it under the same number)
            spec = spec.with_listener(listen.fileno())
            fds = (listen.fileno(),)
        if forks is not None:
            try:
                info = await forks.fork(attempt_dir, spec, listen)
            except BaseException:
                if listen is not None:
                    listen.close()
                raise
            if info is not None:
                if listen is not None:
                    listen.close()
                return await cls._ready(attempt_dir, secret, info, None)
        # Its own marker too: a sweep that finds it with no successor ends it (cleanup).
        env = datapath_env(run_token, token)
        env["AUTOPILOT_CELL_ID"] = cell
        try:
            with open_append(attempt_dir / wire.LOG) as log:
                proc = await spawn([sys.executable, "-m", "autopilot.datapath.process"],
                                   stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=log,
                                   env=env, start_new_session=True, pass_fds=fds)
        finally:
            if listen is not None:
                listen.close()
        try:
            assert proc.stdin is not None and proc.stdout is not None
            await proc.stdin.send(wire.encode_spec(spec))
            await proc.stdin.aclose()
            reader = BufferedByteReceiveStream(proc.stdout)
            with anyio.fail_after(READY_SECS):
                line = await reader.receive_until(b"\n", wire.LINE_CAP)
            doc = wire.decode(line)
            info = Attempt.of(doc) if Attempt.is_ready(doc) else None
        except (anyio.EndOfStream, anyio.IncompleteRead, anyio.DelimiterNotFound,
                anyio.BrokenResourceError, TimeoutError, OSError):
            info = None
        if info is None:
            with contextlib.suppress(ProcessLookupError):
                proc.kill()
            with anyio.CancelScope(shield=True):
                await proc.wait()
            OWNED.discard(proc.pid)
            raise DataPathError(f"the attempt's data path did not start: "
                                f"{log_tail(attempt_dir / wire.LOG, 3) or 'no output'}")
        with contextlib.suppress(Exception):
            if proc.stdout is not None:
                await proc.stdout.aclose()
        return await cls._ready(attempt_dir, secret, info, proc)

    @classmethod
    async def _ready(cls, attempt_dir: Path, secret: str, info: Attempt,
                     proc: Process | None) -> DataPath:
        datapath = cls._from(attempt_dir, secret, info, proc)
        datapath.spawn_error = info.spawn_error
        if datapath.spawn_error is None:
            try:
                await datapath._connect()
            except CHANNEL_ERRORS:
                # Gone already (a harness that ended while this loop was frozen between
                # the ready line and the connect): its end is in its files.
                await datapath.close()
                datapath._by_files()
        return datapath

    @classmethod
    def _from(cls, attempt_dir: Path, secret: str, info: Attempt,
              proc: Process | None) -> DataPath:
        return cls(attempt_dir, secret, info.pid or 0, info.ticks or start_ticks(info.pid or 0),
                   info.harness_pid, info.harness_ticks, info.port, meta=info.meta,
                   proc=proc)

    @classmethod
    async def attach(cls, attempt_dir: Path) -> DataPath | None:
        """Re-attach to the data path a predecessor started in ``d``; None when there is
        none alive to talk to (see ``finished`` for one that has ended)."""
        saved = wire.read_private_json(attempt_dir / wire.SECRET)
        record = read_record(attempt_dir)
        if saved is None or record is None or not isinstance(saved.get("secret"), str):
            return None
        datapath = cls._from(attempt_dir, saved["secret"], record, None)
        if datapath.pid <= 1 or verify(ProcIdentity(datapath.pid, 0.0, datapath.ticks)) is None:
            return None
        try:
            await datapath._connect()
        except CHANNEL_ERRORS:
            await datapath.close()
            return None
        return datapath

    # ------------------------------------------------------------------ the channel

    async def _connect(self) -> None:
        dirfd = os.open(self.dir, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
        try:
            with anyio.fail_after(ANSWER_SECS):
                self._stream = await anyio.connect_unix(wire.fd_path(dirfd, wire.SOCK))
        finally:
            os.close(dirfd)
        self._reader = BufferedByteReceiveStream(self._stream)
        reply = await self._ask(Hello(self.secret).to_wire(), ANSWER_SECS)
        if reply is None:
            raise anyio.EndOfStream
        refused = Refusal.of(reply)
        if refused is not None:
            self.drain = refused.version
            await self.close()  # watched by its files
            return
        said = Attempt.of(reply)
        assert said is not None  # (a decoded document always reads as one)
        self.harness_pid = said.harness_pid or self.harness_pid
        self.port = said.port or self.port

    async def _ask(self, msg: dict[str, Any], timeout: float) -> dict[str, Any] | None:
        assert self._stream is not None and self._reader is not None
        with anyio.fail_after(timeout):
            await self._stream.send(wire.encode(msg))
            line = await self._reader.receive_until(b"\n", wire.LINE_CAP)
        return wire.decode(line)

    async def wait(self, timeout: float, upstream: list[tuple[str, str]] | None = None
                   ) -> None:
        """Up to ``timeout`` seconds for the harness to end; the meter and the exit as
        the data path has them afterwards (``lost`` if it is gone without a record)."""
        if self.exited or self.lost:
            return
        if self.phase == "watched" or self._stream is None:  # another version's, or its
            self.phase = "watched"  # channel closed (or never opened): by its files
            await anyio.sleep(timeout)
            self._by_files()
            return
        changed = None
        if upstream is not None and tuple(map(tuple, upstream)) != self._sent_upstream:
            changed = self._sent_upstream = tuple((replica, origin) for replica, origin in upstream)
        try:
            reply = Status.of(await self._ask(Poll(timeout, changed).to_wire(),
                                              timeout + ANSWER_SECS))
        except TimeoutError:
            return  # frozen (a paused machine, a debugger): not gone; asked again later
        except CHANNEL_ERRORS:
            reply = None
        if reply is None:
            await self.close()
            self._by_files()
            return
        self._apply(reply)

    def _apply(self, status: Status) -> None:
        meter = meter_from(status.meter)
        if meter is not None:
            self.meter = meter
        if status.throttled is not None:
            self.throttled = status.throttled
        self.failovers.extend(status.failovers)
        if status.spawn_error is not None:
            self.spawn_error = status.spawn_error
        if status.exited:
            self.phase, self.code, self.ended = "exited", status.code, status.ended

    def _by_files(self) -> None:
        """The data path's channel is closed: its end is in exit.json, or it was lost."""
        done = self.finished()
        if done is not None:
            self._apply(done)
            return
        if self.pid > 1 and verify(ProcIdentity(self.pid, 0.0, self.ticks)) is not None:
            return  # alive, but not talking (another version): watched by its files
        self.phase = "lost"
        self.why_lost = "the attempt's data path ended without recording the harness's end"

    def finished(self) -> Status | None:
        """exit.json, once the data path has written it."""
        return finished_record(self.dir)

    async def close(self) -> None:
        """Stop talking to it (it goes on, watched by its files). The child, if ours, is
        reaped by asyncio."""
        if self.phase == "talking":
            self.phase = "watched"
        if self._stream is not None:
            with contextlib.suppress(Exception):
                await self._stream.aclose()
            self._stream = self._reader = None

    async def reap(self, wait: float = 5.0) -> None:
        """The data path's own end (after the harness's end it exits by itself within
        its drain): waited for ``wait`` seconds, then killed by its exact identity. Our
        child is reaped; a predecessor's is watched through /proc."""
        if self.proc is not None:
            await end_child(self.proc, wait)
            return
        if self.pid <= 1:
            return
        with anyio.move_on_after(wait):
            await until_gone(self.identity)
        proc = verify(self.identity)
        if proc is not None:
            with contextlib.suppress(psutil.Error):
                proc.kill()

    @property
    def harness(self) -> ProcIdentity | None:
        if self.harness_pid is None:
            return None
        return ProcIdentity(self.harness_pid, 0.0, self.harness_ticks)

    @property
    def identity(self) -> ProcIdentity:
        return ProcIdentity(self.pid, 0.0, self.ticks)


async def end_child(proc: Process, wait: float) -> None:
    """A child of ours that ends by itself: waited for ``wait`` seconds, then killed."""
    with anyio.move_on_after(wait):
        await proc.wait()
    if proc.returncode is None:
        with contextlib.suppress(ProcessLookupError):
            proc.kill()
        await proc.wait()
    OWNED.discard(proc.pid)


def datapath_env(run_token: str, token: str) -> dict[str, str]:
    env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), RUN_TOKEN_ENV: run_token,
           DATAPATH_ENV: token, "PYTHONDONTWRITEBYTECODE": "1"}
    for name in ("PYTHONPATH", "AUTOPILOT_FORKSERVER_IDLE_SECS"):
        if name in os.environ:
            env[name] = os.environ[name]
    return env


def finished_record(attempt_dir: Path) -> Status | None:
    """The end an attempt's data path recorded in ``d`` (exit.json: its harness's exit,
    the gateway's final meter), else None. Read by start-up for an attempt that ended
    while no loop watched it, and by a loop whose channel to it closed."""
    return Status.of(wire.read_private_json(attempt_dir / wire.EXIT), exited=True)


__all__ = ["DATAPATH_ENV", "DataPath", "DataPathError", "finished_record",
           "meter_from"]
