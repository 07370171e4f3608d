"""The verdict of one Inspect cell, from Inspect's own log (``inspect_ai.log``'s public
API, never its printed text): the sample's score under the task's scorer → PASS or FAIL
(``C``/``I``, booleans and numbers through Inspect's ``value_to_float``, at or above
``--threshold``); the whole task (no sample id) by its headline metric. The log's
status ``error`` or ``cancelled``, or a sample error → ERROR / CANCELLED with Inspect's
own message as the grade's ``detail`` (the preset maps those words to INVALID).

Writes ``--grade-file`` (JSON): verdict, score, scorer, sample id, detail, log name.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

from autopilot.harnesses.inspect_run import newest_log


def judge(log_path: Path, sample_id: str, scorer: str, threshold: float) -> dict[str, Any]:
    from inspect_ai.log import read_eval_log
    from inspect_ai.scorer import value_to_float

    log = read_eval_log(str(log_path))
    out: dict[str, Any] = {"log": log_path.name, "sample_id": sample_id or None,
                           "status": log.status}
    if log.status in ("error", "cancelled"):
        why = log.error.message if log.error else f"eval {log.status}"
        return {**out, "verdict": "ERROR" if log.status == "error" else "CANCELLED",
                "detail": why[:1000]}
    if not sample_id:
        metric = _headline(log)
        if metric is None:
            return {**out, "verdict": "NO_SCORE", "detail": "the log has no metric"}
        return {**out, "verdict": "PASS" if metric >= threshold else "FAIL", "score": metric}
    samples = [s for s in log.samples or [] if str(s.id) == sample_id]
    if not samples:
        return {**out, "verdict": "NO_SAMPLE",
                "detail": f"sample {sample_id!r} is not in the log"}
    s = samples[0]
    if s.error is not None:
        return {**out, "verdict": "ERROR", "detail": s.error.message[:1000]}
    scores = s.scores or {}
    name = scorer or next(iter(scores), "")
    if name not in scores:
        return {**out, "verdict": "NO_SCORE",
                "detail": f"no score {name!r} (the sample has {sorted(scores)})"}
    value = value_to_float()(scores[name].value)
    return {**out, "verdict": "PASS" if value >= threshold else "FAIL", "scorer": name,
            "score": value, "raw": str(scores[name].value)[:100]}


def _headline(log: Any) -> float | None:
    for score in (log.results.scores if log.results else []):
        for metric in score.metrics.values():
            if isinstance(metric.value, int | float):
                return float(metric.value)
    return None


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="inspect_grade", description=__doc__.splitlines()[0])
    ap.add_argument("--out", required=True, type=Path, help="the cell's output dir")
    ap.add_argument("--grade-file", required=True, type=Path)
    ap.add_argument("--sample-id", default="")
    ap.add_argument("--scorer", default="", help="which score (default: the first)")
    ap.add_argument("--threshold", type=float, default=1.0,
                    help="a score at or above it passes (C = 1, I = 0)")
    args = ap.parse_args(argv)
    log = newest_log(args.out / "logs")
    if log is None:
        grade: dict[str, Any] = {"verdict": "NO_LOG", "detail": "inspect wrote no log"}
    else:
        grade = judge(log, args.sample_id, args.scorer, args.threshold)
    tmp = args.grade_file.with_name(args.grade_file.name + ".tmp")
    tmp.write_text(json.dumps(grade, indent=1))
    tmp.replace(args.grade_file)
    return 0


if __name__ == "__main__":
    sys.exit(main())
