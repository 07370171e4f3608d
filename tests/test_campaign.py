"""Roster campaigns and the board: two simulated local models one after another (the
first's endpoint checked gone before the second starts), a fake hosted provider with
429 bursts beside them (never a FAIL because of a 429), a board that matches its golden
file, kill -9 and resume with every cell counted once, mixed runs refused, and hostile
names escaped in every medium."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from collections import Counter
from pathlib import Path

import pytest
from conftest import ROOT, chromium, cli_env, run_cli, wait_for, write_overlay
from provider_fake import FakeProvider

from autopilot.cell.procs import ProcIdentity, verify
from autopilot.state.journal import read_events

GOLDEN = ROOT / "tests" / "golden"
KEY = "sk-fake-campaign-0123456789"
TASKS = [{"id": "p1_bugfix"}, {"id": "p2_extract"}]


def roster(tmp: Path, provider: FakeProvider | None, name: str = "models") -> Path:
    write_overlay(tmp / "alpha.json", {"model": "sim-alpha", "tasks": TASKS,
                                       "vars": {"think_secs": "0.05"}})
    write_overlay(tmp / "beta.json", {"model": "sim-beta", "tasks": TASKS,
                                      "vars": {"think_secs": "0.05"}})
    text = (f'[campaign]\nname = "{name}"\ntarget_n = 2\n\n'
            '[[entries]]\nname = "alpha"\npreset = "demo"\nconfig = "alpha.json"\n\n'
            '[[entries]]\nname = "beta"\npreset = "demo"\nconfig = "beta.json"\n')
    if provider is not None:
        harness = ["{python}", "-m", "autopilot.demo.harness", "{cell}", "--task", "{task}",
                   "--arm", "{arm}", "--n", "{n}", "--port", "0", "--model", "{model}",
                   "--out", "{output_dir}", "--base-url", "{base_url}", "--api-key-env",
                   "{key_env}", "--think-secs", "0", "--rate-limit-secs", "1.5"]
        demo_grader = ["{python}", "-m", "autopilot.demo.grader", "{output_dir}", "--out",
                       "{grade_file}", "--fail-first", "{grader_fail_first}", "--counter",
                       "{state_dir}/demo-grader-failures"]  # the same grader: comparable
        provider.overlay(tmp / "hosted.json", model="sim-pro-1", tasks=TASKS,
                         endpoint={"base_url": provider.base_url, "probe_interval_secs": 0.3},
                         harness={"argv": harness}, run={"concurrency": 3},
                         grader={"argv": demo_grader}, vars={"grader_fail_first": "0"},
                         rate_card={"sim-pro-1": [1.0, 2.0]})
        text += (f'\n[providers]\n"127.0.0.1:{provider.port}" = 1\n\n[[entries]]\n'
                 'name = "hosted"\npreset = "provider-example"\nconfig = "hosted.json"\n')
    (tmp / "roster.toml").write_text(text)
    return tmp / "roster.toml"


def campaign_events(cdir: Path) -> list[dict]:
    return read_events(cdir / "campaign.jsonl").events


def counted_once(entry: Path) -> None:
    valid = Counter(e["cell"] for e in read_events(entry / "journal.jsonl").events
                    if e["event"] == "cell_verdict" and e["verdict"] in ("PASS", "FAIL"))
    status = json.loads((entry / "status.json").read_text())
    assert status["phase"] == "COMPLETE"
    assert len(valid) == status["totals"]["total"] and set(valid.values()) == {1}


def entry_logs(cdir: Path) -> str:
    """What each entry's supervisor printed (its outcome line names why): a failure here
    must say which entry ended how, not only that one did."""
    return "".join(f"\n--- {p.name}:\n{p.read_text(errors='replace')[-2000:]}"
                   for p in sorted(cdir.glob("*.log")))


def normalise_board(text: str, cdir: Path) -> str:
    return text.replace(str(cdir), "<campaign>")


@pytest.mark.slow
def test_a_roster_of_two_local_models_and_a_throttling_provider(tmp_path: Path) -> None:
    provider = FakeProvider(KEY, args=("--throttle-every", "4", "--throttle-secs", "2.5"))
    try:
        path = roster(tmp_path, provider)
        cdir = tmp_path / "campaign"
        dry = run_cli("campaign", str(path), "--state-dir", str(cdir), "--dry-run",
                      env=cli_env(OPENAI_API_KEY=KEY))
        assert dry.returncode == 0, dry.stderr
        assert "local, one after another: alpha -> beta" in dry.stdout
        assert f"provider 127.0.0.1:{provider.port} (at most 1 at once): hosted" in dry.stdout
        assert dry.stdout.count("dry run: nothing launched") == 4 and not cdir.exists()

        r = run_cli("campaign", str(path), "--state-dir", str(cdir), "--quiet",
                    env=cli_env(OPENAI_API_KEY=KEY), timeout=600)
        assert r.returncode == 0, r.stdout + r.stderr[-3000:] + entry_logs(cdir)
        assert "CAMPAIGN_COMPLETE 3 entries" in r.stdout
    finally:
        provider.close()
    evs = campaign_events(cdir)
    started = {e["entry"]: e for e in evs if e["event"] == "entry_started"}
    finished = {e["entry"]: e for e in evs if e["event"] == "entry_finished"}
    # One after another, and alpha's endpoint checked gone before beta began.
    assert started["beta"]["previous_endpoint_gone"] == "alpha"
    assert finished["alpha"]["ts"] < started["beta"]["ts"]
    alpha_ep = [e for e in read_events(cdir / "alpha" / "journal.jsonl").events
                if e["event"] == "endpoint_spawned"]
    assert alpha_ep and all(verify(ProcIdentity(e["pid"], e["create_time"], e["start_ticks"]))
                            is None for e in alpha_ep)
    # The provider ran beside them (it started before beta finished).
    assert started["hosted"]["ts"] < finished["beta"]["ts"]
    for entry in ("alpha", "beta", "hosted"):
        counted_once(cdir / entry)
    # 429s happened, were seen as throttling, and never made a FAIL.
    hosted = read_events(cdir / "hosted" / "journal.jsonl").events
    logs = "".join(p.read_text() for p in (cdir / "hosted" / "logs").glob("*.launcher.log"))
    assert "rate limited (429)" in logs
    assert any(e["event"] in ("endpoint_throttled", "launch_throttled") for e in hosted)
    for e in hosted:
        if e["event"] == "cell_verdict" and e["verdict"] == "FAIL":
            summary = json.loads((cdir / "hosted" / "cells" / e["cell"] /
                                  "summary.json").read_text())
            assert not summary["finish_reason"].startswith("rate_limited")
    limited = [e for e in hosted if e["event"] == "cell_verdict"
               and e.get("reason") == "rate_limited"]
    assert all(e["verdict"] == "INVALID" for e in limited)

    b = run_cli("board", str(cdir))
    assert b.returncode == 0, b.stderr
    board = json.loads((cdir / "board.json").read_text())
    assert [(r["model"], r["arm"]) for r in board["rows"]] == [
        ("sim-alpha", "demo-nothink"), ("sim-alpha", "demo-think"),
        ("sim-beta", "demo-nothink"), ("sim-beta", "demo-think"),
        ("sim-pro-1", "hosted-default")]
    costs = {r["model"]: r["cost"]["basis"] for r in board["rows"]}
    assert costs == {"sim-alpha": "unpriced", "sim-beta": "unpriced", "sim-pro-1": "buckets"}
    golden = GOLDEN / "board-campaign.json"
    text = normalise_board((cdir / "board.json").read_text(), cdir)
    if os.environ.get("UPDATE_GOLDEN") or not golden.exists():
        golden.write_text(text)
    assert text == golden.read_text()


@pytest.mark.slow
def test_kill_9_of_the_campaign_then_resume_counts_every_cell_once(tmp_path: Path) -> None:
    path = roster(tmp_path, None, name="resumable")
    cdir = tmp_path / "campaign"
    p = subprocess.Popen([sys.executable, "-m", "autopilot.cli", "campaign", str(path),
                          "--state-dir", str(cdir), "--quiet"], env=cli_env(), cwd=ROOT,
                         stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        wait_for(lambda: (cdir / "beta" / "journal.jsonl").exists() and any(
            e["event"] == "cell_verdict" for e in read_events(cdir / "beta" / "journal.jsonl")
            .events), what="beta under way")
        p.kill()  # kill -9: the campaign has no chance to stop its entry
        p.wait()
    finally:
        if p.poll() is None:
            p.kill()
            p.wait()
    # Its entry goes with it (PR_SET_PDEATHSIG), so nothing drives beta on alone.
    beta_pid = next(e["pid"] for e in campaign_events(cdir)
                    if e["event"] == "entry_started" and e["entry"] == "beta")
    wait_for(lambda: not Path(f"/proc/{beta_pid}").exists() or
             "zombie" in Path(f"/proc/{beta_pid}/status").read_text().lower(),
             what="beta's supervisor gone with the campaign")
    r = run_cli("campaign", str(path), "--state-dir", str(cdir), "--quiet")
    assert r.returncode == 0, r.stdout + r.stderr[-2000:] + entry_logs(cdir)
    evs = campaign_events(cdir)
    assert [e["entry"] for e in evs if e["event"] == "entry_skipped"] == ["alpha"]
    for entry in ("alpha", "beta"):
        counted_once(cdir / entry)


def test_a_second_campaign_driver_exits_3(tmp_path: Path) -> None:
    path = roster(tmp_path, None, name="locked")
    cdir = tmp_path / "campaign"
    holder = subprocess.Popen([sys.executable, "-c", (
        "import sys, time; from pathlib import Path; from autopilot.state.lock import RunLock\n"
        "lk = RunLock(Path(sys.argv[1])); lk.acquire(); print('HELD', flush=True); "
        "time.sleep(60)"), str(cdir)], stdout=subprocess.PIPE, text=True, cwd=ROOT)
    try:
        assert holder.stdout.readline().strip() == "HELD"
        r = run_cli("campaign", str(path), "--state-dir", str(cdir), "--quiet")
        assert r.returncode == 3 and "AUTOPILOT_ABORTED_DOUBLE_DRIVE" in r.stderr
    finally:
        holder.kill()
        holder.wait()


def make_run(tmp: Path, name: str, overlay: dict) -> Path:
    state = tmp / name
    over = write_overlay(tmp / f"{name}.json", {"vars": {"think_secs": "0"}, **overlay})
    r = run_cli("--preset", "demo", "--target-n", "1", "--config", str(over), "--state-dir",
                str(state), "--quiet")
    assert r.returncode in (0, 1), r.stderr
    return state


def test_a_board_of_runs_with_different_task_tables_is_refused_unless_mixed(
        tmp_path: Path) -> None:
    a = make_run(tmp_path, "a", {"model": "m-a", "tasks": [{"id": "p1_bugfix"}]})
    b = make_run(tmp_path, "b", {"model": "m-b", "tasks": [{"id": "p1_bugfix"},
                                                           {"id": "p2_extract"}]})
    r = run_cli("board", str(a), str(b), "--out", str(tmp_path))
    assert r.returncode == 2 and "task tables differ" in r.stderr
    assert not (tmp_path / "board.json").exists()
    r = run_cli("board", str(a), str(b), "--out", str(tmp_path), "--allow-mixed")
    assert r.returncode == 0, r.stderr
    board = json.loads((tmp_path / "board.json").read_text())
    assert board["mixed"]["tasks"] == {str(a): ["p1_bugfix"],
                                       str(b): ["p1_bugfix", "p2_extract"]}
    row_a = next(r for r in board["rows"] if r["model"] == "m-a")
    assert row_a["tasks"]["p2_extract"] == "not_applicable"
    assert (row_a["cost"]["usd"], row_a["cost"]["basis"]) == (None, "unpriced")
    assert "**MIXED**" in (tmp_path / "board.md").read_text()


HOSTILE_MODEL = "<img src=x onerror=document.body.dataset.pwned=1>|x\x1b[31m[link=javascript:a]"


def test_hostile_model_names_are_escaped_in_every_medium(tmp_path: Path) -> None:
    run = make_run(tmp_path, "h", {"model": HOSTILE_MODEL, "tasks": [{"id": "p1_bugfix"}]})
    assert run_cli("board", str(run), "--out", str(tmp_path)).returncode == 0
    md = (tmp_path / "board.md").read_text()
    assert "<img" not in md and "&lt;img" in md and "\x1b" not in md
    assert "\\|x" in md  # the pipe cannot break the table
    term = run_cli("--board", str(run), "--no-color", "--width", "300", prog="dashboard")
    assert term.returncode == 0 and "\x1b" not in term.stdout
    assert "[link=javascript:a]" in term.stdout  # shown as text, not a link
    page = tmp_path / "board.html"
    assert run_cli("--board", str(run), "--html", str(page), prog="dashboard").returncode == 0
    html = page.read_text()
    assert "<img" not in html and "&lt;img" in html
    js = json.loads(run_cli("--board", str(run), "--json", prog="dashboard").stdout)
    assert js["rows"][0]["model"] == HOSTILE_MODEL  # JSON keeps the value, escaped by JSON
    dom = chromium(tmp_path, page.as_uri(), "--dump-dom").stdout
    assert '<table id="board">' in dom and not re.search(r"<body[^>]*data-pwned", dom)


def test_a_run_budget_stops_launching_and_ends_incomplete(tmp_path: Path) -> None:
    from autopilot.state.budget import of_events

    state = tmp_path / "state"
    over = write_overlay(tmp_path / "o.json", {"vars": {"think_secs": "0"},
                                               "run": {"concurrency": 1},
                                               "budget": {"tokens": 300}})
    args = ["--preset", "demo", "--target-n", "2", "--config", str(over), "--state-dir",
            str(state), "--quiet"]
    r = run_cli(*args)
    assert r.returncode == 1
    assert r.stdout.strip().splitlines()[-1].startswith(
        "AUTOPILOT_INCOMPLETE budget reached: ")
    evs = read_events(state / "journal.jsonl").events
    assert any(e["event"] == "milestone" and e["kind"] == "budget_reached" for e in evs)
    spent = of_events(read_events(state / "journal.jsonl").typed())
    ran = sum(e["event"] == "cell_started" for e in evs)
    assert spent.tokens >= 300 and ran < 24  # it stopped launching
    status = json.loads((state / "status.json").read_text())
    assert status["spend"]["prompt_tokens"] == spent.prompt
    r = run_cli(*args)  # resumed: still past the budget, so nothing more is launched
    assert r.returncode == 1
    assert sum(e["event"] == "cell_started" for e in
               read_events(state / "journal.jsonl").events) == ran


def test_a_campaign_budget_keeps_further_entries_from_starting(tmp_path: Path) -> None:
    path = roster(tmp_path, None, name="budgeted")
    path.write_text(path.read_text().replace("target_n = 2\n",
                                             "target_n = 2\nbudget_tokens = 100\n"))
    cdir = tmp_path / "campaign"
    r = run_cli("campaign", str(path), "--state-dir", str(cdir), "--quiet")
    assert r.returncode == 1 and "CAMPAIGN_INCOMPLETE beta" in r.stdout
    evs = campaign_events(cdir)
    assert [e["entry"] for e in evs if e["event"] == "entry_started"] == ["alpha"]
    assert any(e["event"] == "campaign_budget_reached" for e in evs)


def test_board_publish_commits_to_the_results_branch(tmp_path: Path) -> None:
    run = make_run(tmp_path, "p", {"model": "m-p", "tasks": [{"id": "p1_bugfix"}]})
    repo = tmp_path / "results"
    repo.mkdir()
    git_env = {"GIT_AUTHOR_NAME": "t", "GIT_AUTHOR_EMAIL": "t@t", "GIT_COMMITTER_NAME": "t",
               "GIT_COMMITTER_EMAIL": "t@t", "PATH": "/usr/bin:/bin"}
    subprocess.run(["git", "init", "-q", str(repo)], check=True)
    subprocess.run(["git", "-C", str(repo), "commit", "-q", "--allow-empty", "-m", "init"],
                   check=True, env=git_env)
    r = run_cli("board", str(run), "--out", str(tmp_path), "--publish", "--results-repo",
                str(repo))
    assert r.returncode == 0, r.stderr
    branch = re.search(r"published on (\S+)", r.stdout).group(1)
    shown = subprocess.run(["git", "-C", str(repo), "show",
                            f"{branch}:bench-results/board/board.md"],
                           capture_output=True, text=True, check=True).stdout
    assert shown == (tmp_path / "board.md").read_text() and "m-p" in shown
