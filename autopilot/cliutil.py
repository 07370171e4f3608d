"""Import-light CLI helpers shared by ``autopilot`` and ``dashboard`` (the dashboard's
``--oneline`` must start fast, so nothing heavy is imported here)."""

from __future__ import annotations

import argparse
import atexit
import os
import sys
import threading
from collections.abc import Callable
from pathlib import Path
from typing import NoReturn

from autopilot.errors import EXIT_USAGE

# The default state dir: one per user (a shared box's users never meet each other's run
# in one dir) and per preset (a second preset never meets the first one's run):
# ``$TMPDIR/bench-autopilot-<user>/<preset>``. $AUTOPILOT_STATE_DIR names one exactly.
DEFAULT_STATE_DIR = "${TMPDIR:-/tmp}/bench-autopilot-<user>/<preset>"


class OneLineParser(argparse.ArgumentParser):
    """argparse, but a usage error is one line and exit code 2."""

    def error(self, message: str) -> NoReturn:
        self.exit(EXIT_USAGE, f"{self.prog}: error: {message}\n")


def state_base() -> Path:
    """Where this user's default state dirs live (one per preset)."""
    import pwd

    try:
        user = pwd.getpwuid(os.geteuid()).pw_name
    except KeyError:
        user = str(os.geteuid())
    return Path(os.environ.get("TMPDIR") or "/tmp") / f"bench-autopilot-{user}"


def preset_key(preset: str) -> str:
    """A preset's dir name: its name, or a file's stem (``./my-bench.toml``); ConfigError
    for anything else (the dir is named after it)."""
    from autopilot.config.base import NAME_RE
    from autopilot.errors import ConfigError

    key = Path(preset).stem if preset.endswith(".toml") or os.sep in preset else preset
    if not NAME_RE.fullmatch(key) or ".." in key:
        raise ConfigError(f"--preset {preset!r}: not a preset name or a .toml path")
    return key


def default_state_dir(preset: str | None = None) -> str:
    """$AUTOPILOT_STATE_DIR, else the preset's dir under ``state_base``; without a
    preset (a view), the run there: the only one, or the latest with a note on stderr."""
    if os.environ.get("AUTOPILOT_STATE_DIR"):
        return os.environ["AUTOPILOT_STATE_DIR"]
    base = state_base()
    if preset:
        return str(base / preset_key(preset))
    try:
        runs = [run for run in base.iterdir() if (run / "plan.json").is_file()]
    except OSError:
        runs = []
    if not runs:
        return str(base)
    latest = max(runs, key=_last_written)
    if len(runs) > 1:
        print(f"(state dir {latest}: the latest of {len(runs)} runs in {base}; "
              "--state-dir or --preset to choose)", file=sys.stderr)
    return str(latest)


def _last_written(state_dir: Path) -> float:
    try:
        return (state_dir / "journal.jsonl").stat().st_mtime
    except OSError:
        return 0.0


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
    if any(thread.is_alive() and not thread.daemon for thread in threading.enumerate()
           if thread is not threading.main_thread()):
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
