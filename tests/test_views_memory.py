"""Views fold the journal streaming: their memory is bounded by the plan, not by the
journal. A real demo run's journal is grown by repeating its own records (a long night's
journal is mostly the same kinds again), and each view's peak RSS (the kernel's
ru_maxrss of the real CLI process) is compared at two journal sizes."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import ROOT, cli_env, run_cli

pytestmark = pytest.mark.slow

VIEWS = {
    "validate": [sys.executable, "-m", "autopilot", "validate", "--state-dir"],
    "report": [sys.executable, "-m", "autopilot", "report", "--state-dir"],
    "dashboard": [sys.executable, "-m", "autopilot.views.dashboard.cli", "--json",
                  "--state-dir"],
}


def peak_rss_mb(argv: list[str]) -> float:
    """Run ``argv`` to its end; its peak resident set, in MB, as the kernel counted it."""
    p = subprocess.Popen(argv, cwd=ROOT, env=cli_env(), stdout=subprocess.DEVNULL,
                         stderr=subprocess.DEVNULL)
    try:
        _, status, usage = os.wait4(p.pid, 0)
    except BaseException:
        p.kill()
        p.wait()
        raise
    p.returncode = os.waitstatus_to_exitcode(status)
    assert p.returncode in (0, 1), (argv, p.returncode)
    return usage.ru_maxrss / 1024


def grow(journal: Path, body: list[str], size: int) -> None:
    with journal.open("a") as f:
        while journal.stat().st_size < size:
            f.write("".join(body))
            f.flush()


def test_a_views_memory_does_not_grow_with_the_journal(tmp_path: Path) -> None:
    state = tmp_path / "state"
    r = run_cli("--preset", "demo", "--target-n", "1", "--state-dir", str(state), "--quiet")
    assert r.returncode == 0, r.stderr[-2000:]
    journal = state / "journal.jsonl"
    body = [line + "\n" for line in journal.read_text().splitlines()
            if '"event":"run_' not in line]
    grow(journal, body, 8 << 20)
    small = {name: peak_rss_mb([*argv, str(state)]) for name, argv in VIEWS.items()}
    grow(journal, body, 32 << 20)
    large = {name: peak_rss_mb([*argv, str(state)]) for name, argv in VIEWS.items()}
    # 24 MB more journal: a view that held it would grow by hundreds of MB (it held
    # ~12x the journal before); one that streams grows by what it folds per cell.
    assert {name: round(large[name] - small[name]) for name in VIEWS
            if large[name] - small[name] > 12} == {}, (small, large)
