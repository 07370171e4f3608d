"""Adversary grader: argv[1] says how it hurts, argv[2] is the grade file.

  huge   a 3 MB verdict word (a journal or log that keeps it grows by 12 MB a cell)
  oversize  a 5 MB grade file (past what any grade may be)
  fifo   the grade file is a FIFO nobody writes
"""

import json
import os
import sys

mode, grade = sys.argv[1], sys.argv[2]
if mode == "fifo":
    if os.path.exists(grade):
        os.unlink(grade)
    os.mkfifo(grade)
else:
    with open(grade, "w") as f:
        size = 5 if mode == "oversize" else 3
        json.dump({"verdict": "W" * (size * 1024 * 1024)}, f)
