"""``dashboard``: read-only views of a run (this module: argument parsing, dispatch).

It never writes into the state dir and never takes the lock, so it works while the
autopilot runs, after it died, or while it is wedged. Missing or sparse data is a clear
message and exit 0, not a traceback.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from autopilot.cli import OneLineParser, default_state_dir
from autopilot.fsutil import read_json
from autopilot.status import oneline


def build_parser() -> argparse.ArgumentParser:
    ap = OneLineParser(prog="dashboard", description="Read-only view of a bench-autopilot run.")
    ap.add_argument("--state-dir", default=None, help="default $AUTOPILOT_STATE_DIR or "
                    "/tmp/bench-autopilot")
    ap.add_argument("--oneline", action="store_true", help="one compact status line")
    return ap


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    state_dir = Path(args.state_dir or default_state_dir())
    status = read_json(state_dir / "status.json")
    if not isinstance(status, dict):
        print(f"no run yet: {state_dir / 'status.json'} is missing or unreadable")
        return 0
    print(oneline(status))
    return 0


if __name__ == "__main__":
    sys.exit(main())
