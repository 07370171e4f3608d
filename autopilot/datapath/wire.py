"""The channel between the loop and an attempt's data path, and where its files live.

Stdlib only: the data path imports this at start, and it must start fast.

Files, in ``<state dir>/datapath/<cell>/attempt-<k>/`` (0700, the run's user):
  ``secret``     the attempt's channel secret (0600), written by the loop before the spawn
  ``ctl.sock``   the channel: a Unix socket; the data path checks its caller's uid
                 (``SO_PEERCRED``) before it reads a byte, then the secret in ``hello``
  ``datapath.json``  written once the harness is spawned: pids, the harness's start
                 ticks, the gateway port, the attempt's marker, group and deadline
                 (``shim.json``, as earlier data paths named it, still read)
  ``exit.json``  written when the harness has ended: its exit status and the gateway's
                 final meter (what a successor grades an attempt it did not watch by)

The exchange is one JSON line each way. Every request names ``VERSION``; a data path of
another version answers ``{"ok": false, "version": N}`` and the loop drains it (lets it
finish, grades it from ``exit.json``) instead of half-attaching.
"""

from __future__ import annotations

import contextlib
import json
import os
import socket
import stat
import struct
from pathlib import Path
from typing import Any

from autopilot.attemptspec import AttemptSpec

VERSION = 1
SECRET = "secret"  # noqa: S105 - a file name
SOCK = "ctl.sock"
RECORD = "datapath.json"
LEGACY_RECORD = "shim.json"  # the record's name before the data path had one name
LOG = "datapath.log"
EXIT = "exit.json"
LINE_CAP = 1 << 20  # bytes of one message, either way
HELLO_SECS = 5.0  # a caller that has not said hello by then is dropped


def attempt_dir(state_dir: Path, cell: str, attempt: int) -> Path:
    return state_dir / "datapath" / cell / f"attempt-{attempt}"


def fd_path(dirfd: int, name: str) -> str:
    """A path to ``name`` in the directory open as ``dirfd``: Unix socket addresses hold
    108 bytes, and a state dir's path may be longer; /proc/self/fd resolves it."""
    return f"/proc/self/fd/{dirfd}/{name}"


def peer_uid(sock: socket.socket) -> int:
    """The uid of the process at the other end (the kernel's word, not the caller's)."""
    raw = sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i"))
    return int(struct.unpack("3i", raw)[1])


def trusted_peer(uid: int) -> bool:
    """The run's own user, or root (who could read the secret anyway)."""
    return uid in (os.geteuid(), 0)


def encode(msg: dict[str, Any]) -> bytes:
    return (json.dumps(msg, separators=(",", ":")) + "\n").encode()


def encode_spec(spec: AttemptSpec) -> bytes:
    """An attempt's spec as it travels to its data path: with this version's number."""
    return encode({**spec.to_wire(), "version": VERSION})


def spec_of(doc: dict[str, Any] | None) -> AttemptSpec | None:
    """The spec a loop of this version sent (None: another version's, or no spec)."""
    if doc is None or doc.get("version") != VERSION:
        return None
    return AttemptSpec.of(doc)


def decode(line: bytes) -> dict[str, Any] | None:
    """One message, or None for anything that is not a JSON object of bounded size."""
    if not line or len(line) > LINE_CAP:
        return None
    try:
        doc = json.loads(line)
    except (ValueError, RecursionError):
        return None
    return doc if isinstance(doc, dict) else None


def write_private_json(path: Path, obj: Any) -> None:
    """temp (O_EXCL, O_NOFOLLOW, 0600) + rename: a reader sees all or nothing. No fsync:
    these files matter only while the machine is up (a data path dies with it, and its
    attempt is re-run), and a process's crash loses nothing the page cache holds."""
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC,
                 0o600)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(json.dumps(obj, separators=(",", ":")).encode())
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise


def read_private_json(path: Path, cap: int = LINE_CAP) -> dict[str, Any] | None:
    """A file of ours in the attempt's dir: a regular file owned by us, never through a
    symlink, bounded; None for anything else."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError:
        return None
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode) or info.st_uid != os.geteuid():
            return None
        data = os.read(fd, cap + 1)
    except OSError:
        return None
    finally:
        os.close(fd)
    return decode(data) if len(data) <= cap else None


def proc_ticks(pid: int) -> int | None:
    """A process's start time in clock ticks since boot (/proc/<pid>/stat field 22):
    with the pid, its identity (autopilot.cell.procs.ProcIdentity). The same reading as
    procs.start_ticks, kept here because the data path must not import procs (psutil,
    anyio: a start-up cost per attempt)."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            stat = f.read()
        return int(stat[stat.rindex(b")") + 2:].split()[19])
    except (OSError, ValueError, IndexError):
        return None


def listen_private(dirfd: int, name: str, kind: int, backlog: int) -> socket.socket:
    """A Unix socket listening as ``name`` in the directory open as ``dirfd``, 0600 from
    its first moment (bound under umask 0177), a stale one of that name replaced."""
    sock = socket.socket(socket.AF_UNIX, kind)
    path = fd_path(dirfd, name)
    with contextlib.suppress(FileNotFoundError):
        os.unlink(path)
    old = os.umask(0o177)
    try:
        sock.bind(path)
    except BaseException:
        sock.close()
        raise
    finally:
        os.umask(old)
    sock.listen(backlog)
    return sock
