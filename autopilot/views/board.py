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
    for d in dirs:
        d = d.absolute()
        if (d / "plan.json").is_file():
            out.append(d)
            continue
        found = sorted(p.parent for p in d.glob("*/plan.json"))
        if not found:
            raise ConfigError(f"board: {d}: no run here (no plan.json, and no entry dirs "
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
           "per_task": {t.id: t.grader_argv for t in preset.tasks if t.grader_argv}}
    return hashlib.sha256(json.dumps(doc, sort_keys=True).encode()).hexdigest()[:12]


def build(dirs: list[Path], allow_mixed: bool = False) -> dict[str, Any]:
    from autopilot.state.readers import load_recorded, record_problem
    from autopilot.views import report

    runs = []
    for d in expand(dirs):
        # A board is published: it reads only a run that recorded what it resolved, in
        # a state dir that passes the ownership checks (never a preset or environment
        # another user's plan.json chose).
        problem = record_problem(d)
        if problem:
            raise ConfigError(f"board: {problem}")
        preset, plan = load_recorded(d)
        facts = report.collect(preset, plan.target_n, d)
        runs.append((d, preset, plan, facts))
    tables = {str(d): [t.id for t in p.tasks] for d, p, _, _ in runs}
    graders = {str(d): grader_digest(p) for d, p, _, _ in runs}
    mixed = None
    if len({tuple(v) for v in tables.values()}) > 1 or len(set(graders.values())) > 1:
        what = []
        if len({tuple(v) for v in tables.values()}) > 1:
            what.append("task tables")
        if len(set(graders.values())) > 1:
            what.append("graders")
        if not allow_mixed:
            raise ConfigError(f"board: the runs' {' and '.join(what)} differ, so their rates "
                              "do not compare; pass --allow-mixed to build a marked board")
        mixed = {"tasks": tables, "graders": graders}
    all_tasks = list(dict.fromkeys(t for v in tables.values() for t in v))
    rows = []
    for d, preset, plan, facts in runs:
        for arm in preset.arms:
            mine = [f for f in facts if f.arm == arm.label]
            rows.append(_row(d, preset, arm.label, arm.model or preset.model, plan.target_n,
                             mine, all_tasks))
    board = {
        "schema_version": SCHEMA_VERSION,
        "runs": [{"dir": str(d), "preset": p.name, "model": p.model, "target_n": pl.target_n,
                  "tasks": tables[str(d)], "grader": graders[str(d)]}
                 for d, p, pl, _ in runs],
        "tasks": all_tasks, "mixed": mixed, "rows": rows,
    }
    # Every run's known secret values out of every form the board takes (json, md, html,
    # the terminal, a published commit).
    from autopilot.cell.childenv import secret_values
    from autopilot.logsetup import Redactor

    scrubbed: dict[str, Any] = Redactor(
        [v for _, p, _, _ in runs for v in secret_values(p)]).scrub(board)
    return scrubbed


def _row(d: Path, preset: Preset, arm: str, model: str, target_n: int, facts: list[Any],
         all_tasks: list[str]) -> dict[str, Any]:
    valid = [f for f in facts if f.valid]
    passes = sum(f.verdict == "PASS" for f in valid)
    w = stats.wilson(passes, len(valid))
    invalid = Counter(f.reason for f in facts if f.verdict == "INVALID" and not f.quarantined)
    per_task: dict[str, Any] = {}
    own = {t.id for t in preset.tasks}
    reached = []
    for task in all_tasks:
        if task not in own:
            per_task[task] = "not_applicable"
            continue
        tv = [f for f in valid if f.task == task]
        per_task[task] = {"pass": sum(f.verdict == "PASS" for f in tv), "valid": len(tv),
                          **_samples(tv)}
        reached.append(len(tv))
    usage = [f for f in facts if f.completion_tokens is not None]
    tokens = ({"prompt": sum(f.prompt_tokens or 0 for f in usage),
               "completion": sum(f.completion_tokens or 0 for f in usage)} if usage else None)
    cost: dict[str, Any] = {"usd": None, "basis": "unpriced"}
    if usage:
        cost = cost_doc(preset, arm, usage)
    cost["route"] = route_name(preset, arm)
    return {
        "model": model, "arm": arm, "preset": preset.name, "dir": str(d),
        "pass": passes, "valid": len(valid),
        "rate": round(passes / len(valid), 4) if valid else None,
        "wilson": [round(w[0], 4), round(w[1], 4)] if w else None,
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
    w = stats.wilson(tot["passed"], tot["scored"])
    return {"samples": {**tot, "rate": round(tot["passed"] / tot["scored"], 4)
                        if tot["scored"] else None,
                        "wilson": [round(w[0], 4), round(w[1], 4)] if w else None}}


def to_json(board: dict[str, Any]) -> str:
    return json.dumps(board, indent=1, sort_keys=False) + "\n"


def _cost(c: dict[str, Any]) -> str:
    if c.get("usd") is None:
        return "unpriced"
    return ("≥ " if c.get("basis") in ("floor", "partial") else "") + f"${c['usd']:.4f}"


def _bases(c: dict[str, Any]) -> str:
    got = c.get("bases") or {}
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
    for r in board["rows"]:
        ci = (f"{r['rate'] * 100:.0f}% [{r['wilson'][0] * 100:.0f}–{r['wilson'][1] * 100:.0f}]"
              if r["wilson"] else "-")
        inv = ", ".join(f"{md(k)} {v}" for k, v in r["invalid_by_reason"].items()) or "0"
        tok = f"{r['tokens']['prompt']}/{r['tokens']['completion']}" if r["tokens"] else "-"
        c = r["cost"]
        both = (f"{c['tokens_total']} / {c['tokens_fresh']}" if "tokens_total" in c else "-")
        out.append(f"| {md(r['model'])} | {md(r['arm'])} | {r['pass']}/{r['valid']} | {ci} | "
                   f"{r['n_reached']}/{r['target_n']} | {inv} | {r['quarantined']} | "
                   f"{r['teardown_masked']} | {md(c.get('route', '-'))} | {tok} | {both} | "
                   f"{_cost(c)} | {_bases(c)} |")
    out += ["", "## Per task (pass/valid)", ""]
    tasks = board["tasks"]
    out += ["| model | arm | " + " | ".join(md(t) for t in tasks) + " |",
            "|---|---|" + "---|" * len(tasks)]
    for r in board["rows"]:
        cells = [v if isinstance(v, str) else f"{v['pass']}/{v['valid']}"
                 for v in (r["tasks"][t] for t in tasks)]
        out.append(f"| {md(r['model'])} | {md(r['arm'])} | " + " | ".join(cells) + " |")
    many = [r for r in board["rows"] if r.get("samples")]
    if many:
        out += ["", "## Samples (cells that grade many items)", "",
                "| model | arm | passed/scored | rate [95% CI] | unscored | errored | reused |",
                "|---|---|---|---|---|---|---|"]
        for r in many:
            sm = r["samples"]
            ci = (f"{sm['rate'] * 100:.0f}% [{sm['wilson'][0] * 100:.0f}–"
                  f"{sm['wilson'][1] * 100:.0f}]" if sm["wilson"] else "-")
            out.append(f"| {md(r['model'])} | {md(r['arm'])} | {sm['passed']}/{sm['scored']} "
                       f"| {ci} | {sm['unscored']} | {sm['errored']} | {sm.get('reused', 0)} |")
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
