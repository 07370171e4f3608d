"""The ``autopilot`` command line's grammar: the run's flags and every verb's.

Only argparse and the import-light helpers: ``autopilot completion`` and ``--help``
build it without loading the rest.
"""

from __future__ import annotations

import argparse
from argparse import SUPPRESS
from typing import TYPE_CHECKING

from autopilot import __version__
from autopilot.cliutil import DEFAULT_STATE_DIR, OneLineParser


def positive_int(value: str) -> int:
    try:
        count = int(value)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected an integer, got {value!r}") from None
    if count < 1:
        raise argparse.ArgumentTypeError(f"must be >= 1, got {count}")
    return count


def build_parser() -> argparse.ArgumentParser:
    parser = OneLineParser(
        prog="autopilot",
        description="Self-healing supervisor for long LLM benchmark runs.",
        epilog="exit codes: 0 complete, 1 incomplete, 2 bad config/usage, 3 double drive, "
        "130/143 stopped by signal",
    )
    parser.add_argument("--version", action="version", version=f"%(prog)s {__version__}")
    parser.add_argument("--preset", metavar="PRESET",
                        help="preset name (see `autopilot presets`) or a .toml path")
    parser.add_argument("--config", metavar="OVERLAY", action="append",
                        help="TOML or JSON overlay, deep-merged over the preset (several: in "
                        "order, a later one wins)")
    parser.add_argument("--target-n", type=positive_int, metavar="N",
                        help="replicates per task x arm")
    parser.add_argument("--concurrency", type=positive_int, metavar="N",
                        help="cells at once (their harnesses)")
    parser.add_argument("--max-passes", type=positive_int, metavar="N",
                        help="sweeps over pending cells")
    parser.add_argument("--state-dir", default=None, metavar="DIR",
                        help=f"default $AUTOPILOT_STATE_DIR or {DEFAULT_STATE_DIR}")
    parser.add_argument("--once", action="store_true",
                        help="write one status snapshot rebuilt from the journal, then exit")
    parser.add_argument("--allow-plan-change", action="store_true",
                        help="resume a state dir whose plan identity differs")
    parser.add_argument("--notify-config", metavar="FILE",
                        help="apprise config file (YAML or text, with tags)")
    parser.add_argument("--offline", action="store_true", help="skip live preflight probes")
    parser.add_argument("--dry-run", action="store_true",
                        help="preflight (offline), print the plan, launch nothing")
    parser.add_argument("--publish", action="store_true",
                        help="on COMPLETE: scorecard.md + findings.md, committed to a "
                        "bench-results-<date> branch of the results repo (never pushed)")
    parser.add_argument("--results-repo", metavar="REPO",
                        help="git repo for --publish (default: preset "
                        "publish.results_repo, else the current directory's repo)")
    parser.add_argument("--metrics-textfile", metavar="PATH",
                        help="also write Prometheus metrics there on every status write (for "
                        "node_exporter's textfile collector; name it *.prom)")
    parser.add_argument("--quiet", action="store_true", help="no console log (file log only)")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    _views(sub)
    _operations(sub)
    _campaigns(sub)
    _tools(sub)
    return parser


if TYPE_CHECKING:
    Verbs = argparse._SubParsersAction[OneLineParser]


def _views(sub: Verbs) -> None:
    """The verbs that read a run."""
    # An option a verb shares with the run (--state-dir, --preset, --target-n...) writes
    # the same name: given after the verb it wins, not given it leaves the run's value
    # (SUPPRESS: the verb's parser sets nothing), so no name needs a prefix.
    sub.add_parser("presets", help="list presets with a one-line description")
    validate = sub.add_parser("validate", help="postflight: classify what is on disk; exit 1 if "
                              "any cell is INVALID")
    _which_run(validate)
    report = sub.add_parser("report", help="findings markdown from the per-cell artifacts")
    report.add_argument("--n", type=positive_int, help="up to replicate N (default: the run's)")
    report.add_argument("--out", help="write here instead of stdout")
    _which_run(report)
    summarize = sub.add_parser("summarize", help="print an arm's PASS/FAIL table")
    summarize.add_argument("arm")
    _which_run(summarize)


def _operations(sub: Verbs) -> None:
    """The verbs that act on a run no supervisor holds."""
    cleanup = sub.add_parser("cleanup", help="kill the run's leftover harness/grader processes, "
                             "remove the plan's sandbox containers and scratch dirs (exact names); "
                             "refuses while a supervisor holds the run")
    _state_dir_arg(cleanup, "the run's state dir (default as for the run)")
    cleanup.add_argument("--endpoint", action="store_true",
                         help="also the endpoint container or process")
    _trusted_preset_args(cleanup)
    stop = sub.add_parser("stop", help="end what a run left running with no supervisor (a "
                          "hand-over no successor took up, a crash): its attempts by identity "
                          "and its endpoint, journaled; refuses while a supervisor holds the run")
    _state_dir_arg(stop, "the run's state dir (default as for the run)")
    _trusted_preset_args(stop)
    release = sub.add_parser("release", help="let other runs write this run's output dirs "
                             "(cleanup does it too); refuses while a supervisor holds the run")
    _state_dir_arg(release, "the run's state dir (default as for the run)")
    _trusted_preset_args(release)
    regrade = sub.add_parser("regrade", help="re-run the grader on finished cells (PASS, FAIL, "
                             "ungraded) from their outputs, never the harness; journaled as new "
                             "grades of the same attempt; refuses while a supervisor holds the run")
    regrade.add_argument("--task", help="only this task's cells")
    regrade.add_argument("--arm", help="only this arm's cells")
    _state_dir_arg(regrade, "the run's state dir (default as for the run)")
    _trusted_preset_args(regrade)


def _campaigns(sub: Verbs) -> None:
    """The verbs across runs, and the phone."""
    notify_test = sub.add_parser("notify-test", help="send one test message to each configured URL")
    notify_test.add_argument("--preset", default=SUPPRESS, metavar="PRESET",
                             help="also use this preset's [notify] urls")
    notify_test.add_argument("--notify-config", default=SUPPRESS, metavar="FILE",
                             help="apprise config file")
    campaign = sub.add_parser("campaign", help="run a roster of presets (models) one after another "
                              "(hosted providers beside them), each in its own state dir under "
                              "the campaign dir; re-entrant like a run")
    campaign.add_argument("roster", metavar="ROSTER.toml")
    campaign.add_argument("--target-n", default=SUPPRESS, type=positive_int, metavar="N",
                          help="N for every entry (default: the entry's, then [campaign])")
    _state_dir_arg(campaign, "the campaign dir (default $AUTOPILOT_STATE_DIR-campaigns/NAME)")
    campaign.add_argument("--dry-run", default=SUPPRESS, action="store_true",
                          help="print every entry's plan and the order; launch nothing")
    campaign.add_argument("--quiet", default=SUPPRESS, action="store_true",
                          help="no console log (the campaign's journal and entry logs stay)")
    board = sub.add_parser("board", help="one board across runs (a campaign dir, or run dirs): "
                           "board.json + board.md, per model and arm")
    board.add_argument("dirs", nargs="+", metavar="DIR")
    board.add_argument("--allow-mixed", action="store_true",
                       help="build it even if the runs' task tables or graders differ (marked)")
    board.add_argument("--out", metavar="DIR",
                       help="where board.json and board.md go (default: the campaign dir when "
                       "one is given, else here)")
    board.add_argument("--publish", default=SUPPRESS, action="store_true",
                       help="also commit them to the results repo's bench-results-<date> branch")
    board.add_argument("--results-repo", default=SUPPRESS, metavar="REPO",
                       help="git repo for --publish (default: the current directory's)")


def _tools(sub: Verbs) -> None:
    """The verbs that write files for a person: a starter, a schema, a completion."""
    init = sub.add_parser("init", help="write a commented starter preset NAME.toml with its "
                          "harness and grader scripts (what --dry-run accepts as it is)")
    init.add_argument("name", metavar="NAME")
    init.add_argument("--dir", default=".", metavar="DIR", help="where (default: here)")
    schema = sub.add_parser("schema", help="print the JSON Schema of a preset file (for an "
                            "editor's TOML support), or with --markdown the option reference")
    schema.add_argument("--partial", action="store_true",
                        help="of a file that gives only some keys (one that extends another, "
                        "a --config overlay): nothing required")
    schema.add_argument("--markdown", action="store_true",
                        help="the option reference (docs/reference.md) instead")
    schema.add_argument("--events", action="store_true",
                        help="the journal's events and their fields (docs/events.md) instead")
    completion = sub.add_parser("completion", help="print a shell completion script (bash, zsh, "
                                "tcsh): e.g. `autopilot completion bash > "
                                "/etc/bash_completion.d/autopilot`")
    completion.add_argument("shell", choices=("bash", "zsh", "tcsh"))


def _state_dir_arg(verb: argparse.ArgumentParser, what: str) -> None:
    verb.add_argument("--state-dir", default=SUPPRESS, metavar="DIR", help=what)


def _which_run(verb: argparse.ArgumentParser) -> None:
    _state_dir_arg(verb, "the run's state dir (default as for the run)")
    verb.add_argument("--preset", default=SUPPRESS, metavar="NAME",
                      help="without --state-dir: the run of this preset in the default dirs")


def _trusted_preset_args(verb: argparse.ArgumentParser) -> None:
    # Verbs that delete or run commands never take a preset *path* from plan.json (a
    # planted plan.json would name the attacker's preset): the user names it, or the
    # recorded preset *name* is looked up among the preset dirs.
    verb.add_argument("--preset", default=SUPPRESS, metavar="PRESET",
                      help="the preset the run was made with (default: the run's own record, "
                      "preset.resolved.json; for a run without one its recorded name, looked "
                      "up among the preset dirs; never a path from plan.json)")
    verb.add_argument("--config", default=SUPPRESS, action="append", metavar="OVERLAY",
                      help="the overlay the run was made with (several: in order)")
