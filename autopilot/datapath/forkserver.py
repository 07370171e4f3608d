"""A fork server for data paths: ``python -m autopilot.datapath.forkserver FD``.

A data path per attempt is the isolation we want (the death of one costs at most its
own attempt), but a fresh interpreter per attempt pays the gateway's imports (aiohttp)
every time: measured at ~0.5 CPU-s a cell on a 2-core box, 18x the bare loop on 60
trivial cells. So one process per run imports them once and forks a data path per
attempt (as CPython's multiprocessing "forkserver" does): a fork costs milliseconds.

It is single-threaded and runs no event loop (fork-safe). It listens on
``datapath/forkserver.sock`` (a SOCK_SEQPACKET socket the loop bound, 0600 in the run's
0700 dir): a caller of another uid is dropped before a byte is read (``SO_PEERCRED``),
one without the server's secret (given on stdin at its start, kept in
``forkserver.secret``) after its first message. Then it receives a spec with its
descriptors (SCM_RIGHTS), forks, and answers the child's pid. Each child starts its own
session and event loop and is then exactly the data path ``process`` describes.

It **outlives the loop, as a data path does**: a supervisor killed, frozen out or
handed over leaves it serving, and the successor re-attaches to it (its record,
``forkserver.json``, names it by pid and start ticks) instead of paying its imports
again. It ends when a loop that ends the run says ``bye``, when no loop has come back
for ``IDLE_SECS``, or by the run's marker (``cleanup``, ``stop``). Its death touches no
data path: they re-parent like any orphan. It decides nothing and holds nothing of any
attempt.
"""

from __future__ import annotations

import contextlib
import ctypes
import gc
import hmac
import json
import os
import signal
import socket
import sys

from autopilot.attemptspec import AttemptSpec
from autopilot.datapath import process, wire
from autopilot.datapath.messages import Forked, Hello, Refusal

MSG_CAP = 1 << 20  # one spec; the loop falls back to a spawn for a larger one
IDLE_SECS = 300.0  # with no loop connected this long, the run was left: end
IDLE_ENV = "AUTOPILOT_FORKSERVER_IDLE_SECS"  # (tests)
ENDS_WITH_LOOP_ENV = "AUTOPILOT_FORKSERVER_ENDS_WITH_LOOP"  # a Ray node's: PR_SET_PDEATHSIG
_PR_SET_PDEATHSIG = 1


def _reap(*_: object) -> None:
    while True:
        try:
            pid, _status = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return


def _child(spec: AttemptSpec, fds: list[int], server: socket.socket) -> None:
    """In the fork: become the attempt's data path, never return."""
    code = 1
    try:
        server.close()
        signal.signal(signal.SIGCHLD, signal.SIG_DFL)
        os.setsid()
        ready, log = fds[0], fds[1]
        null = os.open(os.devnull, os.O_RDONLY)
        os.dup2(null, 0)
        os.dup2(ready, 1)
        os.dup2(log, 2)
        for fd in (null, ready, log):
            if fd > 2:
                os.close(fd)
        code = process.run_spec(spec)
    except BaseException as e:
        with contextlib.suppress(Exception):
            os.write(2, f"data path failed: {type(e).__name__}: {e}\n".encode())
    finally:
        os._exit(code)


def serve(listener: socket.socket, secret: bytes, idle_secs: float = IDLE_SECS) -> int:
    """Serve one loop at a time, for as long as loops come back."""
    signal.signal(signal.SIGCHLD, _reap)
    listener.settimeout(idle_secs)
    while True:
        try:
            conn, _ = listener.accept()
        except TimeoutError:
            return 0  # no loop came back: the run was left (cleanup would end us too)
        except InterruptedError:
            continue
        with conn:
            if _welcome(conn, secret) and _serve_loop(conn, listener):
                return 0  # the loop ended the run


def _welcome(conn: socket.socket, secret: bytes) -> bool:
    """The caller's uid first (before a byte is read), then its secret and version."""
    try:
        if not wire.trusted_peer(wire.peer_uid(conn)):
            return False
        conn.settimeout(wire.HELLO_SECS)
        hello = Hello.of(wire.decode(conn.recv(4096)))
        if hello is None or not hmac.compare_digest(hello.secret.encode(), secret):
            return False
        if hello.version != wire.VERSION:
            conn.send(json.dumps(Refusal(wire.VERSION).to_wire()).encode())
            return False
        conn.send(json.dumps(Forked(os.getpid()).to_wire()).encode())
        conn.settimeout(None)
        return True
    except OSError:
        return False


def _serve_loop(conn: socket.socket, listener: socket.socket) -> bool:
    """Fork a data path per spec until the loop goes (False) or says bye (True)."""
    while True:
        try:
            data, fds, _flags, _addr = socket.recv_fds(conn, MSG_CAP, 8)
        except InterruptedError:
            continue
        except OSError:
            return False
        if not data:
            return False  # the loop closed its end, or died: the next one re-attaches
        doc = wire.decode(data)
        if doc is not None and doc.get("op") == "bye" and not fds:
            return True
        spec = wire.spec_of(doc)
        if spec is not None and spec.gateway is not None:
            # its listener, under the number it has here (a gateway without one: no spec)
            spec = spec.with_listener(fds[2]) if len(fds) > 2 else None
        if spec is None or len(fds) < 2:
            for fd in fds:
                os.close(fd)
            with contextlib.suppress(OSError):
                conn.send(json.dumps(Forked(None, "bad spec").to_wire()).encode())
            continue
        pid = os.fork()
        if pid == 0:
            listener.close()
            _child(spec, fds, conn)
        for fd in fds:
            os.close(fd)
        with contextlib.suppress(OSError):
            conn.send(json.dumps(Forked(pid).to_wire()).encode())


def main() -> int:
    # The loop's signals are not ours (a Ctrl-C in its terminal, its process group
    # ended): the fork server outlives the loop, as the data paths it forks do.
    for sig in (signal.SIGINT, signal.SIGHUP):
        signal.signal(sig, lambda *_: None)
    if os.environ.get(ENDS_WITH_LOOP_ENV):  # (a Ray node's attempts end with its actor)
        with contextlib.suppress(OSError, AttributeError):
            ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGTERM, 0, 0, 0)
    secret = sys.stdin.buffer.readline().strip()
    # What every data path needs, imported once here (the reason this process exists).
    import aiohttp.web  # noqa: F401

    import autopilot.gateway.proxy
    import autopilot.logsetup  # noqa: F401

    with contextlib.suppress(ImportError):  # what `ps` shows (the runbook's name)
        from setproctitle import setproctitle

        setproctitle("autopilot data path fork server")
    # Everything imported so far is moved out of the collector's reach: a data path's
    # collections then never walk (and so never copy, page by page) the inherited heap.
    # Measured (perf, 200 trivial cells): the collector was about 4% of a forked data
    # path's CPU before this, and nothing after.
    gc.freeze()
    listener = socket.socket(fileno=int(sys.argv[1]))
    os.write(1, b"ready\n")
    os.close(1)
    idle = float(os.environ.get(IDLE_ENV) or IDLE_SECS)
    return serve(listener, secret, idle)


if __name__ == "__main__":
    sys.exit(main())
