"""A fork server for data paths: ``python -m autopilot.datapath.forkserver FD``.

A data path per attempt is the isolation we want (the death of one costs at most its
own attempt), but a fresh interpreter per attempt pays the gateway's imports (aiohttp)
every time: measured at ~0.5 CPU-s a cell on a 2-core box, 18x the bare loop on 60
trivial cells. So one process per run imports them once and forks a data path per
attempt (as CPython's multiprocessing "forkserver" does): a fork costs milliseconds.

It is single-threaded and runs no event loop (fork-safe): it only receives a spec with
its descriptors (SCM_RIGHTS over a SOCK_SEQPACKET pair the loop made), forks, and
answers the child's pid. Each child starts its own session and event loop and is then
exactly the data path ``process`` describes. The fork server ends with its loop (EOF on the
pair, or PR_SET_PDEATHSIG when the loop dies), and its death touches no data path: they
re-parent like any orphan. It decides nothing and holds nothing of any attempt.
"""

from __future__ import annotations

import contextlib
import ctypes
import json
import os
import signal
import socket
import sys

from autopilot.datapath import process, wire
from autopilot.datapath.messages import Forked

MSG_CAP = 1 << 20  # one spec; the loop falls back to a spawn for a larger one
_PR_SET_PDEATHSIG = 1


def _reap(*_: object) -> None:
    while True:
        try:
            pid, _status = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return


def _child(spec: dict[str, object], fds: list[int], server: socket.socket) -> None:
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
        gw = spec.get("gateway")
        if isinstance(gw, dict) and len(fds) > 2:
            gw["fd"] = fds[2]
        code = process.run_spec(spec)
    except BaseException as e:
        with contextlib.suppress(Exception):
            os.write(2, f"data path failed: {type(e).__name__}: {e}\n".encode())
    finally:
        os._exit(code)


def serve(server: socket.socket) -> int:
    signal.signal(signal.SIGCHLD, _reap)
    while True:
        try:
            data, fds, _flags, _addr = socket.recv_fds(server, MSG_CAP, 8)
        except OSError:
            return 0
        if not data:
            return 0  # the loop closed its end
        spec = wire.decode(data)
        if spec is None or len(fds) < 2:
            for fd in fds:
                os.close(fd)
            server.send(json.dumps(Forked(None, "bad spec").to_wire()).encode())
            continue
        pid = os.fork()
        if pid == 0:
            _child(spec, fds, server)
        for fd in fds:
            os.close(fd)
        server.send(json.dumps(Forked(pid).to_wire()).encode())


def main() -> int:
    with contextlib.suppress(OSError, AttributeError):  # end with the loop that made us
        ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGTERM, 0, 0, 0)
    for sig in (signal.SIGINT, signal.SIGHUP):
        signal.signal(sig, lambda *_: None)
    # What every data path needs, imported once here (the reason this process exists).
    import aiohttp.web  # noqa: F401

    import autopilot.gateway.proxy
    import autopilot.logsetup  # noqa: F401

    with contextlib.suppress(ImportError):  # what `ps` shows (the runbook's name)
        from setproctitle import setproctitle

        setproctitle("autopilot data path fork server")
    server = socket.socket(fileno=int(sys.argv[1]))
    os.write(1, b"ready\n")
    os.close(1)
    return serve(server)


if __name__ == "__main__":
    sys.exit(main())
