"""One way to read what comes from outside: a harness's outputs, a grader's grade, an
endpoint's log, and every file of a state dir a view is pointed at.

A harness (or a local user who owns a state dir) can replace any file we read with a
symlink to someone else's file, a FIFO that blocks whoever opens it, a device that
never ends (``/dev/zero``) or a hardlink. So every read here:
- never follows a symlink at the last component (``O_NOFOLLOW``: refused, ELOOP);
- never blocks in ``open`` (``O_NONBLOCK``: a FIFO opens at once, and is then refused);
- reads only a regular file (``fstat``): never a FIFO, a device, a socket or a directory;
- with ``owner``, only a file owned by that uid (the state dir's owner: a hardlink to
  root's 0600 file planted in a user's state dir is refused);
- reads at most ``cap`` bytes (a larger file is refused), or a bounded tail.
A refusal is an ``Refused`` (an ``OSError``, so every tolerant caller that already
treats an unreadable file as absent keeps doing so), with the reason in words.
"""

from __future__ import annotations

import errno
import json
import os
import stat
from collections.abc import Iterator
from pathlib import Path
from typing import Any

SMALL = 4 * 1024 * 1024  # summary, grade, receipt, status, plan, heartbeat: a few MB at most
TAIL = 64 * 1024  # what a view or a check reads of a transcript or a log: its end


class Refused(OSError):
    """A file we will not read (not a regular file, a symlink, someone else's, too big)."""


def open_fd(path: Path | str, owner: int | None = None) -> int:
    """An fd for reading ``path`` once it passed every check above (the caller closes
    it); FileNotFoundError when it is not there."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError as e:
        if e.errno == errno.ELOOP:  # the last component is a symlink
            raise Refused(e.errno, "a symlink (not followed)", str(path)) from None
        raise
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            raise Refused(0, f"not a regular file ({_kind(info.st_mode)})", str(path))
        if owner is not None and info.st_uid != owner:
            raise Refused(0, f"owned by uid {info.st_uid}, not by the state dir's owner "
                          f"(uid {owner})", str(path))
    except BaseException:
        os.close(fd)
        raise
    return fd


def _kind(mode: int) -> str:
    for test, name in ((stat.S_ISFIFO, "a FIFO"), (stat.S_ISCHR, "a character device"),
                       (stat.S_ISBLK, "a block device"), (stat.S_ISSOCK, "a socket"),
                       (stat.S_ISDIR, "a directory")):
        if test(mode):
            return name
    return "not a plain file"


def read_bytes(path: Path | str, cap: int = SMALL, owner: int | None = None) -> bytes:
    """The whole file, or Refused when it is larger than ``cap``."""
    fd = open_fd(path, owner)
    with os.fdopen(fd, "rb") as f:
        data = f.read(cap + 1)
    if len(data) > cap:
        raise Refused(0, f"larger than {cap} bytes", str(path))
    return data


def read_tail(path: Path | str, limit: int = TAIL, owner: int | None = None
              ) -> tuple[bytes, int]:
    """The last ``limit`` bytes of the file, and its size."""
    fd = open_fd(path, owner)
    with os.fdopen(fd, "rb") as f:
        size = os.fstat(f.fileno()).st_size
        f.seek(max(0, size - limit))
        return f.read(limit), size


def load_json(path: Path | str, cap: int = SMALL, owner: int | None = None
              ) -> tuple[Any | None, str | None]:
    """(value, None), (None, None) when the file is not there or not JSON, or (None,
    why) when it was refused."""
    try:
        data = read_bytes(path, cap, owner)
    except Refused as e:
        return None, f"{e.filename}: {e.strerror}"
    except OSError:
        return None, None
    try:
        return json.loads(data), None
    except (ValueError, RecursionError):  # a hostile nesting depth included
        return None, None


def read_json(path: Path | str, cap: int = SMALL, owner: int | None = None) -> Any | None:
    """The parsed file, or None (missing, refused, not valid JSON): a tolerant read."""
    return load_json(path, cap, owner)[0]


def lines(path: Path | str, owner: int | None = None) -> Iterator[bytes]:
    """A regular file's lines (the journal: ours, but in a state dir someone else may
    own); nothing when it is missing or refused."""
    try:
        fd = open_fd(path, owner)
    except OSError:
        return
    with os.fdopen(fd, "rb") as f:
        yield from f


def owner_of(state_dir: Path) -> int | None:
    """The uid that owns ``state_dir`` (never through a symlink), or None."""
    try:
        return os.lstat(state_dir).st_uid
    except OSError:
        return None


def state_json(state_dir: Path, name: str) -> Any | None:
    """A state dir's own JSON file (status, plan, heartbeat) as every view reads it:
    owned by the state dir's owner, or not at all."""
    return read_json(state_dir / name, owner=owner_of(state_dir))
