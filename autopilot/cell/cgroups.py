"""Containment by cgroup v2: every harness, grader and endpoint of a run in a group of
its own, as systemd tracks a service.

A process found by its identity, the run's marker in its environment or its parent is
found only while it keeps them: a child that clears its environment (``env -i``) and
double-forks keeps none, and survived the cell, the run and ``cleanup``. A cgroup
cannot be left: every descendant stays in its group whatever it does, and
``cgroup.kill`` ends the whole group at once (the kernel walks it, no race with forks).

Layout: ``<cgroup2 mount><our own group>/autopilot-<run marker[:16]>/<name>``, one group
per attempt (``cell-<cell>-a<k>``, ``grade-<cell>-a<k>``) and per endpoint replica
(``endpoint-<i>``). A child is placed before it runs a line of its own: the spawn is
``/bin/sh -c 'echo 0 > GROUP/cgroup.procs && exec "$@"'`` (the shell moves itself, then
execs the real argv under the same pid), so nothing it forks can start outside. The
cgroup2 mount is found in ``/proc/self/mountinfo`` (a hybrid host mounts it at
``/sys/fs/cgroup/unified``), never assumed.

Only the core interface is used (``cgroup.procs``, ``cgroup.kill``, ``cgroup.events``):
no controller, so the no-internal-process rule does not apply and the groups can sit
under our own. Where no group can be made (not root and no delegated subtree, no
cgroup2, or ``AUTOPILOT_CGROUPS=off``), ``probe`` says why and the run falls back to
identity + marker + subreaper adoptees (autopilot.cell.procs).
"""

from __future__ import annotations

import contextlib
import os
import re
import signal
import time
from dataclasses import dataclass, field
from pathlib import Path

OFF_ENV = "AUTOPILOT_CGROUPS"  # "off": never use cgroups (the fallback, e.g. to test it)
PLACE = 'echo 0 > "$0/cgroup.procs" && exec "$@"'


def cgroup2_mount(mountinfo: str | None = None) -> Path | None:
    """Where the cgroup2 hierarchy is mounted (the fields after " - " name the type)."""
    if mountinfo is None:
        try:
            mountinfo = Path("/proc/self/mountinfo").read_text()
        except OSError:
            return None
    for line in mountinfo.splitlines():
        left, sep, right = line.partition(" - ")
        if sep and right.split(" ", 1)[0] == "cgroup2":
            fields = left.split(" ")
            if len(fields) >= 5:
                return Path(fields[4])
    return None


def own_group(proc_cgroup: str | None = None) -> str | None:
    """This process's cgroup v2 path (the ``0::PATH`` line of /proc/self/cgroup)."""
    if proc_cgroup is None:
        try:
            proc_cgroup = Path("/proc/self/cgroup").read_text()
        except OSError:
            return None
    for line in proc_cgroup.splitlines():
        if line.startswith("0::"):
            return line[3:].strip() or "/"
    return None


def where() -> tuple[Path | None, str]:
    """Our own group in the cgroup2 hierarchy (where the run's subtree goes), or None
    and why cgroups are not used here."""
    if os.environ.get(OFF_ENV, "").lower() in ("off", "0", "no"):
        return None, f"cgroups switched off by ${OFF_ENV}"
    mount, own = cgroup2_mount(), own_group()
    if mount is None or own is None:
        return None, "no cgroup v2 hierarchy mounted"
    return mount / own.lstrip("/"), ""


@dataclass(frozen=True)
class Spared:
    """A process in one of the run's groups that is not the group's own (moved in by a
    harness, or the supervisor itself): never signalled, said (foreign_in_cell_group)."""

    group: str
    pid: int
    why: str


@dataclass(frozen=True)
class Swept:
    """One group a sweep emptied: the pids it ended, and those it spared."""

    group: str
    pids: list[int]
    foreign: list[Spared] = field(default_factory=list)


class Containment:
    """The run's subtree of groups (see the module doc)."""

    def __init__(self, base: Path) -> None:
        self.base = base

    @classmethod
    def probe(cls, token: str) -> tuple[Containment | None, str]:
        """The run's subtree, made if need be, and the mode in words; (None, why) where
        cgroups cannot be used here."""
        parent, why = where()
        if parent is None:
            return None, why
        base = parent / f"autopilot-{token[:16]}"
        try:
            base.mkdir(exist_ok=True)
            (base / "cgroup.procs").stat()
        except OSError as e:
            return None, f"cannot make a group under {base.parent} ({e.strerror})"
        return cls(base), f"cgroup v2 at {base}"

    def group(self, name: str) -> Path:
        path = self.base / name
        try:
            path.mkdir()
            # When it was made, in the clock processes' start times are kept in (ticks
            # since boot): "older than the group" to the tick, not to psutil's second.
            _BORN[str(path)] = boot_ticks()
        except FileExistsError:
            pass
        return path

    def wrap(self, argv: list[str], group: Path) -> list[str]:
        """``argv``, run from inside ``group`` (same pid: the shell execs it)."""
        return ["/bin/sh", "-c", PLACE, str(group), *argv]

    @staticmethod
    def members(group: Path) -> list[int]:
        try:
            return [int(x) for x in (group / "cgroup.procs").read_text().split()]
        except (OSError, ValueError):
            return []

    def kill(self, group: Path, timeout: float = 5.0,
             spared: list[Spared] | None = None) -> list[int]:
        """End every process of ``group`` that is the group's own and remove it; the
        pids it ended. A member that is not (``foreign``: moved in by a harness, since a
        group's members may write its ``cgroup.procs``) is never signalled: it is left
        where it is and added to ``spared`` for the caller to
        journal (foreign_in_cell_group)."""
        pids = self.members(group)
        if not pids:
            with contextlib.suppress(OSError):
                group.rmdir()
            return []
        strangers: dict[int, str] = {}
        ours = pids
        mine = _ancestors()
        if mine & set(pids):
            # A harness moved us (or an ancestor of ours) in: never frozen, never
            # signalled; we move ourselves back out to the group we started in.
            if spared is not None:
                spared.extend(Spared(group.name, pid, "the supervisor (or an ancestor of it)")
                              for pid in sorted(mine & set(pids)))
            _write(self.base.parent / "cgroup.procs", str(os.getpid()))
        # Frozen first: nothing in the group forks or moves anyone in while we look
        # (unless that would freeze us).
        frozen = not (mine & set(self.members(group))) and _write(group / "cgroup.freeze",
                                                                  "1")
        try:
            if frozen:
                _wait_frozen(group, min(timeout, 2.0))
            pids = self.members(group)
            strangers = {pid: why for pid in pids if (why := foreign(pid, group))}
            moved_in = set(strangers) & mine  # already said above
            strangers.update(dict.fromkeys(moved_in, "the supervisor"))
            if strangers and spared is not None:
                spared.extend(Spared(group.name, pid, why)
                              for pid, why in strangers.items() if pid not in moved_in)
            ours = [pid for pid in pids if pid not in strangers]
            if not strangers and _write(group / "cgroup.kill", "1"):
                pass  # the kernel ends the whole group at once
            else:  # a stranger inside (or a kernel before 5.14): ours, one by one
                for pid in ours:
                    with contextlib.suppress(ProcessLookupError, PermissionError):
                        os.kill(pid, signal.SIGKILL)
        finally:
            if frozen:
                _write(group / "cgroup.freeze", "0")
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            left = [pid for pid in self.members(group) if pid not in strangers]
            if not left:
                break
            for pid in left:  # what forked before the kill landed
                if foreign(pid, group):
                    continue
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.kill(pid, signal.SIGKILL)
            time.sleep(0.01)
        with contextlib.suppress(OSError):
            group.rmdir()
            _BORN.pop(str(group), None)
        return ours

    @staticmethod
    def populated(group: Path) -> bool:
        try:
            events = (group / "cgroup.events").read_text()
        except OSError:
            return False
        return "populated 1" in events

    def sweep(self, timeout: float = 5.0, endpoint: bool = True,
              keep: frozenset[str] = frozenset()) -> list[Swept]:
        """Kill every group of the run (a dead predecessor's, or all at cleanup; the
        endpoints' only with ``endpoint``; never the groups named in ``keep``: attempts
        re-attached to, a re-adopted endpoint)."""
        found: list[Swept] = []
        for group in sorted(path for path in self.base.iterdir() if path.is_dir()):
            if not endpoint and group.name.startswith("endpoint-"):
                continue
            if group.name in keep or group.name.rpartition("-u")[0] in keep:
                continue  # (kept by its name, whatever uid the attempt ran as)
            spared: list[Spared] = []
            pids = self.kill(group, timeout, spared)
            if pids or spared:
                found.append(Swept(group.name, pids, spared))
        return found

    def close(self) -> None:
        """Remove the run's subtree once it is empty (at the end of a run)."""
        with contextlib.suppress(OSError):
            for group in self.base.iterdir():
                if group.is_dir() and not self.populated(group):
                    group.rmdir()
            self.base.rmdir()


def _write(path: Path, value: str) -> bool:
    try:
        path.write_text(value)
        return True
    except OSError:
        return False


def _wait_frozen(group: Path, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            if "frozen 1" in (group / "cgroup.events").read_text():
                return
        except OSError:
            return
        time.sleep(0.002)


def _group_cell(group: Path) -> tuple[str | None, int | None]:
    """The cell a group is for (``cell-<cell>-a<k>[-u<uid>]``, ``grade-…``) and the uid
    its processes run as; (None, None) for an endpoint's."""
    match = _GROUP.fullmatch(group.name)
    if match is None:
        return None, None
    return match.group(1), int(match.group(2)) if match.group(2) else None


def _ancestors() -> set[int]:
    out: set[int] = set()
    pid = os.getpid()
    while pid > 1 and pid not in out:
        out.add(pid)
        try:
            with open(f"/proc/{pid}/stat") as f:
                pid = int(f.read().rsplit(")", 1)[1].split()[1])
        except (OSError, ValueError, IndexError):
            break
    return out


_BORN: dict[str, int] = {}  # group path -> boot_ticks() when we made it (this process)
_TCK = os.sysconf("SC_CLK_TCK")


def boot_ticks() -> int:
    """Now, as /proc/<pid>/stat's starttime counts: clock ticks since boot."""
    return int(time.clock_gettime(time.CLOCK_BOOTTIME) * _TCK)


_MARKERS = ("AUTOPILOT_CELL_ID", "AUTOPILOT_RUN_TOKEN", "AUTOPILOT_DATAPATH")


def foreign(pid: int, group: Path) -> str | None:
    """Why ``pid``, found in ``group``, is not the group's own (None: it is). Its own:
    started after the group was made, by this user, and either carrying the group's
    cell or no marker of ours at all (a descendant that cleared its environment). Not:
    the supervisor or an ancestor of it, another user's process, one older than the
    group (nothing born before it can be the attempt's), another cell's or the
    endpoint's process, a data path."""
    import psutil

    if pid in _ancestors():
        return "the supervisor (or an ancestor of it)"
    try:
        proc = psutil.Process(pid)
        uid = proc.uids().real
        started = proc.create_time()
    except psutil.Error:
        return None  # gone
    cell, cell_uid = _group_cell(group)
    if uid != os.geteuid() and uid != cell_uid:
        return f"a process of uid {uid}"
    from autopilot.cell.procs import start_ticks

    born, ticks = _BORN.get(str(group)), start_ticks(pid)
    if born is not None and ticks is not None:
        # Made by us: nothing of the attempt can have started before it (its first
        # process is spawned after, and enters it itself).
        if ticks < born:
            return "a process older than the group"
    else:
        # A predecessor's group: its ctime, against psutil's start time (the boot time
        # is whole seconds in /proc/stat: up to a second early). Generous, since what
        # this rules out there is days old (an sshd moved in).
        try:
            made = group.stat().st_ctime
        except OSError:
            made = 0.0
        if started + 1.5 < made:
            return "a process older than the group"
    if cell_uid is not None and uid == cell_uid:
        return None  # the cell's own uid is no one else's (autopilot.cell.users)
    try:
        env = proc.environ()
    except psutil.Error:
        return "a process whose environment cannot be read"
    mine = env.get("AUTOPILOT_CELL_ID")
    if env.get("AUTOPILOT_DATAPATH"):
        return "a data path"
    if cell is None:  # an endpoint's group: a cell's process is never its own
        return "a cell's process" if mine is not None else None
    if mine is not None:
        return None if mine == cell else f"cell {mine[:80]}'s process"
    if any(k in env for k in _MARKERS):
        return "a process of the run that is no cell's (the endpoint, the supervisor's)"
    return None


def mode_line() -> str:
    """Which containment a run here would use, said without making anything (for
    ``--dry-run``)."""
    parent, why = where()
    if parent is not None and not os.access(parent, os.W_OK):
        parent, why = None, (f"cannot make a group under {parent}: run as root, or under "
                             "systemd with Delegate=yes")
    if parent is None:
        return f"containment: process identity + run marker + subreaper adoptees ({why})"
    return (f"containment: a cgroup v2 group per harness, grader and endpoint under "
            f"{parent} (cgroup.kill ends each with everything it started)")


_CACHE: dict[str, tuple[Containment | None, str]] = {}


def for_run(token: str) -> tuple[Containment | None, str]:
    """``Containment.probe`` once per process and run (spawns ask at every cell)."""
    if token not in _CACHE:
        _CACHE[token] = Containment.probe(token)
    return _CACHE[token]


def group_name(kind: str, cell: str, attempt: int, uid: int | None = None) -> str:
    """``<kind>-<cell>-a<k>``, and ``-u<uid>`` for a cell with a user of its own: its
    processes run as that uid, so that uid is the group's own (see ``foreign``)."""
    return f"{kind}-{cell}-a{attempt}" + (f"-u{uid}" if uid is not None else "")


_GROUP = re.compile(r"(?:cell|grade)-(.+)-a\d+(?:-u(\d+))?")
