"""Import-light CLI helpers shared by ``autopilot`` and ``dashboard`` (the dashboard's
``--oneline`` must start fast, so nothing heavy is imported here)."""

from __future__ import annotations

import argparse
import atexit
import os
import sys
import threading
from collections.abc import Callable
from typing import NoReturn

from autopilot.errors import EXIT_USAGE

DEFAULT_STATE_DIR = "/tmp/bench-autopilot"


class OneLineParser(argparse.ArgumentParser):
    """argparse, but a usage error is one line and exit code 2."""

    def error(self, message: str) -> NoReturn:
        self.exit(EXIT_USAGE, f"{self.prog}: error: {message}\n")


def default_state_dir() -> str:
    return os.environ.get("AUTOPILOT_STATE_DIR") or DEFAULT_STATE_DIR


def run_and_exit(main: Callable[[], int]) -> NoReturn:
    """Console-script entry: run ``main`` and leave without the interpreter's teardown.

    Freeing every module and object at exit (pydantic, rich, httpx...) costs 50-100 ms
    per invocation and does nothing the kernel does not do anyway. It is skipped only
    when that is safe: no other thread is alive (so nothing is cut short), and the atexit
    handlers and the standard streams have been run and flushed first.
    """
    try:
        code = main()
        sys.stdout.flush()
    except BrokenPipeError:
        _quiet_broken_pipe()
    if any(t.is_alive() and not t.daemon for t in threading.enumerate()
           if t is not threading.main_thread()):
        sys.exit(code)  # a thread that must finish: the interpreter waits for it
    atexit._run_exitfuncs()
    try:
        sys.stdout.flush()
        sys.stderr.flush()
    except OSError:  # a closed pipe (| head): what the normal exit would also hit
        sys.exit(code)
    os._exit(code)


def _quiet_broken_pipe() -> NoReturn:
    """``autopilot validate | head -3``: the reader has what it wanted. Exit 0 with no
    traceback (stdout is pointed at /dev/null so the interpreter's final flush is quiet)."""
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, sys.stdout.fileno())
    os._exit(0)
