"""``autopilot board DIR...``: one board across runs (models) — board.json and board.md.

Any set of state dirs (a campaign dir stands for its entries) becomes one row per
(model, arm): pass over valid with a 95% Wilson interval, the N reached, valid / INVALID
by reason / quarantined / teardown-masked counts, tokens by bucket, and cost with its
price basis (autopilot.views.cost: ``buckets``, ``floor``, ``partial``, or ``unpriced``:
never $0) and the route its arm's requests took. A task a run does not
have is ``not_applicable``, not a fake 0/0. Runs whose task tables or graders differ are
refused (exit 2) unless ``--allow-mixed``, which records what differs.

Verdicts come from each run's own artifacts through the same fail-closed classification
as ``report`` (never from status.json). Output is deterministic (no timestamps).

board.json, schema_version 2:
  {"schema_version": 2, "runs": [{"dir", "preset", "model", "target_n", "tasks",
   "grader"}], "tasks": [...], "mixed": null | {"tasks": {...}, "graders": {...}},
   "rows": [{"model", "arm", "preset", "dir", "pass", "valid", "rate", "wilson": [lo, hi]
   | null, "target_n", "n_reached", "invalid_by_reason": {...}, "quarantined",
   "teardown_masked", "tokens": {"prompt", "completion"} | null,
   "cost": {"usd": float | null, "basis": "buckets" | "floor" | "partial" | "unpriced",
            "bases": {basis: cells}, "unpriced_buckets": [...], "tokens": {bucket: n},
            "tokens_total", "tokens_fresh", "route"},
   "tasks": {task: {"pass", "valid"} | "not_applicable"},
   "samples": absent | {"passed", "scored", "unscored", "errored", "reused"?, "rate",
   "wilson"}}]}
A row's ``samples`` (only where its cells grade many items: an Inspect task's
samples) counts those, its rate and interval over the scored ones; per task likewise.
"""

from __future__ import annotations

import hashlib
import json
from collections import Counter
from pathlib import Path
from typing import Any

from autopilot.config import Preset
from autopilot.errors import ConfigError
from autopilot.escape import md
from autopilot.state.items import ITEM_KINDS
from autopilot.views import stats
from autopilot.views.cost import cost_doc, route_name

SCHEMA_VERSION = 2


def expand(dirs: list[Path]) -> list[Path]:
    """State dirs of runs: a run's own dir, or every run dir inside a campaign dir."""
    out: list[Path] = []
    for run_dir in dirs:
        run_dir = run_dir.absolute()
        if (run_dir / "plan.json").is_file():
            out.append(run_dir)
            continue
        found = sorted(plan_file.parent for plan_file in run_dir.glob("*/plan.json"))
        if not found:
            raise ConfigError(f"board: {run_dir}: no run here (no plan.json, and no entry dirs "
                              "with one)")
        out += found
    return list(dict.fromkeys(out))


def grader_digest(preset: Preset) -> str:
    """What makes two runs' verdicts comparable: the grader and its verdict words."""
    doc = {"argv": preset.grader.argv, "field": preset.grader.verdict_field,
           # ``streak`` unset or false: the same verdicts (only whether a word alarms
           # differs), and the digest boards of earlier versions compare by
           "verdicts": {k: {**v.model_dump(mode="json"), "streak": bool(v.streak)}
                        for k, v in preset.grader.verdicts.items()},
           "per_task": {task.id: task.grader_argv for task in preset.tasks if task.grader_argv}}
    return hashlib.sha256(json.dumps(doc, sort_keys=True).encode()).hexdigest()[:12]


def build(dirs: list[Path], allow_mixed: bool = False) -> dict[str, Any]:
    from autopilot.state.readers import load_recorded, record_problem
    from autopilot.views import report

    runs = []
    for run_dir in expand(dirs):
        # A board is published: it reads only a run that recorded what it resolved, in
        # a state dir that passes the ownership checks (never a preset or environment
        # another user's plan.json chose).
        problem = record_problem(run_dir)
        if problem:
            raise ConfigError(f"board: {problem}")
        preset, plan = load_recorded(run_dir)
        facts = report.collect(preset, plan.target_n, run_dir)
        runs.append((run_dir, preset, plan, facts))
    tables = {str(run_dir): [task.id for task in run_preset.tasks]
              for run_dir, run_preset, _, _ in runs}
    graders = {str(run_dir): grader_digest(run_preset) for run_dir, run_preset, _, _ in runs}
    mixed = None
    what = [name for name, seen in (("task tables", {tuple(v) for v in tables.values()}),
                                    ("graders", set(graders.values()))) if len(seen) > 1]
    if what:
        if not allow_mixed:
            raise ConfigError(f"board: the runs' {' and '.join(what)} differ, so their rates "
                              "do not compare; pass --allow-mixed to build a marked board")
        mixed = {"tasks": tables, "graders": graders}
    all_tasks = list(dict.fromkeys(task for v in tables.values() for task in v))
    rows = []
    for run_dir, preset, plan, facts in runs:
        for arm in preset.arms:
            mine = [f for f in facts if f.arm == arm.label]
            rows.append(_row(run_dir, preset, arm.label, arm.model or preset.model, plan.target_n,
                             mine, all_tasks))
    board = {
        "schema_version": SCHEMA_VERSION,
        "runs": [{"dir": str(run_dir), "preset": run_preset.name, "model": run_preset.model,
                  "target_n": run_plan.target_n,
                  "tasks": tables[str(run_dir)], "grader": graders[str(run_dir)]}
                 for run_dir, run_preset, run_plan, _ in runs],
        "tasks": all_tasks, "mixed": mixed, "rows": rows,
    }
    # Every run's known secret values out of every form the board takes (json, md, html,
    # the terminal, a published commit).
    from autopilot.cell.childenv import secret_values
    from autopilot.logsetup import Redactor

    scrubbed: dict[str, Any] = Redactor(
        [v for _, run_preset, _, _ in runs for v in secret_values(run_preset)]).scrub(board)
    return scrubbed


def _row(run_dir: Path, preset: Preset, arm: str, model: str, target_n: int, facts: list[Any],
         all_tasks: list[str]) -> dict[str, Any]:
    valid = [f for f in facts if f.valid]
    passes = sum(f.verdict == "PASS" for f in valid)
    interval = stats.wilson(passes, len(valid))
    invalid = Counter(f.reason for f in facts if f.verdict == "INVALID" and not f.quarantined)
    per_task: dict[str, Any] = {}
    own = {spec.id for spec in preset.tasks}
    reached = []
    for task in all_tasks:
        if task not in own:
            per_task[task] = "not_applicable"
            continue
        task_valid = [f for f in valid if f.task == task]
        per_task[task] = {"pass": sum(f.verdict == "PASS" for f in task_valid),
                          "valid": len(task_valid),
                          **_samples(task_valid)}
        reached.append(len(task_valid))
    usage = [f for f in facts if f.completion_tokens is not None]
    tokens = ({"prompt": sum(f.prompt_tokens or 0 for f in usage),
               "completion": sum(f.completion_tokens or 0 for f in usage)} if usage else None)
    cost: dict[str, Any] = {"usd": None, "basis": "unpriced"}
    if usage:
        cost = cost_doc(preset, arm, usage)
    cost["route"] = route_name(preset, arm)
    return {
        "model": model, "arm": arm, "preset": preset.name, "dir": str(run_dir),
        "pass": passes, "valid": len(valid),
        "rate": round(passes / len(valid), 4) if valid else None,
        "wilson": [round(interval[0], 4), round(interval[1], 4)] if interval else None,
        "target_n": target_n, "n_reached": min(reached) if reached else 0,
        "invalid_by_reason": dict(sorted(invalid.items())),
        "quarantined": sum(f.quarantined for f in facts),
        "teardown_masked": sum(f.masked and f.valid for f in facts),
        "tokens": tokens, "cost": cost, "tasks": per_task, **_samples(valid),
    }


def _samples(valid: list[Any]) -> dict[str, Any]:
    """What valid cells that grade many items scored (nothing where none do)."""
    got = [f.items for f in valid if f.items]
    if not got:
        return {}
    tot = {k: sum(i.get(k, 0) for i in got) for k in ITEM_KINDS}
    if not tot["reused"]:
        del tot["reused"]
    interval = stats.wilson(tot["passed"], tot["scored"])
    return {"samples": {**tot, "rate": round(tot["passed"] / tot["scored"], 4)
                        if tot["scored"] else None,
                        "wilson": [round(interval[0], 4), round(interval[1], 4)]
                        if interval else None}}


def to_json(board: dict[str, Any]) -> str:
    return json.dumps(board, indent=1, sort_keys=False) + "\n"


def _interval(rate: float, bounds: list[float] | None) -> str:
    """A rate and its 95% Wilson interval, in percent."""
    if not bounds:
        return "-"
    return f"{rate * 100:.0f}% [{bounds[0] * 100:.0f}–{bounds[1] * 100:.0f}]"


def _cost(cost: dict[str, Any]) -> str:
    if cost.get("usd") is None:
        return "unpriced"
    return ("≥ " if cost.get("basis") in ("floor", "partial") else "") + f"${cost['usd']:.4f}"


def _bases(cost: dict[str, Any]) -> str:
    got = cost.get("bases") or {}
    return ", ".join(f"{md(k)} {v}" for k, v in got.items()) or "-"


def to_markdown(board: dict[str, Any]) -> str:
    """board.md: every value from a run escaped for markdown and HTML."""
    out = ["# Board", ""]
    if board["mixed"]:
        out += ["> **MIXED**: these runs' task tables or graders differ (built with "
                "`--allow-mixed`); rates do not compare across them. A task a run does not "
                "have is `not_applicable`.", ""]
    out += ["| model | arm | pass/valid | rate [95% CI] | N reached / target | invalid | "
            "quarantined | teardown-masked | route | tokens (in/out) | tokens cache-incl. / "
            "fresh | cost | price basis (cells) |",
            "|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for row in board["rows"]:
        interval = _interval(row["rate"], row["wilson"])
        inv = ", ".join(f"{md(k)} {v}" for k, v in row["invalid_by_reason"].items()) or "0"
        tok = f"{row['tokens']['prompt']}/{row['tokens']['completion']}" if row["tokens"] else "-"
        cost = row["cost"]
        both = (f"{cost['tokens_total']} / {cost['tokens_fresh']}" if "tokens_total" in cost
                else "-")
        out.append(f"| {md(row['model'])} | {md(row['arm'])} | {row['pass']}/{row['valid']} | "
                   f"{interval} | {row['n_reached']}/{row['target_n']} | {inv} | "
                   f"{row['quarantined']} | "
                   f"{row['teardown_masked']} | {md(cost.get('route', '-'))} | {tok} | {both} | "
                   f"{_cost(cost)} | {_bases(cost)} |")
    out += ["", "## Per task (pass/valid)", ""]
    tasks = board["tasks"]
    out += ["| model | arm | " + " | ".join(md(task) for task in tasks) + " |",
            "|---|---|" + "---|" * len(tasks)]
    for row in board["rows"]:
        cells = [v if isinstance(v, str) else f"{v['pass']}/{v['valid']}"
                 for v in (row["tasks"][task] for task in tasks)]
        out.append(f"| {md(row['model'])} | {md(row['arm'])} | " + " | ".join(cells) + " |")
    many = [row for row in board["rows"] if row.get("samples")]
    if many:
        out += ["", "## Samples (cells that grade many items)", "",
                "| model | arm | passed/scored | rate [95% CI] | unscored | errored | reused |",
                "|---|---|---|---|---|---|---|"]
        for row in many:
            samples = row["samples"]
            interval = _interval(samples["rate"], samples["wilson"])
            out.append(f"| {md(row['model'])} | {md(row['arm'])} | "
                       f"{samples['passed']}/{samples['scored']} | {interval} | "
                       f"{samples['unscored']} | {samples['errored']} | "
                       f"{samples.get('reused', 0)} |")
    out += ["", "Rates count valid cells only; INVALID, quarantined and teardown-masked "
            "cells are counted beside them, never hidden. Cost is priced per cell by "
            "token bucket from the preset's rate card: `buckets` where every bucket a "
            "cell used has a price, `floor` where one has none (a lower bound, marked ≥), "
            "`unpriced` where the model has no entry (never $0).", ""]
    return "\n".join(out)


def write(board: dict[str, Any], out_dir: Path) -> list[Path]:
    from autopilot.state.fsutil import atomic_write_text

    paths = [out_dir / "board.json", out_dir / "board.md"]
    atomic_write_text(paths[0], to_json(board))
    atomic_write_text(paths[1], to_markdown(board))
    return paths
