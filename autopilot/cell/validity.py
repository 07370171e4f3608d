"""Fail-closed validity classification: what is on disk + what happened -> a verdict.

Pure: the cell runner gathers plain data (exit code, watchdog kill, artifacts present,
the parsed grade, token counts, executed-vs-requested configuration) and this module
decides. PASS / FAIL only ever come from a well-formed grade whose verdict word the
preset recognises; everything else is INVALID with exactly one reason from
``config.INVALID_REASONS`` (origin doc 000: never a silent 0, never a silent pass).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, replace
from typing import Any, Literal

from autopilot.config import GRADE_REASONS, VerdictRule
from autopilot.state.cellevents import CellVerdict
from autopilot.state.items import items_of, progress_of

Verdict = Literal["PASS", "FAIL", "INVALID"]
Killed = Literal["stall", "deadline", "teardown"]
# Reasons that point at a broken harness or grader rather than at the model: a harness
# crash, an attempt without its completion artifacts, a grader that fails. (The verdict
# words that count too, e.g. MISSING_OUTPUT, are preset data: VerdictRule.streak.)
STREAK_REASONS = frozenset({"grader_failed", "malformed_grade", "missing_output",
                            "harness_crash", "malformed_summary", "unmetered"})


@dataclass(frozen=True)
class RunOutcome:
    """What happened to the harness process."""

    exit_code: int | None
    killed: Killed | None = None
    completion: bool = False
    endpoint_down: bool = False
    kill_reason: str | None = None
    # the endpoint was not configured for this cell's arm while it ran (arm settings)
    arm_mismatch: str | None = None
    # free space under the run's roots was below the floor while it ran (diskspace)
    disk_low: bool = False
    # the attempt's data path ended without recording the harness's end (why)
    datapath_lost: str | None = None
    # killed with one of its requests open at the endpoint (the gateway's in-flight
    # count): the model was working for it, answered or not
    working: bool = False
    # a harness of many items: how far it got, as it said (autopilot.cell.itemsprogress)
    finished: dict[str, int] | None = None


@dataclass(frozen=True)
class GradeOutcome:
    ok: bool  # grader ran and exited 0 within its timeout
    detail: str = ""
    grade: Any = None  # parsed grade file, None when missing or unparsable


@dataclass(frozen=True)
class Checks:
    """Accounting and configuration evidence, read from the harness's own files."""

    tokens: float | None = None  # None: not checked; NaN: missing
    tokens_checked: bool = False
    mismatches: tuple[str, ...] = ()
    finish_error: str | None = None  # the harness stopped on an endpoint error
    rate_limited: str | None = None  # the harness gave up on a throttling provider
    malformed: str | None = None  # a value of the wrong shape in the harness's files


@dataclass(frozen=True)
class Classification:
    verdict: Verdict
    reason: str | None = None
    word: str | None = None
    caveat: str | None = None
    teardown_masked: bool = False
    detail: str = ""
    extra: dict[str, Any] = field(default_factory=dict)
    streak: bool = False  # the verdict word counts towards the harness-break streak
    # the preset's rule says this word is never a harness break (``streak = false``)
    quiet: bool = False
    # When the process whose evidence decided this was launched (wall clock, so that
    # nodes of a cluster compare): the harness-break streak is counted in launch order
    # (autopilot.run.runbook.streak_step).
    launched: float | None = None
    # what a harness that grades many items scored (autopilot.state.items)
    items: dict[str, int] | None = None
    # an attempt cut before all its items were done: how far it got (INVALID(interrupted))
    finished: dict[str, int] | None = None

    def as_event(self, cell: str, attempt: int, *, regrade: bool = False) -> CellVerdict:
        """The verdict as the journal records it, the one form every writer of it (a
        run's recorder, ``autopilot regrade``) builds: its word, and ``items`` (a valid
        verdict's counts) or ``finished`` (how far an interrupted attempt got). What it
        spent is the recorder's to add: the gateway metered that, not the grader."""
        event = CellVerdict(cell=cell, attempt=attempt, verdict=self.verdict,
                            reason=self.reason, word=self.word, caveat=self.caveat,
                            teardown_masked=self.teardown_masked, detail=self.detail)
        said: dict[str, object] = {"ungraded": True} if self.grade_side else {}
        if regrade:
            said["regrade"] = True
        if self.finished and self.reason == "interrupted":
            said["finished"] = self.finished
        elif self.items and self.verdict in ("PASS", "FAIL"):
            said["items"] = self.items  # its samples are what is counted
        # (set, not defaulted: a record holds the fields that were said, and no others)
        return event.model_copy(update=said)

    @property
    def harness_break(self) -> bool:
        return not self.quiet and (self.streak or self.reason in STREAK_REASONS)

    @property
    def streak_kind(self) -> Literal["break", "healthy", "neutral"]:
        """What this says about the harness and grader: broken, working (a grade came
        back), or nothing (INVALID for infrastructure: a stall, the endpoint down)."""
        if self.harness_break:
            return "break"
        return "healthy" if self.verdict in ("PASS", "FAIL") else "neutral"

    @property
    def grade_side(self) -> bool:
        """INVALID because of grading alone: the harness's outputs stand."""
        return self.verdict == "INVALID" and self.reason in GRADE_REASONS

    def label(self) -> str:
        return self.verdict if self.verdict != "INVALID" else f"INVALID({self.reason})"


def _invalid(reason: str, detail: str, **fields: Any) -> Classification:
    return Classification("INVALID", reason=reason, detail=detail, **fields)


def classify(
    run: RunOutcome,
    grade: GradeOutcome | None,
    rules: Mapping[str, VerdictRule],
    checks: Checks = Checks(),
    verdict_field: str = "verdict",
) -> Classification:
    judged = _classify(run, grade, rules, checks, verdict_field)
    if run.disk_low and judged.verdict == "INVALID" and not judged.grade_side:
        # ENOSPC breaks a harness in any of these ways (a crash, a torn summary, no
        # outputs): with the disk below the run's floor, infrastructure, not the cell.
        return replace(judged, reason="disk_full", streak=False,
                       detail=f"free space below the run's floor during the attempt "
                              f"(would be {judged.reason}: {judged.detail})")
    return judged


def _interrupted(run: RunOutcome) -> Classification | None:
    """A cell of many items cut before all were done (its deadline, a stall, a kill, an
    eval that did not finish) is resumable work: the items it finished stand, and it
    is no more the model's FAIL than a power cut would be (autopilot.cell.itemsprogress)."""
    progress = progress_of(run.finished)
    if progress is None or progress.total < 2 or not progress.unfinished:
        return None
    if run.killed:
        why = run.kill_reason or f"{run.killed} kill"
    elif run.exit_code not in (0, None):
        why = f"exit code {run.exit_code}"
    else:
        why = "ended without its completion artifacts"
    return _invalid("interrupted", f"{why}; {progress.done} of {progress.total} samples finished "
                    f"({progress.new} by this attempt): the next attempt resumes the rest",
                    finished=progress.as_dict())


def _classify(
    run: RunOutcome,
    grade: GradeOutcome | None,
    rules: Mapping[str, VerdictRule],
    checks: Checks,
    verdict_field: str,
) -> Classification:
    masked = run.killed == "teardown"
    if run.datapath_lost:
        # Ours, not the cell's: the process that carried the attempt died under it.
        # Whatever the harness did next (it lost its gateway) says nothing of the model.
        return _invalid("datapath_lost", run.datapath_lost)
    if not run.completion:
        # An outage during the attempt is the cause of whatever followed (a cell starved
        # of tokens stalls): infrastructure, named as such, before the watchdog's verdict.
        if run.endpoint_down:
            why = f" ({run.killed} kill)" if run.killed else ""
            return _invalid("endpoint_down",
                            f"harness ended without outputs during an outage{why}")
        cut = _interrupted(run)
        if cut is not None:
            return cut
        if run.killed in ("stall", "deadline"):
            return _invalid(run.killed, run.kill_reason or run.killed)
        if run.killed == "teardown":
            return _invalid("missing_output", "said it was done, hung, and left no outputs")
        if run.exit_code not in (0, None):
            return _invalid("harness_crash", f"exit code {run.exit_code}, no completion artifacts")
        return _invalid("missing_output", "harness ended without its completion artifacts")
    if run.arm_mismatch:
        return _invalid("arm_mismatch", run.arm_mismatch, teardown_masked=masked)
    if checks.mismatches:
        return _invalid("arm_mismatch", "; ".join(checks.mismatches), teardown_masked=masked)
    if checks.malformed:
        return _invalid("malformed_summary", checks.malformed, teardown_masked=masked)
    if checks.rate_limited:  # before zero_tokens: throttled before its first token
        return _invalid("rate_limited", f"harness ended by the provider's rate limiting: "
                        f"{checks.rate_limited[:200]}", teardown_masked=masked)
    if checks.tokens_checked and not (checks.tokens and checks.tokens > 0):
        return _invalid("zero_tokens", "token accounting missing or zero", teardown_masked=masked)
    if checks.finish_error:
        return _invalid("api_error", f"harness stopped on an endpoint error: "
                        f"{checks.finish_error[:200]}", teardown_masked=masked)
    if grade is None or not grade.ok:
        detail = grade.detail if grade else "grader did not run"
        return _invalid("grader_failed", detail, teardown_masked=masked)
    doc = grade.grade
    if not isinstance(doc, Mapping):
        return _invalid("malformed_grade", grade.detail or "grade file missing or not a "
                        "JSON object", teardown_masked=masked)
    word = doc.get(verdict_field)
    if not isinstance(word, str) or not word:
        return _invalid("malformed_grade", f"no {verdict_field!r} in grade",
                        teardown_masked=masked)
    rule = rules.get(word)
    if rule is None:
        return _invalid("malformed_grade", f"unknown verdict word {word!r}", word=word,
                        teardown_masked=masked)
    if rule.verdict == "INVALID":
        assert rule.reason is not None
        said = doc.get("detail")  # the grader's own words (Inspect's error): untrusted text
        detail = f"grader said {word}" + (f": {said[:400]}" if isinstance(said, str) else "")
        if run.endpoint_down and rule.reason not in GRADE_REASONS:
            # the outage is the cause of whatever the harness then reported
            return _invalid("endpoint_down", f"{detail} (during an outage)", word=word,
                            teardown_masked=masked)
        return _invalid(rule.reason, detail, word=word, teardown_masked=masked,
                        streak=bool(rule.streak), quiet=rule.streak is False)
    found = items_of(doc.get("items"))
    return Classification(rule.verdict, word=word, caveat=rule.caveat, teardown_masked=masked,
                          streak=bool(rule.streak), items=found)


def unmetered(judged: Classification, requests: int, required: bool,
              unread: int = 0) -> Classification:
    """Under ``gateway.require_metering``, a verdict whose harness sent no request
    through the gateway rests on evidence we did not see (a harness with the endpoint's
    port hard-coded, a cached answer), and one with ``unread`` responses the gateway
    could not meter (encoded, too large, cut, of another shape) rests on spend nobody
    knows: INVALID(unmetered), a harness break."""
    if required and requests == 0 and judged.verdict in ("PASS", "FAIL"):
        return _invalid("unmetered", f"{judged.label()} from outputs of a harness that sent no "
                        "request through the gateway (gateway.require_metering)",
                        launched=judged.launched)
    if required and unread > 0 and judged.verdict in ("PASS", "FAIL"):
        return _invalid("unmetered", f"{judged.label()} with {unread} response(s) the gateway "
                        "could not meter (see the attempt's gateway log: unmetered; "
                        "gateway.require_metering)", launched=judged.launched)
    return judged


def served_as(judged: Classification, models: Mapping[str, int], expected: str) -> Classification:
    """The endpoint's own word on who answered (each response's ``model``, through the
    gateway) against the model the run serves: a harness's receipt says what it was
    told, so checking that alone is circular. Any response from another model makes the
    verdict INVALID(arm_mismatch); no word (a server that omits it) proves nothing."""
    others = sorted(model for model in models if model != expected)
    if others and judged.verdict in ("PASS", "FAIL"):
        return _invalid("arm_mismatch", f"{judged.label()} from responses of "
                        f"{', '.join(map(repr, others[:3]))} (the endpoint's own word, "
                        f"through the gateway), not the served {expected!r}",
                        launched=judged.launched)
    return judged


@dataclass(frozen=True)
class Evidence:
    """What the gateway saw of an attempt (its cell_metered totals)."""
    requests: int = 0
    answered: int = 0
    errors: Mapping[str, int] = field(default_factory=dict)
    first_error: str | None = None  # the kind of error the first request got, if any
    throttled_tail: int = 0  # the attempt's last requests, refused by a throttling provider


def evidence_of(record: Any) -> Evidence | None:
    """Evidence from a journaled ``cell_metered`` (shape-checked: the journal is a state
    file); None for anything else."""
    if not isinstance(record, Mapping):
        return None
    requests, answered = record.get("requests"), record.get("answered")
    errors = record.get("errors")
    if type(requests) is not int or type(answered) is not int or not isinstance(errors, Mapping):
        return None
    first = record.get("first_error")
    tail = record.get("throttled_tail")
    return Evidence(requests, answered, {str(k): v for k, v in errors.items() if type(v) is int},
                    first if isinstance(first, str) and first else None,
                    tail if type(tail) is int and tail >= 0 else 0)


def by_gateway(judged: Classification, run: RunOutcome, evidence: Evidence, *, unread: int,
               required: bool, policy: str) -> Classification:
    """A verdict as the gateway's evidence leaves it — the one chain the run and
    ``validate`` both apply: unmetered spend, then counting by evidence, then a
    provider that throttled the attempt to its end."""
    judged = unmetered(judged, evidence.requests, required, unread)
    return throttled_out(count_by_evidence(judged, run, evidence, policy), evidence)


def throttled_out(judged: Classification, evidence: Evidence | None) -> Classification:
    """A cell that did not pass while the provider was refusing its last requests (429,
    Anthropic's 529 ``overloaded_error``, Gemini's RESOURCE_EXHAUSTED), with none
    answered since, ended on the provider's capacity, not on the task: an agent CLI
    that gives up after its own retries leaves no deliverable, and that is no FAIL of
    the model. INVALID(rate_limited): re-run, no retry spent."""
    if evidence is None or evidence.throttled_tail < 1 or judged.verdict == "PASS" \
            or judged.grade_side:
        return judged
    if judged.verdict == "INVALID" and judged.reason == "rate_limited":
        return judged
    return _invalid("rate_limited", f"{judged.label()} after the provider refused the attempt's "
                    f"last {evidence.throttled_tail} request(s) as throttled (429/529), none "
                    "answered since", launched=judged.launched)


LOOP_KILLS = ("scroll loop", "runaway generation")  # the substance watchdog's reasons


def count_by_evidence(judged: Classification, run: RunOutcome, evidence: Evidence | None,
                      policy: str = "evidence") -> Classification:
    """Count like the benchmark counts. An INVALID attempt whose evidence points at the
    model is the model's FAIL, with a caveat: the endpoint answered (or had its request
    when the deadline came) and the cell ran out of time (``timed out``), looped
    (``looped``), or outgrew its context (``context exceeded``). It stays INVALID
    where the evidence points at the infrastructure: the endpoint down or failing, no
    request ever reaching it (zero work), a frozen harness with no request in flight
    (a stall), grading. A first request already over the served context is the
    preset's settings, not the model: INVALID(config). Without the gateway's evidence
    nothing changes."""
    if policy != "evidence" or evidence is None or judged.verdict != "INVALID" or judged.grade_side:
        return judged
    if judged.reason == "interrupted":  # resumable work, whatever was in flight at the cut
        return judged
    if run.endpoint_down or evidence.errors.get("endpoint_error") or evidence.requests == 0:
        return judged
    if evidence.first_error == "context_overflow":
        return _invalid("config", "the first request already exceeds the served context: "
                        "the endpoint's context is below what the harness asks for "
                        "(harness.max_context)", launched=judged.launched)
    why = ""
    if evidence.errors.get("context_overflow"):
        why = "context exceeded"
    elif judged.reason == "deadline" and (evidence.answered or run.working):
        # A first answer longer than the deadline is the model's too: the endpoint had
        # the request all along (the origin counts it so).
        why = "timed out"
    elif judged.reason == "stall" and evidence.answered and (run.kill_reason or "").startswith(
            LOOP_KILLS):
        why = "looped"
    if not why:
        return judged
    return Classification("FAIL", caveat=why, teardown_masked=judged.teardown_masked,
                          detail=f"{why}: {judged.detail}"[:600], launched=judged.launched,
                          extra={"was": judged.label()})


def counting_line(policy: str) -> str:
    """What --dry-run and the report say of the counting rule."""
    if policy == "invalid":
        return ("counting: invalid (a killed or broken attempt is INVALID and retried, "
                "whatever the model did)")
    return ("counting: evidence (through the gateway, a model that ran out of time, "
            "looped or outgrew its context is a FAIL with that caveat; the endpoint "
            "failing, no request reaching it, a frozen harness or grading stay INVALID; "
            "a first request over the served context is INVALID(config))")


def lookup(doc: Any, dotted: str) -> Any:
    """``a.b.c`` inside nested dicts; None when any step is missing."""
    cur = doc
    for part in dotted.split("."):
        if not isinstance(cur, Mapping) or part not in cur:
            return None
        cur = cur[part]
    return cur


def grader_unavailable(missing: list[str], masked: bool = False) -> Classification:
    """A task whose grader cannot run here (its declared requirements are missing)."""
    return _invalid("grader_unavailable", "grader needs " + ", ".join(missing),
                    teardown_masked=masked)


def attempt_outcomes(events: Iterable[Mapping[str, Any]]) -> dict[tuple[str, int], RunOutcome]:
    """What happened to each attempt's harness, from its journaled ``cell_exited`` /
    ``cell_ran`` (unknown fields of another version ignored, malformed ones skipped)."""
    out: dict[tuple[str, int], RunOutcome] = {}
    fields = set(RunOutcome.__dataclass_fields__)
    for record in events:
        if record.get("event") in ("cell_exited", "cell_ran") \
                and isinstance(record.get("outcome"), dict):
            known = {k: v for k, v in record["outcome"].items() if k in fields}
            try:
                out[(str(record.get("cell")), int(record.get("attempt", 0)))] = RunOutcome(**known)
            except (TypeError, ValueError):
                continue
    return out
