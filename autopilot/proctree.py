"""A process's descendants, found from the process down, never by walking the host.

psutil's ``children(recursive=True)`` builds a parent map of every process on the
machine first (a read of ``/proc/<pid>/stat`` each): with 2,000 idle processes on a
shared host that is ~100 ms a call, paid at every cell's teardown. The kernel keeps
each thread's children in ``/proc/<pid>/task/<tid>/children`` (Linux 4.2+): read from
the root down, the cost is the tree's size, not the machine's. Where that file is
missing (an older or restricted kernel) psutil's walk is the fallback.
"""

from __future__ import annotations

import os

import psutil


def child_pids(pid: int) -> list[int] | None:
    """``pid``'s children (forked by any of its threads); None when the kernel does not
    list them here (use psutil's walk)."""
    try:
        tids = os.listdir(f"/proc/{pid}/task")
    except FileNotFoundError:
        return []  # gone: no children
    except OSError:
        return None
    out: list[int] = []
    for tid in tids:
        try:
            with open(f"/proc/{pid}/task/{tid}/children") as f:
                out += [int(x) for x in f.read().split()]
        except FileNotFoundError:
            if not os.path.exists(f"/proc/{pid}/task/{tid}"):
                continue  # the thread ended meanwhile
            return None
        except (OSError, ValueError):
            continue
    return out


def descendants(proc: psutil.Process) -> list[psutil.Process]:
    """Every live descendant of ``proc``, parents before children."""
    found: list[psutil.Process] = []
    seen = {proc.pid}
    todo = [proc.pid]
    while todo:
        kids = child_pids(todo.pop(0))
        if kids is None:
            try:
                return list(proc.children(recursive=True))
            except psutil.NoSuchProcess:
                return []
        for kid in kids:
            if kid in seen:
                continue
            seen.add(kid)
            try:
                found.append(psutil.Process(kid))
            except psutil.NoSuchProcess:
                continue
            todo.append(kid)
    return found
