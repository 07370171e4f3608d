"""A hostile harness or a hostile neighbour gets nothing (issue #24): files from outside
are read one way (autopilot.state.untrusted: no symlink, no FIFO or device, someone
else's file refused, bounded), values are bounded and number-checked, and a dashboard
served over a state dir another user owns reads none of root's files and never hangs."""

from __future__ import annotations

import json
import os
import pwd
import re
import signal
import stat
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from conftest import DEMO_ARGS, ROOT, cli_env, events, run_cli, write_overlay

from autopilot.escape import bounded, finite, sane
from autopilot.state import untrusted
from autopilot.state.budget import count_or_none, of_events

ADV = str(ROOT / "tests" / "adversaries")
BIG = int("1" + "0" * 400)


# ---------------------------------------------------------------------- the reader


def test_the_reader_refuses_what_would_hang_or_leak(tmp_path: Path) -> None:
    secret = tmp_path / "secret.json"
    secret.write_text('{"key": "root-only"}')
    os.mkfifo(tmp_path / "fifo")
    (tmp_path / "link").symlink_to(secret)
    (tmp_path / "zero").symlink_to("/dev/zero")
    (tmp_path / "big").write_bytes(b"x" * (untrusted.SMALL + 1))
    for name, why in [("fifo", "not a regular file (a FIFO)"), ("link", "a symlink"),
                      ("zero", "a symlink"), ("big", "larger than")]:
        value, refused = untrusted.load_json(tmp_path / name)
        assert value is None and refused and why in refused, (name, refused)
    with pytest.raises(untrusted.Refused, match="a character device"):
        untrusted.read_bytes("/dev/zero")
    with pytest.raises(untrusted.Refused, match="not by the state dir's owner"):
        untrusted.read_bytes(secret, owner=os.geteuid() + 1)
    assert untrusted.read_json(secret) == {"key": "root-only"}  # a plain file still reads
    assert untrusted.load_json(tmp_path / "missing.json") == (None, None)


def test_a_tail_is_bounded_and_never_a_fifo(tmp_path: Path) -> None:
    log = tmp_path / "log"
    log.write_bytes(b"a" * 100_000 + b"\nlast line\n")
    data, size = untrusted.read_tail(log, 64)
    assert size == 100_011 and len(data) == 64 and data.endswith(b"last line\n")
    os.mkfifo(tmp_path / "fifo")
    with pytest.raises(untrusted.Refused):
        untrusted.read_tail(tmp_path / "fifo")


# ---------------------------------------------------------------------- values


@pytest.mark.parametrize(("value", "count"), [
    (BIG, None), (-1, None), (10**15, 1e15), (10**15 + 1, None), (7, 7.0), (True, None),
    (float("nan"), None), (1e999, None), ("12", None)])
def test_a_count_is_a_finite_number_in_range(value: object, count: float | None) -> None:
    assert count_or_none(value) == count


def test_a_journaled_spend_of_401_digits_counts_nothing_and_crashes_nothing() -> None:
    from autopilot.state.events import parse

    spend = of_events(filter(None, map(parse, [
        {"event": "cell_verdict", "cell": "c", "spend": [BIG, 5]},
        {"event": "cell_verdict", "cell": "c", "spend": [3, 4]}])))
    assert (spend.prompt, spend.completion) == (3, 4)
    from autopilot.config import Rate

    assert spend.usd(Rate.model_validate([1.0, 1.0])) == 7e-6


def test_numbers_from_a_state_dir_never_overflow_a_view() -> None:
    assert finite(BIG) == 0.0 and finite("3") == 0.0 and finite(2.5) == 2.5
    assert sane({"frozen_secs": BIG, "n": 3}) == {"frozen_secs": None, "n": 3}


def test_bounded_cuts_long_values_and_says_so() -> None:
    word = "W" * 5_000_000
    cut = bounded({"word": word, "detail": [word] * 3, "n": 1})
    assert len(json.dumps(cut)) < 20_000
    assert cut["word"].endswith("…[cut 4995904 chars]") and cut["n"] == 1
    small = {"a": 1, "b": None}
    assert bounded(small) is small  # the common flat record is not copied


# ---------------------------------------------------------------------- a run


def hostile_run(tmp_path: Path, modes: dict[str, str], grader: str | None = None,
                n: int = 1) -> tuple[subprocess.CompletedProcess[str], Path]:
    state = tmp_path / "state"
    doc: dict[str, object] = {
        "vars": {"hostile": "none"},
        "tasks": [{"id": t, "vars": {"hostile": m}} for t, m in modes.items()],
        "harness": {"argv": ["{python}", f"{ADV}/hostile_files.py", "{hostile}",
                             "{output_dir}", *DEMO_ARGS]},
        "trust": {"infra_retries": 1}, "run": {"concurrency": 2}, "baseline": None}
    if grader:
        doc["grader"] = {"argv": ["{python}", f"{ADV}/hostile_grader.py", grader,
                                  "{grade_file}"], "retries": 1}
    over = write_overlay(tmp_path / "o.json", doc)
    r = run_cli("--preset", "demo", "--target-n", str(n), "--config", str(over),
                "--state-dir", str(state), "--quiet", timeout=240)
    return r, state


def test_a_fifo_or_dev_zero_summary_is_malformed_not_a_frozen_supervisor(
        tmp_path: Path) -> None:
    r, state = hostile_run(tmp_path, {"p1_bugfix": "fifo", "p2_extract": "zero",
                                      "p2_triage": "none"})
    assert r.returncode == 1, r.stderr[-2000:]  # ended, INCOMPLETE: two tasks never valid
    assert "Traceback" not in r.stderr
    verdicts = [e for e in events(state) if e["event"] == "cell_verdict"]
    why = {e["cell"].split("_demo")[0]: e for e in verdicts if e["verdict"] == "INVALID"}
    assert why["p1_bugfix"]["reason"] == "malformed_summary"
    assert "not a regular file (a FIFO)" in why["p1_bugfix"]["detail"]
    assert why["p2_extract"]["reason"] == "malformed_summary"
    assert "a symlink (not followed)" in why["p2_extract"]["detail"]
    assert {e["cell"].split("_demo")[0] for e in verdicts if e["verdict"] != "INVALID"} \
        == {"p2_triage"}


def test_a_401_digit_token_count_neither_crashes_the_run_nor_its_readers(
        tmp_path: Path) -> None:
    r, state = hostile_run(tmp_path, {"p1_bugfix": "bigint", "p2_extract": "none"})
    assert "Traceback" not in r.stderr and "OverflowError" not in r.stderr, r.stderr[-2000:]
    assert r.returncode == 0, r.stderr[-2000:]  # the prompt count is not checked: valid
    spends = [e["spend"] for e in events(state) if e["event"] == "cell_verdict"]
    assert all(type(x) is int and x < 10**16 for s in spends for x in s)
    again = run_cli("--preset", "demo", "--target-n", "1", "--config",
                    str(tmp_path / "o.json"), "--state-dir", str(state), "--quiet")
    assert again.returncode == 0 and "Traceback" not in again.stderr  # the resume
    for verb in (["report"], ["validate"], ["board", str(state), "--out", str(tmp_path)]):
        v = run_cli(*verb, *([] if verb[0] == "board" else ["--state-dir", str(state)]))
        assert "Traceback" not in v.stderr and v.returncode in (0, 1), (verb, v.stderr[-800:])


def test_a_3mb_verdict_word_costs_the_journal_and_the_log_kilobytes(tmp_path: Path) -> None:
    r, state = hostile_run(tmp_path, {"p1_bugfix": "none"}, grader="huge")
    assert r.returncode == 1 and "Traceback" not in r.stderr, r.stderr[-2000:]
    assert (state / "journal.jsonl").stat().st_size < 200_000
    assert (state / "autopilot.log").stat().st_size < 400_000
    words = [e.get("word") or "" for e in events(state) if e["event"] == "cell_verdict"]
    assert words and all(w.endswith("chars]") and "…[cut " in w for w in words)


@pytest.mark.parametrize(("mode", "why"), [("fifo", "not a regular file (a FIFO)"),
                                         ("oversize", "larger than 4194304 bytes")])
def test_a_fifo_or_oversize_grade_file_is_malformed_not_a_frozen_supervisor(
        tmp_path: Path, mode: str, why: str) -> None:
    r, state = hostile_run(tmp_path, {"p1_bugfix": "none"}, grader=mode)
    assert r.returncode == 1 and "Traceback" not in r.stderr, r.stderr[-2000:]
    verdicts = [e for e in events(state) if e["event"] == "cell_verdict"]
    assert {e["reason"] for e in verdicts} == {"malformed_grade"}
    assert all("grade file refused: " in e["detail"] and why in e["detail"]
               for e in verdicts)


# ---------------------------------------------------------------------- the views


@pytest.fixture
def nobody() -> pwd.struct_passwd:
    if os.geteuid() != 0:
        pytest.skip("needs root: a state dir owned by another user, served by root")
    return pwd.getpwnam("nobody")


@pytest.fixture
def served(tmp_path: Path) -> Iterator[tuple[str, Path, subprocess.Popen[str]]]:
    """A finished demo run, served by ``dashboard --serve`` (yields base URL, state dir)."""
    state = tmp_path / "state"
    r = run_cli("--preset", "demo", "--target-n", "1", "--state-dir", str(state), "--quiet")
    assert r.returncode == 0, r.stderr[-2000:]
    p = subprocess.Popen([sys.executable, "-m", "autopilot.views.dashboard.cli",
                          "--state-dir", str(state), "--serve", "--bind", "127.0.0.1:0"],
                         env=cli_env(), cwd=ROOT, stdout=subprocess.PIPE, text=True,
                         preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    try:
        line = p.stdout.readline() if p.stdout else ""
        url = re.search(r"(http://127\.0\.0\.1:\d+/)", line)
        assert url, line
        yield url.group(1), state, p
    finally:
        p.kill()
        p.wait(10)


def test_a_state_dir_owner_cannot_read_roots_files_through_the_server(
        nobody: pwd.struct_passwd, served: tuple[str, Path, subprocess.Popen[str]],
        tmp_path: Path) -> None:
    url, state, _ = served
    secret = tmp_path / "root-secret.json"
    secret.write_text('{"phase": "COMPLETE", "token": "ROOT-ONLY-0600"}')
    secret.chmod(0o600)
    for p in [state, *state.rglob("*")]:
        os.lchown(p, nobody.pw_uid, nobody.pw_gid)
    (state / "status.json").unlink()
    (state / "status.json").symlink_to(secret)
    os.lchown(state / "status.json", nobody.pw_uid, nobody.pw_gid)
    (state / "heartbeat.json").unlink()
    os.link(secret, state / "heartbeat.json")  # a hardlink: root's file, root's uid
    for path in ("status.json", "", "metrics"):
        body = httpx.get(url + path, timeout=10).text
        assert "ROOT-ONLY-0600" not in body, path


def test_fifos_in_a_cell_never_hang_the_server(
        served: tuple[str, Path, subprocess.Popen[str]]) -> None:
    url, state, _ = served
    cid = json.loads((state / "status.json").read_text())["recent_cells"][0]["cell"]
    transcript = state / "cells" / cid / "transcript.jsonl"
    transcript.unlink()
    os.mkfifo(transcript)
    launcher = state / "logs" / f"{cid}.launcher.log"
    launcher.unlink()
    os.mkfifo(launcher)
    assert stat.S_ISFIFO(transcript.stat().st_mode)
    for _ in range(10):  # more than the server's thread pool
        page = httpx.get(f"{url}cell/{cid}", timeout=10)
        assert page.status_code == 200 and "not a regular file (a FIFO)" in page.text
    for path in ("", "metrics", "status.json"):
        assert httpx.get(url + path, timeout=10).status_code == 200, path


def test_a_foreign_host_header_is_refused_and_errors_carry_the_headers(
        served: tuple[str, Path, subprocess.Popen[str]]) -> None:
    url, _, _ = served
    r = httpx.get(url, headers={"Host": "rebind.attacker.example"}, timeout=10)
    assert r.status_code == 421 and "<table" not in r.text
    for host in ("localhost", "127.0.0.1", url.split("//")[1].rstrip("/")):
        assert httpx.get(url, headers={"Host": host}, timeout=10).status_code == 200, host
    missing = httpx.get(url + "cell/nope", timeout=10)
    assert missing.status_code == 404
    assert missing.headers["Content-Security-Policy"].startswith("default-src 'none'")
    assert missing.headers["X-Content-Type-Options"] == "nosniff"


def test_a_client_holds_a_bounded_number_of_event_streams(
        served: tuple[str, Path, subprocess.Popen[str]]) -> None:
    url, _, _ = served
    with httpx.Client(timeout=10) as c:
        streams = [c.stream("GET", url + "events") for _ in range(4)]
        opened = [s.__enter__() for s in streams]
        try:
            assert all(o.status_code == 200 for o in opened)
            assert c.get(url + "events").status_code == 429
        finally:
            for s in streams:
                s.__exit__(None, None, None)


HOSTILE_REASON = "stall\x1b[31m\u202eevil\x1b]8;;javascript:x\x1b\\"


@pytest.fixture
def bidi_state(tmp_path: Path) -> Path:
    import dashfix

    cells = {dashfix.cid("t_alpha", "m-nothink", 1): [("INVALID", HOSTILE_REASON, False)],
             dashfix.cid("t_beta", "m-nothink", 1): [dashfix.P],
             dashfix.cid("t_alpha", "m-nothink", 2): [dashfix.F],
             dashfix.cid("t_beta", "m-nothink", 2): [("INVALID", HOSTILE_REASON, False)]}
    return dashfix.write(tmp_path / "bidi", tasks=dashfix.TASKS, n=2, cells=cells,
                         phase="INCOMPLETE")


@pytest.mark.parametrize("view", [[], ["--trend"], ["--flips"], ["--json"], ["--oneline"]])
def test_no_escape_or_bidi_override_from_a_journal_reaches_the_terminal(
        bidi_state: Path, view: list[str]) -> None:
    r = run_cli("--state-dir", str(bidi_state), "--no-color", "--width", "200", *view,
                prog="dashboard")
    assert r.returncode == 0, r.stderr[-1000:]
    assert "\x1b" not in r.stdout and "\u202e" not in r.stdout
    if not view:
        assert "stall" in r.stdout  # the trust line still names the reason, cleaned


def test_no_bidi_override_reaches_the_html_page(bidi_state: Path, tmp_path: Path) -> None:
    out = tmp_path / "page.html"
    r = run_cli("--state-dir", str(bidi_state), "--html", str(out), prog="dashboard")
    assert r.returncode == 0, r.stderr[-1000:]
    page = out.read_text()
    assert "\u202e" not in page and "\x1b" not in page
    assert re.search(r'title="[^"]*INVALID\(stall', page)  # the grid cell's title, cleaned


# ---------------------------------------------------------------------- writes


def test_the_metrics_textfile_never_writes_through_a_planted_symlink(tmp_path: Path) -> None:
    from autopilot.state.ledger import Ledger
    from autopilot.state.liveness import Liveness
    from autopilot.views.metrics import write_textfile

    victim = tmp_path / "victim"
    victim.write_text("root's file\n")
    victim.chmod(0o600)
    out = tmp_path / "prom"
    out.mkdir(mode=0o755)
    target = out / "autopilot.prom"
    target.symlink_to(victim)
    write_textfile(target, Ledger([]), {"phase": "COMPLETE"}, Liveness("finished", 0.0, ""))
    assert victim.read_text() == "root's file\n"
    assert not target.is_symlink() and "autopilot_" in target.read_text()
    assert [p.name for p in out.iterdir()] == ["autopilot.prom"]  # no temp left behind


def test_a_textfile_dir_others_may_write_into_is_refused_in_one_line(tmp_path: Path) -> None:
    shared = tmp_path / "shared"
    shared.mkdir()
    shared.chmod(0o777)  # no sticky bit
    r = run_cli("--preset", "demo", "--target-n", "1", "--state-dir", str(tmp_path / "s"),
                "--metrics-textfile", str(shared / "a.prom"), "--quiet")
    assert r.returncode == 2 and not (tmp_path / "s").exists()
    assert r.stderr.count("\n") == 1 and "writable by others without the sticky bit" in r.stderr
    shared.chmod(0o1777)  # like /tmp: allowed
    from autopilot.views.metrics import textfile_dir_problem

    assert textfile_dir_problem(shared) is None


def test_publish_runs_none_of_the_results_repos_hooks(tmp_path: Path) -> None:
    from autopilot.run.publish import publish

    repo = tmp_path / "results"
    subprocess.run(["git", "init", "-q", str(repo)], check=True)
    ran = tmp_path / "ran"
    ran.mkdir()
    hooks = repo / ".git" / "hooks"
    for hook in ("reference-transaction", "post-index-change", "pre-commit",
                 "post-commit"):
        (hooks / hook).write_text(f"#!/bin/sh\ntouch {ran}/{hook}\n")
        (hooks / hook).chmod(0o755)
    monitor = tmp_path / "fsmonitor.sh"
    monitor.write_text(f"#!/bin/sh\ntouch {ran}/fsmonitor\n")
    monitor.chmod(0o755)
    subprocess.run(["git", "-C", str(repo), "config", "core.fsmonitor", str(monitor)],
                   check=True)
    res = publish(repo, {"runs/x/scorecard.md": "# card\n"}, "results", date="2026-12-01")
    assert res.ok and res.created, res.error
    shown = subprocess.run(["git", "-C", str(repo), "show",
                            "bench-results-2026-12-01:runs/x/scorecard.md"],
                           capture_output=True, text=True, check=True).stdout
    assert shown == "# card\n"
    assert sorted(p.name for p in ran.iterdir()) == []


# ---------------------------------------------------------------------- the run's marker


def test_the_run_marker_is_a_private_random_secret(tmp_path: Path) -> None:
    import hashlib

    from autopilot.cell.procs import existing_run_token, run_token

    state = tmp_path / "state"
    assert existing_run_token(state) is None
    token = run_token(state)
    assert token == run_token(state) == existing_run_token(state)  # made once, kept
    assert token != hashlib.sha256(str(state.resolve()).encode()).hexdigest()[:32]
    assert stat.S_IMODE((state / "run.token").stat().st_mode) == 0o600
    other = tmp_path / "other"
    assert run_token(other) != token  # per state dir
    (other / "run.token").unlink()
    (other / "run.token").symlink_to(state / "run.token")
    assert existing_run_token(other) is None  # never read through a symlink


def test_a_marked_process_of_another_user_is_never_signalled(
        nobody: pwd.struct_passwd, tmp_path: Path) -> None:
    from autopilot.cell.procs import RUN_TOKEN_ENV, TOKEN_ENV, run_token

    state = tmp_path / "state"
    token = run_token(state)  # as a predecessor made it; a user who learnt it plants:
    env = {**cli_env(), RUN_TOKEN_ENV: token, TOKEN_ENV: "t-x",
           "AUTOPILOT_CELL_ID": "p1_bugfix_demo-nothink_v1"}
    theirs = subprocess.Popen(["sleep", "600"], env=env, user=nobody.pw_uid,
                              group=nobody.pw_gid, start_new_session=True)
    try:
        r = run_cli("--preset", "demo", "--target-n", "1", "--state-dir", str(state),
                    "--quiet")
        assert r.returncode == 0, r.stderr[-2000:]
        assert theirs.poll() is None  # alive: not ours to signal
        assert not [e for e in events(state) if e["event"] == "orphan_killed"]
        c = run_cli("cleanup", "--endpoint", "--state-dir", str(state))
        assert c.returncode == 0 and theirs.poll() is None, c.stdout
    finally:
        theirs.kill()
        theirs.wait(10)


# ---------------------------------------------------------------------- secrets

READ_PARENT = r"""
import os, subprocess, sys
sys.path.insert(0, sys.argv[1])
if sys.argv[2] == "undumpable":
    from autopilot.privacy import make_undumpable
    assert make_undumpable()
child = ("import os, sys\n"
         "try:\n"
         "    print(open(f'/proc/{os.getppid()}/environ', 'rb').read().count(b'sk-parent-only'))\n"
         "except OSError as e:\n"
         "    print(type(e).__name__)\n")
print(subprocess.run([sys.executable, "-c", child], capture_output=True, text=True).stdout.strip())
"""


@pytest.mark.parametrize(("mode", "child_sees"), [("plain", "1"),
                                                  ("undumpable", "PermissionError")])
def test_a_child_of_the_same_user_cannot_read_the_supervisors_environment(
        nobody: pwd.struct_passwd, mode: str, child_sees: str) -> None:
    # As a user (not root, who reads every process's environ): Debian's python, which
    # that user can run, with the package's stdlib-only helper.
    r = subprocess.run(["/usr/bin/python3", "-c", READ_PARENT, str(ROOT), mode],
                       capture_output=True, text=True, timeout=60, user=nobody.pw_uid,
                       group=nobody.pw_gid, cwd="/",
                       env={"PATH": "/usr/bin:/bin", "PROVIDER_KEY": "sk-parent-only-0123"})
    assert r.stdout.strip() == child_sees, r.stderr[-1000:]


def test_the_supervisor_is_not_dumpable(tmp_path: Path) -> None:
    state = tmp_path / "state"
    assert run_cli("--preset", "demo", "--target-n", "1", "--state-dir", str(state),
                   "--quiet").returncode == 0
    started = [e for e in events(state) if e["event"] == "run_started"]
    assert started and started[0]["dumpable"] is False


def test_a_leaked_key_reaches_no_report_commit_or_page(tmp_path: Path) -> None:
    import base64

    key = "sk-demo-0123456789abcdefXYZ"
    forms = [key, base64.b64encode(f"user:{key}".encode()).decode()[8:]]
    repo = tmp_path / "results"
    subprocess.run(["git", "init", "-q", str(repo)], check=True)
    state = tmp_path / "state"
    over = write_overlay(tmp_path / "o.json", {
        "vars": {"hostile": "secret"}, "tasks": [{"id": "p1_bugfix"}, {"id": "p2_extract"}],
        "harness": {"argv": ["{python}", f"{ADV}/hostile_summary.py", "{hostile}",
                             "{output_dir}", *DEMO_ARGS], "pass_env": ["DEMO_SECRET"]},
        "preflight": {"secrets": ["DEMO_SECRET"]}, "baseline": None})
    env = cli_env(DEMO_SECRET=key)
    r = run_cli("--preset", "demo", "--target-n", "1", "--config", str(over), "--state-dir",
                str(state), "--quiet", "--publish", "--results-repo", str(repo), env=env)
    assert r.returncode == 0, r.stderr[-2000:]
    rep = run_cli("report", "--state-dir", str(state), env=env)
    board = run_cli("board", str(state), "--out", str(tmp_path), env=env)
    committed = subprocess.run(["git", "-C", str(repo), "log", "-p", "--all"],
                               capture_output=True, text=True, check=True).stdout
    texts = {"report": rep.stdout, "findings.md": (state / "findings.md").read_text(),
             "commit": committed, "board": (tmp_path / "board.md").read_text() + board.stdout}
    assert r"stop key=\*\*\*" in texts["report"]  # the finish reason, redacted, escaped
    p = subprocess.Popen([sys.executable, "-m", "autopilot.views.dashboard.cli",
                          "--state-dir", str(state), "--serve", "--bind", "127.0.0.1:0"],
                         env=env, cwd=ROOT, stdout=subprocess.PIPE, text=True)
    try:
        line = p.stdout.readline() if p.stdout else ""
        url = re.search(r"(http://127\.0\.0\.1:\d+/)", line)
        assert url, line
        for cid in ("p1_bugfix_demo-nothink_v1", "p2_extract_demo-think_v1"):
            texts[cid] = httpx.get(f"{url.group(1)}cell/{cid}", timeout=10).text
        assert "my key is ***" in texts["p1_bugfix_demo-nothink_v1"]  # the transcript tail
    finally:
        p.kill()
        p.wait(10)
    leaks = {name: form for name, text in texts.items() for form in forms if form in text}
    assert leaks == {}
