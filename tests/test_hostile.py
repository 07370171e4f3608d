"""Hostile values never crash, never inject: what a harness writes reaches markdown
escaped (checked in a real browser), a value of the wrong shape makes that cell
malformed_summary instead of crashing report, summarize or validate, and terminal
output carries no escape sequence from outside."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest
from conftest import ROOT, chromium, events, run_cli, write_overlay
from markdown_it import MarkdownIt

ADV = str(ROOT / "tests" / "adversaries" / "hostile_summary.py")
HARNESS = ["{python}", ADV, "{hostile}", "{output_dir}", "{cell}", "--task", "{task}",
           "--arm", "{arm}", "--n", "{n}", "--attempt", "{attempt}", "--host", "{host}",
           "--port", "{port}", "--model", "{model}", "--out", "{output_dir}",
           "--think-secs", "0"]
FINISH = {"file": "{output_dir}/summary.json", "field": "finish_reason",
          "invalid_prefixes": ["api_error"]}


def overlay(tmp_path: Path, modes: dict[str, str]) -> Path:
    return write_overlay(tmp_path / "o.json", {
        "vars": {"hostile": "none"},
        "tasks": [{"id": t, "vars": {"hostile": m}} for t, m in modes.items()],
        "harness": {"argv": HARNESS}, "trust": {"finish": FINISH}})


def no_traceback(r: subprocess.CompletedProcess[str]) -> None:
    assert "Traceback" not in r.stderr and "Error:" not in r.stderr.replace(
        "autopilot: error:", ""), r.stderr[-2000:]


@pytest.fixture(scope="module")
def hostile_run(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    tmp = tmp_path_factory.mktemp("hostile")
    state = tmp / "state"
    over = overlay(tmp, {"p1_bugfix": "xss", "p2_extract": "list", "p2_triage": "inf",
                         "p3_market": "deep"})
    r = run_cli("--preset", "demo", "--target-n", "1", "--config", str(over),
                "--state-dir", str(state), "--quiet")
    assert r.returncode == 1, r.stderr[-3000:]  # three tasks can never be valid
    no_traceback(r)
    assert "\x1b" not in r.stdout + r.stderr
    return state, over


def test_wrong_shapes_are_malformed_cells_not_crashes(hostile_run) -> None:
    state, _ = hostile_run
    evs = events(state)
    assert not [e for e in evs if e["event"] == "cell_abandoned"]
    reasons = {(e["cell"].split("_demo")[0], e.get("reason")) for e in evs
               if e["event"] == "cell_verdict" and e["verdict"] == "INVALID"}
    assert ("p2_extract", "malformed_summary") in reasons  # finish_reason: a list
    assert ("p2_triage", "malformed_summary") in reasons  # tokens: Infinity
    assert {r for t, r in reasons if t == "p3_market"} == {"zero_tokens"}  # unreadable
    quarantined = {e["cell"] for e in evs if e["event"] == "cell_quarantined"}
    assert {c.split("_demo")[0] for c in quarantined} == {"p2_extract", "p2_triage",
                                                          "p3_market"}
    detail = next(e["detail"] for e in evs if e["event"] == "cell_verdict"
                  and e.get("reason") == "malformed_summary" and "p2_extract" in e["cell"])
    assert "finish_reason is a list" in detail


@pytest.mark.parametrize("verb", [["report"], ["summarize", "demo-think"], ["validate"]])
def test_read_only_verbs_survive_every_hostile_value(hostile_run, verb: list[str]) -> None:
    state, _ = hostile_run
    r = run_cli(*verb, "--state-dir", str(state))
    assert r.returncode in (0, 1)
    no_traceback(r)
    assert "\x1b" not in r.stdout and "<script" not in r.stdout and "<img" not in r.stdout


def test_report_markdown_is_inert_in_a_browser(hostile_run, tmp_path: Path) -> None:
    state, _ = hostile_run
    text = run_cli("report", "--state-dir", str(state)).stdout
    assert "](javascript:" not in text
    audit = text.split("## 4. Finish-reason audit")[1].split("## 5.")[0]
    rows = [ln for ln in audit.splitlines() if ln.startswith("|") and "---" not in ln]
    assert len({ln.count(" | ") - ln.count("\\|") for ln in rows}) == 1  # the table holds
    # A markdown viewer that passes HTML through (GitHub-like), then a real browser.
    page = tmp_path / "findings.html"
    page.write_text("<!doctype html><html><body>"
                    + MarkdownIt("commonmark", {"html": True}).enable("table").render(text)
                    + "</body></html>")
    dom = chromium(tmp_path, page.as_uri(), "--dump-dom").stdout
    assert "<table>" in dom and "&lt;img src=x onerror" in dom  # shown as text ...
    assert "data-pwned" not in dom  # ... and nothing ran
    assert 'href="javascript:' not in dom and "<img" not in dom


def test_dashboard_views_carry_no_escape_sequences(hostile_run) -> None:
    state, _ = hostile_run
    for args in (["--no-color"], ["--trend", "--no-color"], ["--flips", "--no-color"],
                 ["--oneline"]):
        r = run_cli("--state-dir", str(state), *args, prog="dashboard")
        assert r.returncode == 0, r.stderr
        assert "\x1b" not in r.stdout


def test_a_forged_task_name_in_the_state_dir_is_not_markup(tmp_path: Path) -> None:
    state = tmp_path / "state"
    state.mkdir()
    forged = "[link=javascript:alert(1)]x[/link]\x1b]8;;javascript:alert(1)\x1b\\"
    (state / "plan.json").write_text(json.dumps({"tasks": [forged, "ok_task"],
                                                 "arms": ["a1"], "target_n": 1}))
    (state / "status.json").write_text(json.dumps({"phase": "run:pass1\x1b[2J",
                                                   "target_n": "many", "running": 7}))
    for args in (["--trend"], ["--flips"], []):
        r = run_cli("--state-dir", str(state), *args, prog="dashboard", env=None)
        assert r.returncode == 0, r.stderr
        assert "\x1b" not in r.stdout  # no OSC 8 link, no screen clear
        assert "[link=javascript:alert(1)]x[/link]" in r.stdout  # shown as text


def test_publish_commits_escaped_text_and_a_failure_keeps_exit_0(tmp_path: Path) -> None:
    over = overlay(tmp_path, {"p1_bugfix": "xss"})
    repo = tmp_path / "results"
    repo.mkdir()
    subprocess.run(["git", "init", "-q", str(repo)], check=True)
    subprocess.run(["git", "-C", str(repo), "commit", "-q", "--allow-empty", "-m", "init"],
                   check=True, env={"GIT_AUTHOR_NAME": "t", "GIT_AUTHOR_EMAIL": "t@t",
                                    "GIT_COMMITTER_NAME": "t", "GIT_COMMITTER_EMAIL": "t@t",
                                    "PATH": "/usr/bin:/bin"})
    state = tmp_path / "state"
    r = run_cli("--preset", "demo", "--target-n", "1", "--config", str(over), "--state-dir",
                str(state), "--quiet", "--publish", "--results-repo", str(repo))
    assert r.returncode == 0, r.stderr[-2000:]
    assert [e for e in events(state) if e["event"] == "published"]
    found = (state / "findings.md").read_text()
    assert "&lt;img src=x onerror" in found and "<img" not in found
    # Into something that is not a repository: said on stderr even with --quiet, exit 0.
    r = run_cli("--preset", "demo", "--target-n", "1", "--config", str(over), "--state-dir",
                str(state), "--quiet", "--publish", "--results-repo", str(tmp_path / "nope"))
    assert r.returncode == 0 and "publish_failed" in r.stderr and "[error" in r.stderr
    assert [e for e in events(state) if e["event"] == "publish_failed"]
