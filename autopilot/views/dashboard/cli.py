"""``dashboard``: read-only views of a run (this module: argument parsing, dispatch).

It never writes into the state dir and never takes the lock, so it works while the
autopilot runs, after it died, or while it is wedged. Missing or sparse data is a clear
message and exit 0, not a traceback.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from pathlib import Path
from typing import NoReturn

from autopilot.cliutil import OneLineParser, default_state_dir, run_and_exit
from autopilot.errors import EXIT_USAGE
from autopilot.escape import sane
from autopilot.state.liveness import shown
from autopilot.state.progress import oneline
from autopilot.state.statusdoc import read as read_status
from autopilot.state.untrusted import state_json


def positive_float(value: str) -> float:
    try:
        f = float(value)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected seconds, got {value!r}") from None
    if f <= 0:
        raise argparse.ArgumentTypeError(f"must be > 0, got {value}")
    return f


def build_parser() -> argparse.ArgumentParser:
    parser = OneLineParser(prog="dashboard", description="Read-only view of a bench-autopilot run.")
    parser.add_argument("--state-dir", default=None, metavar="DIR",
                        help="default $AUTOPILOT_STATE_DIR or /tmp/bench-autopilot")
    views = parser.add_mutually_exclusive_group()
    views.add_argument("--oneline", action="store_true", help="one compact status line")
    views.add_argument("--watch", nargs="?", type=positive_float, const=2.0, metavar="SECS",
                       help="redraw in place every SECS (default 2: it reads one small "
                       "file); Ctrl-C exits")
    parser.add_argument("--html", metavar="FILE", help="write a self-contained HTML page (with "
                        "--watch: rewritten atomically every SECS)")
    views.add_argument("--json", action="store_true", help="compact machine-readable status")
    parser.add_argument("--board", nargs="+", metavar="DIR",
                       help="the board across runs (a campaign dir, or run dirs); with "
                       "--json or --html for those forms")
    views.add_argument("--serve", action="store_true",
                       help="serve the live view, per-cell pages, /status.json and /metrics "
                       "over HTTP (read-only)")
    views.add_argument("--trend", action="store_true",
                       help="per-task cumulative pass rate over v1-3/5/10/20")
    views.add_argument("--flips", action="store_true",
                       help="per-task cells that differ from the modal verdict")
    parser.add_argument("--bind", default="127.0.0.1:8765", metavar="HOST:PORT",
                        help="--serve address (default 127.0.0.1:8765; anything but loopback "
                        "needs --token-file)")
    parser.add_argument("--allow-host", action="append", default=[], metavar="NAME",
                        help="--serve: another name clients may reach it by (the Host header; "
                        "besides the bound address, localhost and loopback); repeatable")
    parser.add_argument("--token-file", metavar="FILE",
                        help="--serve: clients must present this token (Bearer header, or "
                        "?token= once, then a cookie)")
    parser.add_argument("--no-color", action="store_true", help="no colour (also: NO_COLOR)")
    parser.add_argument("--no-events", action="store_true", help="grid without recent events")
    parser.add_argument("--no-sparkline", action="store_true", help="grid without the sparkline")
    parser.add_argument("--width", type=int, default=None, help=argparse.SUPPRESS)
    parser.add_argument("--print-completion", choices=("bash", "zsh", "tcsh"), metavar="SHELL",
                        help="print a shell completion script (bash, zsh, tcsh) and exit")
    return parser


def _no_run(state_dir: Path) -> int:
    from autopilot.state.readers import unreadable

    denied = unreadable(state_dir)
    if denied:
        print(f"dashboard: error: {denied}", file=sys.stderr)
        return EXIT_USAGE
    print(f"no run yet: nothing readable in {state_dir} (status.json / plan.json missing)")
    return 0


def serve(state_dir: Path, args: argparse.Namespace) -> int:
    import asyncio

    from autopilot.views.dashboard import serve as server

    host, _, port_text = args.bind.rpartition(":")
    host = host.strip("[]")
    try:
        port = int(port_text)
        if not host or not 0 <= port <= 65535:
            raise ValueError
    except ValueError:
        print(f"dashboard: error: --bind {args.bind!r}: expected HOST:PORT", file=sys.stderr)
        return EXIT_USAGE
    token = None
    if args.token_file:
        try:
            token = server.read_token(Path(args.token_file))
        except (OSError, ValueError) as e:
            print(f"dashboard: error: --token-file: {e}", file=sys.stderr)
            return EXIT_USAGE
    elif not server.is_loopback(host):
        print(f"dashboard: error: --bind {args.bind}: not loopback, so --token-file is "
              "required (or reach it through an SSH tunnel to 127.0.0.1)", file=sys.stderr)
        return EXIT_USAGE
    try:
        asyncio.run(server.run(state_dir, host, port, token,
                               allow_hosts=tuple(args.allow_host)))
    except KeyboardInterrupt:
        return 0
    except OSError as e:
        print(f"dashboard: error: --bind {args.bind}: {e.strerror}", file=sys.stderr)
        return EXIT_USAGE
    return 0


def board_view(args: argparse.Namespace, no_color: bool) -> int:
    """``--board DIR...``: the consolidated board (mixed runs are shown, marked)."""
    from autopilot.errors import AutopilotError
    from autopilot.views import board

    try:
        result = board.build([Path(directory) for directory in args.board], allow_mixed=True)
    except AutopilotError as e:
        print(f"dashboard: error: {e}", file=sys.stderr)
        return EXIT_USAGE
    if args.json:
        sys.stdout.write(board.to_json(result))
        return 0
    if args.html:
        from autopilot.views.dashboard.html import render_template

        out = Path(args.html).absolute()
        if not out.parent.is_dir():
            print(f"dashboard: error: --html {out}: directory {out.parent} does not exist",
                  file=sys.stderr)
            return EXIT_USAGE
        write_html(out, render_template("board.html.j2", board=result))
        print(f"wrote {out}")
        return 0
    from autopilot.views.dashboard import term

    term.make_console(no_color, args.width).print(term.board_view(result))
    return 0


def write_html(path: Path, text: str) -> None:
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")
    with os.fdopen(fd, "w", encoding="utf-8") as f:
        f.write(text)
    os.replace(tmp, path)  # a browser refresh never sees half a page


def watch_html(state_dir: Path, every: float, out: Path) -> int:
    """``--watch SECS --html FILE``: rewrite the page every SECS (atomically: a browser
    refresh never sees half a page) until Ctrl-C, one line per rewrite."""
    from autopilot.views.dashboard import model
    from autopilot.views.dashboard.html import render_html

    k = 0
    try:
        while True:
            k += 1
            data = model.load(state_dir)
            if data is not None:
                write_html(out, render_html(data))
                print(f"wrote {out} (refresh #{k})", flush=True)
            time.sleep(every)
    except KeyboardInterrupt:
        return 0


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.print_completion:
        import shtab

        print(shtab.complete(parser, args.print_completion))
        return 0
    state_dir = Path(args.state_dir or default_state_dir()).absolute()
    no_color = args.no_color or bool(os.environ.get("NO_COLOR"))
    if args.serve:
        return serve(state_dir, args)
    if args.board:
        return board_view(args, no_color)
    if args.oneline:
        status = state_json(state_dir, "status.json")
        if not isinstance(status, dict):
            return _no_run(state_dir)
        try:
            print(oneline(read_status(shown(state_dir, sane(status)))))
        except (TypeError, ValueError, KeyError, AttributeError, OverflowError):
            print(f"dashboard: error: {state_dir}/status.json: malformed", file=sys.stderr)
            return 1
        return 0
    if args.html:
        out = Path(args.html).absolute()
        if args.json or args.trend or args.flips:
            print("dashboard: error: --html goes with the grid (or --watch), not with "
                  "--json/--trend/--flips", file=sys.stderr)
            return EXIT_USAGE
        if out.is_relative_to(state_dir):
            print(f"dashboard: error: --html {out}: inside the state dir, which the dashboard "
                  "never writes; choose another path", file=sys.stderr)
            return EXIT_USAGE
        if not out.parent.is_dir():
            print(f"dashboard: error: --html {out}: directory {out.parent} does not exist",
                  file=sys.stderr)
            return EXIT_USAGE
    if args.watch and args.html:
        return watch_html(state_dir, args.watch, Path(args.html).absolute())
    if args.watch:
        return watch(state_dir, args.watch, no_color, args)
    from autopilot.views.dashboard import model  # the views need the journal; --oneline does not

    data = model.load(state_dir)
    if data is None:
        return _no_run(state_dir)
    if args.json:
        from autopilot.views.dashboard.jsonview import to_json

        print(to_json(data))
        return 0
    if args.html:
        from autopilot.views.dashboard.html import render_html

        write_html(Path(args.html).absolute(), render_html(data))
        print(f"wrote {Path(args.html).absolute()}")
        return 0
    from autopilot.views.dashboard import term

    console = term.make_console(no_color, args.width)
    if args.trend:
        console.print(term.trend_view(data))
    elif args.flips:
        console.print(term.flips_view(data))
    else:
        console.print(term.grid(data, events=not args.no_events, spark=not args.no_sparkline,
                                width=console.width))
    return 0


def watch(state_dir: Path, every: float, no_color: bool, args: argparse.Namespace) -> int:
    from rich.console import Group, RenderableType
    from rich.live import Live
    from rich.text import Text

    from autopilot.views.dashboard import model, term

    console = term.make_console(no_color, args.width)

    def frame(k: int) -> RenderableType:
        data = model.load(state_dir)
        stamp = Text(f"refresh #{k} every {every:g}s · {time.strftime('%H:%M:%S')} · Ctrl-C exits",
                     style="dim")
        if data is None:
            return Group(stamp, Text(f"no run yet in {state_dir}"))
        return Group(stamp, term.grid(data, events=not args.no_events,
                                      spark=not args.no_sparkline, width=console.width))

    k = 1
    try:
        with Live(frame(k), console=console, auto_refresh=False, transient=False) as live:
            while True:
                time.sleep(every)
                k += 1
                live.update(frame(k), refresh=True)
    except KeyboardInterrupt:
        return 0


def entry() -> NoReturn:
    run_and_exit(main)


if __name__ == "__main__":
    entry()
