"""Demo grader: reads the deliverable, writes ``grade.json`` with a verdict word.

``PASS`` when the answer is correct, ``FAIL`` when wrong, ``MISSING_OUTPUT`` when there
is no deliverable. Fault knob ``--fail-first K``: the first K invocations of a run (a
counter file under ``--counter``) crash with exit 1, a harness-break streak for the
anomaly alarm and the retry budget to absorb.
"""

from __future__ import annotations

import argparse
import fcntl
import json
import sys
from pathlib import Path


def _take_failure(counter: Path, limit: int) -> bool:
    counter.parent.mkdir(parents=True, exist_ok=True)
    with counter.open("a+") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        f.seek(0)
        used = int(f.read().strip() or 0)
        if used >= limit:
            return False
        f.seek(0)
        f.truncate()
        f.write(str(used + 1))
        return True


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description="bench-autopilot demo grader")
    ap.add_argument("outputs")
    ap.add_argument("--out", required=True)
    ap.add_argument("--fail-first", type=int, default=0)
    ap.add_argument("--counter", default="")
    a = ap.parse_args(argv)
    if a.fail_first and a.counter and _take_failure(Path(a.counter), a.fail_first):
        print("fault knob: grader crash", file=sys.stderr)
        return 1
    answer_file = Path(a.outputs) / "answer.txt"
    if not answer_file.is_file():
        grade = {"verdict": "MISSING_OUTPUT", "details": "no answer.txt"}
    else:
        answer = answer_file.read_text().strip()
        grade = {"verdict": "PASS" if answer == "correct" else "FAIL", "answer": answer}
    Path(a.out).write_text(json.dumps(grade) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
