"""Exact-PID process-tree kill (psutil, identity-checked).

Never by name, never by pattern: origin doc 004 warns that killing by a command-line
pattern takes down every concurrent cell. A process is identified by (pid, create_time)
captured at spawn, and every signal goes to a process whose identity was verified just
before, so a pid the kernel recycled for someone else's process is never signalled.

Finding the whole tree is the hard part: a harness may ``setsid`` or double-fork, and
its grandchildren are then re-parented away from it. Three nets catch them:
  1. psutil's recursive children of the verified root;
  2. descendants seen on earlier polls (``Tracker.remember``), re-verified by identity;
  3. an exact per-attempt token in the environment (``AUTOPILOT_CELL_TOKEN``), which every
     descendant inherits unless it scrubs its environment; matched for equality, and only
     on processes created after the root.
The supervisor also makes itself a child subreaper (``PR_SET_CHILD_SUBREAPER``) so
orphans re-parent to it rather than to init, and it reaps the zombies of those adoptees.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import re
import secrets
import signal
import subprocess
import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import anyio
import psutil
from anyio.abc import Process

from autopilot.errors import StateDirError
from autopilot.proctree import child_pids, descendants

if TYPE_CHECKING:  # the data path and fork server use this module: no pydantic there
    from autopilot.state.cellevents import Probe

TOKEN_ENV = "AUTOPILOT_CELL_TOKEN"  # noqa: S105 - an env var name, not a secret
# Every harness and grader of a run carries the run's marker, so a process spawned by a
# supervisor killed before it could journal the spawn is still recognisably this run's.
RUN_TOKEN_ENV = "AUTOPILOT_RUN_TOKEN"  # noqa: S105 - an env var name, not a secret
# One Ray actor's processes (autopilot.backends.ray.node): <session>-<replica>.<incarnation>
LEASE_ENV = "AUTOPILOT_RAY_LEASE"
# An attempt's data path (autopilot.datapath): its attempt's token. Not the harness's own
# variable (TOKEN_ENV): a kill of the harness's tree, which finds its descendants by
# that token, must not take the data path with it.
DATAPATH_ENV = "AUTOPILOT_DATAPATH"


MARKER_FILE = "run.token"


def grade_marker(token: str) -> str:
    """What a grader carries as the run's marker instead of the marker itself: a sweep
    still recognises it, and it yields nothing (the run token opens the run's data path
    channels and cgroups; a grader is a stranger to them)."""
    import hashlib

    return "g" + hashlib.sha256(f"grader:{token}".encode()).hexdigest()[:31]

_TOKEN_RE = re.compile(r"[0-9a-f]{32}")


def run_token(state_dir: Path) -> str:
    """The run's marker: a random secret made once per state dir (0600 in it), so every
    successor knows it and no other user can compute it (it was a hash of the path,
    which anyone could: enough to block a campaign, or to have a start-up sweep signal
    a process of theirs carrying it)."""
    from autopilot.state.statedir import ensure_private_dir

    found = existing_run_token(state_dir)
    if found is not None:
        return found
    ensure_private_dir(state_dir)
    token = secrets.token_hex(16)
    try:
        fd = os.open(state_dir / MARKER_FILE,
                     os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
    except FileExistsError:  # another process of ours made it first: theirs stands
        again = existing_run_token(state_dir)
        if again is None:
            raise StateDirError(f"{state_dir / MARKER_FILE}: not a run marker this user "
                                "wrote (a plain 0600 file of 32 hex digits)") from None
        return again
    with os.fdopen(fd, "w") as f:
        f.write(token + "\n")
        f.flush()
        os.fsync(f.fileno())
    return token


def existing_run_token(state_dir: Path) -> str | None:
    """The run's marker if the state dir has one (read-only verbs: cleanup, campaign);
    only from a plain file of ours (autopilot.state.untrusted), never through a symlink."""
    from autopilot.state.untrusted import read_bytes

    try:
        text = read_bytes(state_dir / MARKER_FILE, 64, owner=os.geteuid()).decode().strip()
    except (OSError, UnicodeDecodeError):
        return None
    return text if _TOKEN_RE.fullmatch(text) else None


def marked_processes(token: str) -> list[tuple[psutil.Process, dict[str, str]]]:
    """Every live process (but us) whose environment carries the run marker ``token``,
    with that environment: a full scan, for the start-up sweep and cleanup only."""
    found = []
    for proc, env in _env_holders(RUN_TOKEN_ENV, (token, grade_marker(token))):
        try:
            if proc.status() != psutil.STATUS_ZOMBIE:
                found.append((proc, env))
        except (psutil.NoSuchProcess, psutil.AccessDenied):
            continue
    return found
_PR_SET_CHILD_SUBREAPER = 36
# Only for "started no earlier than" filters (a token holder forked by the root): never
# for identity, which is compared exactly (see ProcIdentity).
_CT_TOLERANCE = 0.05

# Pids we spawned through asyncio: its child watcher reaps them, so we must not. While a
# spawn is in flight its pid is not known yet, so the blanket zombie sweep waits.
OWNED: set[int] = set()
_spawning = 0


async def spawn(argv: list[str], **kwargs: Any) -> Process:
    """``anyio.open_process`` that registers the child as asyncio-owned atomically with
    respect to ``reap_adopted`` (both run on the event loop thread)."""
    global _spawning
    # anyio's default is a stdin pipe nobody writes: a child that reads stdin would block
    # forever, and the pipe costs a transport per spawn. /dev/null gives it EOF instead.
    kwargs.setdefault("stdin", subprocess.DEVNULL)
    _spawning += 1
    try:
        proc = await anyio.open_process(argv, **kwargs)
        OWNED.add(proc.pid)
        return proc
    finally:
        _spawning -= 1


def describe_exit(code: int | None) -> str:
    """A process's end in words: ``killed by SIGILL`` rather than asyncio's ``code -4``
    (a CPU-feature crash of a natively built server must be recognisable at a glance)."""
    if code is None:
        return "still running"
    if code < 0:
        try:
            return f"killed by {signal.Signals(-code).name}"
        except ValueError:
            return f"killed by signal {-code}"
    return f"exit code {code}"


def start_ticks(pid: int) -> int | None:
    """The kernel's start time of ``pid`` in clock ticks since boot (/proc/PID/stat field
    22): exact, and unmoved by wall-clock steps, unlike an epoch create_time."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            data = f.read()
        # comm (field 2) may hold spaces and ')': the fields after its last ')' are safe
        return int(data[data.rindex(b")") + 2:].split()[19])
    except (OSError, ValueError, IndexError):
        return None


@dataclass(frozen=True, slots=True)
class ProcIdentity:
    """A process as (pid, start time). ``ticks`` (kernel clock ticks since boot) is the
    exact identity; ``create_time`` (epoch, for people) decides only for records written
    before ticks were journaled, and then exactly too: any tolerance is a window in which
    a decoy forked onto a recycled pid passes for ours."""

    pid: int
    create_time: float
    ticks: int | None = None


def identify(pid: int) -> ProcIdentity | None:
    try:
        create_time = psutil.Process(pid).create_time()
    except (psutil.NoSuchProcess, psutil.AccessDenied):
        return None
    ticks = start_ticks(pid)
    return None if ticks is None else ProcIdentity(pid, create_time, ticks)


def verify(ident: ProcIdentity) -> psutil.Process | None:
    """The live process with exactly this identity, or None (gone, zombie or recycled)."""
    try:
        proc = psutil.Process(ident.pid)
        if ident.ticks is not None:
            if start_ticks(ident.pid) != ident.ticks:
                return None  # the pid was recycled: not ours
        elif proc.create_time() != ident.create_time:
            return None
        if proc.status() == psutil.STATUS_ZOMBIE:
            return None
        return proc
    except (psutil.NoSuchProcess, psutil.AccessDenied):
        return None


async def until_gone(ident: ProcIdentity, poll: float = 0.01) -> None:
    """Return once the process ``ident`` names has ended (a zombie counts): woken by its
    pidfd the moment it exits, where one is to be had; else polled every ``poll`` s.
    (A poll of 10 ms was on every cell's path from its harness's end to its verdict.)"""
    try:
        fd = os.pidfd_open(ident.pid)
    except (OSError, AttributeError):  # gone already, or no pidfds here
        fd = -1
    try:
        # Checked after the open: a pid recycled before it is not ours, and the pidfd
        # then refers to a stranger (the loop below ends at once).
        if fd >= 0 and verify(ident) is not None:
            await anyio.wait_readable(fd)
            return
        while verify(ident) is not None:
            await anyio.sleep(poll)
    finally:
        if fd >= 0:
            os.close(fd)


def child_exited(pid: int) -> bool:
    """Our child ``pid`` has exited: a zombie its watcher has not reaped yet, or gone.
    Asked before judging a child by the clock: after the supervisor itself was frozen,
    a timer and the child's exit become ready together, and the timer may run first."""
    try:
        return bool(psutil.Process(pid).status() == psutil.STATUS_ZOMBIE)
    except psutil.NoSuchProcess:
        return True


def run_marked(proc: psutil.Process, token: str) -> bool:
    """``p`` carries this run's marker in its environment, or is our own descendant: the
    second test a process named only by the journal (untrusted) must pass before it is
    signalled, so a planted record can never name someone else's process."""
    try:
        if proc.environ().get(RUN_TOKEN_ENV) in (token, grade_marker(token)) \
                and proc.uids().real == os.geteuid():
            return True
        return any(parent.pid == os.getpid() for parent in proc.parents())
    except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess, OSError):
        return False


def journaled_identity(record: Mapping[str, object]) -> ProcIdentity | None:
    """The process identity an event records (cell_started, endpoint_spawned...), or
    None when it has none or a field has the wrong shape (the journal is untrusted)."""
    pid, create_time = record.get("pid"), record.get("create_time")
    ticks = record.get("start_ticks")
    if type(pid) is not int or pid <= 1 or not isinstance(create_time, int | float) \
            or isinstance(create_time, bool):
        return None
    return ProcIdentity(pid, float(create_time), ticks if type(ticks) is int else None)


def journaled_alive(events: Iterable[Mapping[str, object]]) -> list[int]:
    """Pids of journaled cell and endpoint processes (cell_started, endpoint_spawned,
    endpoint_started) whose exact identity is still alive: what a dead supervisor left."""
    alive: list[int] = []
    for record in events:
        if record.get("event") not in ("cell_started", "endpoint_spawned", "endpoint_started"):
            continue
        ident = journaled_identity(record)
        if ident is not None and ident.pid not in alive and verify(ident):
            alive.append(ident.pid)
    return alive


_subreaper = False


def enable_subreaper() -> bool:
    """Make orphaned descendants re-parent to us (Linux >= 3.4); False if unsupported."""
    global _subreaper
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        _subreaper = bool(libc.prctl(_PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) == 0)
    except (OSError, AttributeError):
        _subreaper = False
    return _subreaper


def direct_children() -> list[int]:
    """Our direct children, from the main thread's /proc children list (cheap: psutil's
    children() walks every process on the box to build a parent map).

    Only the main thread's list is read, not one per thread (there is a thread per live
    child under asyncio's child watcher, so that was ~15 reads per call): every process
    we spawn is forked by the event loop on the main thread, and the kernel re-parents an
    orphan to a subreaper's first live thread, which is the main thread while we run."""
    pid = os.getpid()
    try:
        with open(f"/proc/{pid}/task/{pid}/children") as f:
            return [int(child_pid) for child_pid in f.read().split()]
    except (OSError, ValueError):
        try:
            return [child.pid for child in psutil.Process().children()]
        except psutil.NoSuchProcess:
            return []


def _alive(proc: psutil.Process) -> bool:
    try:
        return bool(proc.is_running() and proc.status() != psutil.STATUS_ZOMBIE)
    except psutil.NoSuchProcess:
        return False


class Tracker:
    """The known tree of one cell attempt: root identity, token, descendants seen.

    While we are the child subreaper, an orphaned descendant can only be in the root's
    tree or re-parented to us, so the token is looked for among our direct children; a
    ``full_scan`` (the start-up sweep of a dead predecessor's cells, whose orphans went
    to init) looks at every process."""

    def __init__(self, root: ProcIdentity, token: str | None = None,
                 full_scan: bool = False, reaper: int | None = None,
                 uid: int | None = None) -> None:
        self.root = root
        self.token = token
        self.full_scan = full_scan
        # the cell's own uid (autopilot.cell.users): every process of it is the cell's
        self.uid = uid
        # the root's parent when it is a subreaper of its own (the attempt's data path):
        # orphans re-parent there while it lives, to us once it is gone
        self.reaper = reaper
        self.seen: set[ProcIdentity] = set()

    def remember(self) -> None:
        """Record the current descendants so a later re-parenting cannot hide them."""
        root = verify(self.root)
        if root is None:
            return
        try:
            for child in descendants(root):
                self.seen.add(ProcIdentity(child.pid, child.create_time(),
                                           start_ticks(child.pid)))
        except psutil.NoSuchProcess:
            pass

    def collect(self) -> dict[int, psutil.Process]:
        found: dict[int, psutil.Process] = {}

        def add(proc: psutil.Process) -> None:
            if _alive(proc):
                found[proc.pid] = proc
                try:
                    for child in descendants(proc):
                        if _alive(child):
                            found[child.pid] = child
                except psutil.NoSuchProcess:
                    pass

        root = verify(self.root)
        if root is not None:
            add(root)
        for ident in list(self.seen):
            seen = verify(ident)
            if seen is not None:
                add(seen)
        # Children we spawned ourselves (other cells' roots, graders, the endpoint) are
        # never another cell's orphans: only adoptees are looked at.
        scope = self._adoptees() if self.token or self.uid is not None else None
        if self.token:
            for proc, _ in _env_holders(TOKEN_ENV, self.token, self.root.create_time, scope):
                add(proc)
        if self.uid is not None and scope is not None:
            # A process of the cell's uid is in the root's tree or an orphan of it, and
            # an orphan is re-parented to a subreaper (the data path, then us): it is
            # among the adoptees, with its own tree. (No process can take the uid on.)
            for pid in scope:
                with contextlib.suppress(psutil.Error):
                    proc = psutil.Process(pid)
                    if proc.uids().real == self.uid:
                        add(proc)
        elif self.uid is not None:
            from autopilot.cell.users import processes_of

            for proc in processes_of(self.uid):
                if _alive(proc):
                    found[proc.pid] = proc
        found.pop(os.getpid(), None)
        return found

    def _adoptees(self) -> list[int] | None:
        """The pids an orphan of this attempt can be re-parented to us as; None when
        every process must be looked at (a dead predecessor's orphans went to init, or
        we are no subreaper)."""
        if self.full_scan or not _subreaper:
            return None
        # The reaper's children first, then ours: an orphan the data path drops as it
        # exits is moved to us before it stops being the data path's, so read in this
        # order it is in one list or the other, never in neither.
        scope: list[int] = []
        if self.reaper is not None:
            with contextlib.suppress(psutil.Error):
                kids = child_pids(self.reaper)
                scope += kids if kids is not None else [
                    child.pid for child in psutil.Process(self.reaper).children()]
        return scope + [pid for pid in direct_children() if pid not in OWNED]

    def alive(self) -> bool:
        return bool(self.collect())


def _env_holders(key: str, value: str | tuple[str, ...], not_before: float = 0.0,
                 scope: list[int] | None = None
                 ) -> Iterable[tuple[psutil.Process, dict[str, str]]]:
    """Processes (every one, or the pids in ``scope``) started no earlier than
    ``not_before`` whose environment has ``key`` = ``value`` (one of them, for a
    tuple), with that environment."""
    values = (value,) if isinstance(value, str) else value
    candidates: Iterable[psutil.Process]
    if scope is None:
        candidates = psutil.process_iter()
    else:
        candidates = []
        for pid in scope:
            try:
                candidates.append(psutil.Process(pid))
            except psutil.NoSuchProcess:
                continue
    euid = os.geteuid()
    for proc in candidates:
        try:
            if proc.create_time() + _CT_TOLERANCE < not_before or proc.pid == os.getpid():
                continue
            if proc.uids().real != euid:  # a marker is signalled only in the run's own user's
                continue
            env = proc.environ()
            if env.get(key) in values:
                yield proc, env
        except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess, OSError):
            continue


def _signal_all(procs: Iterable[psutil.Process], sig: int) -> list[int]:
    sent = []
    for proc in procs:
        try:
            # psutil re-checks (pid, create_time) before signalling and raises
            # NoSuchProcess on a recycled pid: identity is verified just before the kill.
            proc.send_signal(sig)
            sent.append(proc.pid)
        except (psutil.NoSuchProcess, psutil.AccessDenied):
            pass
    return sent


def _wait_gone(procs: Iterable[psutil.Process], timeout: float) -> None:
    """Wait until every process is gone or a zombie, *without reaping*: psutil's
    wait_procs would waitpid() our direct children and steal asyncio's exit status."""
    deadline = time.monotonic() + timeout
    pending = list(procs)
    while pending and time.monotonic() < deadline:
        pending = [proc for proc in pending if _alive(proc)]
        if pending:
            time.sleep(0.02)


def kill_tree(tracker: Tracker, grace: float) -> list[int]:
    """SIGTERM the whole tree, wait ``grace``, SIGKILL what is left. Blocking: run it in
    a worker thread. Returns every pid that was signalled."""
    signalled: set[int] = set()
    procs = tracker.collect()
    if not procs:
        return []
    signalled.update(_signal_all(procs.values(), signal.SIGTERM))
    _wait_gone(procs.values(), grace)
    # Survivors, plus anything forked meanwhile: collect again each round.
    for _ in range(5):
        procs = tracker.collect()
        if not procs:
            break
        signalled.update(_signal_all(procs.values(), signal.SIGKILL))
        _wait_gone(procs.values(), 2)
    reap_adopted(signalled)
    return sorted(signalled)


def reap_adopted(pids: Iterable[int] | None = None) -> list[int]:
    """waitpid() zombies re-parented to us as subreaper. Only pids given (or, with None,
    our zombie children that no asyncio watcher owns) are reaped."""
    reaped: list[int] = []
    if pids is None and _spawning:
        return reaped  # a fresh child may already be a zombie its watcher has not seen
    children = set(direct_children())
    wanted = (children if pids is None else set(pids) & children) - OWNED
    for pid in wanted:
        try:
            if psutil.Process(pid).status() != psutil.STATUS_ZOMBIE:
                continue
            got, _ = os.waitpid(pid, os.WNOHANG)
            if got:
                reaped.append(pid)
        except (ChildProcessError, psutil.NoSuchProcess):
            continue
    return reaped


def kill_adoptees(grace: float = 1.0) -> list[int]:
    """At the end of a run without cgroups: every live process re-parented to us (we
    are the subreaper) that we did not spawn is a run's leftover — a daemon that left
    its cell's tree and cleared its environment, so nothing else would find it. Killed
    with its own tree (TERM, then KILL after ``grace``)."""
    killed: list[int] = []
    procs = []
    for pid in set(direct_children()) - OWNED:
        try:
            proc = psutil.Process(pid)
            if proc.status() == psutil.STATUS_ZOMBIE:
                continue
            procs += [proc, *descendants(proc)]
        except psutil.Error:
            continue
    for proc in procs:
        with contextlib.suppress(psutil.Error):
            proc.terminate()
            killed.append(proc.pid)
    _, alive = psutil.wait_procs(procs, timeout=grace)
    for proc in alive:
        with contextlib.suppress(psutil.Error):
            proc.kill()
    reap_adopted(killed)
    return killed


def probe(tracker: Tracker | None, activity: int | None) -> Probe:
    """What the watchdog's PROBE records: is the tree alive, what is it doing, the
    sandbox's CPU."""
    from autopilot.state.cellevents import Probe

    procs = tracker.collect() if tracker else {}
    states: dict[str, int] = {}
    cpu = 0.0
    for proc in procs.values():
        try:
            states[proc.status()] = states.get(proc.status(), 0) + 1
            times = proc.cpu_times()
            cpu += times.user + times.system
        except psutil.Error:
            continue
    return Probe(alive=bool(procs), pids=len(procs), states=states, cpu_secs=round(cpu, 2),
                 sandbox_activity=activity)
