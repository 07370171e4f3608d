"""Findings report, scorecard and per-arm summaries, from the per-cell artifacts.

Verdicts come from the same fail-closed classification as ``validate`` (what is on disk:
completion files, token and arm evidence, the grade file, plus the journal's record of
how each attempt ended) — never from status.json. Output is deterministic: fixed
ordering, no timestamps, so two reports over the same data are byte-identical.
Aggregates count valid cells only and always stand next to the trust counts.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from autopilot.cell.childenv import redactor
from autopilot.cell.validity import counting_line
from autopilot.config import INVALID_REASONS, Preset
from autopilot.escape import md, term
from autopilot.plan import Plan, cell_context
from autopilot.state.budget import METERED, count_or_none
from autopilot.state.cellevents import (
    CellAdopted,
    CellExited,
    CellStarted,
    CellVerdict,
)
from autopilot.state.fsutil import read_json
from autopilot.state.items import items_of
from autopilot.state.journal import state_events
from autopilot.state.ledger import VALID, CellState
from autopilot.state.tokens import Tokens, tokens_of
from autopilot.templates import render
from autopilot.views import stats
from autopilot.views.cost import tokens_section
from autopilot.views.energy import Energy, energy_lines, measure
from autopilot.views.runrecord import (
    endpoint_record,
    gateway_errors,
    isolation,
    plan_changes,
    recorded_pins,
)
from autopilot.views.samples import finished_by, per_attempt_line, samples_text
from autopilot.views.validate import validate_run


@dataclass
class CellFacts:
    id: str
    task: str
    arm: str
    n: int
    verdict: str  # PASS / FAIL / INVALID / ABSENT
    reason: str = ""
    masked: bool = False
    attempts: int = 0
    quarantined: bool = False
    finish_reason: str | None = None
    prompt_tokens: int | None = None
    completion_tokens: int | None = None
    caveat: str | None = None
    invalid_attempts: tuple[str, ...] = ()  # reasons of earlier INVALID attempts (journal)
    # whose word the tokens are: "metered" (the gateway's), "self_reported_mismatch"
    # (the gateway's, the harness's disagreeing), else the harness's summary
    cost_basis: str | None = None
    wall_secs: float | None = None  # the harness's run of the latest attempt (journal)
    joules: float | None = None  # GPU energy of all its attempts (power samples), if any
    items: dict[str, int] | None = None  # a many-item cell's counts (autopilot.state.items)
    by_bucket: Tokens | None = None  # the gateway's count by bucket, where it metered one
    # a many-item cell cut and resumed: the items each attempt finished itself
    per_attempt: tuple[int, ...] = ()

    @property
    def valid(self) -> bool:
        return self.verdict in ("PASS", "FAIL")

    @property
    def tokens(self) -> Tokens | None:
        """Its tokens by bucket: the gateway's split, else the two counts it has (all
        input taken as fresh: nothing says what a cache held)."""
        if self.by_bucket is not None:
            return self.by_bucket
        if self.completion_tokens is None:
            return None
        return Tokens(input=self.prompt_tokens or 0, output=self.completion_tokens)


def collect(preset: Preset, target_n: int, state_dir: Path,
            energy: Energy | None = None) -> list[CellFacts]:
    """Every planned cell's facts; ``energy``: the run's, when the caller measured it."""
    plan = Plan(preset, target_n)
    # A key a harness printed into its outputs is redacted before it is escaped or cut
    # (escaping changes its characters; a cut keeps half of it).
    scrub = redactor(preset).scrub
    checks = {check.cell: check for check in validate_run(preset, plan, state_dir).cells}
    masked: dict[str, bool] = {}
    attempts: Counter[str] = Counter()
    invalid: dict[str, list[str]] = {}
    metered: dict[str, tuple[str, int, int]] = {}  # the gateway's count, where it is used
    buckets: dict[str, Tokens] = {}
    wall: dict[str, float | None] = {}
    items: dict[str, dict[str, int] | None] = {}
    per_attempt: dict[str, list[int]] = {}
    for event in state_events(state_dir).typed():
        if isinstance(event, CellStarted):
            attempts[event.cell] += 1
        elif isinstance(event, CellExited | CellAdopted):
            wall[event.cell] = count_or_none(event.elapsed_secs)
        elif isinstance(event, CellVerdict):
            cid = event.cell
            masked[cid] = event.teardown_masked
            items[cid] = items_of(event.items) if event.verdict in VALID else None
            finished = finished_by(event.reason, event.finished, items[cid], event.regrade)
            if finished is not None:
                per_attempt.setdefault(cid, []).append(finished)
            spend, basis = event.spend, event.cost_basis
            if basis in METERED and isinstance(spend, list) \
                    and len(spend) == 2 and all(_int(part) is not None for part in spend):
                metered[cid] = (str(basis), int(spend[0]), int(spend[1]))
                split = tokens_of(event.tokens)  # journaled where the metered count is the spend
                if split is not None and not split.empty:
                    buckets[cid] = split
                else:
                    buckets.pop(cid, None)
            elif not event.regrade:
                metered.pop(cid, None)
                buckets.pop(cid, None)
            if event.verdict == "INVALID":
                reason = event.reason  # a word of ours, unless the journal was forged
                invalid.setdefault(cid, []).append(
                    reason if reason in INVALID_REASONS else md(scrub(reason), 40))
    energy = energy or measure(preset, state_dir)
    facts = []
    for cell in plan.cells:
        chk = checks[cell.id]
        ctx = cell_context(preset, cell, 1, state_dir)
        summary = read_json(Path(render(preset.harness.summary, ctx)))
        summary = summary if isinstance(summary, dict) else {}
        grade = read_json(Path(ctx["grade_file"]))
        word = grade.get(preset.grader.verdict_field) if isinstance(grade, dict) else None
        rule = preset.grader.verdicts.get(str(word)) if word else None
        facts.append(CellFacts(
            id=cell.id, task=cell.task, arm=cell.arm, n=cell.n,
            # PENDING (abandoned, interrupted): no verdict yet, like a cell never run.
            verdict="INVALID" if chk.reason == "quarantined" else (
                "ABSENT" if chk.verdict == "PENDING" else chk.verdict),
            reason=chk.reason, masked=masked.get(cell.id, False) and chk.verdict != "ABSENT",
            attempts=attempts[cell.id], quarantined=chk.reason == "quarantined",
            finish_reason=_text(scrub(summary.get("finish_reason"))),
            prompt_tokens=metered[cell.id][1] if cell.id in metered else
            _int(summary.get("total_prompt_tokens")),
            completion_tokens=metered[cell.id][2] if cell.id in metered else
            _int(summary.get("total_completion_tokens")),
            caveat=rule.caveat if rule else chk.caveat,
            invalid_attempts=tuple(invalid.get(cell.id, [])),
            cost_basis=metered[cell.id][0] if cell.id in metered else None,
            wall_secs=wall.get(cell.id),
            joules=energy.joules.get(cell.id) if energy and energy.ran.get(cell.id) else None,
            items=items.get(cell.id) if chk.verdict in VALID else None,
            by_bucket=buckets.get(cell.id),
            per_attempt=tuple(per_attempt.get(cell.id, ())),
        ))
    return facts


def facts_from_cells(cells: list[CellState]) -> list[CellFacts]:
    """Facts from the ledger's cell states (verdict, masking, attempts; no artifacts)."""
    out = []
    for cell in cells:
        verdict = cell.status if cell.status in ("PASS", "FAIL") else (
            "INVALID" if cell.status in ("invalid", "quarantined", "ungraded") else "ABSENT")
        out.append(CellFacts(
            id=cell.id, task=cell.task, arm=cell.arm, n=cell.n, verdict=verdict,
            reason=cell.reason or "",
            masked=cell.teardown_masked, attempts=cell.attempts,
            quarantined=cell.status == "quarantined", invalid_attempts=tuple(cell.reasons)))
    return out


def _int(v: Any) -> int | None:
    """A count from a harness's summary, if it is one (Infinity, NaN, a string: None)."""
    count = count_or_none(v)
    return None if count is None else int(count)


def _text(v: Any) -> str | None:
    """A harness's word (finish_reason), markdown-safe; None unless it is a string."""
    return md(v, 60) if isinstance(v, str) and v else None


# ------------------------------------------------------------------ shared pieces


def _by(facts: list[CellFacts], arm: str, task: str | None = None) -> list[CellFacts]:
    return [f for f in facts if f.arm == arm and (task is None or f.task == task)]


def _score(facts: list[CellFacts]) -> tuple[int, int]:
    valid = [f for f in facts if f.valid]
    return sum(f.verdict == "PASS" for f in valid), len(valid)


def _samples(facts: list[CellFacts]) -> str:
    return samples_text([f.items for f in facts if f.valid])


def _pct(passes: int, valid: int) -> str:
    return f"{100 * passes / valid:.0f}%" if valid else "-"


def _delta(preset: Preset, arm: str, task: str | None, passes: int, valid: int) -> str:
    baseline = preset.baseline
    if baseline is None or baseline.arm != arm or not valid:
        return ""
    if task is None:
        base_p, base_n = sum(baseline.passes.values()), baseline.n * len(baseline.passes)
    elif task in baseline.passes:
        base_p, base_n = baseline.passes[task], baseline.n
    else:
        return ""
    return f"{(passes / valid - base_p / base_n) * 100:+.0f}pp"


def _matrix(facts: list[CellFacts], arm: str) -> dict[str, dict[int, str]]:
    out: dict[str, dict[int, str]] = {}
    for f in _by(facts, arm):
        out.setdefault(f.task, {})[f.n] = f.verdict
    return out


def trust_block(facts: list[CellFacts]) -> dict[str, Any]:
    reasons = Counter(f.reason for f in facts if f.verdict == "INVALID" and not f.quarantined)
    attempts = Counter(reason for f in facts for reason in f.invalid_attempts)
    return {
        "invalid_attempts_by_reason": dict(sorted(attempts.items())),
        "valid": sum(f.valid for f in facts),
        "invalid": sum(f.verdict == "INVALID" and not f.quarantined for f in facts),
        "invalid_by_reason": dict(sorted(reasons.items())),
        "quarantined": sum(f.quarantined for f in facts),
        "teardown_masked": sum(f.masked and f.valid for f in facts),
        "retried": sum(f.attempts > 1 for f in facts),
        "absent": sum(f.verdict == "ABSENT" for f in facts),
        "metered": sum(f.valid and f.cost_basis is not None for f in facts),
        "cost_mismatch": sum(f.valid and f.cost_basis == "self_reported_mismatch"
                             for f in facts),
    }


def _trust_line(trust: dict[str, Any]) -> str:
    reasons = ", ".join(f"{k} {v}" for k, v in trust["invalid_by_reason"].items())
    said = f" ({reasons})" if reasons else ""
    return (f"valid {trust['valid']} · invalid {trust['invalid']}{said}"
            f" · quarantined {trust['quarantined']} · teardown-masked {trust['teardown_masked']}"
            f" · retried {trust['retried']} · not run {trust['absent']}")


def _attempts_line(trust: dict[str, Any]) -> str:
    by_reason = trust["invalid_attempts_by_reason"]
    return ", ".join(f"{k} {v}" for k, v in by_reason.items()) or "none"


# ------------------------------------------------------------------ scorecard


def scorecard(preset: Preset, facts: list[CellFacts], target_n: int) -> str:
    lines = [f"# Scorecard — {md(preset.name)} ({md(preset.model)}), N={target_n}", ""]
    arms = [arm_spec.label for arm_spec in preset.arms]
    head = "| task | " + " | ".join(arms) + " |"
    lines += [head, "|---|" + "---|" * len(arms)]
    for task in preset.tasks:
        row = []
        for arm in arms:
            passes, valid = _score(_by(facts, arm, task.id))
            delta = _delta(preset, arm, task.id, passes, valid)
            row.append(f"{passes}/{valid}" + (f" ({delta})" if delta else "")
                       + _samples(_by(facts, arm, task.id)))
        lines.append(f"| {task.id} | " + " | ".join(row) + " |")
    totals = []
    for arm in arms:
        passes, valid = _score(_by(facts, arm))
        delta = _delta(preset, arm, None, passes, valid)
        totals.append(f"**{passes}/{valid}**" + (f" ({delta})" if delta else "")
                      + _samples(_by(facts, arm)))
    lines.append("| **total** | " + " | ".join(totals) + " |")
    lines.append("")
    if preset.baseline:
        baseline = preset.baseline
        lines.append(f"Δ vs baseline: arm {baseline.arm} at N={baseline.n} "
                     f"({sum(baseline.passes.values())}/{baseline.n * len(baseline.passes)}), "
                     "in percentage points "
                     "of pass rate over valid cells.")
    lines.append(f"Trust: {_trust_line(trust_block(facts))}.")
    return "\n".join(lines) + "\n"


def arm_summary(preset: Preset, facts: list[CellFacts], arm: str) -> str:
    """The origin's per-arm PASS/FAIL table (summary-<arm>.txt)."""
    mine = _by(facts, arm)
    replicates = max((f.n for f in mine), default=0)
    width = max(len(task.id) for task in preset.tasks)
    cols = " ".join(f"v{i:<4}" for i in range(1, replicates + 1))
    lines = [f"{arm}  ({term(preset.model)}, N={replicates})",
             f"{'task':<{width}}  {cols}  pass/valid"]
    for task in preset.tasks:
        row = {f.n: f for f in _by(facts, arm, task.id)}
        cells = []
        for i in range(1, replicates + 1):
            f = row.get(i)
            word = "-" if f is None or f.verdict == "ABSENT" else (
                "Q" if f.quarantined else f.verdict if f.valid else "INV")
            cells.append(f"{word + ('*' if f and f.masked and f.valid else ''):<5}")
        passes, valid = _score(list(row.values()))
        lines.append(f"{task.id:<{width}}  " + " ".join(cells) + f"  {passes}/{valid}")
    passes, valid = _score(mine)
    lines.append(f"{'total':<{width}}  " + " " * (6 * replicates) + f"{passes}/{valid}")
    lines.append(f"trust: {_trust_line(trust_block(mine))}")
    return "\n".join(lines) + "\n"


# ------------------------------------------------------------------ findings


def findings(preset: Preset, facts: list[CellFacts], target_n: int,
             changes: list[tuple[str, str, str]] | None = None,
             pins: tuple[list[tuple[str, str]], list[tuple[str, str]]] = ([], []),
             errors: dict[str, int] | None = None,
             endpoint: list[str] | None = None, energy: list[str] | None = None,
             who: list[str] | None = None) -> str:
    arms = [arm_spec.label for arm_spec in preset.arms]
    trust = trust_block(facts)
    # The record is a state file: its free-text words escaped for markdown (the ids are
    # plain names by their grammar).
    out = [f"# Findings — {md(preset.name)} ({md(preset.model)}), N={target_n}", ""]
    for when, old, new in changes or []:
        out += [f"> **PLAN CHANGED** at {when}: identity {old} → {new} (resumed with "
                "`--allow-plan-change`); verdicts recorded before it were judged under the "
                "old plan and are counted under this one.", ""]
    for when, files in pins[1]:
        out += [f"> **BENCHMARK CHANGED** at {when}: {files} (resumed with "
                "`--allow-plan-change`); earlier verdicts were measured with the old files.",
                ""]
    total = len(facts)
    if trust["absent"] or any(not f.valid and not f.quarantined and f.verdict != "INVALID"
                          for f in facts):
        out += [f"> **PARTIAL**: {total - trust['absent']} of {total} cells up to "
                f"v{target_n} have run; "
                "figures cover what exists.", ""]
    out += [f"Trust: {_trust_line(trust)}. Rates count valid cells only.", ""]

    out += ["## 1. Scorecard", ""]
    # The scorecard's own trust line is the header's, said once above.
    out += [line for line in scorecard(preset, facts, target_n).splitlines()[2:]
            if not line.startswith("Trust: ")]
    out.append("")

    out += _trend_section(facts, arms, target_n)
    out += _arms_section(preset, facts, arms)
    out += _finish_section(preset, facts, arms)
    out += _trust_section(preset, facts, trust, errors, who)

    out += ["## 6. Tokens and cost", ""]
    out += tokens_section(preset, facts, arms)
    if energy:
        out += [*energy, ""]

    out += ["## 7. Reference comparators", ""]
    out += _comparators(preset, facts, arms)
    section = 8  # numbered as they appear: no gap where a run has no pins
    if pins[0]:
        out += ["", f"## {section}. Benchmark files (sha256, pinned at the run's first "
                "launch)", ""]
        out += [f"- `{digest[:23]}` {name}" for name, digest in pins[0]]
        section += 1
    if endpoint:
        out += ["", f"## {section}. What served the model (the latest launch)", "",
                *endpoint]
    return "\n".join(out).rstrip() + "\n"


def _trend_section(facts: list[CellFacts], arms: list[str], target_n: int) -> list[str]:
    """Section 2: the cumulative pass rate over v1..k, per arm and task."""
    out: list[str] = []
    out += ["## 2. What N reveals", "",
            "Cumulative pass rate over v1..k. A task is flagged when its smallest-window rate "
            f"differs from its full-N rate by {stats.MISLEADING_DELTA * 100:.0f} points or more.",
            ""]
    for arm in arms:
        rows = stats.trend(_matrix(facts, arm), target_n)
        wins = list(rows[0].windows) if rows else []
        out += [f"### {arm}", "", "| task | " + " | ".join(f"v1-{window}" for window in wins)
                + " | note |",
                "|---|" + "---|" * (len(wins) + 1)]
        for row in rows:
            cells = [f"{passes}/{valid} ({_pct(passes, valid)})"
                     for passes, valid in (row.windows[window] for window in wins)]
            out.append(f"| {row.task} | " + " | ".join(cells) +
                       (" | misleading at small N |" if row.misleading else " | |"))
        flagged = [row.task for row in rows if row.misleading]
        out += ["", f"Misleading at small N: {', '.join(flagged) or 'none'}.", ""]
    return out


def _arms_section(preset: Preset, facts: list[CellFacts], arms: list[str]) -> list[str]:
    """Section 3: each arm against the first, per task."""
    out: list[str] = []
    out += ["## 3. Arm vs arm", ""]
    if len(arms) < 2:
        out += ["One arm only: nothing to compare.", ""]
    else:
        out += ["Each arm against the first one, per task: pass rates with 95% Wilson "
                "intervals and the two-sided p-value of Fisher's exact test on the 2x2 table "
                "of passes and fails (valid cells only). With p >= 0.05 the difference is "
                "reported as not significant: N does not carry a claim.", ""]
        ref = arms[0]
        for other in arms[1:]:
            out += [f"### {other} vs {ref}", "",
                    f"| task | {ref} | {other} | Δ | Fisher p | note |",
                    "|---|---|---|---|---|---|"]
            for task in [task_spec.id for task_spec in preset.tasks] + [None]:
                a_p, a_v = _score(_by(facts, ref, task))
                b_p, b_v = _score(_by(facts, other, task))
                if not a_v or not b_v:
                    delta, p_txt, verdict = "-", "-", "no data"
                else:
                    delta = f"{(b_p / b_v - a_p / a_v) * 100:+.0f}pp"
                    p_value = stats.fisher_exact(b_p, b_v - b_p, a_p, a_v - a_p)
                    p_txt = f"{p_value:.3f}"
                    verdict = "significant" if p_value < 0.05 else "not significant"
                name = task or "**total**"
                out.append(f"| {name} | {_wilson_txt(a_p, a_v)} | {_wilson_txt(b_p, b_v)} | "
                           f"{delta} | {p_txt} | {verdict} |")
            out.append("")
    return out


def _finish_section(preset: Preset, facts: list[CellFacts], arms: list[str]) -> list[str]:
    """Section 4: finish reasons per arm and task."""
    out: list[str] = []
    out += ["## 4. Finish-reason audit", "", "From each cell's summary file (cells that "
            "have one).", ""]
    reasons = sorted({f.finish_reason for f in facts if f.finish_reason})
    out += ["| arm | task | " + " | ".join(reasons) + " |", "|---|---|" + "---|" * len(reasons)]
    for arm in arms:
        for task in [task_spec.id for task_spec in preset.tasks]:
            finishes = Counter(f.finish_reason for f in _by(facts, arm, task) if f.finish_reason)
            if finishes:
                out.append(f"| {arm} | {task} | " + " | ".join(str(finishes.get(reason, 0))
                                                              for reason in reasons) + " |")
    out.append("")
    return out


def _trust_section(preset: Preset, facts: list[CellFacts], trust: dict[str, Any],
                   errors: dict[str, int] | None, who: list[str] | None) -> list[str]:
    """Section 5: what counts, what was excluded, and why."""
    out: list[str] = []
    out += ["## 5. Trust", "", f"- valid cells: {trust['valid']}",
            f"- invalid cells: {trust['invalid']}"]
    out += [f"  - {k}: {v}" for k, v in trust["invalid_by_reason"].items()]
    out += [f"- quarantined cells: {trust['quarantined']}",
            f"- teardown-masked cells (valid, killed after finishing, scored from outputs): "
            f"{trust['teardown_masked']}",
            f"- retried cells: {trust['retried']} (INVALID attempts by reason: "
            f"{_attempts_line(trust)})", *per_attempt_line([(f.id, f.per_attempt) for f in facts]),
            f"- cells not run: {trust['absent']}",
            f"- {counting_line(preset.trust.count)}",
            "- model requests that failed, by kind (the gateway's record, every attempt): "
            + (", ".join(f"{k} {v}" for k, v in errors.items()) if errors else "none"),
            f"- tokens metered by the gateway: {trust['metered']} of {trust['valid']} valid cells"
            + (f"; the harness's own count disagrees on {trust['cost_mismatch']} (the "
               "gateway's is used)" if trust["cost_mismatch"] else ""),
            *(who or []), ""]
    excluded = [f for f in facts if f.verdict == "INVALID"]
    if excluded:
        out += ["Excluded from every aggregate:", ""]
        for f in excluded:
            if f.quarantined:
                history = ", ".join(f"{reason} {count}" for reason, count in sorted(
                    Counter(f.invalid_attempts).items()))
                out.append(f"- {f.id}: quarantined after {len(f.invalid_attempts)} INVALID "
                           f"attempts ({history or 'reasons not journaled'})")
            else:
                out.append(f"- {f.id}: INVALID({f.reason})")
        out.append("")
    caveats = Counter(f.caveat for f in facts if f.caveat)
    if caveats:
        out += ["Caveats from the verdict words: " + ", ".join(
            f"{k} ({v} cells)" for k, v in sorted(caveats.items())) + ".", ""]
    return out


def _wilson_txt(passes: int, valid: int) -> str:
    interval = stats.wilson(passes, valid)
    if interval is None:
        return "-"
    low, high = interval
    return f"{passes}/{valid} {_pct(passes, valid)} [{low * 100:.0f}–{high * 100:.0f}]"


FAMILY_BAR = 2 / 3  # a task family "passes" at >= 2/3 of its valid replicates (the origin's)


def _comparators(preset: Preset, facts: list[CellFacts], arms: list[str]) -> list[str]:
    """Other models' published results beside this run's, each in its own unit: passes of
    the cells run, and task families at >= 2/3. This run's figures are computed in both
    units, so every comparison is like with like."""
    if not preset.comparators:
        return ["No comparators in this preset."]
    out = ["| model | passes | task families at >= 2/3 | source |", "|---|---|---|---|"]
    for name, comparator in sorted(preset.comparators.items()):
        passes = f"{comparator.passes}/{comparator.of}" if comparator.passes is not None else "-"
        fams = (f"{comparator.families}/{comparator.families_of}"
                if comparator.families is not None else "-")
        out.append(f"| {md(name, 60)} | {passes} | {fams} | {md(comparator.source, 120) or '-'} |")
    tasks = list(dict.fromkeys(f.task for f in facts))
    for arm in arms:
        mine = _by(facts, arm)
        run_passes, run_valid = _score(mine)
        scores = [_score([f for f in mine if f.task == task]) for task in tasks]
        held = sum(1 for task_passes, task_valid in scores
                   if task_valid and task_passes >= FAMILY_BAR * task_valid)
        out.append(f"| **this run: {arm}** | {run_passes}/{run_valid} valid "
                   f"({len(mine)} planned) | "
                   f"{held}/{len(tasks)} | this report |")
    return out


def render_findings(preset: Preset, target_n: int, state_dir: Path) -> str:
    energy = measure(preset, state_dir)  # once: the per-task medians and the table
    text = findings(preset, collect(preset, target_n, state_dir, energy), target_n,
                    plan_changes(state_dir), recorded_pins(state_dir),
                    gateway_errors(state_dir), endpoint_record(state_dir),
                    energy_lines(preset, energy,
                                 {cell.id: cell.arm for cell in Plan(preset, target_n).cells}),
                    isolation(state_dir))
    return str(redactor(preset).scrub(text))
