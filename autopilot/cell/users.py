"""A user per cell (``[harness] user = "cell"``, or "auto" where it can be had): the
uids live cells run as.

With the supervisor as root, each attempt's harness and grader run as a uid of their
own, one no other live cell holds, taken from the preset's range. A uid is free when no
live cell of ours holds it, no account has it (``/etc/passwd``), and no process runs as
it: so every process of that uid is the cell's, and ending the cell ends exactly them.
The switch is ``setpriv`` (util-linux), run after the process has entered its cgroup as
root: ``--reuid/--regid/--clear-groups``, and ``--no-new-privs`` (no setuid program
takes it back). Its cgroup stays root's: it cannot move itself or anyone out or in.
"""

from __future__ import annotations

import contextlib
import fcntl
import grp
import os
import pwd
import shutil
import stat
import sys
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Literal

import psutil

from autopilot.logsetup import get_logger
from autopilot.state.fsguard import remove_owned_by

if TYPE_CHECKING:
    from autopilot.config import Preset

log = get_logger(__name__)

SETPRIV = "setpriv"


CLAIMS = Path("/run/bench-autopilot/uids")  # one lock file per uid held by a live run


class UidPool:
    """The uids of one range, handed to live cells (thread-safe: grading and kills run
    in worker threads).

    Free is decided without walking the host's processes at every cell (that was
    ~75 ms a launch with 2,000 idle processes on the box): the range's running uids are
    read once, when the pool first hands one out; a uid a live run holds is claimed by
    a lock file (``CLAIMS/<uid>``, flock: it lets go by itself when its run dies); a
    claim found written but unlocked (its run died without letting go) is checked
    against the processes before it is taken; and the host is read again only when the
    range seems full."""

    def __init__(self, first: int, last: int, groups: tuple[int, ...] = (),
                 claims: Path | None = CLAIMS) -> None:
        self.first, self.last = first, last
        self.groups = groups  # supplementary gids of every cell's harness (harness.groups)
        self._held: dict[int, str] = {}
        self._claimed: dict[int, int] = {}  # uid -> the claim's open, locked descriptor
        self._lock = threading.Lock()
        self._next = first
        self._claims = _claims_dir(claims)
        self._busy: set[int] | None = None  # the range's uids running at the last read

    def take(self, cell: str) -> int:
        """A free uid for ``cell``; raises LookupError when the range has none."""
        with self._lock:
            for fresh in (False, True):
                if fresh or self._busy is None or self._claims is None:
                    self._busy = _running_uids(self.first, self.last)
                uid = self._first_free(cell)
                if uid is not None:
                    # Clean before it is handed on (this run's last cell of it, or another
                    # run's: every run draws from the same range): nothing of it is left.
                    left = remove_owned_by(uid)
                    if left:
                        log.info("uid_scrubbed", uid=uid, cell=cell, removed=left[:20])
                    return uid
        raise LookupError(f"no free uid in {self.first}-{self.last} (every one held by a "
                          "live cell, an account or a running process)")

    def _first_free(self, cell: str) -> int | None:
        assert self._busy is not None
        span = self.last - self.first + 1
        for i in range(span):
            uid = self.first + (self._next - self.first + i) % span
            if uid in self._held or uid in self._busy or _has_account(uid):
                continue
            if self._claims is not None:
                claim = _claim(self._claims, uid, cell)
                if claim is None:
                    continue  # another live run holds it
                fd, stale = claim
                if stale and uid in _running_uids(uid, uid):
                    self._busy.add(uid)  # its run died and left a process of it
                    _let_go(fd, uid)
                    continue
                self._claimed[uid] = fd
            self._held[uid] = cell
            self._next = uid + 1 if uid < self.last else self.first
            return uid
        return None

    def hold(self, uid: int, cell: str) -> None:
        """A uid a predecessor gave a cell that is still running (re-attached)."""
        with self._lock:
            self._held[uid] = cell
            if self._claims is not None and uid not in self._claimed:
                claim = _claim(self._claims, uid, cell)
                if claim is not None:
                    self._claimed[uid] = claim[0]

    def give(self, uid: int) -> None:
        """``uid`` back: its cell ended and nothing of it runs (the caller killed it)."""
        with self._lock:
            self._held.pop(uid, None)
            if self._busy is not None:
                self._busy.discard(uid)
            fd = self._claimed.pop(uid, None)
            if fd is not None:
                _let_go(fd, uid)

    def held(self) -> dict[int, str]:
        with self._lock:
            return dict(self._held)


def _claims_dir(claims: Path | None) -> Path | None:
    """The claims' directory, made root's own and private; None where it cannot be (then
    every take reads the host's processes, as a claim-less pool must)."""
    if claims is None:
        return None
    try:
        claims.mkdir(mode=0o700, parents=True, exist_ok=True)
        info = claims.lstat()
    except OSError:
        return None
    if not stat.S_ISDIR(info.st_mode) or info.st_uid != os.geteuid() or info.st_mode & 0o077:
        return None  # not ours alone: a claim there proves nothing
    return claims


def _claim(claims: Path, uid: int, cell: str) -> tuple[int, bool] | None:
    """The uid's claim file, locked: (descriptor, whether it was left written by a run
    that died holding it); None when a live run holds it."""
    try:
        fd = os.open(claims / str(uid), os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC,
                     0o600)
    except OSError:
        return None
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        os.close(fd)
        return None
    stale = os.fstat(fd).st_size > 0
    os.ftruncate(fd, 0)
    os.pwrite(fd, f"{os.getpid()} {cell}\n".encode(), 0)
    return fd, stale


def _let_go(fd: int, uid: int) -> None:
    with contextlib.suppress(OSError):
        os.ftruncate(fd, 0)  # let go cleanly: the next taker need not check the host
    os.close(fd)  # (closing drops the lock)


def _running_uids(first: int, last: int) -> set[int]:
    """The uids in ``first``-``last`` some process runs as (one read of the host)."""
    out: set[int] = set()
    for proc in psutil.process_iter(["uids"]):
        uids = proc.info.get("uids")
        if uids is not None and first <= uids.real <= last:
            out.add(uids.real)
    return out


def _has_account(uid: int) -> bool:
    try:
        pwd.getpwuid(uid)
        return True
    except KeyError:
        return False


def as_user(argv: list[str], uid: int, groups: tuple[int, ...] = ()) -> list[str]:
    """``argv`` run as ``uid`` (gid the same, no supplementary group but ``groups``, no
    new privileges)."""
    keep = [f"--groups={','.join(map(str, groups))}"] if groups else ["--clear-groups"]
    return [shutil.which(SETPRIV) or SETPRIV, f"--reuid={uid}", f"--regid={uid}", *keep,
            "--no-new-privs", "--", *argv]


def processes_of(uid: int) -> list[psutil.Process]:
    """Every live process of ``uid`` (exact: a cell's uid is no one else's)."""
    out = []
    for proc in psutil.process_iter(["uids"]):
        uids = proc.info.get("uids")
        if uids is not None and uids.real == uid:
            out.append(proc)
    return out


def why_not(user: str) -> str | None:
    """Why ``[harness] user = "cell"`` cannot be had here, or None."""
    if user == "same":
        return None
    if os.geteuid() != 0:
        return "a user per cell needs the supervisor to run as root"
    if shutil.which(SETPRIV) is None:
        return "a user per cell needs setpriv (util-linux) on PATH"
    return None


@dataclass(frozen=True)
class Resolved:
    """Who this run's harnesses run as, and why: the preset's ``user`` decided here."""

    mode: Literal["cell", "same"]
    why: str  # for "cell" asked and impossible, the refusal
    refused: bool = False
    groups: tuple[int, ...] = ()
    group_names: tuple[str, ...] = ()


def harness_needs_docker(preset: Preset) -> bool:
    """Whether the harness itself drives Docker (a sandbox container, Compose projects)."""
    harness = preset.harness
    return bool(harness.sandbox_container or harness.compose_projects or preset.preflight.docker)


def programs(preset: Preset) -> list[Path]:
    """What a cell's uid must be able to run: the harness's and grader's programs, and
    for the autopilot's own interpreter its prefix and (for ``-m autopilot...``) us."""
    out: list[Path] = []
    for argv in (preset.harness.argv, preset.grader.argv):
        if not argv:
            continue
        first = argv[0]
        if not isinstance(first, str):
            continue
        if first == "{python}":
            out += [Path(sys.executable), Path(sys.prefix), Path(os.__file__).parent]
            if any(isinstance(arg, str) and arg.startswith("autopilot.") for arg in argv):
                out.append(Path(__file__).resolve().parent.parent)
        elif "{" not in first:
            found = shutil.which(first)
            if found:
                out.append(Path(found))
    return out


def unreachable_program(path: Path) -> str | None:
    """Why another user could not run or read ``path`` (an ancestor it cannot search, a
    file it cannot execute or list), or None."""
    try:
        real = path.resolve()
        mode = real.stat().st_mode
    except OSError:
        return None  # preflight names a missing program
    need = stat.S_IXOTH | (stat.S_IROTH if stat.S_ISDIR(mode) else 0)
    if mode & need != need:
        return f"{real} is not usable by other users (mode {stat.filemode(mode)})"
    for anc in real.parents:
        try:
            if not anc.stat().st_mode & stat.S_IXOTH:
                return f"{anc} is not searchable by other users (it holds {real})"
        except OSError:
            continue
    return None


def resolve(preset: Preset, state_dir: Path) -> Resolved:
    """What ``[harness] user`` comes to on this machine for this state dir. "auto" is a
    user per cell where nothing here stops one, else the supervisor's user, saying
    why; "cell" that cannot be had is refused (exit 2), never run as root instead."""
    harness = preset.harness
    if harness.user == "same":
        return Resolved("same", 'harness.user = "same"')
    gids, why = [], why_not(harness.user)
    for name in harness.groups:
        try:
            gids.append(grp.getgrnam(name).gr_gid)
        except KeyError:
            why = why or f"harness.groups: no group {name!r} on this machine"
    why = why or unreachable(state_dir) or next(
        (problem for problem in map(unreachable_program, programs(preset)) if problem), None)
    if why is None and harness.user == "auto" and harness_needs_docker(preset) \
            and not harness.groups:
        why = ("the harness drives Docker, and a uid of its own could not reach the "
               'socket (harness.user = "cell" with harness.groups = ["docker"]: '
               "root-equivalent through it)")
    if why is not None:
        if harness.user == "cell":
            return Resolved("same", why, refused=True)
        return Resolved("same", f"auto: {why}")
    return Resolved("cell", "auto" if harness.user == "auto" else 'harness.user = "cell"',
                    groups=tuple(gids), group_names=harness.groups)


def mode_line(resolved: Resolved, uids: tuple[int, int]) -> str:
    """What --dry-run says of who harnesses run as."""
    user = pwd.getpwuid(os.geteuid()).pw_name if _has_account(os.geteuid()) else str(os.geteuid())
    if resolved.refused:
        return f"harness user: REFUSED: {resolved.why}"
    if resolved.mode == "cell":
        line = (f"harness user: a uid of its own per live cell ({uids[0]}-{uids[1]}; "
                f"{resolved.why}): it reaches only its output dir; the state dir, journal, run "
                "token and secrets are root's")
        if "docker" in resolved.group_names:
            line += ("; in group docker it reaches the Docker socket, root-equivalent: "
                     "the run's files stay out of its direct reach, no more")
        elif resolved.group_names:
            line += f"; in groups {', '.join(resolved.group_names)}"
        return line
    return (f"harness user: the supervisor's ({user}; {resolved.why}): a harness can read the "
            "run's token and files and rewrite its journal")


def unreachable(state_dir: Path) -> str | None:
    """Why the cells' users could not reach their output dirs under ``state_dir``: an
    ancestor another user cannot search (the state dir itself is made searchable)."""
    for anc in state_dir.parents:
        try:
            mode = anc.stat().st_mode
        except OSError:
            continue
        if not mode & stat.S_IXOTH:
            return (f"{anc} is not searchable by other users (mode {stat.filemode(mode)}): "
                    "the cells' users could not reach their output dirs; chmod o+x it or "
                    "use another --state-dir")
    return None


def own_dirs(output_dir: Path, state_dir: Path, uid: int) -> None:
    """The cell's output dir is its user's (0700); the way to it through the state dir
    may be passed (o+x) but not read or written: the journal, run.token, every log and
    secret stay 0600 root's."""
    os.chown(output_dir, uid, uid)
    os.chmod(output_dir, 0o700)
    root = state_dir.resolve()
    try:
        rel = output_dir.resolve().relative_to(root)
    except ValueError:
        return  # outside the state dir: the preset's own dirs, as it made them
    path = root
    for part in ("", *rel.parts[:-1]):
        path = path / part if part else path
        mode = stat.S_IMODE(path.stat().st_mode)
        want = (mode & ~0o066) | 0o011
        if mode != want:
            # search only (x): to pass through to its own dir; never list or write
            os.chmod(path, want)


def disown(output_dir: Path) -> None:
    """The output dir back to us (0700) as its cell lets go of its uid: a uid is handed
    to another cell later, whose harness must not read or rewrite this one's files
    (they stay its, unreachable behind a dir it cannot search). Never through a link."""
    try:
        info = os.lstat(output_dir)
    except FileNotFoundError:
        return
    if stat.S_ISDIR(info.st_mode):
        os.chown(output_dir, os.geteuid(), os.getegid(), follow_symlinks=False)
        os.chmod(output_dir, 0o700)


_POOLS: dict[tuple[int, int], UidPool] = {}
_POOLS_LOCK = threading.Lock()


def pool_for(first: int, last: int, groups: tuple[int, ...] = ()) -> UidPool:
    """One pool per range and process: every backend context of a loop shares it."""
    with _POOLS_LOCK:
        pool = _POOLS.setdefault((first, last), UidPool(first, last, groups))
        pool.groups = groups
        return pool


__all__ = [
    "Resolved",
    "UidPool",
    "as_user",
    "disown",
    "harness_needs_docker",
    "mode_line",
    "own_dirs",
    "pool_for",
    "processes_of",
    "programs",
    "resolve",
    "unreachable",
    "unreachable_program",
    "why_not",
]
