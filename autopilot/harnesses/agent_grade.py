"""Grade an agent cell: ``python -m autopilot.harnesses.agent_grade {output_dir} --out
{grade_file} --expect-regex RE [--file work/RESULT.txt]``.

PASS when the deliverable matches the regular expression — a file the agent wrote
(``--file``, relative to the cell's output dir) or, without one, its answer
(``answer.txt``) — FAIL when it does not, MISSING_OUTPUT when there is none.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import sys
from pathlib import Path

READ_CAP = 1 << 20


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="grade an agent cell by a regular expression")
    parser.add_argument("outputs")
    parser.add_argument("--out", required=True)
    parser.add_argument("--expect-regex", required=True)
    parser.add_argument("--file", default="", help="the deliverable, relative to OUTPUTS")
    args = parser.parse_args(argv)
    base = Path(args.outputs).resolve()
    target = (base / (args.file or "answer.txt")).resolve()
    if not target.is_relative_to(base):
        print(f"agent_grade: {args.file!r} is outside the cell's outputs", file=sys.stderr)
        return 2
    verdict, detail = "MISSING_OUTPUT", f"no {target.relative_to(base)}"
    if target.is_file() and not target.is_symlink():
        with open(target, "rb") as f:
            text = f.read(READ_CAP).decode("utf-8", "replace")
        if text.strip():
            ok = re.search(args.expect_regex, text) is not None
            verdict = "PASS" if ok else "FAIL"
            detail = ("matches" if ok else "does not match") + f" {args.expect_regex!r}"
    tmp = Path(args.out + ".tmp")
    tmp.write_text(json.dumps({"verdict": verdict, "detail": detail}))
    os.replace(tmp, args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
