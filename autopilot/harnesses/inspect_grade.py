"""The verdict of one Inspect cell, from Inspect's own log (``inspect_ai.log``'s public
API, never its printed text): the sample's score under the task's scorer → PASS or FAIL
(``C``/``I``, booleans and numbers through Inspect's ``value_to_float``, infinities
included, at or above ``--threshold``); a sample Inspect left unscored (NaN) →
UNSCORED, never FAIL; a value Inspect cannot read as a number (it warns and counts 0)
→ UNREADABLE with the raw value; a dict score by its ``--score-key`` part; with the
task's own epochs, the score its reducer made (``log.reductions``; a task that reduces
several ways is decided by ``--reducer``). A log that is neither ``success`` nor
``error`` (a killed or cancelled eval) → INTERRUPTED. A cell of many samples (no
sample id: the whole task; a comma list; a glob) is graded sample by sample: its grade
carries their counts
(``items``, what every view counts) and PASS when the share that passed reaches
``--threshold``; samples an earlier attempt scored (``inspect-reuse.json``) are
counted as ``reused``, and ``scored_by`` says how many each attempt scored. Such a
cell whose eval ran on past samples that errored → SAMPLE_ERRORS (re-run, only those).
The log's status ``error``, or a sample error → ERROR with
Inspect's own message as the grade's ``detail`` (the preset maps those words to
INVALID).

Writes ``--grade-file`` (JSON): verdict, score, scorer, sample id, detail, log name.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from pathlib import Path
from typing import Any

from autopilot.harnesses.inspect_check import matches
from autopilot.harnesses.inspect_resume import newest_log
from autopilot.harnesses.inspect_run import many_samples
from autopilot.harnesses.inspect_table import Reading, read_table, read_value


def judge(log_path: Path, sample_id: str, scorer: str, threshold: float,
          score_key: str = "", scored_by: dict[str, int] | None = None,
          attempt: int = 0, reducer: str = "", log: Any = None) -> dict[str, Any]:
    """The grade of the log at ``log_path`` (``log``: as already read, when it was)."""
    if log is None:
        from inspect_ai.log import read_eval_log

        log = read_eval_log(str(log_path))
    out: dict[str, Any] = {"log": log_path.name, "sample_id": sample_id or None,
                           "status": log.status}
    samples = log.samples or []
    if (log.status == "error" and many_samples(sample_id)
            and any(sample.error for sample in samples)
            and any(sample.error is None and sample.scores for sample in samples)):
        # the eval ran on (--continue-on-fail) past samples that errored: not the
        # model's FAIL, and not yet counted as errored (the last try does that); the
        # next attempt re-runs only the samples without a score
        got = _many(log, sample_id, scorer, threshold, score_key, scored_by, attempt,
                    reducer)
        errored = got.get("items", {}).get("errored", 0)
        return {**out, **{k: v for k, v in got.items() if k != "score"},
                "verdict": "SAMPLE_ERRORS",
                "detail": f"{errored} sample(s) errored in Inspect: "
                          f"{got.get('detail') or ''}"[:1000]}
    if log.status == "error":
        why = log.error.message if log.error else "eval error"
        return {**out, "verdict": "ERROR", "detail": why[:1000]}
    if log.status != "success":
        # a log a killed or cancelled eval left (``started``, ``cancelled``): not a
        # finished eval, whatever samples it holds; its next attempt resumes it
        done = sum(1 for sample in samples if sample.error is None and sample.scores)
        return {**out, "verdict": "INTERRUPTED",
                "detail": f"the eval did not finish (its log says {log.status!r}; "
                          f"{done} sample(s) scored)"}
    if not many_samples(sample_id):
        samples = [sample for sample in log.samples or [] if matches(sample.id, sample_id)]
        if not samples:
            return {**out, "verdict": "NO_SAMPLE",
                    "detail": f"sample {sample_id!r} is not in the log"}
        got = _sample(log, samples, sample_id, scorer, threshold, score_key, reducer)
        got.pop("decided", None)
        return {**out, **got}
    return {**out, **_many(log, sample_id, scorer, threshold, score_key, scored_by, attempt,
                           reducer)}


def _many(log: Any, sample_id: str, scorer: str, threshold: float, score_key: str,
          scored_by: dict[str, int] | None = None, attempt: int = 0,
          reducer: str = "") -> dict[str, Any]:
    """A cell of many samples (the whole task, a list, a glob): each sample judged as
    one is, the cell's grade their counts (``items``: autopilot.state.items), its verdict
    PASS when the share of scored samples that passed is at or above ``threshold``."""
    wanted = [wanted_id.strip() for wanted_id in sample_id.split(",") if wanted_id.strip()]
    groups: dict[str, list[Any]] = {}
    for sample in log.samples or []:
        if not wanted or any(matches(sample.id, wanted_id) for wanted_id in wanted):
            groups.setdefault(str(sample.id), []).append(sample)  # one per epoch
    if not groups:
        return {"verdict": "NO_SAMPLE", "detail": f"no sample of {sample_id!r} in the log"}
    items = {"passed": 0, "scored": 0, "unscored": 0, "errored": 0, "reused": 0}
    problem: dict[str, Any] | None = None
    by_attempt: dict[str, int] = {}
    for sid, samples in groups.items():
        got = _sample(log, samples, sid, scorer, threshold, score_key, reducer)
        if scored_by and got["verdict"] != "ERROR":
            # the attempt that scored it (its last epoch's): inspect-reuse.json
            k = max(scored_by.get(f"{sample.id}#{sample.epoch}", attempt) for sample in samples)
            by_attempt[str(k)] = by_attempt.get(str(k), 0) + 1
            items["reused"] += 0 < k < attempt
        if got["verdict"] in ("PASS", "FAIL"):
            items["scored"] += 1
            items["passed"] += got["verdict"] == "PASS"
        elif got["verdict"] == "UNSCORED":
            items["unscored"] += 1
        elif got["verdict"] == "UNREADABLE" or got.pop("decided", True) is False:
            # a score Inspect cannot read, or the task's own setup (two reducers, a
            # dict score with no part named): never a count the verdict hides
            return {**got, "detail": f"sample {sid}: {got['detail']}"[:1000]}
        else:
            items["errored"] += 1
            problem = problem or {**got, "detail": f"sample {sid}: {got.get('detail', '')}"}
    if not items["reused"]:
        del items["reused"]
    out: dict[str, Any] = {"items": items, "samples": len(groups),
                           **({"scored_by": dict(sorted(by_attempt.items()))}
                              if items.get("reused") else {})}
    if items["scored"]:
        rate = items["passed"] / items["scored"]
        return {**out, "verdict": "PASS" if rate >= threshold else "FAIL",
                "score": round(rate, 6)}
    if problem is not None:
        return {**out, "verdict": problem["verdict"], "detail": problem["detail"][:1000]}
    return {**out, "verdict": "UNSCORED", "detail": "Inspect left every sample unscored"}


def _sample(log: Any, samples: list[Any], sample_id: str, scorer: str, threshold: float,
            score_key: str, reducer: str = "") -> dict[str, Any]:
    """One sample's verdict from its entries in the log (one per epoch)."""
    errors = [sample.error for sample in samples if sample.error is not None]
    if errors:
        return {"verdict": "ERROR", "detail": errors[0].message[:1000]}
    scores = samples[0].scores or {}
    name = scorer or next(iter(scores), "")
    if name not in scores:
        return {"verdict": "NO_SCORE",
                "detail": f"no score {name!r} (the sample has {sorted(scores)})"}
    epochs = len(samples)
    value, used = scores[name].value, None
    if epochs > 1:  # the task's own epochs: its reducer's score is the sample's
        reductions = [reduction for reduction in log.reductions or [] if reduction.scorer == name]
        names = [str(reduction.reducer or "mean") for reduction in reductions]
        if len(reductions) > 1 and reducer not in names:
            # Inspect reports each reducer's score side by side; which one is the
            # verdict is the preset's choice, never the first by accident
            return {"scorer": name, "verdict": "NO_SCORE", "decided": False,
                    "detail": f"score {name!r} is reduced {len(names)} ways "
                              f"({', '.join(names)}): set vars.reducer to the one that "
                              "decides" if not reducer else
                              f"score {name!r} has no reducer {reducer!r} (it has "
                              f"{', '.join(names)})"}
        for red in reductions:
            if len(reductions) == 1 or str(red.reducer or "mean") == reducer:
                got = next((scored for scored in red.samples
                            if matches(scored.sample_id, sample_id)), None)
                if got is not None:
                    value, used = got.value, red.reducer
                break
    out: dict[str, Any] = {"scorer": name, "epochs": epochs,
                           **({"reducer": used} if used else {})}
    if isinstance(value, dict):
        if not score_key or score_key not in value:
            parts = ", ".join(sorted(map(str, value)))
            return {**out, "verdict": "NO_SCORE", "decided": False,
                    "detail": f"score {name!r} has parts ({parts}): set vars.score_key to "
                              "the one that decides" if not score_key else
                              f"score {name!r} has no part {score_key!r} (it has {parts})"}
        value = value[score_key]
        out["score_key"] = score_key
    return {**out, **_decide(value, threshold)}


def _decide(value: Any, threshold: float) -> dict[str, Any]:
    """Inspect's own reading of a score value (``value_to_float``): every value it
    accepts is judged as it judges it, infinities included (written as null beside
    the raw value: JSON has no infinity); NaN is what Inspect leaves unscored (its
    metrics skip it): never a FAIL. A value Inspect cannot convert (it warns and counts
    0) is no score at all here: the raw value goes with the verdict. ``value``: as in
    the log, or as the wrapper's table read it already (a ``Reading``)."""
    got = value if isinstance(value, Reading) else read_value(value)
    raw, number = got.raw, got.number
    if got.unreadable:
        return {"verdict": "UNREADABLE", "score": None, "raw": raw,
                "detail": f"Inspect cannot read the score {raw!r} as a number (it would "
                          "count it as 0)"}
    if math.isnan(number):
        return {"verdict": "UNSCORED", "score": None, "raw": raw,
                "detail": "Inspect left this sample unscored (NaN)"}
    return {"verdict": "PASS" if number >= threshold else "FAIL",
            "score": number if math.isfinite(number) else None, "raw": raw}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="inspect_grade", description=__doc__.splitlines()[0])
    parser.add_argument("--out", required=True, type=Path, help="the cell's output dir")
    parser.add_argument("--grade-file", required=True, type=Path)
    parser.add_argument("--sample-id", default="")
    parser.add_argument("--scorer", default="", help="which score (default: the first)")
    parser.add_argument("--score-key", default="",
                        help="a score whose value is a dict: the part that decides")
    parser.add_argument("--threshold", type=float, default=1.0,
                        help="a score at or above it passes (C = 1, I = 0)")
    parser.add_argument("--attempt", type=int, default=0,
                        help="the attempt graded: samples an earlier one scored are `reused`")
    parser.add_argument("--reducer", default="",
                        help="a task whose epochs are reduced several ways: the reducer whose "
                         "score decides (preflight refuses such a task without one)")
    args = parser.parse_args(argv)
    log = newest_log(args.out / "logs")
    if log is None:
        grade: dict[str, Any] = {"verdict": "NO_LOG", "detail": "inspect wrote no log"}
    else:
        from autopilot.harnesses.inspect_resume import read_scored_by

        # the scores as the wrapper read them from this very log, when it did (one
        # import of Inspect per cell); else the log itself, through Inspect
        grade = judge(log, args.sample_id, args.scorer, args.threshold, args.score_key,
                      read_scored_by(args.out), args.attempt, args.reducer,
                      read_table(args.out, log))
    tmp = args.grade_file.with_name(args.grade_file.name + ".tmp")
    tmp.write_text(json.dumps(grade, indent=1, allow_nan=False))
    tmp.replace(args.grade_file)
    return 0


if __name__ == "__main__":
    sys.exit(main())
