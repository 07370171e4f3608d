"""Who opened a loopback TCP connection to an attempt's gateway port (stdlib only).

A harness that sends no API key (the origin benchmark's talks to ``127.0.0.1:<port>``
with a bare urllib request) is still known before a byte of its body is read: the
kernel says which socket is the other end of the connection (``/proc/net/tcp``: the
row whose local address is the caller's and whose remote address is our port), and a
socket belongs to a process that holds it open (``/proc/<pid>/fd``). A caller is
admitted only when that process is one of the data path's own descendants: the
harness and whatever it started. Another cell's harness, a local user, a grader or a
container of someone else's has no socket there.
"""

from __future__ import annotations

import os
import socket
import struct

MAX_TREE = 4096  # processes looked at under one data path (a fork bomb is not walked)


def _hex_addr(host: str, port: int) -> str:
    """``/proc/net/tcp``'s spelling of an IPv4 address: the 32-bit word as the kernel
    holds it, in host byte order, then the port; both upper-case hex."""
    word = struct.unpack("=I", socket.inet_aton(host))[0]
    return f"{word:08X}:{port:04X}"


def socket_inode(peer: tuple[str, int], local: tuple[str, int]) -> int | None:
    """The inode of the socket at ``peer`` connected to ``local`` (an established
    loopback connection), or None."""
    want_local, want_remote = _hex_addr(*peer), _hex_addr(*local)
    try:
        with open("/proc/net/tcp") as f:
            next(f, None)
            for line in f:
                cols = line.split()
                if len(cols) > 9 and cols[1] == want_local and cols[2] == want_remote:
                    return int(cols[9]) or None
    except (OSError, ValueError):
        return None
    return None


def descendants(root: int) -> list[int]:
    """Every process under ``root`` (not ``root`` itself), from the kernel's children
    lists; bounded by MAX_TREE."""
    out: list[int] = []
    todo = [root]
    while todo and len(out) < MAX_TREE:
        pid = todo.pop()
        try:
            tids = os.listdir(f"/proc/{pid}/task")
        except OSError:
            continue
        for tid in tids:
            try:
                with open(f"/proc/{pid}/task/{tid}/children") as f:
                    kids = [int(x) for x in f.read().split()]
            except (OSError, ValueError):
                continue
            out.extend(kids)
            todo.extend(kids)
    return out[:MAX_TREE]


def holds_socket(pid: int, inode: int) -> bool:
    target = f"socket:[{inode}]"
    try:
        fds = os.listdir(f"/proc/{pid}/fd")
    except OSError:
        return False
    for fd in fds:
        try:
            if os.readlink(f"/proc/{pid}/fd/{fd}") == target:
                return True
        except OSError:
            continue
    return False


def opened_by_tree(peer: tuple[str, int], local: tuple[str, int], root: int) -> bool:
    """The connection from ``peer`` to ``local`` was opened by a descendant of ``root``
    (and is still held by one)."""
    inode = socket_inode(peer, local)
    if inode is None:
        return False
    return any(holds_socket(pid, inode) for pid in descendants(root))


__all__ = ["descendants", "holds_socket", "opened_by_tree", "socket_inode"]
