"""The first hour of a new user: the terminal shows progress (not a log line per event),
a stop says how far it got and how to resume, the run's target N is remembered, a plan
change is shown where results are read, and every cell that is not valid says why."""

from __future__ import annotations

import json
import os
import pty
import select
import shlex
import shutil
import signal
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest
from conftest import DEMO_ARGS, ROOT, cli_env, events, run_cli, wait_for, write_overlay

ANSI = __import__("re").compile(r"\x1b\[[0-9;?]*[a-zA-Z]")


def run_on_a_terminal(args: list[str], timeout: float = 120) -> tuple[int, str]:
    pid, fd = pty.fork()
    if pid == 0:  # child: the supervisor on a pseudo-terminal
        os.chdir(ROOT)
        os.execve(sys.executable, [sys.executable, "-m", "autopilot.cli", *args],
                  cli_env(TERM="xterm", COLUMNS="120", LINES="40"))
    out = b""
    while True:
        ready, _, _ = select.select([fd], [], [], timeout)
        assert ready, f"no output for {timeout}s: {out[-500:]!r}"
        try:
            chunk = os.read(fd, 65536)
        except OSError:  # EIO: the child closed the terminal
            break
        if not chunk:
            break
        out += chunk
    _, status = os.waitpid(pid, 0)
    return os.waitstatus_to_exitcode(status), ANSI.sub("", out.decode("utf-8", "replace"))


@pytest.mark.slow
def test_a_terminal_gets_a_progress_panel_not_a_log_line_per_event(tmp_path: Path) -> None:
    code, out = run_on_a_terminal(["--preset", "demo", "--target-n", "2", "--state-dir",
                                   str(tmp_path / "s")])
    assert code == 0, out[-2000:]
    assert "24/24 valid" in out and "100%" in out and "━" in out
    assert "demo-nothink" in out and "pending" in out  # the per-arm table
    assert "AUTOPILOT_COMPLETE" in out
    assert "cell_verdict" not in out and "cell_started" not in out  # no info log lines
    # Off a terminal (and with --quiet) the plain behaviour stays.
    r = run_cli("--preset", "demo", "--target-n", "1", "--state-dir", str(tmp_path / "t"))
    assert r.returncode == 0 and "━" not in r.stderr and "cell_verdict" in r.stderr


@pytest.mark.slow
def test_a_stop_says_how_far_and_the_exact_resume_command(tmp_path: Path) -> None:
    # Started as a venv's console script (the Quick start's `.venv/bin/autopilot`): the
    # resume line names that program, not a bare `autopilot` the shell may not find.
    state = tmp_path / "state"
    over = write_overlay(tmp_path / "o.json", {"vars": {"think_secs": "0.3"}})
    script = Path(sys.executable).parent / "autopilot"
    p = subprocess.Popen([str(script), "--preset", "demo", "--config", str(over), "--quiet"],
                         env=cli_env(AUTOPILOT_STATE_DIR=str(state)), cwd=tmp_path,
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        wait_for(lambda: sum(e["event"] == "cell_verdict" for e in events(state)) >= 2,
                 what="some cells done")
        p.send_signal(signal.SIGTERM)
        _, err = p.communicate(timeout=60)
    finally:
        if p.poll() is None:
            p.kill()
            p.wait()
    assert p.returncode == 143
    line = next(ln for ln in err.splitlines() if ln.startswith("AUTOPILOT_STOPPED"))
    assert line.startswith("AUTOPILOT_STOPPED by SIGTERM: stopped demo ")
    command = line.split("; resume with: ", 1)[1]
    argv = shlex.split(command)
    assert argv[0] == str(script) and argv[argv.index("--state-dir") + 1] == str(state)
    assert argv[argv.index("--target-n") + 1] == "3"
    assert argv[argv.index("--config") + 1] == str(over)  # absolute, run from anywhere
    r = subprocess.run(argv, env=cli_env(), cwd="/", capture_output=True, text=True,
                       timeout=180)  # the line exactly as printed, from another dir
    assert r.returncode == 0, r.stderr[-2000:]


def test_the_resume_line_of_python_m_autopilot_is_this_interpreter_s() -> None:
    for first in ("/x/autopilot/cli.py", "/x/autopilot/__main__.py", "-c"):
        assert subprocess.run(
            [sys.executable, "-c", f"import sys; sys.argv = [{first!r}]; "
             "from autopilot.runline import program; print(program())"],
            capture_output=True, text=True, cwd=ROOT).stdout.strip() == \
            str([sys.executable, "-m", "autopilot"])


def one_task_run(tmp_path: Path) -> tuple[Path, list[str]]:
    """A demo run of one task, quick: its state dir and the flags that drive it."""
    state = tmp_path / "state"
    over = write_overlay(tmp_path / "o.json", {"vars": {"think_secs": "0"},
                                               "tasks": [{"id": "p1_bugfix"}]})
    return state, ["--preset", "demo", "--config", str(over), "--state-dir", str(state),
                   "--quiet"]


def test_the_runs_target_n_is_remembered(tmp_path: Path) -> None:
    state, base = one_task_run(tmp_path)
    assert run_cli(*base, "--target-n", "4").returncode == 0
    r = run_cli(*base)  # the preset says 3: the state dir says 4
    assert r.returncode == 0, r.stderr
    assert f"target N 4: remembered from {state}/plan.json" in r.stderr
    status = json.loads((state / "status.json").read_text())
    assert status["target_n"] == 4 and status["totals"]["total"] == 8
    assert "N=4" in run_cli("report", "--state-dir", str(state)).stdout
    r = run_cli(*base, "--target-n", "5")
    assert r.returncode == 0 and "target N changes 4 -> 5" in r.stderr


def test_elapsed_counts_the_whole_run_across_resumes(tmp_path: Path) -> None:
    from autopilot.run.snapshot import prior_elapsed
    from autopilot.state.progress import fmt_secs

    state, base = one_task_run(tmp_path)
    assert run_cli(*base, "--target-n", "1").returncode == 0
    # As if that first launch had run for 5000 s (it ran for seconds): what its status
    # said is where the resume's clock starts, and the --once rebuild keeps it too.
    path = state / "status.json"
    path.write_text(json.dumps({**json.loads(path.read_text()), "elapsed_secs": 5000.0}))
    assert run_cli(*base, "--target-n", "2").returncode == 0
    after = json.loads(path.read_text())["elapsed_secs"]
    assert after > 5000  # carried on, not restarted
    shown = run_cli("--state-dir", str(state), prog="dashboard").stdout
    assert f"elapsed {fmt_secs(after)}" in shown
    assert run_cli(*base, "--once").returncode == 0
    assert json.loads(path.read_text())["elapsed_secs"] == after
    # A bad value adds nothing: the --once rebuild (which runs for no time) says exactly
    # 0, and a resume starts its clock from 0, not from what it carried before.
    path.write_text(json.dumps({**json.loads(path.read_text()), "elapsed_secs": "x"}))
    assert run_cli(*base, "--once").returncode == 0
    assert json.loads(path.read_text())["elapsed_secs"] == 0.0
    path.write_text(json.dumps({**json.loads(path.read_text()), "elapsed_secs": "x"}))
    assert run_cli(*base, "--target-n", "3").returncode == 0
    launches = [e for e in events(state) if e["event"] == "run_started"]
    assert launches[-1]["elapsed_before"] == 0.0  # the carried 5000 is gone
    assert launches[-2]["elapsed_before"] == 5000.0  # where the good one carried on
    # a state file: anything but a plain non-negative number counts as nothing
    for bad in ("x", True, -1, float("nan"), float("inf"), None, [5]):
        assert prior_elapsed({"elapsed_secs": bad}) == 0.0
    assert prior_elapsed("not a dict") == 0.0 and prior_elapsed({"elapsed_secs": 12}) == 12.0


def test_a_plan_change_is_journaled_and_shown(tmp_path: Path) -> None:
    state = tmp_path / "state"
    one = write_overlay(tmp_path / "a.json", {"vars": {"think_secs": "0"},
                                              "tasks": [{"id": "p1_bugfix"}]})
    two = write_overlay(tmp_path / "b.json", {"vars": {"think_secs": "0"},
                                              "tasks": [{"id": "p1_bugfix"},
                                                        {"id": "p2_extract"}]})
    base = ["--preset", "demo", "--target-n", "1", "--state-dir", str(state), "--quiet"]
    assert run_cli(*base, "--config", str(one)).returncode == 0
    r = run_cli(*base, "--config", str(two))
    assert r.returncode == 2 and "--allow-plan-change" in r.stderr
    assert run_cli(*base, "--config", str(two), "--allow-plan-change").returncode == 0
    changes = [e for e in events(state) if e["event"] == "plan_changed"]
    assert len(changes) == 1
    report = run_cli("report", "--state-dir", str(state)).stdout
    assert "**PLAN CHANGED**" in report and changes[0]["new"] in report
    grid = run_cli("--state-dir", str(state), "--no-color", prog="dashboard").stdout
    assert "plan_changed identity" in grid


FATE = ("import os, sys\n"
        "if sys.argv[1] == 'crash':\n"
        "    print('ImportError: no module named frob'); sys.exit(3)\n"
        "os.execv(sys.executable, [sys.executable, '-m', 'autopilot.demo.harness', "
        "*sys.argv[2:]])\n")


def test_every_cell_that_is_not_valid_says_why(tmp_path: Path) -> None:
    state = tmp_path / "state"
    wrong = ["{python}", "-c", "import json, sys; json.dump(dict(result='PASS'), "
             "open(sys.argv[1], 'w'))", "{grade_file}"]
    over = write_overlay(tmp_path / "o.json", {
        "vars": {"fate": "ok"},
        "tasks": [{"id": "p1_bugfix", "grader_argv": wrong},
                  {"id": "p2_extract", "vars": {"fate": "crash"}}],
        "arms": [{"label": "demo-nothink", "mode": "nothink"}],
        "harness": {"argv": ["{python}", "-c", FATE, "{fate}", *DEMO_ARGS]},
        "trust": {"infra_retries": 0}})
    r = run_cli("--preset", "demo", "--target-n", "1", "--config", str(over),
                "--state-dir", str(state), "--quiet")
    assert r.returncode == 1
    v = run_cli("validate", "--state-dir", str(state))
    assert v.returncode == 1
    rows = {ln.split()[0]: ln for ln in v.stdout.splitlines() if ln.startswith("p")}
    crashed = rows["p2_extract_demo-nothink_v1"]
    assert "quarantined" in crashed and "harness_crash" in crashed
    assert "exit code 3" in crashed and "ImportError: no module named frob" in crashed
    assert "no 'verdict' in grade" in rows["p1_bugfix_demo-nothink_v1"]


def readme_blocks() -> dict[str, str]:
    """The files of docs/presets.md's "Writing your own preset" example, by name."""
    text = (ROOT / "docs" / "presets.md").read_text()
    section = text.split("### Writing your own preset", 1)[1].split("\n### ", 1)[0]
    out = {}
    for name, body in __import__("re").findall(r"`([\w.-]+)`:\n\n```\w+\n(.*?)```", section,
                                               __import__("re").S):
        out[name] = body
    return out


def test_the_documented_example_is_what_init_writes_and_it_runs(tmp_path: Path) -> None:
    blocks = readme_blocks()
    assert set(blocks) == {"my-bench.toml", "my-bench_harness.py", "my-bench_grader.py"}
    r = run_cli("init", "my-bench", "--dir", str(tmp_path))
    assert r.returncode == 0, r.stderr
    for name, body in blocks.items():
        assert (tmp_path / name).read_text() == body, name  # the page is the truth
    dry = run_cli("--preset", "./my-bench.toml", "--target-n", "2", "--dry-run",
                  "--state-dir", str(tmp_path / "s"), cwd=tmp_path)
    assert dry.returncode == 0, dry.stderr
    run = run_cli("--preset", "./my-bench.toml", "--target-n", "2", "--state-dir",
                  str(tmp_path / "s"), "--quiet", cwd=tmp_path)
    assert run.returncode == 0, run.stderr[-2000:]
    status = json.loads((tmp_path / "s" / "status.json").read_text())
    assert status["phase"] == "COMPLETE" and status["totals"]["pass"] == 2
    assert status["endpoint"]["engine"] == "none"
    again = run_cli("init", "my-bench", "--dir", str(tmp_path))
    assert again.returncode == 2 and "exists; nothing written" in again.stderr
    assert run_cli("init", "../x", "--dir", str(tmp_path)).returncode == 2


def test_every_config_error_at_once_with_suggestions(tmp_path: Path) -> None:
    bad = tmp_path / "bad.toml"
    bad.write_text('concurrency = 3\n[harness]\nargvv = ["x"]\n[endpoint]\n'
                   'engine = "llamacpp"\nbinaryy = "x"\n')
    r = run_cli("--preset", "demo", "--config", str(bad), "--target-n", "1", "--dry-run")
    assert r.returncode == 2 and r.stderr.count("\n") == 1
    assert "harness.argvv: unknown key (did you mean 'argv'?)" in r.stderr
    assert "endpoint.binaryy: unknown key (did you mean 'binary'?)" in r.stderr
    assert "concurrency: unknown key (did you mean [run] concurrency?)" in r.stderr
    ext = tmp_path / "child.toml"
    ext.write_text('extends = "no-such-base"\n')
    r = run_cli("--preset", str(ext), "--target-n", "1", "--dry-run")
    assert r.returncode == 2 and r.stderr.startswith(f"autopilot: error: {ext}: extends = ")


def test_small_things_that_break_scripts(tmp_path: Path) -> None:
    state = tmp_path / "state"
    assert run_cli("--preset", "demo", "--target-n", "1", "--state-dir", str(state),
                   "--quiet").returncode == 0
    # A closed pipe is the reader's choice, not an error.
    for cmd in ([sys.executable, "-m", "autopilot.views.dashboard.cli", "--json"],
                [sys.executable, "-m", "autopilot", "validate"]):
        p = subprocess.run(f"{shlex.join(cmd)} --state-dir {state} | head -c 10",
                           shell=True, capture_output=True, text=True, env=cli_env(),
                           cwd=ROOT, executable="/bin/bash")
        assert "Traceback" not in p.stderr and "BrokenPipe" not in p.stderr, p.stderr
    # --html into a directory that does not exist: refused, nothing created.
    r = run_cli("--state-dir", str(state), "--html", str(tmp_path / "no/such/x.html"),
                prog="dashboard")
    assert r.returncode == 2 and "does not exist" in r.stderr
    assert not (tmp_path / "no").exists()
    # Completion scripts and real metavars.
    comp = run_cli("completion", "bash")
    assert comp.returncode == 0 and "_shtab_autopilot" in comp.stdout
    assert "--target-n" in comp.stdout and "regrade" in comp.stdout
    dcomp = run_cli("--print-completion", "zsh", prog="dashboard")
    assert dcomp.returncode == 0 and "--oneline" in dcomp.stdout
    helps = run_cli("cleanup", "--help").stdout + run_cli("notify-test", "--help").stdout
    assert "--state-dir DIR" in helps and "SUB_STATE_DIR" not in helps
    assert "NT_PRESET" not in helps and "--preset PRESET" in helps


# `pip install .` (the Quick start) and then `python -m autopilot` in the checkout's root:
# the checkout's autopilot/ is imported, not the installed one, and it has no presets
# inside. Our test venv is an editable install, whose finder would map the presets back:
# it is taken out, as a plain install has none.
AS_PLAIN_INSTALL = """
import runpy, sys
sys.meta_path[:] = [f for f in sys.meta_path if "_EditableFinder" not in repr(f)]
sys.argv = ["autopilot", *sys.argv[1:]]
runpy.run_module("autopilot", run_name="__main__", alter_sys=True)
"""


def test_python_m_autopilot_in_the_checkout_root_finds_the_presets(tmp_path: Path) -> None:
    r = subprocess.run([sys.executable, "-c", AS_PLAIN_INSTALL, "presets"], cwd=ROOT,
                       capture_output=True, text=True, env=cli_env(), timeout=60)
    assert r.returncode == 0, r.stderr[-2000:]
    assert "demo " in r.stdout and "tiny-llamacpp" in r.stdout
    dry = subprocess.run([sys.executable, "-c", AS_PLAIN_INSTALL, "--preset", "demo",
                          "--target-n", "1", "--dry-run", "--state-dir", str(tmp_path / "s")],
                         cwd=ROOT, capture_output=True, text=True, env=cli_env(), timeout=60)
    assert dry.returncode == 0 and "dry run: nothing launched" in dry.stdout, dry.stderr


def test_a_private_state_dir_says_permission_denied() -> None:
    # Another user (nobody) looks at a root-run state dir (0700): "permission denied",
    # never "no run yet" / "no plan.json here". The venv's interpreter lives in root's
    # home, so the system one runs our code with the venv's packages on its path.
    system_python = Path("/usr/bin/python3")
    if os.geteuid() != 0 or not system_python.exists():
        pytest.skip("needs root (to switch to nobody) and /usr/bin/python3")
    base = Path(tempfile.mkdtemp(prefix="autopilot-perm-"))
    try:
        os.chmod(base, 0o755)
        state = base / "state"
        assert run_cli("--preset", "demo", "--target-n", "1", "--state-dir", str(state),
                       "--quiet").returncode == 0
        site = next((ROOT / ".venv" / "lib").glob("python3*/site-packages"))
        env = {"PATH": "/usr/bin:/bin", "PYTHONPATH": f"{ROOT}:{site}"}
        for argv in (["-m", "autopilot.views.dashboard.cli", "--oneline"],
                     ["-m", "autopilot", "validate"]):
            r = subprocess.run([str(system_python), *argv, "--state-dir", str(state)],
                               capture_output=True, text=True, env=env, cwd="/",
                               preexec_fn=lambda: (os.setgid(65534), os.setuid(65534)))
            assert r.returncode == 2, (argv, r.stdout, r.stderr)
            assert "permission denied" in r.stderr and "no run yet" not in r.stdout
    finally:
        shutil.rmtree(base)


@pytest.mark.slow
def test_watch_with_html_rewrites_the_page(tmp_path: Path) -> None:
    state = tmp_path / "state"
    assert run_cli("--preset", "demo", "--target-n", "1", "--state-dir", str(state),
                   "--quiet").returncode == 0
    page = tmp_path / "live.html"
    p = subprocess.Popen([sys.executable, "-m", "autopilot.views.dashboard.cli", "--state-dir",
                          str(state), "--watch", "0.2", "--html", str(page)], env=cli_env(),
                         cwd=ROOT, stdout=subprocess.PIPE, text=True)
    try:
        assert p.stdout.readline().startswith(f"wrote {page} (refresh #1)")
        first = page.stat().st_ino
        assert p.stdout.readline().startswith(f"wrote {page} (refresh #2)")
        assert page.stat().st_ino != first  # replaced atomically, not rewritten in place
        assert "<table" in page.read_text()
    finally:
        p.send_signal(signal.SIGINT)
        p.wait(10)
    assert p.returncode == 0


def test_the_default_state_dir_is_per_user_and_per_preset(tmp_path: Path) -> None:
    """The Quick start's demo, then `autopilot init` and the command it suggests: the
    second preset gets a dir of its own (it used to meet the demo's run and exit 2)."""
    env = cli_env(TMPDIR=str(tmp_path))
    env.pop("AUTOPILOT_STATE_DIR", None)
    import pwd

    base = tmp_path / f"bench-autopilot-{pwd.getpwuid(os.geteuid()).pw_name}"
    over = write_overlay(tmp_path / "o.json", {"vars": {"think_secs": "0"},
                                               "tasks": [{"id": "p1_bugfix"}]})
    r = run_cli("--preset", "demo", "--config", str(over), "--target-n", "1", "--quiet",
                env=env)
    assert r.returncode == 0, r.stderr[-2000:]
    assert (base / "demo" / "plan.json").is_file()
    one = run_cli("--oneline", env=env, prog="dashboard")
    assert "COMPLETE" in one.stdout and "latest of" not in one.stderr, one.stderr
    init = run_cli("init", "my-bench", "--dir", str(tmp_path), env=env)
    assert init.returncode == 0, init.stderr
    suggested = shlex.split(init.stdout.splitlines()[-1].removeprefix("next: "))
    assert suggested[:2] == ["autopilot", "--preset"]
    dry = run_cli(*suggested[1:], env=env, cwd=tmp_path)
    assert dry.returncode == 0, dry.stderr
    assert str(base / "my-bench") in dry.stdout
    # A second run of its own: views without --state-dir say which one they read.
    other = tmp_path / "other.toml"
    other.write_text((ROOT / "presets" / "demo.toml").read_text())
    r = run_cli("--preset", str(other), "--config", str(over), "--target-n", "1", "--quiet",
                env=env)
    assert r.returncode == 0, r.stderr[-2000:]
    assert (base / "other" / "plan.json").is_file()
    both = run_cli("--oneline", env=env, prog="dashboard")
    assert f"(state dir {base / 'other'}: the latest of 2 runs in {base}" in both.stderr
    v = run_cli("validate", "--preset", "demo", env=env)
    assert v.returncode == 0 and "PASS=2" in v.stdout and "latest of" not in v.stderr
    for bad in ("..", "a b", "\x1b[31mred"):  # the dir is named after it: refused
        r = run_cli("validate", "--preset", bad, env=env)
        assert r.returncode == 2 and len(r.stderr.splitlines()) == 1
        assert "not a preset name or a .toml path" in r.stderr and "\x1b" not in r.stderr
