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
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import ROOT

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
    assert summary.tasks[("a-x", "t")]["items"] == {"passed": 17, "scored": 24,
                                                    "unscored": 1, "errored": 0}
    assert "items" not in summary.tasks[("a-x", "u")]
    assert summary.totals["items"]["scored"] == 24
    assert led.counts()["items"]["passed"] == 17


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
