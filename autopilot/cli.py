"""``autopilot``: argument parsing and exit codes.

    autopilot --target-n 20 --preset NAME [flags]     drive a run (the systemd form)
    autopilot presets                                 list presets
    autopilot validate | report | summarize ARM       read-only verbs over a state dir
    autopilot regrade [--task T] [--arm A]            re-run the grader on finished cells
    autopilot cleanup [--endpoint] | release | notify-test   reclaim the box; free its
                                                      output dirs; test phone pushes
    autopilot stop                                    end what a run left running with no
                                                      supervisor (a hand-over no successor
                                                      took up): attempts, endpoint
    autopilot schema [--partial | --markdown]         the preset's JSON Schema; the
                                                      option reference

Exit codes: 0 COMPLETE, 1 INCOMPLETE, 2 bad config / usage / preflight, 3 double drive,
130 / 143 stopped by SIGINT / SIGTERM. Bad input is one line on stderr and nothing is
written.
"""

from __future__ import annotations

import argparse
import json
import signal
import sys
from dataclasses import replace
from functools import partial
from pathlib import Path
from typing import Any, NoReturn

import anyio

from autopilot import sigrecord
from autopilot.cliparser import build_parser
from autopilot.cliutil import default_state_dir, run_and_exit
from autopilot.config import Preset
from autopilot.errors import (
    EXIT_HANDOVER,
    EXIT_SIGTERM,
    AutopilotError,
    ConfigError,
    LockHeld,
    OutputsOwned,
    SandboxTaken,
    StateDirError,
)
from autopilot.escape import term
from autopilot.loader import find_preset, list_presets, load_preset
from autopilot.plan import Plan
from autopilot.run.preflight import PreflightReport, run_preflight
from autopilot.runline import recorded_overlays, resume_command
from autopilot.state.fsutil import atomic_write_json, atomic_write_text, check_writable_dir
from autopilot.state.journal import state_events
from autopilot.state.readers import load_recorded
from autopilot.state.untrusted import state_json


def _state_dir(args: argparse.Namespace) -> Path:
    """``--state-dir`` given after a verb, before it, ``$AUTOPILOT_STATE_DIR``, or the default."""
    from autopilot.state.statedir import settled

    chosen = args.state_dir or default_state_dir(args.preset)
    # resolved once, link by link (a symlink of another user's is refused): every later
    # open goes through a path without a symlink, so a swap after the check is nothing
    return settled(Path(chosen).absolute())


def cmd_presets() -> int:
    rows = list_presets()
    width = max((len(preset_name) for preset_name, _ in rows), default=0)
    for name, desc in rows:
        print(f"{name:<{width}}  {desc}")
    return 0


def cmd_notify_test(args: argparse.Namespace) -> int:
    from autopilot import logsetup
    from autopilot.cell.childenv import urls_from_env
    from autopilot.run.notify import MILESTONES, Message, Notifier

    logsetup.configure(None)  # events to stderr; stdout is the per-URL result table

    urls = urls_from_env()
    if args.preset:
        urls = [*load_preset(args.preset).notify.urls, *urls]
    notifier = Notifier(urls, args.notify_config)
    if not notifier.enabled:
        raise ConfigError("notify-test: no URLs (set [notify].urls in the preset, "
                          "AUTOPILOT_NOTIFY_URLS, or --notify-config)")
    ntype, priority = MILESTONES["test"]
    msg = Message("test", "bench-autopilot test", "If you can read this, milestones reach you.",
                  ntype, priority)
    results = anyio.run(notifier.send, msg)
    for url, ok in results:
        print(f"{'ok  ' if ok else 'FAIL'}  {url}")
    return 0 if results and all(ok for _, ok in results) else 1


def dry_run_text(preset: Preset, plan: Plan, state_dir: Path, warnings: list[str]) -> str:
    from autopilot.state.ledger import Ledger

    led = Ledger(plan)

    for record in state_events(state_dir):
        led.apply(record)
    tally = led.counts()
    lines = [
        f"plan: preset {preset.name} (identity {plan.identity}), model {preset.model}, "
        f"engine {preset.endpoint.engine}",
        f"arms ({len(preset.arms)}): " + ", ".join(arm.label for arm in preset.arms),
        f"tasks ({len(preset.tasks)}): " + ", ".join(task.id for task in preset.tasks),
        f"N: {plan.target_n}",
        f"state dir: {state_dir}",
        f"cells: {tally.total} total | {tally.done} valid | "
        f"{tally.pending + tally.running + tally.grading} pending | {tally.invalid} invalid | "
        f"{tally.quarantined} quarantined | {tally.ungraded} ungraded",
    ]
    from autopilot.backends.base import backend_class  # imports no Ray

    lines += backend_class(preset.backend.kind).dry_run_lines(preset)
    from autopilot.cell.cgroups import mode_line

    lines.append(mode_line())
    from autopilot.cell.users import mode_line as user_line
    from autopilot.cell.users import resolve

    lines.append(user_line(resolve(preset, state_dir), preset.harness.uids))
    from autopilot.gateway.evidence import mode_line as gateway_line

    lines.append(gateway_line(preset))
    from autopilot.cell.validity import counting_line

    lines.append(counting_line(preset.trust.count))
    lines += env_lines(preset)
    lines += [f"warning: {warning}" for warning in warnings]
    lines.append("dry run: nothing launched")
    return "\n".join(lines)


def env_lines(preset: Preset) -> list[str]:
    """Which env vars each child role is given on purpose (besides the base allow-list),
    and which of this environment's it does not inherit (names only: values are never
    printed)."""
    from autopilot.cell.childenv import Role, passed, withheld

    out = []
    roles: tuple[Role, ...] = ("harness", "grader", "endpoint")
    for role in roles:
        given, held = sorted(passed(preset, role)), withheld(preset, role)
        shown = ", ".join(held[:30]) + (f" and {len(held) - 30} more" if len(held) > 30
                                        else "")
        out.append(f"env {role}: passes {', '.join(given) or 'nothing extra'} (besides the "
                   f"base: PATH, HOME, locale, TERM, TZ, ...); withheld {shown or 'none'}")
    return out


def load_trusted(state_dir: Path, args: argparse.Namespace) -> tuple[Preset, Plan]:
    """The run's preset and plan for a verb that deletes or runs commands (see
    autopilot.state.readers.load_trusted), from the verb's --preset / --config."""
    from autopilot.state.readers import load_trusted as trusted

    return trusted(state_dir, args.preset, args.config)


def cmd_validate(args: argparse.Namespace) -> int:
    from autopilot.state.liveness import look
    from autopilot.state.lock import lock_held
    from autopilot.views.validate import render_table, validate_run

    state_dir = _state_dir(args)
    preset, plan = load_recorded(state_dir)

    status = state_json(state_dir, "status.json")
    # The lock says whether a run is in progress: a frozen supervisor (SIGSTOP, a paused
    # VM) has a stale heartbeat but still holds the run, and its cells still run.
    live = lock_held(state_dir) is not None or look(
        state_dir, status.get("phase") if isinstance(status, dict) else None).state == "live"
    result = validate_run(preset, plan, state_dir, in_progress=live)
    print(render_table(result))
    return 0 if result.ok else 1


def cmd_report(args: argparse.Namespace) -> int:
    from autopilot.views import report

    state_dir = _state_dir(args)
    preset, plan = load_recorded(state_dir)
    text = report.render_findings(preset, args.n or plan.target_n, state_dir)
    if args.out:
        out = Path(args.out)
        why = check_writable_dir(out.parent)
        if why:
            raise StateDirError(f"--out {why}")
        atomic_write_text(out, text)
        print(f"wrote {out}")
    else:
        sys.stdout.write(text)
    return 0


def cmd_summarize(args: argparse.Namespace) -> int:
    from autopilot.views import report

    state_dir = _state_dir(args)
    preset, plan = load_recorded(state_dir)
    if args.arm not in [arm.label for arm in preset.arms]:
        raise ConfigError(f"summarize: unknown arm {args.arm!r} "
                          f"(arms: {', '.join(arm.label for arm in preset.arms)})")
    facts = report.collect(preset, plan.target_n, state_dir)
    sys.stdout.write(report.arm_summary(preset, facts, args.arm))
    return 0


def cmd_cleanup(args: argparse.Namespace) -> int:
    from autopilot.ops.cleanup import cleanup
    from autopilot.state.lock import describe_holder, lock_held

    state_dir = _state_dir(args)
    holder = lock_held(state_dir)
    if holder is not None:
        raise LockHeld(f"refusing to clean up a run in progress: {describe_holder(holder)}")
    preset, plan = load_trusted(state_dir, args)
    removed = anyio.run(partial(cleanup, preset, plan, state_dir,
                                endpoint=getattr(args, "endpoint", False),
                                release_only=args.command == "release"))
    for item in removed:
        print(f"removed {item}")
    if not removed:
        print("nothing to clean up")
    return 0


def cmd_stop(args: argparse.Namespace) -> int:
    """``autopilot stop``: a supervisor that starts with a stop already asked for, so it
    does what a ``systemctl stop`` during a start-up does (autopilot.run.supervisor):
    takes the lock (exit 3 while another holds it), ends the run's leftovers, journals
    them and ``run_finished stopped``. The unit runs it after a stop that found only a
    handed-over run (ExecStopPost)."""
    from autopilot.run.supervisor import RunOptions, Supervisor

    state_dir = _state_dir(args)
    preset, plan = load_trusted(state_dir, args)
    last = None  # the last launch's last word: a run that ended itself left nothing
    for record in state_events(state_dir):
        if record.get("event") in ("run_started", "run_finished", "run_handed_over"):
            last = record
    if last is not None and last.get("event") == "run_finished":
        from autopilot.datapath.forks import end_forkserver

        end_forkserver(state_dir)  # (a run that ended itself left none: a crash might)
        print(f"nothing to stop: the run ended ({term(str(last.get('outcome')), 40)})")
        return 0
    sup = Supervisor(preset, plan, RunOptions(state_dir, console_log=not args.quiet))
    sup.stop.request(signal.SIGTERM, by="autopilot stop")
    code = anyio.run(sup.run)
    return 0 if code == EXIT_SIGTERM else code


def cmd_regrade(args: argparse.Namespace) -> int:
    from autopilot.ops.regrade import refresh_status, regrade
    from autopilot.state.status import oneline
    from autopilot.state.statusdoc import read as read_status

    state_dir = _state_dir(args)
    preset, plan = load_trusted(state_dir, args)
    if args.task and args.task not in [task.id for task in preset.tasks]:
        raise ConfigError(f"regrade: --task {args.task!r} is not a task of this run "
                          f"(tasks: {', '.join(task.id for task in preset.tasks)})")
    if args.arm and args.arm not in [arm.label for arm in preset.arms]:
        raise ConfigError(f"regrade: --arm {args.arm!r} is not an arm of this run "
                          f"(arms: {', '.join(arm.label for arm in preset.arms)})")
    done = anyio.run(partial(regrade, preset, plan, state_dir, task=args.task, arm=args.arm))
    snap = refresh_status(preset, plan, state_dir)
    print(f"regraded {len(done)} cell(s); {oneline(read_status(snap))}")
    return 0


def recorded_target_n(state_dir: Path) -> int | None:
    """The target N this state dir's run was last driven to (plan.json), if any: a re-run
    without --target-n keeps it rather than falling back to the preset's."""


    rec = state_json(state_dir, "plan.json")
    target_n = rec.get("target_n") if isinstance(rec, dict) else None
    return target_n if type(target_n) is int and target_n > 0 else None


def metrics_path(value: str | None) -> Path | None:
    if not value:
        return None
    from autopilot.views.metrics import textfile_dir_problem

    path = Path(value).absolute()
    if not path.parent.is_dir():
        raise ConfigError(f"--metrics-textfile {path}: directory {path.parent} does not exist")
    why = textfile_dir_problem(path.parent)
    if why:
        raise ConfigError(f"--metrics-textfile {path}: {why}")
    return path


def cmd_board(args: argparse.Namespace) -> int:
    from autopilot.run import publish
    from autopilot.views import board

    dirs = [Path(given) for given in args.dirs]
    result = board.build(dirs, allow_mixed=args.allow_mixed)
    if args.out:
        out = Path(args.out).absolute()
    elif len(dirs) == 1 and not (dirs[0] / "plan.json").exists():
        out = dirs[0].absolute()  # a campaign dir: the board sits beside its entries
    else:
        out = Path.cwd()
    why = check_writable_dir(out)
    if why:
        raise StateDirError(f"--out {why}")
    for path in board.write(result, out):
        print(f"wrote {path}")
    if args.publish:
        repo = Path(args.results_repo or Path.cwd())
        res = publish.publish(repo, {"bench-results/board/board.md": board.to_markdown(result),
                                     "bench-results/board/board.json": board.to_json(result)},
                              f"bench-autopilot: board of {len(result['runs'])} runs")
        if not res.ok:
            print(f"autopilot: error: publish failed: {res.error}", file=sys.stderr)
            return 1
        print(f"published on {res.branch} ({res.commit or 'unchanged'})")
    return 0


def cmd_campaign(args: argparse.Namespace) -> int:
    import subprocess

    from autopilot import logsetup
    from autopilot.ops.campaign import (
        Campaign,
        campaign_dir_for,
        entry_argv,
        load_roster,
        order_text,
    )

    roster_path = Path(args.roster).absolute()
    roster, planned = load_roster(roster_path, args.target_n, None)
    cdir = campaign_dir_for(roster.campaign.name, args.state_dir)
    planned = [replace(entry_plan, state_dir=cdir / entry_plan.entry.name)
               for entry_plan in planned]
    if args.dry_run:
        print(f"campaign {roster.campaign.name}: {len(planned)} entries in {cdir}")
        print(order_text(planned, roster.providers))
        for entry_plan in planned:
            print(f"--- entry {entry_plan.entry.name} ({entry_plan.state_dir})", flush=True)
            dry = subprocess.run(entry_argv(entry_plan, "--dry-run"), capture_output=True,
                                 text=True)
            sys.stdout.write(dry.stdout)
            if dry.returncode != 0:
                raise ConfigError(f"entry {entry_plan.entry.name}: {dry.stderr.strip()}")
        print("dry run: nothing launched")
        return 0
    why = check_writable_dir(cdir)
    if why:
        raise StateDirError(f"campaign dir {why}")
    logsetup.configure(None, console=not args.quiet)
    return anyio.run(Campaign(roster_path, cdir, planned, roster.providers,
                              roster.campaign).run)


def cmd_run(args: argparse.Namespace) -> int:
    from autopilot.run.once import snapshot_once
    from autopilot.run.recovery import check_plan_identity
    from autopilot.run.supervisor import RunOptions, Supervisor
    from autopilot.state.statedir import check_trusted

    state_dir = _state_dir(args)
    why = check_writable_dir(state_dir)
    if why:
        raise StateDirError(f"--state-dir {why}")
    check_trusted(state_dir)
    remembered = recorded_target_n(state_dir)
    flags: dict[str, Any] = {
        "target_n": args.target_n or remembered, "concurrency": args.concurrency,
        "max_passes": args.max_passes,
    }
    from autopilot.run.admission import load_admitted

    preset = load_admitted(args.preset, overlay=args.config, flags=flags)
    if preset.run.target_n is None:
        raise ConfigError("--target-n: not set (and the preset has no run.target_n)")
    from autopilot.cell.users import resolve

    who = resolve(preset, state_dir)
    if who.refused and not args.dry_run:
        raise ConfigError(f"harness.user: {who.why}")
    plan = Plan(preset, preset.run.target_n)
    if remembered and args.target_n is None:
        print(f"target N {remembered}: remembered from {state_dir}/plan.json "
              "(--target-n changes it)", file=sys.stderr)
    elif remembered and args.target_n != remembered:
        print(f"target N changes {remembered} -> {args.target_n} for this state dir",
              file=sys.stderr)
    check_plan_identity(state_dir, plan, args.allow_plan_change)

    asked = sigrecord.asked()  # a signal during the start-up so far
    if asked == "handover":  # nothing touched yet: everything stays for the successor
        print("AUTOPILOT_HANDED_OVER: during start-up, before the run was taken: "
              "nothing touched", file=sys.stderr, flush=True)
        return EXIT_HANDOVER
    # A stop needs no preflight (it may fail on what it is to stop: the predecessor's
    # endpoint on its port): the supervisor ends what was left and says so.
    report = PreflightReport() if asked == "stop" else anyio.run(partial(
        run_preflight, preset, plan, state_dir, offline=args.offline or args.dry_run))
    if args.dry_run:
        print(dry_run_text(preset, plan, state_dir, report.warnings))
        return 0

    if args.once:
        from autopilot.state.lock import lock_held
        from autopilot.state.status import oneline
        from autopilot.state.statusdoc import read as read_status

        snap = snapshot_once(preset, plan, state_dir)
        holder = lock_held(state_dir)
        if holder is None:
            atomic_write_json(state_dir / "status.json", snap)
        else:
            from autopilot.state.lock import describe_holder

            print(f"run in progress ({describe_holder(holder)}): status.json is the live "
                  "supervisor's and is left as it is; from the journal:", file=sys.stderr)
        print(oneline(read_status(snap)))
        return 0

    opts = RunOptions(
        state_dir, args.allow_plan_change, args.notify_config, console_log=not args.quiet,
        preset_path=str(find_preset(args.preset).absolute()),
        config_path=recorded_overlays(args.config),
        identity=report.identity, warnings=tuple(report.warnings),
        publish=args.publish, results_repo=args.results_repo,
        resume_command=resume_command(args, state_dir, plan.target_n),
        live_view=not args.quiet and sys.stderr.isatty(),
        metrics_textfile=metrics_path(args.metrics_textfile),
    )
    sup = Supervisor(preset, plan, opts)
    return anyio.run(sup.run)


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.command or args.dry_run or args.once:
        # Not a run: stop signals mean what they mean to any command (autopilot.sigrecord
        # held them since the first instruction for the case that this was a run).
        sigrecord.release()
    try:
        if args.command == "presets":
            return cmd_presets()
        if args.command == "notify-test":
            return cmd_notify_test(args)
        if args.command == "campaign":
            return cmd_campaign(args)
        if args.command == "board":
            return cmd_board(args)
        if args.command == "init":
            from autopilot.starter import write_starter

            written = write_starter(args.name, Path(args.dir))
            for path in written:
                print(f"wrote {path}")
            print(f"next: autopilot --preset {written[0]} --target-n 2 --dry-run")
            return 0
        if args.command == "schema":
            from autopilot import reference
            from autopilot.state.events import events_markdown

            print(events_markdown() if args.events else reference.reference_markdown()
                  if args.markdown else
                  json.dumps(reference.json_schema(partial=args.partial), indent=2))
            return 0
        if args.command == "completion":
            import shtab

            print(shtab.complete(parser, args.shell))
            return 0
        if args.command == "validate":
            return cmd_validate(args)
        if args.command in ("cleanup", "release"):
            return cmd_cleanup(args)
        if args.command == "report":
            return cmd_report(args)
        if args.command == "summarize":
            return cmd_summarize(args)
        if args.command == "regrade":
            return cmd_regrade(args)
        if args.command == "stop":
            return cmd_stop(args)
        if not args.preset:
            parser.error("--preset is required to run (try `autopilot presets`)")
        return cmd_run(args)
    except LockHeld as e:
        if args.command in ("cleanup", "release", "stop") or isinstance(
                e, OutputsOwned | SandboxTaken):
            print(f"autopilot: error: {e}", file=sys.stderr)
        else:
            print(f"AUTOPILOT_ABORTED_DOUBLE_DRIVE: another autopilot drives this run: {e}",
                  file=sys.stderr)
        return e.exit_code
    except AutopilotError as e:
        print(f"autopilot: error: {e}", file=sys.stderr)
        return e.exit_code
    except KeyboardInterrupt:
        return 130


def entry() -> NoReturn:
    sigrecord.install()  # `python -m autopilot.cli`: late, but before the first step
    run_and_exit(main)


if __name__ == "__main__":
    entry()
