"""Demo grader: reads the deliverable, writes ``grade.json`` with a verdict word.

``PASS`` when the answer is correct, ``FAIL`` when wrong, ``MISSING_OUTPUT`` when there
is no deliverable. Fault knobs: ``--fail-first K`` (the first K invocations of a run, by
a counter file under ``--counter``, crash with exit 1: a harness-break streak for the
anomaly alarm and the retry budget to absorb), ``--fail-invocations 1-3,7-9`` (the
same, for chosen invocation numbers), and ``--fail-cells A,B --fail-until-attempt K``
(those cells' grader crashes on attempts below K; K large = always), and
``--fail-cells A,B --fail-until-try K`` (crashes on grading tries below K of the same
attempt: the autopilot re-runs a failed grader on the same outputs).
"""

from __future__ import annotations

import argparse
import fcntl
import json
import os
import re
import sys
from pathlib import Path


def _invocation(counter: Path) -> int:
    """This invocation's number (1-based) in the run, counted under a file lock."""
    counter.parent.mkdir(parents=True, exist_ok=True)
    with counter.open("a+") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        f.seek(0)
        n = int(f.read().strip() or 0) + 1
        f.seek(0)
        f.truncate()
        f.write(str(n))
        return n


def _in_ranges(n: int, spec: str) -> bool:
    for part in filter(None, spec.split(",")):
        lo, _, hi = part.partition("-")
        if int(lo) <= n <= int(hi or lo):
            return True
    return False


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description="bench-autopilot demo grader")
    ap.add_argument("outputs")
    ap.add_argument("--out", required=True)
    ap.add_argument("--fail-first", type=int, default=0)
    ap.add_argument("--counter", default="")
    ap.add_argument("--fail-invocations", default="")
    ap.add_argument("--fail-cells", default="")
    ap.add_argument("--fail-until-attempt", type=int, default=0)
    ap.add_argument("--fail-until-try", type=int, default=0)
    ap.add_argument("--expect-regex", default="", help="PASS when the answer matches this "
                    "regular expression (a real model's answer), instead of 'correct'")
    a = ap.parse_args(argv)
    spec = a.fail_invocations or (f"1-{a.fail_first}" if a.fail_first else "")
    if spec and a.counter and _in_ranges(_invocation(Path(a.counter)), spec):
        print("fault knob: grader crash", file=sys.stderr)
        return 1
    cell = os.environ.get("AUTOPILOT_CELL_ID", "")
    attempt = int(os.environ.get("AUTOPILOT_CELL_ATTEMPT", "1"))
    if cell and cell in a.fail_cells.split(",") and attempt < a.fail_until_attempt:
        print(f"fault knob: grader crash for {cell} attempt {attempt}", file=sys.stderr)
        return 1
    grade_try = int(os.environ.get("AUTOPILOT_GRADE_TRY", "1"))
    if cell and cell in a.fail_cells.split(",") and grade_try < a.fail_until_try:
        print(f"fault knob: grader crash for {cell} try {grade_try}", file=sys.stderr)
        return 1
    answer_file = Path(a.outputs) / "answer.txt"
    if not answer_file.is_file():
        grade = {"verdict": "MISSING_OUTPUT", "details": "no answer.txt"}
    else:
        answer = answer_file.read_text().strip()
        ok = bool(re.search(a.expect_regex, answer)) if a.expect_regex else answer == "correct"
        grade = {"verdict": "PASS" if ok else "FAIL", "answer": answer[:500]}
    Path(a.out).write_text(json.dumps(grade) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
