"""FAKE origin grader (tests only): grade.py <scratch-dir> [ground_truth.json] --out FILE.
Reads answer.txt from the extracted workspace; records whether ground truth was given."""

import argparse
import json
import os

ap = argparse.ArgumentParser()
ap.add_argument("scratch")
ap.add_argument("ground_truth", nargs="?")
ap.add_argument("--out", required=True)
a = ap.parse_args()
path = os.path.join(a.scratch, "answer.txt")
if not os.path.exists(path):
    verdict = "MISSING_OUTPUT"
else:
    verdict = "PASS" if open(path).read().strip() == "correct" else "FAIL"
with open(a.out, "w") as f:
    json.dump({"verdict": verdict, "ground_truth": a.ground_truth}, f)
