"""Ports an endpoint listens on, and how often its readiness is probed."""

from __future__ import annotations

import re
import socket


def free_port(host: str = "127.0.0.1") -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((host, 0))
        return int(sock.getsockname()[1])


# How an engine says its port was taken: Python's and uvicorn's strerror, llama-server's
# own words, Docker's port publisher.
PORT_TAKEN = re.compile(r"address already in use|couldn'?t bind|port is already allocated",
                         re.IGNORECASE)
PORT_TRIES = 3


def port_taken(host: str, port: int) -> bool:
    """Whether something else holds ``host:port`` now (a bind like a server's fails)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # TIME_WAIT is not "taken"
        try:
            sock.bind((host, port))
        except OSError:
            return True
    return False


def probe_pause(waited: float) -> float:
    """Seconds to the next readiness probe after ``waited`` seconds of waiting: readiness
    is seen at most ~10% (+10 ms) late, so a simulator ready in 0.1 s is seen at once and
    a 30-minute model load is probed twice a second, not hammered."""
    return min(0.5, 0.01 + waited / 10)
