"""Fail-closed trust: every INVALID reason from real on-disk fixtures, retry then
quarantine with real subprocess cells, the harness-break alarm, preflight, validate,
per-arm grading, secret hygiene."""

from __future__ import annotations

import json
import os
import sys
from collections import Counter
from pathlib import Path

import anyio
import pytest
from conftest import ROOT, cli_env, events, run_cli, write_overlay
from provider_fake import FakeProvider

from autopilot.cell.grading import judge_cell
from autopilot.cell.validity import RunOutcome
from autopilot.loader import load_preset

PRESET = str(ROOT / "tests" / "presets" / "fake-provider.toml")


def origin_summary(tokens: int = 812, model: str = "demo-sim-1") -> dict:
    return {"finish_reason": "stop", "iterations": 7, "total_prompt_tokens": 5000,
            "total_completion_tokens": tokens, "elapsed_s": 41.2, "model": model}


def make_cell(tmp: Path, *, summary: dict | None = None, receipt_model: str = "demo-sim-1",
              answer: str | None = "correct", grade_text: str | None = None) -> dict[str, str]:
    out = tmp / "cells" / "p1_bugfix_demo-think_v1"
    out.mkdir(parents=True)
    if summary is not None:
        (out / "summary.json").write_text(json.dumps(summary))
    (out / "receipt.json").write_text(json.dumps({"model": receipt_model}))
    if answer is not None:
        (out / "answer.txt").write_text(answer)
    ctx = {"cell": "p1_bugfix_demo-think_v1", "task": "p1_bugfix", "attempt": "1",
           "output_dir": str(out),
           "grade_file": str(out / "grade.json"), "state_dir": str(tmp), "model": "demo-sim-1",
           "python": sys.executable, "grader_fail_first": "0"}
    if grade_text is not None:
        ctx["_grade_text"] = grade_text
    return ctx


def judge(tmp: Path, ctx: dict[str, str], outcome: RunOutcome, grader: list[str] | None = None):
    overlay = {}
    if grader is not None:
        overlay["grader"] = {"argv": grader}
    over = write_overlay(tmp / "over.json", overlay)
    preset = load_preset("demo", overlay=str(over))
    return anyio.run(judge_cell, preset, ctx, outcome, tmp / "grade.log")


FAIL_GRADER = ["{python}", "-c", "import sys; sys.exit(1)"]
BAD_JSON_GRADER = ["{python}", "-c",
                   "import sys; open(sys.argv[1], 'w').write('{{not json')", "{grade_file}"]
WORD_GRADER = ["{python}", "-c",
               "import sys, json; json.dump({{'verdict': 'MAYBE'}}, open(sys.argv[1], 'w'))",
               "{grade_file}"]
MISSING_GRADER = ["{python}", "-m", "autopilot.demo.grader", "{output_dir}", "--out",
                  "{grade_file}"]


@pytest.mark.parametrize(
    ("fixture", "outcome", "grader", "label"),
    [
        ({"summary": origin_summary()}, RunOutcome(0, completion=True), None, "PASS"),
        ({"summary": origin_summary(), "answer": "wrong"}, RunOutcome(0, completion=True),
         None, "FAIL"),
        ({}, RunOutcome(None, killed="stall"), None, "INVALID(stall)"),
        ({}, RunOutcome(None, killed="deadline"), None, "INVALID(deadline)"),
        ({}, RunOutcome(1), None, "INVALID(harness_crash)"),
        ({}, RunOutcome(0), None, "INVALID(missing_output)"),
        ({}, RunOutcome(3, endpoint_down=True), None, "INVALID(endpoint_down)"),
        ({"summary": origin_summary()}, RunOutcome(0, completion=True), FAIL_GRADER,
         "INVALID(grader_failed)"),
        ({"summary": origin_summary()}, RunOutcome(0, completion=True), BAD_JSON_GRADER,
         "INVALID(malformed_grade)"),
        ({"summary": origin_summary()}, RunOutcome(0, completion=True), WORD_GRADER,
         "INVALID(malformed_grade)"),
        ({"summary": origin_summary(), "answer": None}, RunOutcome(0, completion=True),
         MISSING_GRADER, "FAIL"),  # the model shipped nothing: its failure, not ours
        ({"summary": origin_summary(tokens=0)}, RunOutcome(0, completion=True), None,
         "INVALID(zero_tokens)"),
        ({"summary": {k: v for k, v in origin_summary().items()
                      if k != "total_completion_tokens"}},
         RunOutcome(0, completion=True), None, "INVALID(zero_tokens)"),
        ({"summary": origin_summary(), "receipt_model": "other-model"},
         RunOutcome(0, completion=True), None, "INVALID(arm_mismatch)"),
    ],
)
def test_every_reason_from_disk(tmp_path: Path, fixture, outcome, grader, label) -> None:
    ctx = make_cell(tmp_path, **fixture)
    assert judge(tmp_path, ctx, outcome, grader).label() == label


def test_missing_output_is_a_fail_with_caveat_that_feeds_the_streak(tmp_path: Path) -> None:
    ctx = make_cell(tmp_path, summary=origin_summary(), answer=None)
    c = judge(tmp_path, ctx, RunOutcome(0, completion=True), MISSING_GRADER)
    assert (c.verdict, c.word, c.caveat) == ("FAIL", "MISSING_OUTPUT", "no deliverable")
    assert c.harness_break  # three in a row still raise harness_anomaly


def test_api_error_finish_is_invalid_not_a_fail(tmp_path: Path) -> None:
    summary = {**origin_summary(), "finish_reason": "api_error: <urlopen error refused>"}
    ctx = make_cell(tmp_path, summary=summary, answer=None)
    over = write_overlay(tmp_path / "over.json", {"trust": {"finish": {}}})
    preset = load_preset("demo", overlay=str(over))
    c = anyio.run(judge_cell, preset, ctx, RunOutcome(0, completion=True), tmp_path / "g.log")
    assert c.label() == "INVALID(api_error)" and "urlopen error refused" in c.detail
    assert not (tmp_path / "g.log").exists()  # no grader ran on a broken run


COUNTING_GRADER = [
    "{python}", "-c",
    "import json, os, sys\n"
    "n = int(os.environ['AUTOPILOT_GRADE_TRY'])\n"
    "open(sys.argv[2], 'a').write(str(n) + '\\n')\n"
    "sys.exit(1) if n < int(sys.argv[3]) else "
    "json.dump({{'verdict': 'PASS'}}, open(sys.argv[1], 'w'))",
    "{grade_file}", "{state_dir}/tries.txt", "{succeed_on}"]


@pytest.mark.parametrize(("succeed_on", "label", "tries"), [
    ("2", "PASS", ["1", "2"]), ("3", "PASS", ["1", "2", "3"]),
    ("9", "INVALID(grader_failed)", ["1", "2", "3"])])
def test_grader_failure_regrades_the_same_outputs(tmp_path: Path, succeed_on: str, label: str,
                                                  tries: list[str]) -> None:
    ctx = {**make_cell(tmp_path, summary=origin_summary()), "succeed_on": succeed_on}
    over = write_overlay(tmp_path / "over.json", {"grader": {"argv": COUNTING_GRADER},
                                                  "vars": {"succeed_on": succeed_on}})
    preset = load_preset("demo", overlay=str(over))
    retried = []
    c = anyio.run(lambda: judge_cell(preset, ctx, RunOutcome(0, completion=True),
                                     tmp_path / "g.log", on_retry=lambda n, c: retried.append(n)))
    assert c.label() == label
    assert (tmp_path / "tries.txt").read_text().split() == tries  # retries=2: 3 tries at most
    assert retried == [int(t) for t in tries[:-1]]
    assert c.grade_side == (label != "PASS")


def test_grader_with_missing_requirement_is_unavailable_without_running(tmp_path: Path) -> None:
    ctx = make_cell(tmp_path, summary=origin_summary())
    helper = tmp_path / "code_task_grader.py"
    over = write_overlay(tmp_path / "over.json", {"tasks": [
        {"id": "p1_bugfix", "grader_requires": [str(helper)]}]})
    preset = load_preset("demo", overlay=str(over))
    c = anyio.run(judge_cell, preset, ctx, RunOutcome(0, completion=True), tmp_path / "g.log")
    assert c.label() == "INVALID(grader_unavailable)" and str(helper) in c.detail
    assert c.grade_side and not (tmp_path / "g.log").exists()
    helper.write_text("# now it is there\n")
    c = anyio.run(judge_cell, preset, ctx, RunOutcome(0, completion=True), tmp_path / "g.log")
    assert c.label() == "PASS"


def test_teardown_masked_is_graded_and_flagged(tmp_path: Path) -> None:
    ctx = make_cell(tmp_path, summary=origin_summary())
    c = judge(tmp_path, ctx, RunOutcome(-9, killed="teardown", completion=True))
    assert c.label() == "PASS" and c.teardown_masked


@pytest.mark.slow
def test_grader_fails_twice_then_valid_without_rerunning_the_harness(state_dir: Path,
                                                                     tmp_path: Path) -> None:
    cell = "p1_bugfix_demo-nothink_v1"
    over = write_overlay(tmp_path / "o.json", {
        "vars": {"think_secs": "0"}, "tasks": [{"id": "p1_bugfix"}, {"id": "p2_extract"}],
        "grader": {"argv": ["{python}", "-m", "autopilot.demo.grader", "{output_dir}", "--out",
                            "{grade_file}", "--fail-cells", cell, "--fail-until-try", "3"]}})
    r = run_cli("--preset", "demo", "--target-n", "1", "--config", str(over),
                "--state-dir", str(state_dir), "--quiet")
    assert r.returncode == 0, r.stderr[-2000:]
    evs = events(state_dir)
    retries = [(e["attempt"], e["tried"], e["reason"]) for e in evs
               if e["event"] == "grade_retry" and e["cell"] == cell]
    assert retries == [(1, 1, "grader_failed"), (1, 2, "grader_failed")]
    verdicts = [(e["attempt"], e["verdict"]) for e in evs
                if e["event"] == "cell_verdict" and e["cell"] == cell]
    assert len(verdicts) == 1 and verdicts[0][0] == 1 and verdicts[0][1] in ("PASS", "FAIL")
    assert sum(e["event"] == "cell_started" and e["cell"] == cell for e in evs) == 1
    assert not (state_dir / "attempts" / cell).exists()  # no attempt was spent
    status = json.loads((state_dir / "status.json").read_text())
    assert status["trust"]["retried_cells"] == 0 and status["trust"]["grade_retries"] == 2
    assert status["trust"]["invalid_by_reason"] == {}


@pytest.mark.slow
def test_broken_grader_leaves_cells_ungraded_then_regrade_fixes_them(state_dir: Path,
                                                                     tmp_path: Path) -> None:
    cell = "p1_bugfix_demo-nothink_v1"
    broken = ["{python}", "-m", "autopilot.demo.grader", "{output_dir}", "--out",
              "{grade_file}", "--fail-cells", cell, "--fail-until-attempt", "99"]
    over = tmp_path / "o.json"
    write_overlay(over, {"vars": {"think_secs": "0"},
                         "tasks": [{"id": "p1_bugfix"}, {"id": "p2_extract"}],
                         "grader": {"argv": broken}})
    r = run_cli("--preset", "demo", "--target-n", "1", "--config", str(over),
                "--state-dir", str(state_dir), "--quiet")
    assert r.returncode == 1
    last = r.stdout.strip().splitlines()[-1]
    assert last.startswith("AUTOPILOT_INCOMPLETE 1 ungraded") and cell in last
    assert "autopilot regrade" in last
    evs = events(state_dir)
    assert not [e for e in evs if e["event"] == "cell_quarantined"]
    assert sum(e["event"] == "cell_started" and e["cell"] == cell for e in evs) == 1
    assert sum(e["event"] == "grade_retry" and e["cell"] == cell for e in evs) == 2
    status = json.loads((state_dir / "status.json").read_text())
    assert status["phase"] == "INCOMPLETE" and status["totals"]["ungraded"] == 1
    assert status["trust"]["ungraded_cells"] == 1
    one = run_cli("--state-dir", str(state_dir), "--oneline", prog="dashboard")
    assert " U1 " in one.stdout  # the one-line view shows it, not just the JSON
    assert status["totals"]["pass"] + status["totals"]["fail"] == 3  # never counted
    v = run_cli("validate", "--state-dir", str(state_dir))
    assert v.returncode == 1 and cell in v.stdout

    # The grader is fixed (regrade is given the overlay; it never takes one from plan.json).
    write_overlay(over, {"vars": {"think_secs": "0"},
                         "tasks": [{"id": "p1_bugfix"}, {"id": "p2_extract"}],
                         "grader": {"argv": broken[:-4]}})
    g = run_cli("regrade", "--task", "p1_bugfix", "--state-dir", str(state_dir),
                "--config", str(over))
    assert g.returncode == 0, g.stderr
    assert f"{cell} (attempt 1): ungraded(grader_failed) -> " in g.stdout
    evs2 = events(state_dir)
    regraded = [e for e in evs2 if e["event"] == "cell_verdict" and e.get("regrade")]
    assert {e["cell"] for e in regraded} == {"p1_bugfix_demo-nothink_v1",
                                             "p1_bugfix_demo-think_v1"}
    assert all(e["attempt"] == 1 and e["verdict"] in ("PASS", "FAIL") for e in regraded)
    assert sum(e["event"] == "cell_started" for e in evs2) == 4  # no harness re-ran
    status = json.loads((state_dir / "status.json").read_text())
    assert status["totals"]["done"] == 4 and status["totals"]["ungraded"] == 0
    assert status["trust"]["valid_cells"] == 4  # each cell counted once
    # the run itself now completes without launching anything (the grader's argv is part
    # of the plan's identity, so the fixed one is a declared plan change)
    r2 = run_cli("--preset", "demo", "--target-n", "1", "--config", str(over),
                 "--state-dir", str(state_dir), "--quiet", "--allow-plan-change")
    assert r2.returncode == 0 and r2.stdout.strip().endswith("AUTOPILOT_COMPLETE")
    assert sum(e["event"] == "cell_started" for e in events(state_dir)) == 4


@pytest.mark.slow
def test_harness_break_alarm_once_per_streak(state_dir: Path, tmp_path: Path) -> None:
    # Grading tries 1-3 (one cell, re-graded twice) and 7-9 (another) fail: two streaks of
    # fresh grading failures, two alarms; try 4 failing alone then a success resets.
    over = write_overlay(tmp_path / "o.json", {
        "vars": {"think_secs": "0"}, "run": {"concurrency": 1},
        "grader": {"argv": ["{python}", "-m", "autopilot.demo.grader", "{output_dir}", "--out",
                            "{grade_file}", "--counter", "{state_dir}/grader-count",
                            "--fail-invocations", "1-4,7-9"]}})
    r = run_cli("--preset", "demo", "--target-n", "1", "--config", str(over),
                "--state-dir", str(state_dir), "--quiet")
    assert r.returncode == 1 and "2 ungraded" in r.stdout, r.stdout
    alarms = [e for e in events(state_dir)
              if e["event"] == "milestone" and e["kind"] == "harness_anomaly"]
    assert len(alarms) == 2
    assert alarms[0]["priority"] == "emergency"
    status = json.loads((state_dir / "status.json").read_text())
    assert status["anomaly"]["alarms"] == 2


@pytest.mark.slow
def test_anomaly_pause_stops_launching(state_dir: Path, tmp_path: Path) -> None:
    # A harness that crashes every time: three crashes in a row, then nothing more launches.
    over = write_overlay(tmp_path / "o.json", {
        "vars": {"think_secs": "0"}, "run": {"concurrency": 1},
        "trust": {"on_anomaly": "pause"},
        "harness": {"argv": ["{python}", "-c", "import sys; sys.exit(3)"]}})
    r = run_cli("--preset", "demo", "--target-n", "1", "--config", str(over),
                "--state-dir", str(state_dir), "--quiet")
    assert r.returncode == 1
    assert "paused after a harness-break streak of 3" in r.stdout
    evs = events(state_dir)
    assert sum(e["event"] == "cell_started" for e in evs) == 3
    assert [e["kind"] for e in evs if e["event"] == "milestone"].count("harness_anomaly") == 1
    reasons = {e["reason"] for e in evs if e["event"] == "cell_verdict"}
    assert reasons == {"harness_crash"}


@pytest.mark.slow
def test_per_arm_grading(state_dir: Path, tmp_path: Path) -> None:
    over = write_overlay(tmp_path / "o.json", {"vars": {"think_secs": "0"},
                                                "grader": {"mode": "per-arm"}})
    r = run_cli("--preset", "demo", "--target-n", "1", "--config", str(over),
                "--state-dir", str(state_dir), "--quiet")
    assert r.returncode == 0, r.stderr[-2000:]
    evs = events(state_dir)
    kinds = [e["event"] for e in evs]
    assert kinds.count("cell_ran") == 12 and kinds.count("arm_grading") == 2
    first_grading = kinds.index("arm_grading")
    nothink_ran = [i for i, e in enumerate(evs) if e["event"] == "cell_ran"
                   and "nothink" in e["cell"]]
    assert max(nothink_ran) < first_grading  # graded only once the whole arm ran
    assert sum(e["event"] == "cell_verdict" for e in evs) == 12


def _nothing_written(state_dir: Path) -> None:
    assert not (state_dir / "journal.jsonl").exists()
    assert not (state_dir / "endpoint.log").exists()


def test_preflight_missing_key(state_dir: Path, tmp_path: Path) -> None:
    fake = FakeProvider("k-123456")
    try:
        r = run_cli("--preset", PRESET, "--config", str(fake.overlay(tmp_path / "o.json")),
                    "--state-dir", str(state_dir))
    finally:
        fake.close()
    assert r.returncode == 2 and "FAKE_PROVIDER_KEY" in r.stderr
    _nothing_written(state_dir)


@pytest.mark.parametrize(("key", "model", "needle"), [
    ("wrong-key-999", "sim-pro-1", "rejected the key in $FAKE_PROVIDER_KEY (HTTP 401)"),
    ("k-123456", "sim-pro-3", "(closest: sim-pro-2, sim-pro-1"),
])
def test_preflight_live_probe(state_dir: Path, tmp_path: Path, key: str, model: str,
                              needle: str) -> None:
    fake = FakeProvider("k-123456")
    try:
        over = fake.overlay(tmp_path / "o.json", model=model)
        r = run_cli("--preset", PRESET, "--config", str(over), "--state-dir", str(state_dir),
                    env=cli_env(FAKE_PROVIDER_KEY=key))
    finally:
        fake.close()
    assert r.returncode == 2, r.stderr
    assert needle in r.stderr and len(r.stderr.strip().splitlines()) == 1
    assert key not in r.stderr
    _nothing_written(state_dir)


def test_preflight_harness_missing_and_docker_unreachable(state_dir: Path,
                                                          tmp_path: Path) -> None:
    over = write_overlay(tmp_path / "o.json", {"harness": {"argv": ["/nonexistent/harness"]}})
    r = run_cli("--preset", "demo", "--config", str(over), "--state-dir", str(state_dir))
    assert r.returncode == 2 and "harness program /nonexistent/harness not found" in r.stderr
    _nothing_written(state_dir)
    over = write_overlay(tmp_path / "o.json", {"preflight": {"docker": True}})
    r = run_cli("--preset", "demo", "--config", str(over), "--state-dir", str(state_dir),
                env=cli_env(DOCKER_HOST=f"unix://{tmp_path}/no-docker.sock"))
    assert r.returncode == 2 and "Docker unreachable" in r.stderr
    _nothing_written(state_dir)


def test_key_from_dotenv_and_secret_never_written(state_dir: Path, tmp_path: Path) -> None:
    secret = "sk-SECRET-planted-8f3a9c"
    fake = FakeProvider(secret)
    work = tmp_path / "work"
    work.mkdir()
    (work / ".env").write_text(f"FAKE_PROVIDER_KEY={secret}\n")
    try:
        import subprocess

        over = fake.overlay(tmp_path / "o.json")
        r = subprocess.run(
            [sys.executable, "-m", "autopilot.cli", "--preset", PRESET, "--config", str(over),
             "--state-dir", str(state_dir)],
            cwd=work, env={**cli_env(), "PYTHONPATH": str(ROOT)}, capture_output=True,
            text=True, timeout=120)
    finally:
        fake.close()
    assert r.returncode == 0, r.stderr[-2000:]
    assert secret not in r.stdout + r.stderr
    for path in state_dir.rglob("*"):
        if path.is_file():
            assert secret not in path.read_text(errors="replace"), path
    assert Counter(e["verdict"] for e in events(state_dir)
                   if e["event"] == "cell_verdict")["INVALID"] == 0


def test_dry_run_prints_plan_and_writes_nothing(state_dir: Path) -> None:
    r = run_cli("--preset", "demo", "--target-n", "4", "--dry-run", "--state-dir", str(state_dir))
    assert r.returncode == 0
    assert "cells: 48 total | 0 valid | 48 pending | 0 invalid | 0 quarantined" in r.stdout
    assert "arms (2): demo-nothink, demo-think" in r.stdout
    assert not state_dir.exists()


@pytest.mark.slow
def test_validate_exit_codes_and_armless_dirs(state_dir: Path, tmp_path: Path) -> None:
    over = write_overlay(tmp_path / "o.json", {"vars": {"think_secs": "0"}})
    assert run_cli("--preset", "demo", "--target-n", "1", "--config", str(over),
                   "--state-dir", str(state_dir), "--quiet").returncode == 0
    ok = run_cli("validate", "--state-dir", str(state_dir))
    assert ok.returncode == 0 and "INVALID" not in ok.stdout
    stray = state_dir / "cells" / "p1_bugfix_None_v1"
    stray.mkdir()
    (stray / "grade.json").write_text('{"verdict": "PASS"}')
    # Written after the run: another run's (or a person's), counted and not judged ...
    later = run_cli("validate", "--state-dir", str(state_dir))
    assert later.returncode == 0 and "ARM-LESS" not in later.stdout
    assert "1 directory beside the cells' outputs written outside" in later.stdout
    # ... but written while one of this run's attempts ran, as the origin's lost arm did.
    during = (state_dir / "cells" / "p1_bugfix_demo-think_v1" / "summary.json").stat()
    os.utime(stray / "grade.json", (during.st_atime, during.st_mtime))
    bad = run_cli("validate", "--state-dir", str(state_dir))
    assert bad.returncode == 1 and "ARM-LESS DIRECTORY" in bad.stdout
    stray.joinpath("grade.json").unlink()
    victim = state_dir / "cells" / "p2_extract_demo-think_v1" / "grade.json"
    victim.write_text("{truncated")
    bad = run_cli("validate", "--state-dir", str(state_dir))
    assert bad.returncode == 1
    assert "p2_extract_demo-think_v1" in bad.stdout and "malformed_grade" in bad.stdout
    assert run_cli("validate", "--state-dir", str(tmp_path / "none")).returncode == 2


def test_validate_leaves_another_runs_cells_on_a_shared_checkout_alone(tmp_path: Path) -> None:
    """Two runs, one after the other, write into one harness checkout (claims keep them
    from doing so at once): the first run's validate does not call the second's cells
    arm-less, and the second's does not call the first's."""
    logs = tmp_path / "checkout" / "logs"
    runs = {}
    for name, task in (("a", "p1_bugfix"), ("b", "p2_extract")):
        over = write_overlay(tmp_path / f"{name}.json", {
            "vars": {"think_secs": "0"}, "tasks": [{"id": task}], "baseline": None,
            "harness": {"output_dir": str(logs) + "/{cell}"}})
        runs[name] = tmp_path / f"state-{name}"
        r = run_cli("--preset", "demo", "--target-n", "1", "--config", str(over),
                    "--state-dir", str(runs[name]), "--quiet")
        assert r.returncode == 0, r.stderr[-2000:]
    assert {d.name.split("_demo")[0] for d in logs.iterdir() if d.is_dir()} == {
        "p1_bugfix", "p2_extract"}
    for name in ("a", "b"):
        v = run_cli("validate", "--state-dir", str(runs[name]))
        assert v.returncode == 0, v.stdout
        assert "ARM-LESS" not in v.stdout
        assert "2 directories beside the cells' outputs written outside" in v.stdout


def test_pin_drift_warns_or_refuses(state_dir: Path, tmp_path: Path) -> None:
    pinned = tmp_path / "harness.bin"
    pinned.write_text("v1")
    over = write_overlay(tmp_path / "o.json", {"preflight": {"pins": {str(pinned): "0" * 64}}})
    r = run_cli("--preset", "demo", "--config", str(over), "--state-dir", str(state_dir),
                "--dry-run")
    assert r.returncode == 0 and "warning: pin drift" in r.stdout
    over = write_overlay(tmp_path / "o.json", {"preflight": {"pins": {str(pinned): "0" * 64},
                                                              "pin": "strict"}})
    r = run_cli("--preset", "demo", "--config", str(over), "--state-dir", str(state_dir))
    assert r.returncode == 2 and "pin = strict" in r.stderr
    _nothing_written(state_dir)
