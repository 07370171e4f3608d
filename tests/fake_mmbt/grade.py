#!/usr/bin/env python3
"""FAKE of an MMBT phase 2/3 grader (tests only): `<grader> <workspace> [ground_truth]
--out FILE`, as the real ones. PASS when the workspace's answer.txt says "correct", FAIL
otherwise, MISSING_OUTPUT without one (the real graders' words). A ground truth given
must exist. FAKE_GRADER_HOLD=<file>: write <file>.grading, then wait for <file>."""

import argparse
import json
import os
import sys
import time
from pathlib import Path

ap = argparse.ArgumentParser()
ap.add_argument("workspace")
ap.add_argument("ground_truth", nargs="?")
ap.add_argument("--out", default=None)
a = ap.parse_args()
hold = os.environ.get("FAKE_GRADER_HOLD")
if hold:
    Path(hold + ".grading").write_text(os.environ.get("AUTOPILOT_CELL_ID", ""))
    while not os.path.exists(hold):
        time.sleep(0.05)
if a.ground_truth and not os.path.isfile(a.ground_truth):
    sys.exit(f"ground truth not found: {a.ground_truth}")
answer = Path(a.workspace) / "answer.txt"
if not answer.is_file():
    result = {"verdict": "MISSING_OUTPUT", "notes": f"agent did not produce {answer}"}
else:
    text = answer.read_text().strip()
    result = {"verdict": "PASS" if text == "correct" else "FAIL", "answer": text,
              "ground_truth": a.ground_truth, "grader": Path(__file__).name}
out = Path(a.out) if a.out else Path(a.workspace) / "grade.json"
out.write_text(json.dumps(result, indent=2))
print(json.dumps(result))
