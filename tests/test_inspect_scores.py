"""Inspect's score semantics, as Inspect applies them, with real Inspect: `inspect eval`
on tasks of our own (tests/inspect_fixture/scores.py) with Inspect's own ``mockllm``
model (a fake model that Inspect ships: the scorers here do not read its words), then
the preset's grader on that log. Unscored stays unscored, a dict score is decided by the
part the preset names, a task's own epochs and reducer stand, and preflight finds a
sample without an id under the number Inspect gives it."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import ROOT, wait_for

pytestmark = pytest.mark.timeout(300)
TASKS = ROOT / "tests" / "inspect_fixture" / "scores.py"


@pytest.fixture(autouse=True)
def need_inspect() -> None:
    try:
        import inspect_ai  # noqa: F401
    except ImportError:
        pytest.skip("inspect-ai not installed (pip install -c constraints.txt '.[inspect]')")


def inspect_eval(tmp: Path, task: str, *extra: str) -> Path:
    """Plain `inspect eval`, as its users run it; the log dir as inspect_run lays it."""
    out = tmp / task
    # In a network namespace of its own with no network (root: unshare -n): whatever
    # Inspect might try to reach, nothing leaves this machine.
    jail = ["unshare", "-n"] if os.geteuid() == 0 and shutil.which("unshare") else []
    r = subprocess.run([*jail, sys.executable, "-m", "inspect_ai", "eval", f"{TASKS}@{task}",
                        "--model", "mockllm/model", "--log-dir", str(out / "logs"),
                        "--log-format", "eval", "--display", "plain", *extra],
                       capture_output=True, text=True, timeout=240,
                       env={"PATH": "/usr/bin:/bin", "HOME": str(tmp),
                            "XDG_DATA_HOME": str(tmp / "data")})
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:]
    return out


def grade(out: Path, sample: str, *extra: str) -> dict[str, object]:
    from autopilot.harnesses.inspect_grade import main

    path = out / f"grade-{sample}.json"
    assert main(["--out", str(out), "--grade-file", str(path), "--sample-id", sample,
                 *extra]) == 0

    def no_nan(word: str) -> None:
        raise AssertionError(f"{path} holds {word}: not JSON")

    return dict(json.loads(path.read_text(), parse_constant=no_nan))


def test_a_sample_inspect_leaves_unscored_is_unscored_never_fail(tmp_path: Path) -> None:
    out = inspect_eval(tmp_path, "unscored")
    from inspect_ai.log import read_eval_log

    [log] = (out / "logs").glob("*.eval")
    metric = read_eval_log(str(log)).results.scores[0].metrics["mean"].value
    assert metric == 1.0  # Inspect's own mean skips the unscored sample
    first = grade(out, "1")
    assert first["verdict"] == "UNSCORED" and first["score"] is None
    assert grade(out, "2")["verdict"] == "PASS"
    from autopilot.loader import load_preset

    rule = load_preset("inspect").grader.verdicts["UNSCORED"]
    assert (rule.verdict, rule.reason) == ("INVALID", "unscored")


def test_a_dict_score_is_decided_by_the_part_the_preset_names(tmp_path: Path) -> None:
    out = inspect_eval(tmp_path, "parts")
    assert grade(out, "1", "--score-key", "security")["verdict"] == "PASS"
    assert grade(out, "1", "--score-key", "utility")["verdict"] == "FAIL"
    unnamed = grade(out, "1")
    assert unnamed["verdict"] == "NO_SCORE"
    assert "has parts (security, utility): set vars.score_key" in str(unnamed["detail"])
    wrong = grade(out, "1", "--score-key", "safety")
    assert "has no part 'safety' (it has security, utility)" in str(wrong["detail"])


def test_a_tasks_own_epochs_and_reducer_stand(tmp_path: Path) -> None:
    out = inspect_eval(tmp_path, "epochs_max")
    got = grade(out, "q")
    # epoch 1 alone is wrong; the task's reducer (max over 3 epochs) says right
    assert (got["verdict"], got["epochs"], got["reducer"]) == ("PASS", 3, "max")
    cmd = (ROOT / "autopilot" / "harnesses" / "inspect_run.py").read_text()
    assert '"--epochs", "1"' not in cmd  # the harness no longer overrides them


def test_preflight_finds_samples_without_ids_as_inspect_numbers_them() -> None:
    from autopilot.harnesses.inspect_check import problems

    def cell(sample: str) -> dict[str, object]:
        return {"id": f"u_{sample}", "vars": {"inspect_file": str(TASKS),
                                             "inspect_task": "unscored", "sample": sample}}

    found = [p for p in problems([cell("1"), cell("2"), cell("02"), cell("*")])
             if "inspect-ai" not in p]  # (the installed version is another test's)
    assert found == []
    [missing] = [p for p in problems([cell("3")]) if "inspect-ai" not in p]
    assert missing == "task u_3: sample '3' is not in unscored (it has 1, 2)"


def test_a_cell_of_many_samples_carries_their_counts(tmp_path: Path) -> None:
    """The whole task (no sample id), a list or a glob as one cell: its grade is the
    samples' counts (what the views count), PASS when the share passed reaches the
    threshold; unscored and errored samples are counted apart, never as FAIL."""
    out = inspect_eval(tmp_path, "mixed")
    whole = grade(out, "", "--threshold", "0.7")
    assert (whole["verdict"], whole["items"], whole["score"]) == (
        "PASS", {"passed": 3, "scored": 4, "unscored": 0, "errored": 0}, 0.75)
    assert grade(out, "")["verdict"] == "FAIL"  # at the default threshold, 1.0
    some = grade(out, "1,4", "--threshold", "0.5")
    assert (some["verdict"], some["items"]["passed"], some["items"]["scored"]) == (
        "PASS", 1, 2)
    assert grade(out, "*")["items"] == {"passed": 3, "scored": 4, "unscored": 0,
                                        "errored": 0}
    half = inspect_eval(tmp_path, "unscored")
    got = grade(half, "")
    assert got["items"] == {"passed": 1, "scored": 1, "unscored": 1, "errored": 0}
    assert got["verdict"] == "PASS"


def test_the_ledger_counts_a_cells_items_and_ignores_forged_ones() -> None:
    from autopilot.plan import Cell
    from autopilot.state.ledger import Ledger

    cells = [Cell("t", "a-x", 1), Cell("t", "a-x", 2), Cell("u", "a-x", 1)]
    led = Ledger(cells)
    for cid, items in (("t_a-x_v1", {"passed": 17, "scored": 24, "unscored": 1}),
                       ("t_a-x_v2", {"passed": 9, "scored": 3}),  # more passed than scored
                       ("u_a-x_v1", {"passed": "1", "scored": 2})):  # not a count
        led.apply({"event": "cell_verdict", "cell": cid, "attempt": 1, "verdict": "PASS",
                   "items": items})
    summary = led.summary()
    assert summary.tasks[("a-x", "t")].items == {"passed": 17, "scored": 24,
                                                 "unscored": 1, "errored": 0}
    assert summary.tasks[("a-x", "u")].items is None
    assert summary.totals.items is not None and summary.totals.items["scored"] == 24
    assert (led.counts().items or {}).get("passed") == 17


def test_preflight_applies_the_presets_task_args_and_names_a_missing_published_task(
        ) -> None:
    from autopilot.harnesses.inspect_check import problems

    def cell(sample: str, **more: str) -> dict[str, object]:
        return {"id": f"l_{sample}", "vars": {"inspect_file": str(TASKS),
                                             "inspect_task": "levels", "sample": sample,
                                             **more}}

    def mine(found: list[str]) -> list[str]:
        return [p for p in found if "inspect-ai" not in p]

    assert mine(problems([cell("5")], ["-T", "count=5", "--limit", "9"])) == []
    assert mine(problems([cell("5")])) == [
        "task l_5: sample '5' is not in levels (it has 1, 2)"]
    # a task's own inspect_args replace the preset's
    assert mine(problems([cell("3", inspect_args="-T count=3")], ["-T", "count=1"])) == []
    [gone] = mine(problems([{"id": "g", "vars": {"inspect_task": "inspect_evals/nope_zz",
                                                  "sample": ""}}]))
    assert gone.startswith("task g: inspect_evals/nope_zz() fails")


def test_the_harness_runs_a_published_task_by_its_name_with_the_presets_flags(
        tmp_path: Path) -> None:
    """inspect_run's `inspect eval` command line (printed first, as it runs it)."""
    jail = ["unshare", "-n"] if os.geteuid() == 0 and shutil.which("unshare") else []
    r = subprocess.run([*jail, sys.executable, "-m", "autopilot.harnesses.inspect_run",
                        "--task", "inspect_evals/nope_zz", "--sample-id", "", "--model", "m",
                        "--base-url",
                        "http://127.0.0.1:9/v1", "--out", str(tmp_path / "o"),
                        "--inspect-args", "-T level=2 --limit 3", "--inspect-args", "",
                        "--sample-retries", "2",
                        "--", "--max-connections", "1"],
                       capture_output=True, text=True, timeout=240,
                       env={"PATH": "/usr/bin:/bin", "HOME": str(tmp_path)},
                       cwd=tmp_path)
    line = next(x for x in r.stdout.splitlines() if x.startswith("inspect_run: ["))
    cmd = json.loads(line.removeprefix("inspect_run: "))
    assert cmd[3:5] == ["eval", "inspect_evals/nope_zz"]
    assert cmd[-7:] == ["--retry-on-error=2", "-T", "level=2", "--limit", "3",
                        "--max-connections", "1"]
    assert r.returncode != 0  # no such task here: Inspect says so, no log
    one = subprocess.run([*jail, sys.executable, "-m", "autopilot.harnesses.inspect_run",
                          "--task", "inspect_evals/nope_zz", "--sample-id", "7", "--model",
                          "m", "--base-url", "http://127.0.0.1:9/v1", "--out",
                          str(tmp_path / "o1"), "--sample-retries", "2"],
                         capture_output=True, text=True, timeout=240,
                         env={"PATH": "/usr/bin:/bin", "HOME": str(tmp_path)}, cwd=tmp_path)
    # a one-sample cell: its error is the autopilot's to retry (an outage said as one)
    assert "--retry-on-error" not in next(x for x in one.stdout.splitlines()
                                          if x.startswith("inspect_run: ["))


def harness_attempt(state: Path, gate: Path, attempt: int, last_try: str = "0") -> Path:
    """One attempt of a whole-task cell of `flaky`, through the preset's harness
    (inspect_run) as the autopilot launches it, after moving the previous attempt's
    outputs aside as the autopilot does (attempts/<cell>/attempt-<k>). The task asks no
    model: the gateway URL is never dialled."""
    out = state / "cells" / "flaky_v1"
    if out.exists():
        out.rename(state / "attempts" / "flaky_v1" / f"attempt-{attempt - 1}")
    (state / "attempts" / "flaky_v1").mkdir(parents=True, exist_ok=True)
    jail = ["unshare", "-n"] if os.geteuid() == 0 and shutil.which("unshare") else []
    r = subprocess.run(
        [*jail, sys.executable, "-m", "autopilot.harnesses.inspect_run", "--task-file",
         str(TASKS), "--task", "flaky", "--sample-id", "", "--model", "m",
         "--inspect-args", f"-T gate={gate}", "--sample-retries", "0",
         "--previous", str(state / "attempts" / "flaky_v1"), "--attempt", str(attempt),
         "--last-try", last_try, "--base-url", "http://127.0.0.1:9/v1", "--out", str(out),
         "--", "--max-connections", "1", "--temperature", "0"],
        capture_output=True, text=True, timeout=240, cwd=ROOT,
        env={"PATH": "/usr/bin:/bin", "HOME": str(state), "PYTHONPATH": str(ROOT)})
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    return out


def ran(gate: Path) -> list[str]:
    got = (gate / "ran.txt").read_text().split()
    (gate / "ran.txt").unlink()
    return got


def test_a_sample_that_errors_is_re_run_alone_then_the_cell_is_scored(tmp_path: Path) -> None:
    """The third of four samples raises: the eval runs on (the other three scored), the
    cell is INVALID(sample_errors); the next attempt reuses the three through Inspect's
    eval-retry, runs the third alone, and its grade says who scored what."""
    gate, state = tmp_path / "gate", tmp_path / "state"
    gate.mkdir()
    out = harness_attempt(state, gate, 1)
    assert sorted(ran(gate)) == ["1", "2", "3", "4"]
    first = grade(out, "", "--attempt", "1")
    assert first["verdict"] == "SAMPLE_ERRORS"
    assert first["items"] == {"passed": 3, "scored": 3, "unscored": 0, "errored": 1}
    from autopilot.loader import load_preset

    rule = load_preset("inspect").grader.verdicts["SAMPLE_ERRORS"]
    assert (rule.verdict, rule.reason) == ("INVALID", "sample_errors")

    (gate / "fixed").touch()
    out = harness_attempt(state, gate, 2)
    assert ran(gate) == ["3"]  # the others' scores were reused, not re-earned
    second = grade(out, "", "--attempt", "2")
    assert second["verdict"] == "PASS"
    assert second["items"] == {"passed": 4, "scored": 4, "unscored": 0, "errored": 0,
                               "reused": 3}
    assert second["scored_by"] == {"1": 3, "2": 1}
    assert len(list((out / "logs").glob("*.eval"))) == 1  # one log, as inspect view lists
    summary = json.loads((out / "summary.json").read_text())
    assert (summary["samples"], summary["samples_reused"]) == (4, 3)


def test_on_the_last_try_a_sample_still_erroring_is_counted_errored(tmp_path: Path) -> None:
    gate, state = tmp_path / "gate", tmp_path / "state"
    gate.mkdir()
    harness_attempt(state, gate, 1)
    ran(gate)
    out = harness_attempt(state, gate, 2, last_try="1")
    assert ran(gate) == ["3"]
    last = grade(out, "", "--attempt", "2")
    assert last["verdict"] == "PASS"  # 3 of the 3 scored; the errored one said apart
    assert last["items"] == {"passed": 3, "scored": 3, "unscored": 0, "errored": 1,
                             "reused": 3}


def test_an_earlier_attempt_of_another_eval_is_never_reused(tmp_path: Path) -> None:
    """The preset changed between attempts (another -T, another temperature): the
    earlier log is not this eval's, so every sample runs again."""
    gate, state = tmp_path / "gate", tmp_path / "state"
    gate.mkdir()
    out = harness_attempt(state, gate, 1)
    ran(gate)
    cmd = json.loads((out / "inspect-cmd.json").read_text())
    cmd["argv"][-1] = "0.5"
    (out / "inspect-cmd.json").write_text(json.dumps(cmd))
    (gate / "fixed").touch()
    harness_attempt(state, gate, 2)
    assert sorted(ran(gate)) == ["1", "2", "3", "4"]


def test_scores_at_inspects_edges_are_read_as_inspect_reads_them(tmp_path: Path) -> None:
    """inf passes and -inf fails, as Inspect's value_to_float says, in valid JSON (the
    grader used to crash on them); a word Inspect cannot convert (it warns, counts 0) is
    UNREADABLE with the raw value, never a silent FAIL, and its rule is no harness
    break (no page for the eval's own data)."""
    out = inspect_eval(tmp_path, "extremes")
    high, low, word = grade(out, "1"), grade(out, "2"), grade(out, "3")
    assert (high["verdict"], high["score"], high["raw"]) == ("PASS", None, "inf")
    assert (low["verdict"], low["score"], low["raw"]) == ("FAIL", None, "-inf")
    assert (word["verdict"], word["raw"]) == ("UNREADABLE", "somewhat")
    assert "cannot read the score 'somewhat'" in str(word["detail"])
    whole = grade(out, "", "--threshold", "0.5")
    assert whole["verdict"] == "UNREADABLE" and "sample 3:" in str(whole["detail"])
    two = grade(inspect_eval(tmp_path, "extremes_readable"), "", "--threshold", "0.5")
    assert (two["verdict"], two["items"]) == (
        "PASS", {"passed": 1, "scored": 2, "unscored": 0, "errored": 0})

    from autopilot.cell.validity import GradeOutcome, RunOutcome, classify
    from autopilot.loader import load_preset

    rules = load_preset("inspect").grader.verdicts
    c = classify(RunOutcome(exit_code=0, completion=True),
                 GradeOutcome(True, grade=word), rules)
    assert (c.verdict, c.reason) == ("INVALID", "malformed_grade")
    assert "somewhat" in c.detail and not c.harness_break
    broken = classify(RunOutcome(exit_code=0, completion=True),
                      GradeOutcome(True, grade={"verdict": "NO_LOG"}), rules)
    assert broken.harness_break  # a rule left unset still counts by its reason


def test_two_reducers_need_the_preset_to_name_the_one_that_decides(tmp_path: Path) -> None:
    """Inspect reports each reducer's score side by side: the grade never takes the
    first by accident, and preflight refuses the task until vars.reducer names one."""
    out = inspect_eval(tmp_path, "two_ways")
    unnamed = grade(out, "q")
    assert unnamed["verdict"] == "NO_SCORE"
    assert "reduced 2 ways (max, mean): set vars.reducer" in str(unnamed["detail"])
    assert grade(out, "q", "--reducer", "max")["verdict"] == "PASS"
    by_mean = grade(out, "q", "--reducer", "mean")
    assert (by_mean["verdict"], by_mean["score"], by_mean["reducer"]) == ("FAIL", 0.5, "mean")
    assert "has no reducer 'median'" in str(grade(out, "q", "--reducer", "median")["detail"])

    from autopilot.harnesses.inspect_check import problems

    def cell(reducer: str) -> dict[str, object]:
        return {"id": "w", "vars": {"inspect_file": str(TASKS), "inspect_task": "two_ways",
                                    "sample": "q", "reducer": reducer}}

    [refused] = [p for p in problems([cell("")]) if "inspect-ai" not in p]
    assert refused == ("task w: two_ways reduces its epochs 2 ways (max, mean): set "
                       "vars.reducer to the one that decides")
    assert [p for p in problems([cell("mean")]) if "inspect-ai" not in p] == []


def test_the_grade_from_the_wrappers_table_is_the_grade_from_the_log(tmp_path: Path) -> None:
    """The wrapper writes the scores it read (inspect-scores.json) so that the grader
    needs no second import of Inspect: every grade read from that table equals the one
    read from the log with Inspect, and a table of another log is never used."""
    from autopilot.harnesses.inspect_grade import judge
    from autopilot.harnesses.inspect_resume import newest_log
    from autopilot.harnesses.inspect_run import summary_of
    from autopilot.harnesses.inspect_table import TABLE, read_table

    cases = {"extremes": ["1", "2", "3", ""], "two_ways": ["q"], "parts": ["1"],
             "mixed": ["", "1,4", "*"], "unscored": ["1", ""], "epochs_max": ["q"]}
    for task, samples in cases.items():
        out = inspect_eval(tmp_path, task)
        log = newest_log(out / "logs")
        assert log is not None and read_table(out, log) is None  # none written yet
        summary_of(log, "m")
        table = read_table(out, log)
        assert table is not None, task
        for sample in samples:
            for extra in ({}, {"score_key": "security"}, {"reducer": "mean"},
                          {"threshold": 0.5}):
                args = {"threshold": 1.0, **extra}
                assert judge(log, sample, "", log=table, **args) == judge(
                    log, sample, "", **args), (task, sample, extra)
        log.touch()  # another log now: the table is not its
        assert read_table(out, log) is None
        (out / TABLE).write_text('{"log": 1}')
        assert read_table(out, log) is None

    # the grader of a cell whose wrapper wrote the table does not import Inspect
    out = tmp_path / "mixed"
    probe = ("import sys; from autopilot.harnesses.inspect_grade import main; "
             f"main(['--out', {str(out)!r}, '--grade-file', {str(tmp_path / 'g.json')!r}]); "
             "print('inspect_ai' in sys.modules)")
    summary_of(newest_log(out / "logs"), "m")  # type: ignore[arg-type]
    r = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True,
                       timeout=120, cwd=ROOT)
    assert r.stdout.strip() == "False", r.stdout + r.stderr
    assert json.loads((tmp_path / "g.json").read_text())["items"]["scored"] == 4


def test_preflight_does_not_load_the_tasks_again_while_nothing_changed(tmp_path: Path) -> None:
    """A plan that passed is not loaded again (no import of Inspect, no task load) until
    a task file, the plan or Inspect changes; a plan that failed is checked every time."""
    task_file = tmp_path / "tasks.py"
    task_file.write_text(TASKS.read_text())
    plan = [{"id": "u", "vars": {"inspect_file": str(task_file), "inspect_task": "unscored",
                                 "sample": "1"}}]
    probe = ("import sys; from autopilot.harnesses.inspect_check import main; rc = main([]); "
             "print('loaded' if 'inspect_ai' in sys.modules else 'cached', rc)")

    def check(tasks: list[dict[str, object]]) -> str:
        r = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True,
                           timeout=120, cwd=ROOT, env={
                               **os.environ, "XDG_CACHE_HOME": str(tmp_path / "cache"),
                               "AUTOPILOT_PLAN_TASKS": json.dumps(tasks)})
        return r.stdout.strip().splitlines()[-1]

    assert check(plan) == "loaded 0"
    assert check(plan) == "cached 0"
    os.utime(task_file, ns=(1, 1))  # the file changed: loaded again, then cached
    assert check(plan) == "loaded 0"
    assert check(plan) == "cached 0"
    wrong = [{"id": "u", "vars": {**plan[0]["vars"], "sample": "9"}}]  # type: ignore[dict-item]
    assert check(wrong) == "loaded 1"
    assert check(wrong) == "loaded 1"  # a refusal is never cached


def test_a_log_a_killed_eval_left_is_interrupted_never_a_score(tmp_path: Path) -> None:
    """Plain `inspect eval` killed while its third sample waits: its log says
    ``started`` and holds two scored samples. The grader says INTERRUPTED (the preset:
    INVALID(interrupted), resumed), never PASS or FAIL on what happened to be done."""
    gate = tmp_path / "gate"
    gate.mkdir()
    out = tmp_path / "held"
    proc = subprocess.Popen(
        [sys.executable, "-m", "inspect_ai", "eval", f"{TASKS}@held", "-T", f"gate={gate}",
         "--model", "mockllm/model", "--log-dir", str(out / "logs"), "--log-format", "eval",
         "--display", "none", "--max-samples", "1"],
        env={"PATH": "/usr/bin:/bin", "HOME": str(tmp_path),
             "XDG_DATA_HOME": str(tmp_path / "data")},
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        wait_for(lambda: (gate / "waiting").exists(), 120, "the third sample at the gate")
        proc.send_signal(signal.SIGKILL)
        proc.wait(30)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    got = grade(out, "")
    assert got["verdict"] == "INTERRUPTED" and got["status"] == "started", got
    assert "did not finish" in str(got["detail"])
    from autopilot.loader import load_preset

    rule = load_preset("inspect").grader.verdicts["INTERRUPTED"]
    assert (rule.verdict, rule.reason) == ("INVALID", "interrupted")
