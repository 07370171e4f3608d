"""The command lines of a run: how its ``--config`` files are recorded, and the line
that resumes it (said on a stop signal), as the user ran it."""

from __future__ import annotations

import argparse
import os
import shlex
import sys
from pathlib import Path


def recorded_overlays(given: list[str] | None) -> str | list[str] | None:
    """How plan.json keeps the --config files: absolute, one as a string (as before),
    several as a list in their order."""
    paths = [str(Path(overlay).absolute()) for overlay in given or []]
    return None if not paths else paths[0] if len(paths) == 1 else paths


def program() -> list[str]:
    """This program as it was run, to be run again from anywhere: a path (a venv's
    ``.venv/bin/autopilot``) made absolute, a bare name (found on PATH) kept, and ``python
    -m autopilot[.cli]`` as this interpreter's ``-m autopilot``."""
    first = sys.argv[0] if sys.argv else ""
    if not first or first in ("-c", "-m") or Path(first).name in ("__main__.py", "cli.py"):
        return [sys.executable, "-m", "autopilot"]
    if os.sep in first:
        return [str(Path(first).absolute())]
    return [first]


def resume_command(args: argparse.Namespace, state_dir: Path, target_n: int) -> str:
    """The command line that resumes this run: the same flags, with the state dir and
    the target N spelled out (the defaults that chose them may differ next time)."""
    argv = [*program(), *sys.argv[1:]]
    # Paths as absolute ones: the line is run again from anywhere (a shell in $HOME, a
    # systemd unit), where a relative --config or --state-dir names another file.
    path_flags = {"--config", "--state-dir", "--preset", "--notify-config", "--results-repo",
                  "--metrics-textfile"}
    def is_path(flag: str, value: str) -> bool:  # a preset name stays a name
        return Path(value).is_file() if flag == "--preset" else Path(value).exists()

    for i, arg in enumerate(argv):
        flag, eq, value = arg.partition("=")
        if eq and flag in path_flags and value and is_path(flag, value):
            argv[i] = f"{flag}={Path(value).absolute()}"
        elif i > 0 and argv[i - 1] in path_flags and is_path(argv[i - 1], arg):
            argv[i] = str(Path(arg).absolute())
    if not args.state_dir:
        argv += ["--state-dir", str(state_dir)]
    if args.target_n is None:
        argv += ["--target-n", str(target_n)]
    return shlex.join(argv)


__all__ = ["program", "recorded_overlays", "resume_command"]
