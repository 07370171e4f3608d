"""The verdict of one Inspect cell, from Inspect's own log (``inspect_ai.log``'s public
API, never its printed text): the sample's score under the task's scorer → PASS or FAIL
(``C``/``I``, booleans and numbers through Inspect's ``value_to_float``, at or above
``--threshold``); a sample Inspect left unscored (NaN) → UNSCORED, never FAIL; a dict
score by its ``--score-key`` part; with the task's own epochs, the score its reducer
made (``log.reductions``). A cell of many samples (no sample id: the whole task; a
comma list; a glob) is graded sample by sample: its grade carries their counts
(``items``, what every view counts) and PASS when the share that passed reaches
``--threshold``; samples an earlier attempt scored (``inspect-reuse.json``) are
counted as ``reused``, and ``scored_by`` says how many each attempt scored. Such a
cell whose eval ran on past samples that errored → SAMPLE_ERRORS (re-run, only those).
The log's status ``error`` or ``cancelled``, or a sample error → ERROR / CANCELLED with
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


def judge(log_path: Path, sample_id: str, scorer: str, threshold: float,
          score_key: str = "", scored_by: dict[str, int] | None = None,
          attempt: int = 0) -> dict[str, Any]:
    from inspect_ai.log import read_eval_log

    log = read_eval_log(str(log_path))
    out: dict[str, Any] = {"log": log_path.name, "sample_id": sample_id or None,
                           "status": log.status}
    samples = log.samples or []
    if (log.status == "error" and many_samples(sample_id) and any(s.error for s in samples)
            and any(s.error is None and s.scores for s in samples)):
        # the eval ran on (--continue-on-fail) past samples that errored: not the
        # model's FAIL, and not yet counted as errored (the last try does that); the
        # next attempt re-runs only the samples without a score
        got = _many(log, sample_id, scorer, threshold, score_key, scored_by, attempt)
        n = got.get("items", {}).get("errored", 0)
        return {**out, **{k: v for k, v in got.items() if k != "score"},
                "verdict": "SAMPLE_ERRORS",
                "detail": f"{n} sample(s) errored in Inspect: {got.get('detail') or ''}"[:1000]}
    if log.status in ("error", "cancelled"):
        why = log.error.message if log.error else f"eval {log.status}"
        return {**out, "verdict": "ERROR" if log.status == "error" else "CANCELLED",
                "detail": why[:1000]}
    if not many_samples(sample_id):
        samples = [s for s in log.samples or [] if matches(s.id, sample_id)]
        if not samples:
            return {**out, "verdict": "NO_SAMPLE",
                    "detail": f"sample {sample_id!r} is not in the log"}
        return {**out, **_sample(log, samples, sample_id, scorer, threshold, score_key)}
    return {**out, **_many(log, sample_id, scorer, threshold, score_key, scored_by, attempt)}


def _many(log: Any, sample_id: str, scorer: str, threshold: float, score_key: str,
          scored_by: dict[str, int] | None = None, attempt: int = 0) -> dict[str, Any]:
    """A cell of many samples (the whole task, a list, a glob): each sample judged as
    one is, the cell's grade their counts (``items``: autopilot.state.items), its verdict
    PASS when the share of scored samples that passed is at or above ``threshold``."""
    wanted = [w.strip() for w in sample_id.split(",") if w.strip()]
    groups: dict[str, list[Any]] = {}
    for s in log.samples or []:
        if not wanted or any(matches(s.id, w) for w in wanted):
            groups.setdefault(str(s.id), []).append(s)  # one per epoch
    if not groups:
        return {"verdict": "NO_SAMPLE", "detail": f"no sample of {sample_id!r} in the log"}
    items = {"passed": 0, "scored": 0, "unscored": 0, "errored": 0, "reused": 0}
    problem: dict[str, Any] | None = None
    by_attempt: dict[str, int] = {}
    for sid, samples in groups.items():
        got = _sample(log, samples, sid, scorer, threshold, score_key)
        if scored_by and got["verdict"] != "ERROR":
            # the attempt that scored it (its last epoch's): inspect-reuse.json
            k = max(scored_by.get(f"{s.id}#{s.epoch}", attempt) for s in samples)
            by_attempt[str(k)] = by_attempt.get(str(k), 0) + 1
            items["reused"] += 0 < k < attempt
        if got["verdict"] in ("PASS", "FAIL"):
            items["scored"] += 1
            items["passed"] += got["verdict"] == "PASS"
        elif got["verdict"] == "UNSCORED":
            items["unscored"] += 1
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
            score_key: str) -> dict[str, Any]:
    """One sample's verdict from its entries in the log (one per epoch)."""
    errors = [s.error for s in samples if s.error is not None]
    if errors:
        return {"verdict": "ERROR", "detail": errors[0].message[:1000]}
    scores = samples[0].scores or {}
    name = scorer or next(iter(scores), "")
    if name not in scores:
        return {"verdict": "NO_SCORE",
                "detail": f"no score {name!r} (the sample has {sorted(scores)})"}
    epochs = len(samples)
    value, reducer = scores[name].value, None
    if epochs > 1:  # the task's own epochs: its reducer's score is the sample's
        for red in log.reductions or []:
            if red.scorer == name:
                got = next((x for x in red.samples if matches(x.sample_id, sample_id)), None)
                if got is not None:
                    value, reducer = got.value, red.reducer
                break
    out: dict[str, Any] = {"scorer": name, "epochs": epochs,
                           **({"reducer": reducer} if reducer else {})}
    if isinstance(value, dict):
        if not score_key or score_key not in value:
            parts = ", ".join(sorted(map(str, value)))
            return {**out, "verdict": "NO_SCORE",
                    "detail": f"score {name!r} has parts ({parts}): set vars.score_key to "
                              "the one that decides" if not score_key else
                              f"score {name!r} has no part {score_key!r} (it has {parts})"}
        value = value[score_key]
        out["score_key"] = score_key
    return {**out, **_decide(value, threshold)}


def _decide(value: Any, threshold: float) -> dict[str, Any]:
    """Inspect's own reading of a score value (``value_to_float``); NaN is what Inspect
    leaves unscored (its metrics skip it): never a FAIL, never a bare NaN in JSON."""
    from inspect_ai.scorer import value_to_float

    number = value_to_float()(value)
    raw = str(value)[:100]
    if isinstance(number, float) and math.isnan(number):
        return {"verdict": "UNSCORED", "score": None, "raw": raw,
                "detail": "Inspect left this sample unscored (NaN)"}
    return {"verdict": "PASS" if number >= threshold else "FAIL", "score": number,
            "raw": raw}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="inspect_grade", description=__doc__.splitlines()[0])
    ap.add_argument("--out", required=True, type=Path, help="the cell's output dir")
    ap.add_argument("--grade-file", required=True, type=Path)
    ap.add_argument("--sample-id", default="")
    ap.add_argument("--scorer", default="", help="which score (default: the first)")
    ap.add_argument("--score-key", default="",
                    help="a score whose value is a dict: the part that decides")
    ap.add_argument("--threshold", type=float, default=1.0,
                    help="a score at or above it passes (C = 1, I = 0)")
    ap.add_argument("--attempt", type=int, default=0,
                    help="the attempt graded: samples an earlier one scored are `reused`")
    args = ap.parse_args(argv)
    log = newest_log(args.out / "logs")
    if log is None:
        grade: dict[str, Any] = {"verdict": "NO_LOG", "detail": "inspect wrote no log"}
    else:
        from autopilot.harnesses.inspect_resume import read_scored_by

        grade = judge(log, args.sample_id, args.scorer, args.threshold, args.score_key,
                      read_scored_by(args.out), args.attempt)
    tmp = args.grade_file.with_name(args.grade_file.name + ".tmp")
    tmp.write_text(json.dumps(grade, indent=1, allow_nan=False))
    tmp.replace(args.grade_file)
    return 0


if __name__ == "__main__":
    sys.exit(main())
