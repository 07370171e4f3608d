"""Every wait bounded, one truth in every view (issue #25, the parts done so far)."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from conftest import ROOT, cli_env

from autopilot.errors import LockHeld
from autopilot.state.lock import RunLock

PROBE = ("import sys; from pathlib import Path; from autopilot.state.lock import lock_held\n"
         "d = Path(sys.argv[1]); print('probing', flush=True)\n"
         "while True: lock_held(d)\n")


def test_a_readers_probe_never_makes_a_lone_starter_lose(tmp_path: Path) -> None:
    state = tmp_path / "state"
    first = RunLock(state)
    first.acquire()  # made once, then let go: the lock file exists
    first.release()
    probe = subprocess.Popen([sys.executable, "-c", PROBE, str(state)], env=cli_env(),
                             cwd=ROOT, stdout=subprocess.PIPE, text=True)
    try:
        assert probe.stdout is not None and probe.stdout.readline() == "probing\n"
        lost = 0
        for _ in range(200):
            lock = RunLock(state)
            try:
                lock.acquire()
            except LockHeld:
                lost += 1
            finally:
                lock.release()
        assert lost == 0
    finally:
        probe.kill()
        probe.wait(10)


def test_the_probe_still_sees_a_holder(tmp_path: Path) -> None:
    from autopilot.state.lock import flock_held, lock_held

    state = tmp_path / "state"
    lock = RunLock(state)
    lock.acquire()
    try:
        lock.beat("run:pass1")
        assert flock_held(state / "autopilot.lock") is True
        holder = lock_held(state)
        assert holder is not None and holder.phase == "run:pass1" and holder.pid == os.getpid()
    finally:
        lock.release()
    assert flock_held(state / "autopilot.lock") is False


def test_validate_waits_for_the_cells_of_a_frozen_run(tmp_path: Path) -> None:
    import os
    import signal

    from conftest import events, run_cli, wait_for, write_overlay

    state = tmp_path / "state"
    over = write_overlay(tmp_path / "o.json", {"vars": {"think_secs": "2"}})
    p = subprocess.Popen([sys.executable, "-m", "autopilot.cli", "--preset", "demo",
                          "--target-n", "1", "--concurrency", "2", "--config", str(over),
                          "--state-dir", str(state), "--quiet"],
                         env=cli_env(AUTOPILOT_HEARTBEAT_SECS="0.3"),
                         stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        wait_for(lambda: sum(e["event"] == "cell_started" for e in events(state)) >= 2,
                 what="cells running")
        os.kill(p.pid, signal.SIGSTOP)
        wait_for(lambda: "STALE (heartbeat" in run_cli("--state-dir", str(state),
                                                      "--oneline", prog="dashboard").stdout,
                 what="a stale heartbeat")
        v = run_cli("validate", "--state-dir", str(state))
        assert "in progress" in v.stdout, v.stdout[-2000:]
        assert "grader_failed" not in v.stdout and "missing_output" not in v.stdout
    finally:
        os.kill(p.pid, signal.SIGCONT)
        p.kill()
        p.wait(30)


def test_cells_end_at_once_when_the_endpoint_has_failed_for_good(tmp_path: Path) -> None:
    from conftest import events, run_cli, write_overlay

    state = tmp_path / "state"
    # Every cell freezes after one turn and stuck_secs is 10 minutes: only the endpoint's
    # death (the third request; no restart allowed) can end them inside the timeout.
    over = write_overlay(tmp_path / "o.json", {
        "vars": {"hang_share": "1.0"}, "watchdog": {"stuck_secs": 600, "kill_secs": 600,
                                                    "warn_secs": 300, "probe_secs": 400},
        "endpoint": {"crash_after_requests": 2, "max_restarts": 0,
                     "down_restart_secs": 0.2, "probe_interval_secs": 0.2}})
    r = run_cli("--preset", "demo-chaos", "--target-n", "1", "--concurrency", "3",
                "--config", str(over), "--state-dir", str(state), "--quiet", timeout=120)
    assert r.returncode == 1 and "AUTOPILOT_INCOMPLETE" in r.stdout, r.stderr[-2000:]
    evs = events(state)
    killed = [e for e in evs if e["event"] == "cell_killed"]
    assert killed and {e["kind"] for e in killed} == {"endpoint_failed"}
    verdicts = [e for e in evs if e["event"] == "cell_verdict"]
    assert verdicts and {(e["verdict"], e["reason"]) for e in verdicts} == {
        ("INVALID", "endpoint_down")}


def test_the_suite_survives_a_parent_that_ignores_sigint(tmp_path: Path) -> None:
    # As under nohup or a background job: SIGINT ignored, and inherited so by every child.
    import signal

    r = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-x",
         "tests/test_dashboard.py", "-k", "watch_redraws"], cwd=ROOT, env=cli_env(),
        capture_output=True, text=True, timeout=300,
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_IGN))
    assert r.returncode == 0 and "1 passed" in r.stdout, r.stdout[-2000:]


def test_a_trickling_notification_receiver_cannot_hold_the_run_or_its_successor(
        tmp_path: Path) -> None:
    from conftest import events, run_cli, write_overlay
    from receiver import Trickler

    rx = Trickler()
    try:
        state = tmp_path / "state"
        over = write_overlay(tmp_path / "o.json", {"notify": {"timeout_secs": 2}})
        env = cli_env(AUTOPILOT_NOTIFY_URLS=f"json://127.0.0.1:{rx.port}/")
        r = run_cli("--preset", "demo", "--target-n", "1", "--config", str(over),
                    "--state-dir", str(state), "--quiet", env=env, timeout=120)
        assert r.returncode == 0 and "AUTOPILOT_COMPLETE" in r.stdout, r.stderr[-2000:]
        assert any(e["event"] == "notify_failed" for e in events(state))
        again = run_cli("--preset", "demo", "--target-n", "2", "--config", str(over),
                        "--state-dir", str(state), "--quiet", env=env, timeout=120)
        assert again.returncode == 0, again.stderr[-2000:]  # not exit 3: the run was let go
    finally:
        rx.close()


def test_a_resume_without_the_runs_variable_names_it(tmp_path: Path) -> None:
    from conftest import FAKEBIN, run_cli, write_overlay
    from mmbt_fixture import add_p1_helper, make_checkout

    bench = make_checkout(tmp_path)
    add_p1_helper(bench)
    over = write_overlay(tmp_path / "o.json", {
        "harness": {"sandbox_container": "", "scratch_remove_image": ""},
        "endpoint": {"startup_timeout_secs": 30, "probe_interval_secs": 0.5}})
    state = tmp_path / "state"
    env = cli_env(BENCH_DIR=str(bench), AUTOPILOT_LLAMA_SERVER=str(FAKEBIN / "llama-server"),
                  QWEN27B_GGUF=str(FAKEBIN / "llama-server"))
    args = ["--preset", "qwen3.6-27b", "--target-n", "1", "--config", str(over),
            "--state-dir", str(state), "--quiet"]
    assert run_cli(*args, env=env, timeout=120).returncode == 0
    env.pop("BENCH_DIR")
    r = run_cli(*args, env=env)
    assert r.returncode == 2
    assert "${BENCH_DIR} is not set (or empty); the default '/opt/mmbt' was used" in r.stderr
    assert r.stderr.count("\n") == 1


def test_the_resume_line_spells_its_paths_out(tmp_path: Path, monkeypatch) -> None:
    from autopilot.cli import build_parser, resume_command

    (tmp_path / "o.toml").write_text("")
    monkeypatch.chdir(tmp_path)
    argv = ["--preset", "demo", "--config", "o.toml", "--state-dir=s"]
    (tmp_path / "s").mkdir()
    monkeypatch.setattr(sys, "argv", ["autopilot", *argv])
    line = resume_command(build_parser().parse_args(argv), tmp_path / "s", 3)
    assert line == (f"autopilot --preset demo --config {tmp_path / 'o.toml'} "
                    f"--state-dir={tmp_path / 's'} --target-n 3")


# ---------------------------------------------------------------------- bounded output


def test_redaction_streams_and_finds_a_secret_split_across_chunks(tmp_path: Path) -> None:
    from autopilot import logsetup
    from autopilot.logsetup import Redactor

    key = "sk-split-secret-0123456789"
    log = tmp_path / "spool.log"
    # No newline at all, and the key straddling the first chunk boundary.
    at = logsetup.SCRUB_CHUNK - 10
    log.write_bytes(b"a" * at + key.encode() + b"b" * (3 * logsetup.SCRUB_CHUNK) + b"\xff")
    assert Redactor([key]).scrub_file(log)
    data = log.read_bytes()
    assert key.encode() not in data and data[at:at + 3] == b"***"
    assert data.endswith(b"b\xff")  # invalid UTF-8 kept byte for byte


def test_a_spooled_log_keeps_its_head_and_tail_and_says_what_was_cut(tmp_path: Path) -> None:
    from autopilot.logsetup import Redactor

    log = tmp_path / "spool.log"
    log.write_bytes(b"HEAD" + b"x" * 10_000_000 + b"TAIL")
    assert Redactor([]).scrub_file(log, cap=1_000_000)
    data = log.read_bytes()
    assert data.startswith(b"HEAD") and data.endswith(b"TAIL")
    assert len(data) < 1_000_200 and b"bytes of this output cut here" in data


def test_a_harness_writing_hundreds_of_mb_without_a_newline_costs_little(
        tmp_path: Path) -> None:
    import time

    import psutil
    from conftest import events, write_overlay

    spew = ("import os, sys\n"
            "out = sys.argv[1]; os.makedirs(out, exist_ok=True)\n"
            "block = b'z' * (1 << 20)\n"
            "for _ in range(300): os.write(1, block)\n"
            "os.write(1, ('key ' + os.environ['SPEW_KEY']).encode())\n"
            "import json; json.dump(dict(total_completion_tokens=3), "
            "open(os.path.join(out, 'summary.json'), 'w'))\n")
    over = write_overlay(tmp_path / "o.json", {
        "tasks": [{"id": "p1_bugfix"}], "arms": [{"label": "demo-nothink", "mode": "nothink"}],
        "harness": {"argv": ["{python}", "-c", spew, "{output_dir}"],
                    "pass_env": ["SPEW_KEY"]},
        "preflight": {"secrets": ["SPEW_KEY"]}, "trust": {"arm_checks": []},
        "grader": {"argv": ["/bin/sh", "-c", "echo '{{\"verdict\": \"PASS\"}}' > \"$1\"",
                            "grade", "{grade_file}"]}, "baseline": None})
    state = tmp_path / "state"
    p = subprocess.Popen([sys.executable, "-m", "autopilot.cli", "--preset", "demo",
                          "--target-n", "1", "--config", str(over), "--state-dir",
                          str(state), "--quiet"],
                         env=cli_env(SPEW_KEY="sk-spew-0123456789"), cwd=ROOT,
                         stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    peak = 0
    try:
        sup = psutil.Process(p.pid)
        deadline = time.monotonic() + 240
        while p.poll() is None and time.monotonic() < deadline:
            try:
                peak = max(peak, sup.memory_info().rss)
            except psutil.NoSuchProcess:
                break
            time.sleep(0.02)
        assert p.wait(10) == 0
    finally:
        if p.poll() is None:
            p.kill()
            p.wait()
    assert peak < 200 * 1024 * 1024, f"supervisor peaked at {peak >> 20} MB"
    spool = state / "logs" / "p1_bugfix_demo-nothink_v1.launcher.log"
    data = spool.read_bytes()
    assert len(data) < 17 * 1024 * 1024 and b"bytes of this output cut here" in data
    assert data.endswith(b"key ***") and b"sk-spew" not in data
    assert [e["verdict"] for e in events(state) if e["event"] == "cell_verdict"] == ["PASS"]


# ---------------------------------------------------------------------- cgroups

DAEMON = ("mkdir -p \"$1\"; env -i /bin/sleep 900 & echo $! > \"$1/daemon.pid\"; "
          "echo '{{\"total_completion_tokens\": 3}}' > \"$1/summary.json\"")
PASS_GRADER = ["/bin/sh", "-c", "echo '{{\"verdict\": \"PASS\"}}' > \"$1\"", "grade",
               "{grade_file}"]


def daemon_run(tmp_path: Path, env: dict[str, str]) -> tuple[Path, list[int]]:
    from conftest import run_cli, write_overlay

    over = write_overlay(tmp_path / "o.json", {
        "tasks": [{"id": "p1_bugfix"}, {"id": "p2_extract"}],
        "harness": {"argv": ["/bin/sh", "-c", DAEMON, "harness", "{output_dir}"]},
        "grader": {"argv": PASS_GRADER}, "trust": {"arm_checks": []}, "baseline": None})
    state = tmp_path / "state"
    r = run_cli("--preset", "demo", "--target-n", "1", "--config", str(over),
                "--state-dir", str(state), "--quiet", env=env)
    assert r.returncode == 0, r.stderr[-2000:]
    pids = [int(p.read_text()) for p in (state / "cells").glob("*/daemon.pid")]
    assert len(pids) == 4
    return state, pids


def alive(pids: list[int]) -> list[int]:
    import psutil

    out = []
    for pid in pids:
        try:
            p = psutil.Process(pid)
            if p.status() != psutil.STATUS_ZOMBIE and "sleep" in p.name():
                out.append(pid)
        except psutil.NoSuchProcess:
            continue
    return out


def test_a_child_that_clears_its_environment_dies_with_its_cell(tmp_path: Path) -> None:
    import os

    import pytest

    from autopilot.cell import cgroups

    if os.geteuid() != 0 or cgroups.cgroup2_mount() is None:
        pytest.skip("needs root and a cgroup v2 hierarchy (tools/test runs as root)")
    r = __import__("conftest").run_cli("--preset", "demo", "--target-n", "1", "--dry-run",
                                       "--state-dir", str(tmp_path / "dry"))
    assert "containment: a cgroup v2 group per harness, grader and endpoint" in r.stdout
    state, pids = daemon_run(tmp_path, cli_env())
    try:
        assert alive(pids) == []  # each killed with its cell's group
        from autopilot.cell.procs import existing_run_token

        token = existing_run_token(state)
        assert token is not None
        base = cgroups.cgroup2_mount() / (cgroups.own_group() or "/").lstrip("/")
        assert not (base / f"autopilot-{token[:16]}").exists()  # the subtree removed
    finally:
        for pid in alive(pids):
            os.kill(pid, 9)


def test_without_cgroups_the_runs_adoptees_die_with_the_run(tmp_path: Path) -> None:
    import os

    env = cli_env(AUTOPILOT_CGROUPS="off")
    r = __import__("conftest").run_cli("--preset", "demo", "--target-n", "1", "--dry-run",
                                       "--state-dir", str(tmp_path / "dry"), env=env)
    assert "containment: process identity + run marker + subreaper adoptees" in r.stdout
    _, pids = daemon_run(tmp_path, env)
    try:
        assert alive(pids) == []  # adopted by the supervisor, killed at the run's end
    finally:
        for pid in alive(pids):
            os.kill(pid, 9)


# ---------------------------------------------------------------------- one run per root


def test_a_second_run_on_the_same_output_root_is_refused_naming_the_holder(
        tmp_path: Path) -> None:
    from conftest import events, run_cli, wait_for, write_overlay

    shared = tmp_path / "checkout" / "logs"
    over = write_overlay(tmp_path / "o.json", {
        "vars": {"think_secs": "0.5", "shared": str(shared)},
        "harness": {"output_dir": "{shared}/{cell}"}})
    first_state, second_state = tmp_path / "first", tmp_path / "second"
    first = subprocess.Popen([sys.executable, "-m", "autopilot.cli", "--preset", "demo",
                              "--target-n", "1", "--config", str(over), "--state-dir",
                              str(first_state), "--quiet"], env=cli_env(), cwd=ROOT,
                             stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        wait_for(lambda: any(e["event"] == "cell_started" for e in events(first_state)),
                 what="the first run's cells")
        r = run_cli("--preset", "demo", "--target-n", "1", "--config", str(over),
                    "--state-dir", str(second_state), "--quiet")
        assert r.returncode == 3
        assert f"{shared} is the output root of another run: state dir {first_state}" \
            in r.stderr
        assert not (second_state / "journal.jsonl").exists()
        assert first.wait(120) == 0  # the first run's cells were left alone
    finally:
        if first.poll() is None:
            first.kill()
            first.wait()
    # Ended, the first run still owns its cells' output dirs until it is released ...
    again = run_cli("--preset", "demo", "--target-n", "1", "--config", str(over),
                    "--state-dir", str(second_state), "--quiet")
    assert again.returncode == 3
    assert f"belongs to the run in {first_state} (finished, not released)" in again.stderr
    assert f"autopilot release --state-dir {first_state}" in again.stderr
    assert not (second_state / "journal.jsonl").exists()
    first_outputs = {p.parent.name: p.read_bytes() for p in shared.rglob("grade.json")}
    assert len(first_outputs) == 12
    v = run_cli("validate", "--state-dir", str(first_state))
    assert v.returncode == 0, v.stdout
    # ... and once released, the next run takes them, and journals what it moved aside.
    before = v.stdout
    rel = run_cli("release", "--state-dir", str(first_state))
    assert rel.returncode == 0 and f"output root {shared} (released: " in rel.stdout
    assert "may move this run's cell output dirs it shares into its own attempts" in rel.stdout
    again = run_cli("--preset", "demo", "--target-n", "1", "--config", str(over),
                    "--state-dir", str(second_state), "--quiet")
    assert again.returncode == 0, again.stderr[-1000:]
    moved = [e for e in events(second_state) if e["event"] == "foreign_outputs_moved"]
    assert len(moved) == 12 and all(e["to"].startswith(str(second_state)) for e in moved)
    # Its outputs gone, the first run's views keep its verdicts and say it was released.
    v = run_cli("validate", "--state-dir", str(first_state))
    assert v.returncode == 0 and v.stdout == before, v.stdout
    one = run_cli("--state-dir", str(first_state), "--oneline", prog="dashboard").stdout
    assert one.startswith("COMPLETE demo") and "| released " in one, one
    # The first run, released, never grades the second run's files as its own.
    rg = run_cli("regrade", "--state-dir", str(first_state))
    assert rg.returncode == 0, rg.stderr
    assert "regraded 0 cell(s)" in rg.stdout and rg.stdout.count("not this run's output") == 12
    assert sum(e["event"] == "regrade_skipped" for e in events(first_state)) == 12


def test_runs_with_disjoint_cells_share_an_output_root_one_after_the_other(
        tmp_path: Path) -> None:
    """Two models of a campaign on one checkout: their cells differ, so the second runs
    while the first still owns its own; the owners record names both."""
    from conftest import events, run_cli, write_overlay

    shared = tmp_path / "checkout" / "logs"
    states = []
    for arm in ("alpha", "beta"):
        over = write_overlay(tmp_path / f"{arm}.json", {
            "vars": {"think_secs": "0"}, "tasks": [{"id": "p1_bugfix"}], "baseline": None,
            "arms": [{"label": f"{arm}-nothink", "mode": "nothink"}],
            "harness": {"output_dir": str(shared) + "/{cell}"}})
        states.append(tmp_path / f"state-{arm}")
        r = run_cli("--preset", "demo", "--target-n", "1", "--config", str(over),
                    "--state-dir", str(states[-1]), "--quiet")
        assert r.returncode == 0, r.stderr[-2000:]
    owners = json.loads((shared.parent / ".logs.autopilot-owners").read_text())
    assert [h["state_dir"] for h in owners["holders"]] == [str(s) for s in states]
    assert owners["holders"][0]["outputs"] == [str(shared / "p1_bugfix_alpha-nothink_v1")]
    # A holder whose state dir is gone protects nothing: dropped, and journaled.
    shutil.rmtree(states[0])
    r = run_cli("--preset", "demo", "--target-n", "1", "--config",
                str(tmp_path / "beta.json"), "--state-dir", str(states[1]), "--quiet")
    assert r.returncode == 0, r.stderr[-2000:]
    dropped = [e for e in events(states[1]) if e["event"] == "claim_dropped"]
    assert [e["state_dir"] for e in dropped] == [str(states[0])]


# ---------------------------------------------------------------------- validate's truth


def test_validate_says_what_the_journal_says_after_a_stop_and_a_kill(tmp_path: Path) -> None:
    import signal

    from conftest import events, run_cli, wait_for, write_overlay

    over = write_overlay(tmp_path / "o.json", {"vars": {"think_secs": "1"}})
    for how in (signal.SIGTERM, signal.SIGKILL):
        state = tmp_path / f"state-{how.name}"
        p = subprocess.Popen([sys.executable, "-m", "autopilot.cli", "--preset", "demo",
                              "--target-n", "1", "--concurrency", "2", "--config", str(over),
                              "--state-dir", str(state), "--quiet"], env=cli_env(), cwd=ROOT,
                             stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        try:
            wait_for(lambda s=state: sum(e["event"] == "cell_started"
                                         for e in events(s)) >= 2, what="cells running")
            p.send_signal(how)
            p.wait(60)
        finally:
            if p.poll() is None:
                p.kill()
                p.wait()
        v = run_cli("validate", "--state-dir", str(state))
        assert v.returncode == 0 and "INVALID" not in v.stdout, v.stdout  # none judged
        assert "PENDING=" in v.stdout.splitlines()[0], v.stdout  # no verdict yet, said so
        stopped = [e["cell"] for e in events(state) if e["event"] == "cell_abandoned"]
        assert (len(stopped) >= 1) == (how == signal.SIGTERM), (how, stopped)


def test_validate_calls_a_cell_killed_while_grading_pending_not_invalid(tmp_path: Path) -> None:
    # The supervisor dies after a harness ended and before its grade: the journal has no
    # verdict (a resume grades it), so validate judges nothing either.
    import signal

    from conftest import events, run_cli, wait_for, write_overlay

    over = write_overlay(tmp_path / "o.json", {
        "tasks": [{"id": "p1_bugfix"}], "arms": [{"label": "demo-nothink", "mode": "nothink"}],
        "grader": {"argv": ["/bin/sh", "-c", 'echo $$ > "$1.pid"; exec sleep 120', "g",
                            "{grade_file}"]}})
    state = tmp_path / "state"
    p = subprocess.Popen([sys.executable, "-m", "autopilot.cli", "--preset", "demo",
                          "--target-n", "1", "--config", str(over), "--state-dir", str(state),
                          "--quiet"], env=cli_env(), cwd=ROOT, stdout=subprocess.DEVNULL,
                         stderr=subprocess.DEVNULL)
    pidfile = state / "cells" / "p1_bugfix_demo-nothink_v1" / "grade.json.pid"
    try:
        wait_for(lambda: pidfile.exists() and pidfile.read_text().strip(), 60, "grading")
        p.send_signal(signal.SIGKILL)
        p.wait(30)
    finally:
        if p.poll() is None:
            p.kill()
            p.wait()
        if pidfile.exists() and pidfile.read_text().strip():
            with contextlib.suppress(ProcessLookupError):
                os.kill(int(pidfile.read_text()), signal.SIGKILL)
    evs = events(state)
    assert any(e["event"] == "cell_exited" for e in evs)
    assert not any(e["event"] == "cell_verdict" for e in evs)
    v = run_cli("validate", "--state-dir", str(state))
    assert v.returncode == 0 and "INVALID" not in v.stdout, v.stdout
    assert "PENDING=1" in v.stdout.splitlines()[0], v.stdout
    assert "grading" in v.stdout and "a resume grades it" in v.stdout


def test_an_attempt_killed_before_its_start_was_journaled_is_adopted_as_itself(
        tmp_path: Path) -> None:
    import time

    from autopilot.loader import load_preset
    from autopilot.plan import Plan, cell_context
    from autopilot.run.recovery import finished_outcome
    from autopilot.state.fsutil import iso
    from autopilot.state.ledger import Ledger

    preset = load_preset("demo")
    plan = Plan(preset, 1)
    cell = plan.cells[0]
    state = tmp_path / "state"
    led = Ledger(plan)
    t0 = time.time() - 60
    for ev in ({"event": "cell_spawning", "cell": cell.id, "attempt": 1, "ts": iso(t0)},
               {"event": "cell_started", "cell": cell.id, "attempt": 1, "pid": 12345,
                "create_time": 1.0, "ts": iso(t0)},
               {"event": "cell_verdict", "cell": cell.id, "attempt": 1, "verdict": "INVALID",
                "reason": "stall", "ts": iso(t0 + 5)},
               # the supervisor was killed after journaling its intent, before the start
               {"event": "cell_spawning", "cell": cell.id, "attempt": 2, "ts": iso(t0 + 10)}):
        led.apply(ev)
    st = led.cells[cell.id]
    assert (st.status, st.attempts, st.pid) == ("running", 2, None)
    out = Path(cell_context(preset, cell, 2, state)["output_dir"])
    out.mkdir(parents=True)
    (out / "summary.json").write_text('{"total_completion_tokens": 3}')  # finished work
    outcome = finished_outcome(preset, cell, state, st, {}, killed=False)
    assert outcome is not None and outcome.completion  # adopted as attempt 2, not re-run


MOVER = r'''
import os, sys
out, who = sys.argv[1], sys.argv[2]
os.makedirs(out, exist_ok=True)
group = next(l[3:].strip() for l in open("/proc/self/cgroup") if l.startswith("0::"))
mount = next(l.split()[4] for l in open("/proc/self/mountinfo")
             if l.split(" - ")[1].split()[0] == "cgroup2")
if who == "supervisor":  # walk up to the autopilot itself
    pid = os.getppid()
    while not any(m in open(f"/proc/{pid}/cmdline", "rb").read()
                  for m in (b"autopilot.cli", b"-m\0autopilot\0")):
        pid = int(open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()[1])
else:
    pid = int(who)
with open(mount + group + "/cgroup.procs", "w") as f:
    f.write(str(pid))
open(os.path.join(out, "summary.json"), "w").write('{"total_completion_tokens": 3}')
'''


def mover_run(tmp_path: Path, who: str) -> tuple[Path, Any]:
    from conftest import events, run_cli, write_overlay

    (tmp_path / "mover.py").write_text(MOVER)
    over = write_overlay(tmp_path / "o.json", {
        "tasks": [{"id": "p1_bugfix"}], "arms": [{"label": "demo-nothink", "mode": "nothink"}],
        "harness": {"argv": ["{python}", str(tmp_path / "mover.py"), "{output_dir}", who]},
        "grader": {"argv": PASS_GRADER}, "trust": {"arm_checks": []}, "baseline": None})
    state = tmp_path / "state"
    r = run_cli("--preset", "demo", "--target-n", "1", "--config", str(over),
                "--state-dir", str(state), "--quiet", timeout=120)
    return state, (r, events(state))


def _needs_cgroups() -> None:
    import os

    import pytest

    from autopilot.cell import cgroups

    if os.geteuid() != 0 or cgroups.cgroup2_mount() is None:
        pytest.skip("needs root and a cgroup v2 hierarchy (tools/test runs as root)")


def test_a_process_moved_into_a_cells_group_survives_the_cell_and_is_journaled(
        tmp_path: Path) -> None:
    """Issue #34: the end of a cell killed whatever was in its group. A harness that
    moves an unrelated process in (here one of the test's, started long before) no
    longer gets it killed: it is spared and journaled."""
    import subprocess

    _needs_cgroups()
    victim = subprocess.Popen(["/bin/sleep", "300"])
    try:
        _, (r, evs) = mover_run(tmp_path, str(victim.pid))
        assert r.returncode == 0, r.stderr[-2000:]
        assert victim.poll() is None  # alive
        spared = [e for e in evs if e["event"] == "foreign_in_cell_group"]
        assert spared and spared[0]["pid"] == victim.pid
        assert "older than the group" in spared[0]["why"]
        v = next(e for e in evs if e["event"] == "cell_verdict")
        assert v["verdict"] == "PASS"
    finally:
        victim.kill()
        victim.wait()


def test_a_harness_that_moves_the_supervisor_into_its_group_does_not_kill_it(
        tmp_path: Path) -> None:
    """Moved into a cell's group, the supervisor used to kill itself at the cell's end
    (rc 137, the endpoint left running). It is never signalled (nor frozen), moves
    itself back out, and the run completes."""
    _needs_cgroups()
    _, (r, evs) = mover_run(tmp_path, "supervisor")
    assert r.returncode == 0, (r.returncode, r.stderr[-2000:])
    spared = [e for e in evs if e["event"] == "foreign_in_cell_group"]
    assert spared and "supervisor" in spared[0]["why"]
    assert any(e["event"] == "run_finished" and e["outcome"] == "COMPLETE" for e in evs)


def test_an_owners_record_is_rewritten_as_read_and_one_of_another_shape_refused(
        tmp_path: Path) -> None:
    """Each holder of a root's owners record is read as a Holder: another version's
    fields on it are written back as they were; an entry of another shape refuses the
    claim in one line, and the record is left untouched."""
    from autopilot.state.claims import Claims, owners_path, release_owned

    root, other, mine = tmp_path / "logs", tmp_path / "state-other", tmp_path / "state"
    other.mkdir()
    mine.mkdir()
    theirs = {"state_dir": str(other), "outputs": [str(root / "a")], "since": "x",
              "note": "from a later version"}
    owners_path(root).write_text(json.dumps({"holders": [theirs]}))
    claims = Claims()
    claims.take([root], mine, [root / "b"])
    claims.release()
    holders = json.loads(owners_path(root).read_text())["holders"]
    assert holders[0] == theirs  # kept field for field
    assert (holders[1]["state_dir"], holders[1]["outputs"]) == (str(mine), [str(root / "b")])
    assert release_owned([root], mine) == [root]
    assert json.loads(owners_path(root).read_text())["holders"] == [theirs]

    odd = json.dumps({"holders": [theirs, {"state_dir": str(other), "outputs": "a"}]})
    owners_path(root).write_text(odd)
    with pytest.raises(LockHeld, match="not an owners record this autopilot wrote"):
        Claims().take([root], mine, [root / "b"])
    assert owners_path(root).read_text() == odd
