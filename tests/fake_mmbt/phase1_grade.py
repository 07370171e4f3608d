#!/usr/bin/env python3
"""FAKE of MMBT's tooling/graders/phase1_grade.py (tests only): the published command
line `phase1_grade.py <bugfix|testwrite|refactor> <workspace> <baseline_dir> [--out FILE]`,
and the published behaviour when its helper code_task_grader.py (beside it) is missing:
verdict GRADER_FAILED, exit 0. With the helper there: PASS/FAIL from answer.txt."""

import argparse
import json
from pathlib import Path

ap = argparse.ArgumentParser()
ap.add_argument("task", choices=["bugfix", "testwrite", "refactor"])
ap.add_argument("workspace")
ap.add_argument("baseline")
ap.add_argument("--out", default=None)
a = ap.parse_args()
workspace = Path(a.workspace).resolve()
if not Path(a.baseline).is_dir():
    ap.error(f"baseline not a dir: {a.baseline}")
if not (Path(__file__).resolve().parent / "code_task_grader.py").exists():
    result = {"task": a.task, "verdict": "GRADER_FAILED", "notes": "code_task_grader.py: "
              "[Errno 2] No such file or directory"}
else:
    answer = workspace / "answer.txt"
    text = answer.read_text().strip() if answer.is_file() else ""
    result = {"task": a.task, "verdict": "PASS" if text == "correct" else "FAIL"}
out = Path(a.out) if a.out else workspace / "grade.json"
out.write_text(json.dumps(result, indent=2))
print(json.dumps(result, indent=2))
