"""Import-light CLI helpers shared by ``autopilot`` and ``dashboard`` (the dashboard's
``--oneline`` must start fast, so nothing heavy is imported here)."""

from __future__ import annotations

import argparse
import os
from typing import NoReturn

from autopilot.errors import EXIT_USAGE

DEFAULT_STATE_DIR = "/tmp/bench-autopilot"


class OneLineParser(argparse.ArgumentParser):
    """argparse, but a usage error is one line and exit code 2."""

    def error(self, message: str) -> NoReturn:
        self.exit(EXIT_USAGE, f"{self.prog}: error: {message}\n")


def default_state_dir() -> str:
    return os.environ.get("AUTOPILOT_STATE_DIR") or DEFAULT_STATE_DIR
