"""Atomic writes and small filesystem helpers.

A reader (the dashboard, an operator's jq) must never see half a file, and a crash
mid-write must leave the previous version intact: write a temp file in the same
directory, fsync it, ``os.replace`` it over the target, then fsync the directory so the
rename itself is durable.
"""

from __future__ import annotations

import errno
import json
import os
import tempfile
from datetime import UTC, datetime
from pathlib import Path
from typing import Any


def atomic_write_text(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except FileNotFoundError:
            pass
        raise
    fsync_dir(path.parent)


def atomic_write_json(path: Path, obj: Any) -> None:
    atomic_write_text(path, json.dumps(obj, indent=1, sort_keys=False) + "\n")


def fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def read_json(path: Path, owner: int | None = None) -> Any | None:
    """The parsed file, or None when it is missing, refused or not valid JSON (a
    tolerant read, through autopilot.state.untrusted: no symlink, no FIFO or device, a
    few MB at most)."""
    from autopilot.state.untrusted import read_json as untrusted_json

    return untrusted_json(path, owner=owner)


_STORAGE_ERRNOS = frozenset({errno.ENOSPC, errno.EDQUOT, errno.EIO, errno.EROFS})


def storage_error(exc: BaseException) -> OSError | None:
    """The first full-disk / I/O error inside ``exc`` (an ExceptionGroup from a task group
    nests them), or None: such an error ends the run cleanly, whichever task hit it."""
    if isinstance(exc, OSError) and exc.errno in _STORAGE_ERRNOS:
        return exc
    if isinstance(exc, BaseExceptionGroup):
        for sub in exc.exceptions:
            found = storage_error(sub)
            if found is not None:
                return found
    if exc.__cause__ is not None and exc.__cause__ is not exc:
        return storage_error(exc.__cause__)
    return None


def stale_temps(state_dir: Path) -> list[Path]:
    """Temp files atomic writes leave when killed between create and rename."""
    return [path for path in state_dir.glob(".*.tmp") if path.is_file() and not path.is_symlink()]


def log_tail(path: Path, lines: int = 8) -> str:
    """The last ``lines`` lines of a spooled log, joined by `` | ``, control characters
    removed (it comes from a harness, a grader or an endpoint), at most 600 characters."""
    from autopilot.escape import clean
    from autopilot.state.untrusted import read_tail

    try:
        data, size = read_tail(path, 16 * 1024)  # a bounded tail: a log may be GBs
    except OSError:
        return ""
    rows = data.splitlines()
    if size > len(data) and rows:
        rows = rows[1:]  # the first line of a cut tail is a fragment
    tail = rows[-lines:]
    return clean(" | ".join(line.decode("utf-8", "replace").rstrip() for line in tail), 600)


def utcnow() -> datetime:
    return datetime.now(UTC)


def iso(ts: float | None = None) -> str:
    when = datetime.fromtimestamp(ts, UTC) if ts is not None else utcnow()
    return when.isoformat(timespec="milliseconds")


def parse_iso(ts: object) -> float | None:
    """Epoch seconds of an ISO timestamp we wrote; None for anything else."""
    try:
        return datetime.fromisoformat(str(ts)).timestamp()
    except ValueError:
        return None


def check_writable_dir(path: Path) -> str | None:
    """Why ``path`` cannot be used as a writable directory, or None if it can.

    Leaves nothing behind (bad input must not half-write a state dir). ``os.access`` is
    not enough: it says yes to root on an immutable or read-only-bound directory, so
    the nearest existing ancestor is probed with an anonymous temp file.
    """
    probe = path
    while not probe.exists():
        if probe.parent == probe:
            return f"{path}: no existing parent directory"
        probe = probe.parent
    if not probe.is_dir():
        return f"{path}: {probe} is not a directory"
    try:
        with tempfile.TemporaryFile(dir=probe):
            pass
    except OSError as e:
        return f"{path}: {probe} is not writable ({e.strerror})"
    return None


_PUNCH = 0x02 | 0x01  # FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE (linux/falloc.h)


def cap_in_place(path: Path, cap: int) -> bool:
    """Keep a file a child is still appending to (a spooled log) at about ``cap`` bytes
    on disk: the blocks between its first and last ``cap / 2`` are given back (a hole
    punched: the child's O_APPEND writes go on at the end; the file reads zeros there
    until the attempt's end cuts it properly, autopilot.logsetup.Redactor.scrub_file).
    True if blocks were given back; False where the file is small, or the filesystem
    cannot punch holes (then the cap applies at the attempt's end only)."""
    import ctypes

    from autopilot.privacy import libc as process_libc

    try:
        info = os.stat(path, follow_symlinks=False)
    except OSError:
        return False
    if info.st_blocks * 512 <= 2 * cap or info.st_size <= cap:
        return False
    libc = process_libc()
    if libc is None:
        return False
    block = max(info.st_blksize, 4096)
    start = -(-(cap // 2) // block) * block  # whole blocks only: a partial one stays
    end = (info.st_size - cap // 2) // block * block
    if end <= start:
        return False
    libc.fallocate.argtypes = [ctypes.c_int, ctypes.c_int, ctypes.c_int64, ctypes.c_int64]
    try:
        fd = os.open(path, os.O_WRONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except OSError:
        return False
    try:
        return bool(libc.fallocate(fd, _PUNCH, start, end - start) == 0)
    finally:
        os.close(fd)
