"""Keep the supervisor's own environment from its children.

Children get a clean environment (autopilot.cell.childenv), but a harness runs as the
same user and could read ``/proc/<supervisor>/environ``: the provider key, the
notification URLs. ``PR_SET_DUMPABLE 0`` makes the kernel hand the supervisor's
``/proc/<pid>`` files to root and refuses same-user ptrace, so a child of the same user
reads nothing (root still can: run the service as its own user, as systemd/ does). The
flag is reset for each child at exec, so harnesses and graders stay debuggable.
Standard library only (ctypes): it runs before anything else is imported.
"""

from __future__ import annotations

import ctypes
import functools

PR_SET_DUMPABLE = 4
PR_GET_DUMPABLE = 3


@functools.cache
def libc() -> ctypes.CDLL | None:
    # The process's own symbols (libc is loaded): no ctypes.util.find_library, which
    # runs ldconfig or a compiler to look for it (~0.1 s at every start).
    try:
        return ctypes.CDLL(None, use_errno=True)
    except OSError:
        return None


def make_undumpable() -> bool:
    """Mark this process non-dumpable; True if the kernel says it now is."""
    lib = libc()
    if lib is None:
        return False
    lib.prctl(PR_SET_DUMPABLE, 0, 0, 0, 0)
    return dumpable() is False


def dumpable() -> bool | None:
    """Whether this process is dumpable (None where prctl is not available)."""
    lib = libc()
    if lib is None:
        return None
    value = lib.prctl(PR_GET_DUMPABLE, 0, 0, 0, 0)
    return None if value < 0 else bool(value)
