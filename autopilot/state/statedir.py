"""The state dir is not a trust anchor: check it the way OpenSSH's StrictModes does.

The default state dir sits in ``/tmp``, where any local user can pre-create it and plant
a journal (naming someone else's processes), a lock or log symlinked at a root-owned
file, or a plan.json naming their own preset. A supervisor running as root would then
kill, truncate or delete on their behalf. So before the autopilot writes into a state
dir, or acts on what it finds there:

  * the dir and every ancestor are owned by us or root, and not writable by group or
    other (an ancestor may be, with the sticky bit, like ``/tmp`` itself): otherwise its
    owner could swap the dir under us;
  * every entry the autopilot itself writes (top level, ``logs/``) is owned by us or
    root, not group/other-writable, and not a symlink;
  * what we create is 0700 (dirs) / 0600 (files) whatever the umask, and every state
    file is opened with ``O_NOFOLLOW``, so a symlink planted after the check still fails
    the open instead of redirecting it.

A violation is ``StateDirError`` (exit 2), one line naming the path, its owner and mode.
Readers (dashboard, validate, report) skip the check: they write nothing, run nothing and
treat every byte they read as untrusted anyway.
"""

from __future__ import annotations

import os
import pwd
import stat
from pathlib import Path
from typing import IO, Any

from autopilot.errors import StateDirError

DIR_MODE = 0o700
FILE_MODE = 0o600
# Subdirectories whose entries the autopilot itself writes (attempts/ holds harness
# outputs moved aside: untrusted data, read as such, never a reason to refuse a run).
CHECKED_SUBDIRS = ("logs",)


def _owner(uid: int) -> str:
    try:
        return pwd.getpwuid(uid).pw_name
    except KeyError:
        return f"uid {uid}"


def _trusted_uid(uid: int) -> bool:
    return uid in (os.geteuid(), 0)


def _describe(path: Path, st: os.stat_result) -> str:
    return f"{path} (owner {_owner(st.st_uid)}, mode {stat.filemode(st.st_mode)})"


def _check_entry(path: Path) -> None:
    try:
        info = os.lstat(path)
    except FileNotFoundError:
        return
    if stat.S_ISLNK(info.st_mode):
        raise StateDirError(f"state dir entry {path} is a symlink (to "
                            f"{os.readlink(path)}); refusing to use it: remove it")
    if not _trusted_uid(info.st_uid) or info.st_mode & 0o022:
        raise StateDirError(f"untrusted state dir entry {_describe(path, info)}: it must be "
                            "owned by you or root and not writable by group or other")


MAX_LINKS = 40  # symlinks followed in one state dir path (the kernel's own bound)


def settled(state_dir: Path) -> Path:
    """The state dir's path with every symlink in it resolved, checked link by link: a
    symlink another user owns is refused (as OpenSSH's StrictModes refuses a path
    another user could change: they could point it at any directory of ours), and a
    looping path is a one-line error. The result has no symlink left, so a link swapped
    after this check changes nothing: every later open goes through the result."""
    given = Path(os.path.abspath(state_dir))
    todo = list(given.parts[1:])
    cur = Path("/")
    hops = 0
    while todo:
        name = todo.pop(0)
        if name in ("", "."):
            continue
        if name == "..":
            cur = cur.parent
            continue
        nxt = cur / name
        try:
            info = os.lstat(nxt)
        except FileNotFoundError:
            return Path(nxt, *todo)  # the rest is made by us, later
        except NotADirectoryError:
            raise StateDirError(f"state dir {given}: {cur} is not a directory") from None
        except OSError as e:
            raise StateDirError(f"state dir {given}: {nxt}: {e.strerror}") from None
        if not stat.S_ISLNK(info.st_mode):
            cur = nxt
            continue
        hops += 1
        if hops > MAX_LINKS:
            raise StateDirError(f"state dir {given}: more than {MAX_LINKS} symlinks "
                                "(a symlink loop)")
        if not _trusted_uid(info.st_uid):
            raise StateDirError(f"state dir {given}: {nxt} is a symlink owned by "
                                f"{_owner(info.st_uid)}, who could point it anywhere; use "
                                "the path it names, or another --state-dir")
        target = Path(os.readlink(nxt))
        if target.is_absolute():
            cur = Path("/")
            todo = list(target.parts[1:]) + todo
        else:
            todo = list(target.parts) + todo
    return cur


def check_trusted(state_dir: Path) -> None:
    """Raise StateDirError unless ``state_dir`` (if it exists) and what the autopilot
    keeps in it can be trusted; see the module doc. Reads only."""
    path = Path(os.path.abspath(state_dir))
    if not os.path.lexists(path):
        _check_ancestors(path.parent)
        return
    real = path.resolve()
    info = os.stat(real)
    if not stat.S_ISDIR(info.st_mode):
        raise StateDirError(f"state dir {path} is not a directory")
    if not _trusted_uid(info.st_uid) or info.st_mode & 0o022:
        raise StateDirError(f"untrusted state dir {_describe(path, info)}: it must be owned "
                            "by you or root and not writable by group or other "
                            f"(fix with: chmod 700 {path}, or use another --state-dir)")
    _check_ancestors(real.parent)
    for entry in os.scandir(real):
        _check_entry(Path(entry.path))
    for sub in CHECKED_SUBDIRS:
        sub_dir = real / sub
        if sub_dir.is_dir() and not sub_dir.is_symlink():
            for entry in os.scandir(sub_dir):
                _check_entry(Path(entry.path))


def _check_ancestors(start: Path) -> None:
    for anc in [start, *start.parents]:
        try:
            info = os.stat(anc)
        except FileNotFoundError:
            continue
        sticky = bool(info.st_mode & stat.S_ISVTX)
        if not _trusted_uid(info.st_uid) or (info.st_mode & 0o022 and not sticky):
            raise StateDirError(f"untrusted parent of the state dir {_describe(anc, info)}: "
                                "its owner or group could replace the state dir")


def ensure_private_dir(path: Path) -> None:
    """Create ``path`` (and missing parents) with the dir itself 0700, whatever the umask."""
    if not path.exists():
        path.mkdir(parents=True, exist_ok=True, mode=DIR_MODE)
        os.chmod(path, DIR_MODE)


def open_private(path: Path, flags: int) -> int:
    """``os.open`` of a state file: never through a symlink, created 0600, close-on-exec.
    An existing file we own is set to 0600 too (an older version wrote 0644)."""
    fd = os.open(path, flags | os.O_NOFOLLOW | os.O_CLOEXEC, FILE_MODE)
    try:
        info = os.fstat(fd)
        if info.st_uid == os.geteuid() and stat.S_IMODE(info.st_mode) != FILE_MODE:
            os.fchmod(fd, FILE_MODE)
    except BaseException:
        os.close(fd)
        raise
    return fd


def open_append(path: Path, binary: bool = True) -> IO[Any]:
    """A state log opened for appending (spooled output, endpoint.log, autopilot.log)."""
    ensure_private_dir(path.parent)
    fd = open_private(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT)
    if binary:
        return os.fdopen(fd, "ab")
    return os.fdopen(fd, "a", encoding="utf-8")
