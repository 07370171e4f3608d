"""A harness's spooled output is capped on disk while the attempt runs, not only at its
end: a harness that prints without end must not fill the disk before it is done."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from conftest import events, run_cli, write_overlay

from autopilot.logsetup import SPOOL_CAP

pytestmark = pytest.mark.timeout(240)

# Prints three caps' worth, then waits (its own handshake: fstat of its stdout, the spool)
# until the blocks on disk are back near one cap, and only then does its work: exit 7 if
# that never happens while it runs.
HARNESS = f"""
import os, sys, time
line = b"y" * 1023 + b"\\n"
for _ in range(3 * {SPOOL_CAP} // 1024):
    os.write(1, line)
deadline = time.monotonic() + 60
while os.fstat(1).st_blocks * 512 > {SPOOL_CAP} + (1 << 20):
    if time.monotonic() > deadline:
        sys.exit(7)
    time.sleep(0.05)
with open(sys.argv[1], "w") as f:
    f.write(str(os.fstat(1).st_size))
os.execv(sys.executable, [sys.executable, "-m", "autopilot.demo.harness", *sys.argv[2:]])
"""


def test_a_spool_is_capped_on_disk_while_its_harness_still_writes(tmp_path: Path,
                                                                 state_dir: Path) -> None:
    script = tmp_path / "loud.py"
    script.write_text(HARNESS)
    seen = tmp_path / "size-while-running"
    demo = ["{cell}", "--task", "{task}", "--arm", "{arm}", "--n", "{n}", "--attempt",
            "{attempt}", "--host", "{host}", "--port", "{port}", "--model", "{model}",
            "--out", "{output_dir}", "--think-secs", "0"]
    over = write_overlay(tmp_path / "o.json", {
        "tasks": [{"id": "p1_bugfix"}], "arms": [{"label": "demo-nothink", "mode": "nothink"}],
        "baseline": None, "trust": {"infra_retries": 0},
        "harness": {"argv": ["{python}", str(script), str(seen), *demo]}})
    r = run_cli("--preset", "demo", "--target-n", "1", "--config", str(over),
                "--state-dir", str(state_dir), "--quiet")
    assert r.returncode == 0, r.stderr[-2000:]
    verdicts = [e for e in events(state_dir) if e["event"] == "cell_verdict"]
    assert [v["verdict"] for v in verdicts] == ["PASS"], verdicts
    # it had written all three caps (the child's appends went on at the end) ...
    assert int(seen.read_text()) >= 3 * SPOOL_CAP
    # ... and at the attempt's end the spool is cut to its head and tail, as before
    spool = state_dir / "logs" / "p1_bugfix_demo-nothink_v1.launcher.log"
    assert spool.stat().st_size <= SPOOL_CAP + 4096
    assert b"bytes of this output cut here, head and tail kept" in spool.read_bytes()
    assert json.loads((state_dir / "status.json").read_text())["phase"] == "COMPLETE"
