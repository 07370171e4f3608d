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
        count = int(f.read().strip() or 0) + 1
        f.seek(0)
        f.truncate()
        f.write(str(count))
        return count


def _in_ranges(n: int, spec: str) -> bool:
    for part in filter(None, spec.split(",")):
        first, _, last = part.partition("-")
        if int(first) <= n <= int(last or first):
            return True
    return False


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="bench-autopilot demo grader")
    parser.add_argument("outputs")
    parser.add_argument("--out", required=True)
    parser.add_argument("--fail-first", type=int, default=0)
    parser.add_argument("--counter", default="")
    parser.add_argument("--fail-invocations", default="")
    parser.add_argument("--fail-cells", default="")
    parser.add_argument("--fail-until-attempt", type=int, default=0)
    parser.add_argument("--fail-until-try", type=int, default=0)
    parser.add_argument("--expect-regex", default="", help="PASS when the answer matches this "
                        "regular expression (a real model's answer), instead of 'correct'")
    args = parser.parse_args(argv)
    spec = args.fail_invocations or (f"1-{args.fail_first}" if args.fail_first else "")
    if spec and args.counter and _in_ranges(_invocation(Path(args.counter)), spec):
        print("fault knob: grader crash", file=sys.stderr)
        return 1
    cell = os.environ.get("AUTOPILOT_CELL_ID", "")
    attempt = int(os.environ.get("AUTOPILOT_CELL_ATTEMPT", "1"))
    if cell and cell in args.fail_cells.split(",") and attempt < args.fail_until_attempt:
        print(f"fault knob: grader crash for {cell} attempt {attempt}", file=sys.stderr)
        return 1
    grade_try = int(os.environ.get("AUTOPILOT_GRADE_TRY", "1"))
    if cell and cell in args.fail_cells.split(",") and grade_try < args.fail_until_try:
        print(f"fault knob: grader crash for {cell} try {grade_try}", file=sys.stderr)
        return 1
    answer_file = Path(args.outputs) / "answer.txt"
    if not answer_file.is_file():
        grade = {"verdict": "MISSING_OUTPUT", "details": "no answer.txt"}
    else:
        answer = answer_file.read_text().strip()
        ok = (bool(re.search(args.expect_regex, answer)) if args.expect_regex
              else answer == "correct")
        grade = {"verdict": "PASS" if ok else "FAIL", "answer": answer[:500]}
    Path(args.out).write_text(json.dumps(grade) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
