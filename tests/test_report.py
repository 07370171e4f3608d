"""Findings report golden files, per-arm summaries, and publish to real git repos."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest
from conftest import ROOT, events, run_cli, write_overlay
from reportfix import PRESET, complete_run, partial_run, trust_run

from autopilot.run.publish import publish

GOLDEN = ROOT / "tests" / "golden"


def golden(name: str, text: str) -> None:
    path = GOLDEN / name
    if os.environ.get("UPDATE_GOLDEN") or not path.exists():
        path.write_text(text)
        if not os.environ.get("UPDATE_GOLDEN"):
            pytest.fail(f"golden file {name} was missing; written, review and commit it")
    assert text == path.read_text(), f"{name} differs from its golden file"


def report(state: Path, *extra: str) -> str:
    r = run_cli("report", "--state-dir", str(state), *extra)
    assert r.returncode == 0, r.stderr
    return r.stdout


@pytest.mark.parametrize("name", ["complete", "partial", "trust", "no-usage", "unpriced"])
def test_report_golden(tmp_path: Path, name: str) -> None:
    state = tmp_path / name
    if name == "complete":
        complete_run(state)
    elif name == "partial":
        partial_run(state)
    elif name == "trust":
        trust_run(state)
    elif name == "no-usage":
        complete_run(state, usage=False)
        for s in (state / "cells").glob("*/summary.json"):
            s.write_text('{"finish_reason": "stop"}')
    else:
        unpriced = tmp_path / "unpriced.toml"
        unpriced.write_text(PRESET.read_text().replace('"fixture-model" = [0.5, 2.0]', ""))
        complete_run(state, preset=unpriced)
    text = report(state)
    golden(f"report-{name}.md", text)
    assert report(state) == text  # deterministic: byte-identical twice


def test_report_content(tmp_path: Path) -> None:
    text = report(complete_run(tmp_path / "c"))
    assert "| t_alpha | 5/5 (+10pp) | 5/5 |" in text
    assert "Fisher" in text and "Wilson" in text
    assert "| **total** |" in text and "Other model A" in text
    assert "priced by bucket from the preset's rate card" in text and "| buckets 15 |" in text
    trust = report(trust_run(tmp_path / "t"))
    assert "t_beta_fx-nothink_v1: quarantined after 3 INVALID attempts (grader_failed 3)" in trust
    assert "t_beta_fx-think_v1: INVALID(missing_output)" in trust
    assert "teardown-masked cells (valid, killed after finishing, scored from outputs): 1" in trust
    assert "grader_failed 3" in trust and "stall 1" in trust
    partial = report(partial_run(tmp_path / "p"))
    assert "**PARTIAL**" in partial and "structural check only (1 cells)" in partial
    unpriced = tmp_path / "u.toml"
    unpriced.write_text(PRESET.read_text().replace('"fixture-model" = [0.5, 2.0]', ""))
    text = report(complete_run(tmp_path / "u", preset=unpriced))
    assert "unpriced" in text and "$0" not in text and "| 0.0000 |" not in text
    out = tmp_path / "findings.md"
    r = run_cli("report", "--state-dir", str(tmp_path / "c"), "--n", "3", "--out", str(out))
    assert r.returncode == 0 and out.read_text().startswith("# Findings — report-fixture")
    assert "N=3" in out.read_text()


def test_summarize(tmp_path: Path) -> None:
    state = complete_run(tmp_path / "c")
    r = run_cli("summarize", "fx-think", "--state-dir", str(state))
    assert r.returncode == 0
    golden("summary-fx-think.txt", r.stdout)
    assert run_cli("summarize", "nope", "--state-dir", str(state)).returncode == 2


def git(repo: Path, *args: str) -> str:
    return subprocess.run(["git", "-C", str(repo), *args], capture_output=True, text=True,
                          check=True).stdout.strip()


@pytest.fixture
def repo(tmp_path: Path) -> Path:
    r = tmp_path / "results"
    r.mkdir()
    git(r, "init", "-q", "-b", "main")
    git(r, "-c", "user.name=t", "-c", "user.email=t@t", "commit", "-q", "--allow-empty",
        "-m", "init")
    (r / "notes.txt").write_text("uncommitted work\n")
    (r / "tracked.txt").write_text("v1\n")
    git(r, "add", "tracked.txt")
    return r


def test_publish_plumbing_idempotent_and_non_disturbing(repo: Path) -> None:
    head, status = git(repo, "rev-parse", "HEAD"), git(repo, "status", "--porcelain")
    files = {"bench-results/x/scorecard.md": "# s\n", "bench-results/x/findings.md": "# f\n"}
    first = publish(repo, files, "msg", date="2026-11-29")
    assert first.ok and first.created and first.branch == "bench-results-2026-11-29"
    shown = git(repo, "show", "bench-results-2026-11-29:bench-results/x/scorecard.md")
    assert shown == "# s"
    again = publish(repo, files, "msg", date="2026-11-29")
    assert again.ok and not again.created and again.commit == first.commit
    assert git(repo, "rev-parse", "HEAD") == head
    assert git(repo, "status", "--porcelain") == status  # index and work tree untouched
    assert git(repo, "branch", "--show-current") == "main"
    changed = publish(repo, {**files, "bench-results/x/scorecard.md": "# s2\n"}, "m",
                      date="2026-11-29")
    assert changed.created and git(repo, "rev-list", "--count",
                                   "bench-results-2026-11-29") == "3"


def test_publish_failures_are_reported_not_raised(tmp_path: Path) -> None:
    res = publish(tmp_path, {"a.md": "x"}, "m")
    assert not res.ok and "git" in res.error
    ro = tmp_path / "ro"
    ro.mkdir()
    git(ro, "init", "-q")
    subprocess.run(["chattr", "+i", str(ro / ".git" / "objects")], check=False)
    try:
        res = publish(ro, {"a.md": "x"}, "m")
    finally:
        subprocess.run(["chattr", "-i", str(ro / ".git" / "objects")], check=False)
    assert not res.ok


@pytest.mark.slow
def test_run_with_publish_end_to_end(tmp_path: Path, repo: Path) -> None:
    state = tmp_path / "state"
    over = write_overlay(tmp_path / "o.json", {"vars": {"think_secs": "0"}})
    args = ["--preset", "demo", "--target-n", "1", "--config", str(over), "--state-dir",
            str(state), "--quiet", "--publish", "--results-repo", str(repo)]
    r = run_cli(*args)
    assert r.returncode == 0 and "AUTOPILOT_COMPLETE" in r.stdout
    assert (state / "scorecard.md").exists() and (state / "findings.md").exists()
    summarized = run_cli("summarize", "demo-think", "--state-dir", str(state)).stdout
    assert (state / "summary-demo-think.txt").read_text() == summarized  # ledger == disk
    branch = next(b.strip(" *") for b in git(repo, "branch").splitlines()
                  if "bench-results-" in b)
    files = git(repo, "ls-tree", "-r", "--name-only", branch).splitlines()
    assert "bench-results/demo/scorecard.md" in files and "bench-results/demo/findings.md" in files
    n_events = len(events(state))
    again = run_cli(*args)  # already complete: straight to publishing, no new commit
    assert again.returncode == 0
    new = events(state)[n_events:]
    assert not any(e["event"] in ("cell_started", "endpoint_started") for e in new)
    assert next(e for e in new if e["event"] == "published")["created"] is False


@pytest.mark.slow
def test_broken_results_repo_still_complete(tmp_path: Path) -> None:
    state = tmp_path / "state"
    over = write_overlay(tmp_path / "o.json", {"vars": {"think_secs": "0"}})
    r = run_cli("--preset", "demo", "--target-n", "1", "--config", str(over), "--state-dir",
                str(state), "--quiet", "--publish", "--results-repo", str(tmp_path / "nogit"))
    assert r.returncode == 0 and "AUTOPILOT_COMPLETE" in r.stdout
    evs = events(state)
    assert any(e["event"] == "publish_failed" for e in evs)
    assert any(e.get("kind") == "publish_failed" for e in evs if e["event"] == "milestone")
    import json

    status = json.loads((state / "status.json").read_text())
    assert status["phase"] == "COMPLETE" and status["publish"]["ok"] is False
