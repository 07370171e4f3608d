"""One cell of an Inspect eval: ``inspect eval`` of one task (and one sample id, or the
whole task) with the model pointed at the cell's gateway (``openai-api/local/<model>``,
``LOCAL_BASE_URL``), its log directory inside the cell's output dir; then
``summary.json`` from that log (status, error, tokens, the model) for the autopilot's
trust checks. The log stays where ``inspect view --log-dir`` reads it.

A later attempt of a cell of many samples (``--previous``, ``--attempt``) reuses the
samples an earlier one finished, through ``inspect eval-retry`` (autopilot.harnesses.
inspect_resume); ``summary.json`` then counts this attempt's tokens only, and
``inspect-reuse.json`` says which attempt scored each sample.

Everything after ``--`` is passed to ``inspect eval`` as it is (an arm's
``--max-tokens``, ``--temperature``, ``--reasoning-effort``, ``-T name=value``...).
Exit status: 0 when Inspect finished the eval (its score is the grader's to read from
the log, also when some samples errored while others were scored); 3 when the log
says it could not (an error: Inspect's message is the last line printed, no summary
is written); 4 when the eval was interrupted (killed, cancelled: its log is neither
``success`` nor ``error``; no summary, and the next attempt resumes it); Inspect's own
status when it wrote no log; 2 when Inspect is not installed.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from autopilot.harnesses import inspect_resume as reuse
from autopilot.harnesses.inspect_resume import newest_log


def parse(argv: list[str]) -> tuple[argparse.Namespace, list[str]]:
    extra: list[str] = []
    if "--" in argv:
        split_at = argv.index("--")
        argv, extra = argv[:split_at], argv[split_at + 1:]
    parser = argparse.ArgumentParser(prog="inspect_run", description=__doc__.splitlines()[0])
    parser.add_argument("--task-file", default="",
                        help="the file defining the @task (empty: the shipped examples)")
    parser.add_argument("--task", required=True,
                        help="the @task's name in that file, or a published task by its "
                         "registered name (inspect_evals/gsm8k), run unchanged")
    parser.add_argument("--inspect-args", action="append", default=[],
                        help="more `inspect eval` flags as one string (-T name=value, --limit, "
                         "--model-role ...), split as a shell would; may repeat")
    parser.add_argument("--sample-id", default="", help="one sample (empty: the whole task)")
    parser.add_argument("--model", required=True, help="the served model name")
    parser.add_argument("--base-url", required=True, help="the cell's gateway, .../v1")
    parser.add_argument("--out", required=True, type=Path, help="the cell's output dir")
    parser.add_argument("--compose-projects", type=Path, default=None,
                        help="list here, as they appear, the Docker Compose projects Inspect's "
                         "sandboxes start (harness.compose_projects: the autopilot removes "
                         "what a killed cell left)")
    parser.add_argument("--sample-retries", type=int, default=0,
                        help="a sample that errors is re-run this many times inside the eval "
                         "(Inspect's --retry-on-error) before the cell gives up on it")
    parser.add_argument("--model-roles", default="",
                        help="Inspect model roles, NAME=MODEL separated by spaces or commas: "
                         "MODEL `served` is the cell's own model through its gateway "
                         "(metered); any other Inspect model spec is an external role, "
                         "named in the summary (its calls show as progress)")
    parser.add_argument("--previous", type=Path, default=None,
                        help="the cell's earlier attempts (<state dir>/attempts/<cell>): the "
                         "samples one finished are reused (inspect eval-retry)")
    parser.add_argument("--attempt", type=int, default=1, help="this attempt's number")
    parser.add_argument("--last-try", default="0",
                        help="1: the cell's last try (its next INVALID quarantines it): a "
                         "sample that still errors is counted as errored, the others' "
                         "scores stand (Inspect's --no-fail-on-error)")
    parser.add_argument("--items", type=Path, default=None,
                        help="a cell of many samples: keep {total, done, reused} current here "
                         "(harness.items: a cut cell is resumed, never the model's FAIL)")
    parser.add_argument("--api-key-env", default="",
                        help="env var holding the key to send (a provider run's placeholder)")
    return parser.parse_args(argv), extra


INTERRUPTED = 4  # the eval did not finish: its log says neither success nor error

# The names Inspect gives its sandboxes' Compose projects (inspect_ai/util/_sandbox/
# docker/util.py: inspect-<task[:12]>-i<6 of a uuid>), and the label Compose sets.
INSPECT_PROJECT = re.compile(r"^inspect-[a-z\d\-_]*-i[a-z\d]{6,}$")
PROJECT_LABEL = "com.docker.compose.project"


def compose_projects() -> set[str] | None:
    """The Inspect-named Compose projects with a container on the Docker daemon now
    (None: no docker CLI, or no answer)."""
    docker = shutil.which("docker")
    if docker is None:
        return None
    try:
        done = subprocess.run(
            [docker, "ps", "-a", "--filter", f"label={PROJECT_LABEL}", "--format",
             f'{{{{.Label "{PROJECT_LABEL}"}}}}'], capture_output=True, text=True,
            timeout=10, check=False)
    except (OSError, subprocess.TimeoutExpired):
        return None
    if done.returncode != 0:
        return None
    return {x.strip() for x in done.stdout.splitlines() if INSPECT_PROJECT.match(x.strip())}


def track(listing: Path, listed: threading.Event, stop: threading.Event,
          every: float = 2.0) -> None:
    """Append to ``listing`` each Inspect project that appears while the eval runs (a
    kill may come at any moment: each name is on disk as soon as it is seen); those
    there before it are not its (``listed`` is set once they are known)."""
    before = compose_projects()
    listed.set()
    if before is None:
        return  # no daemon to ask
    seen = set(before)
    while True:
        now = compose_projects() or set()
        new = sorted(now - seen)
        if new:
            with listing.open("a") as f:
                f.writelines(f"{name}\n" for name in new)
            seen |= set(new)
        if stop.wait(every):
            return


def model_roles(given: str, model: str) -> tuple[list[str], dict[str, str]]:
    """``--model-role`` flags for Inspect, and each role's route (served / external)."""
    flags: list[str] = []
    routes: dict[str, str] = {}
    for part in given.replace(",", " ").split():
        name, eq, spec = part.partition("=")
        if not eq or not name or not spec:
            raise SystemExit(f"inspect_run: --model-roles: {part!r} is not NAME=MODEL")
        served = spec == "served"
        flags += ["--model-role", f"{name}={f'openai-api/local/{model}' if served else spec}"]
        routes[name] = "served" if served else f"external {spec}"
    return flags, routes


def many_samples(sample_id: str) -> bool:
    """The whole task (no id), a comma list or a glob: a cell of many samples."""
    return not sample_id or any(c in sample_id for c in ",*?[")


def _tokens(usages: Any) -> tuple[int, int]:
    prompt = completion = 0
    for usage in usages:
        # Inspect counts a prompt's cached part apart (cache read/write); the server's
        # prompt_tokens, which the gateway meters, include it
        prompt += (usage.input_tokens or 0) + (usage.input_tokens_cache_read or 0) + (
            usage.input_tokens_cache_write or 0)
        completion += usage.output_tokens or 0
    return prompt, completion


def summary_of(log_path: Path, model: str, resumed: Any = None,
               attempt: int = 1) -> dict[str, Any]:
    """What the autopilot's trust checks read, from Inspect's own log (its public API).
    After a resume, the tokens are this attempt's samples' only (the log's totals carry
    the reused samples' forward, which an earlier attempt's gateway metered)."""
    from inspect_ai.log import read_eval_log

    log = read_eval_log(str(log_path))
    # the scores as read here, for the grader (one import of Inspect per cell)
    from autopilot.harnesses.inspect_table import write_table

    write_table(log_path.parent.parent, log_path, log)
    samples = log.samples or []
    scorers = reuse.scored_by(log, resumed, attempt)
    if resumed is None:
        prompt, completion = _tokens((log.stats.model_usage or {}).values())
    else:
        own = [sample for sample in samples
               if scorers.get(reuse.sample_key(sample.id, sample.epoch)) == attempt]
        prompt, completion = _tokens(usage for sample in own
                                     for usage in (sample.model_usage or {}).values())
    errored = [sample.error for sample in samples if sample.error is not None]
    scored = [sample for sample in samples if sample.error is None and sample.scores]
    err = log.error.message if log.error else next((e.message for e in errored), None)
    # samples errored while others were scored: the grader's to count (SAMPLE_ERRORS
    # or, on the last try, errored samples), not an eval that could not run
    per_sample = bool(err) and bool(scored) and bool(errored)
    return {"model": model, "inspect_model": log.eval.model, "status": log.status,
            "error": err[:2000] if err else None, "log": log_path.name,
            "samples": len(samples), "samples_errored": len(errored),
            "samples_reused": sum(1 for k in scorers.values() if k != attempt),
            "total_prompt_tokens": prompt, "total_completion_tokens": completion,
            "finish_reason": "sample_errors" if per_sample else "error" if err else log.status,
            "scored_by": scorers}


@dataclass
class Plan:
    """The eval this attempt runs: afresh, or resuming an earlier attempt's samples."""
    cmd: list[str]  # the eval as recorded for a later attempt's reuse (inspect_resume)
    run: list[str]  # what is run now (``inspect eval``, or ``eval-retry`` of a resume)
    env: dict[str, str]
    routes: dict[str, str]
    many: bool
    resumed: Any = None  # inspect_resume.Resumed


def plan(args: argparse.Namespace, extra: list[str], logs: Path) -> Plan:
    """The eval's argv and environment, and the resume of an earlier attempt's log."""
    # the attempt's gateway key (OPENAI_API_KEY, as the autopilot sets it), or the
    # variable the preset names
    key = (os.environ.get(args.api_key_env, "") if args.api_key_env else "") \
        or os.environ.get("OPENAI_API_KEY", "")
    # Inspect's data and cache dirs (traces, its response cache, sandbox compose files)
    # in the cell's own dir: a replicate never reads another's cached answer, and the
    # hardened service (ProtectHome=yes, a read-only system) has no writable home.
    own = args.out / ".inspect"
    env = {**os.environ, "LOCAL_BASE_URL": args.base_url,
           "LOCAL_API_KEY": key or "unused",  # a local server needs none; the SDK needs one
           "XDG_DATA_HOME": str(own / "data"), "XDG_CACHE_HOME": str(own / "cache")}
    # Inspect's buffer is read here (a resume's recovery, the progress reader) as the
    # child writes it: the same data dir
    os.environ["XDG_DATA_HOME"] = env["XDG_DATA_HOME"]
    from autopilot.harnesses.inspect_check import registered, split_args, task_file

    target = args.task if registered(args.task) else f"{task_file(args.task_file)}@{args.task}"
    roles, routes = model_roles(args.model_roles, args.model)
    more = [*roles, *(x for given in args.inspect_args for x in split_args(given))]
    many = many_samples(args.sample_id)
    cmd = [sys.executable, "-m", "inspect_ai", "eval", target,
           "--model", f"openai-api/local/{args.model}", "--log-dir", str(logs),
           "--log-format", "eval", "--display", "plain",
           # the task's own epochs and reducers stand (pass@k, majority votes): a preset
           # that wants others says --epochs after "--"; inspect_grade reads the reducer's
           *(["--sample-id", args.sample_id] if args.sample_id else []),
           # in a cell of many samples, a sample's error is retried in the eval, that
           # sample alone (the others' finished work stands), before it fails the cell;
           # a one-sample cell is retried by the autopilot, its outage said as one
           *([f"--retry-on-error={args.sample_retries}"]
             if args.sample_retries > 0 and many else []),
           *more, *extra]
    # A sample still failing after those: before the last try, the others run on
    # (--continue-on-fail) and the cell is INVALID(sample_errors), its next attempt
    # re-running only what has no score; on the last try it counts as errored and the
    # others' scores stand. The user's own flags (later on the line) win.
    policy = (["--no-fail-on-error"] if args.last_try == "1" else ["--continue-on-fail"]
              ) if many else []
    # a one-sample cell has nothing to carry over: it is run afresh
    prior = reuse.prior_attempt(args.previous, args.attempt, cmd) if many else None
    resumed = reuse.resume(prior, args.out) if prior is not None else None
    reuse.write_cmd(args.out, cmd)
    if resumed is not None:
        run = reuse.retry_argv(sys.executable, resumed.log, logs, [*policy, *more, *extra])
        print(f"inspect_run: reusing {len(resumed.before)} finished sample(s) of attempt "
              f"{prior.attempt if prior else '?'}", flush=True)
    else:
        index = cmd.index("--log-dir")
        run = [*cmd[:index], *policy, *cmd[index:]]
    return Plan(cmd, run, env, routes, many, resumed)


def execute(args: argparse.Namespace, p: Plan, logs: Path) -> int:
    """Run the eval to its end, its progress and its sandboxes' projects watched."""
    print("inspect_run:", json.dumps(p.run), flush=True)
    stop = threading.Event()
    # The projects there before the eval are listed beside its start, not before it:
    # Inspect's import alone outlasts a `docker ps`, and a project that appeared in
    # between would count as another's (kept), never as this eval's (removed).
    watcher = None
    if args.compose_projects is not None and shutil.which("docker") is not None:
        watcher = threading.Thread(target=track, args=(args.compose_projects,
                                                       threading.Event(), stop), daemon=True)
        watcher.start()
    proc = subprocess.Popen(p.run, env=p.env)
    from autopilot.harnesses.inspect_progress import report

    reporter = threading.Thread(target=report, args=(logs, args.out / "progress.log",
                                                     proc.pid, stop), kwargs={
        "items": args.items if p.many and args.items else None,
        "reused": frozenset(p.resumed.before) if p.resumed is not None else frozenset()},
        daemon=True)
    reporter.start()
    try:
        return proc.wait()
    finally:
        stop.set()
        if watcher is not None:
            watcher.join(15)
        reporter.join(15)


def main(argv: list[str] | None = None) -> int:
    args, extra = parse(sys.argv[1:] if argv is None else argv)
    import importlib.util

    # found, not imported: the eval's own process imports Inspect (seconds of CPU), and
    # this one does so beside it (the progress reader), never before it starts
    if importlib.util.find_spec("inspect_ai") is None:
        print("inspect_run: inspect-ai is not installed (pip install "
              "'bench-autopilot[inspect]')", file=sys.stderr)
        return 2
    logs = args.out / "logs"
    logs.mkdir(parents=True, exist_ok=True)
    planned = plan(args, extra, logs)
    code = execute(args, planned, logs)
    resumed = planned.resumed
    log = newest_log(logs)
    if resumed is not None and log is not None and log != resumed.log:
        resumed.log.unlink(missing_ok=True)  # one log for the cell (its copy is evidence)
    if log is None or (resumed is not None and log == resumed.log):
        print(f"inspect_run: inspect exited {code} and wrote no log", file=sys.stderr)
        return code or 1
    summary = {**summary_of(log, args.model, resumed, args.attempt), "roles": planned.routes}
    if summary["status"] not in ("success", "error"):
        # A killed or cancelled eval: no result, however many samples it holds. Its
        # log stays for the next attempt, which recovers it and resumes the rest.
        if planned.many and args.items:
            from autopilot.harnesses.inspect_progress import final_items

            final_items(logs, args.items, frozenset(resumed.before) if resumed else frozenset())
        print(f"inspect_run: inspect eval interrupted (exit {code}): its log {log.name} "
              f"says {summary['status']!r}, not finished", flush=True)
        return INTERRUPTED
    reuse.write_reuse(args.out, summary.pop("scored_by"))
    if summary["error"] and summary["finish_reason"] == "error":
        # An eval Inspect could not finish (a sample that raised, a sandbox that did not
        # start, the model endpoint failing) is no result: no summary, a non-zero exit,
        # and Inspect's own words last (the autopilot quotes them with the INVALID).
        last = " ".join(str(summary["error"]).split())[:600]
        print(f"inspect_run: inspect eval {summary['status']}: {last}", flush=True)
        return 3
    tmp = args.out / ".summary.json.tmp"
    tmp.write_text(json.dumps(summary, indent=1))
    tmp.replace(args.out / "summary.json")  # written last: the completion artifact
    print(f"inspect_run: {summary['status']} ({log.name})", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
