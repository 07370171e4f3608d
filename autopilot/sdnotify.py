"""The systemd notify protocol: one datagram to ``$NOTIFY_SOCKET``.

Small enough to write ourselves (see sd_notify(3)): a leading ``@`` names an abstract
socket; an unset variable makes every call a no-op, so the same binary runs under
systemd and in a terminal. ``watchdog_interval`` is half of ``WATCHDOG_USEC`` when the
unit enables the watchdog (and ``WATCHDOG_PID`` is unset or ours), so a wedged event
loop stops pinging and gets restarted.
"""

from __future__ import annotations

import os
import socket


def _address() -> str | None:
    addr = os.environ.get("NOTIFY_SOCKET")
    if not addr:
        return None
    if addr.startswith("@"):
        return "\0" + addr[1:]
    return addr


def notify(message: str) -> bool:
    """Send ``message`` (e.g. ``READY=1``); False when there is nowhere to send it."""
    addr = _address()
    if addr is None:
        return False
    try:
        with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM | socket.SOCK_CLOEXEC) as sock:
            sock.connect(addr)
            sock.sendall(message.encode("utf-8", "replace"))
        return True
    except OSError:
        return False


def watchdog_interval() -> float | None:
    usec = os.environ.get("WATCHDOG_USEC")
    pid = os.environ.get("WATCHDOG_PID")
    if not usec or (pid and pid != str(os.getpid())):
        return None
    try:
        return int(usec) / 1e6 / 2
    except ValueError:
        return None
