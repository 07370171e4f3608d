"""The state dir is not a trust anchor: planted journals, symlinked state files, a
planted plan.json and foreign ownership never make the autopilot kill, truncate or
delete anything outside the run; what it creates is private whatever the umask; a
process identity is compared exactly."""

from __future__ import annotations

import contextlib
import json
import os
import stat
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import psutil
import pytest
from conftest import ROOT, cli_env, events, run_cli

from autopilot.cell.procs import ProcIdentity, identify, start_ticks, verify

NOBODY = 65534
DEMO1 = ["--preset", "demo", "--target-n", "1", "--quiet"]


@contextlib.contextmanager
def victims(n: int = 2) -> Iterator[list[subprocess.Popen[bytes]]]:
    """Processes of "someone else": no run marker, not the supervisor's descendants."""
    procs = [subprocess.Popen(["sleep", "120"]) for _ in range(n)]
    try:
        yield procs
    finally:
        for p in procs:
            p.kill()
            p.wait(10)


def plant_journal(state: Path, procs: list[subprocess.Popen[bytes]]) -> None:
    """A journal naming the victims as a dead predecessor's endpoint and running cell,
    with their real pid and start time (what an attacker can read from /proc)."""
    state.mkdir(parents=True, exist_ok=True)
    ep, cell = (identify(p.pid) for p in procs)
    assert ep and cell
    lines = [
        {"ts": "2026-11-30T00:00:00+00:00", "event": "endpoint_spawned", "engine": "sim",
         "pid": ep.pid, "create_time": ep.create_time, "start_ticks": ep.ticks},
        {"ts": "2026-11-30T00:00:01+00:00", "event": "cell_started",
         "cell": "p1_bugfix_demo-nothink_v1", "attempt": 1, "pid": cell.pid,
         "create_time": cell.create_time, "start_ticks": cell.ticks, "token": "t"},
    ]
    (state / "journal.jsonl").write_text("".join(json.dumps(x) + "\n" for x in lines))


def test_a_journal_planted_by_another_user_is_refused_and_kills_nothing(
        state_dir: Path) -> None:
    with victims() as procs:
        plant_journal(state_dir, procs)
        os.chown(state_dir / "journal.jsonl", NOBODY, NOBODY)
        r = run_cli(*DEMO1, "--state-dir", str(state_dir))
        assert r.returncode == 2
        assert r.stderr.count("\n") == 1
        assert f"{state_dir}/journal.jsonl (owner nobody, mode -rw-r--r--)" in r.stderr
        assert all(p.poll() is None for p in procs)
        assert sorted(os.listdir(state_dir)) == ["journal.jsonl"]  # nothing written


def test_a_journal_naming_foreign_processes_is_not_obeyed(state_dir: Path) -> None:
    # Belt and braces: even a journal that passes the ownership checks (here: our own
    # file) names a process that is signalled only if it carries the run's marker or is
    # our descendant. These two are neither; their exact identities are alive.
    with victims() as procs:
        plant_journal(state_dir, procs)
        os.chmod(state_dir, 0o700)
        r = run_cli(*DEMO1, "--state-dir", str(state_dir))
        assert r.returncode == 0, r.stderr[-2000:]
        assert all(p.poll() is None for p in procs)
        refused = {e["pid"] for e in events(state_dir) if e["event"] == "journal_pid_refused"}
        assert refused == {p.pid for p in procs}


@pytest.mark.parametrize("mode", [0o777, 0o770, 0o757])
def test_a_group_or_other_writable_state_dir_is_refused(state_dir: Path, mode: int) -> None:
    state_dir.mkdir()
    os.chmod(state_dir, mode)
    r = run_cli(*DEMO1, "--state-dir", str(state_dir))
    assert r.returncode == 2 and "untrusted state dir" in r.stderr
    assert f"mode {stat.filemode(stat.S_IFDIR | mode)}" in r.stderr
    assert os.listdir(state_dir) == []


def test_a_state_dir_of_another_user_is_refused(state_dir: Path) -> None:
    state_dir.mkdir(mode=0o700)
    os.chown(state_dir, NOBODY, NOBODY)
    r = run_cli(*DEMO1, "--state-dir", str(state_dir))
    assert r.returncode == 2 and "(owner nobody" in r.stderr
    assert os.listdir(state_dir) == []


def test_a_state_dir_path_through_another_users_symlink_is_refused(tmp_path: Path) -> None:
    """Issue #34: another user's symlink as the state dir passed the check (only its
    target was checked), and root wrote the whole run into the root-only directory it
    pointed at."""
    victim = tmp_path / "root-only"
    victim.mkdir(mode=0o700)
    (victim / "status.json").write_text("precious\n")
    link = tmp_path / "planted"
    link.symlink_to(victim)
    os.chown(link, NOBODY, NOBODY, follow_symlinks=False)
    r = run_cli(*DEMO1, "--state-dir", str(link))
    assert r.returncode == 2, r.stderr
    assert "is a symlink owned by nobody" in r.stderr and len(r.stderr.splitlines()) == 1
    assert sorted(os.listdir(victim)) == ["status.json"]
    assert (victim / "status.json").read_text() == "precious\n"


def test_a_looping_state_dir_path_is_one_line_and_exit_2(tmp_path: Path) -> None:
    (tmp_path / "a").symlink_to(tmp_path / "b")
    (tmp_path / "b").symlink_to(tmp_path / "a")
    r = run_cli(*DEMO1, "--state-dir", str(tmp_path / "a" / "state"))
    assert r.returncode == 2 and "symlink loop" in r.stderr, r.stderr
    assert "Traceback" not in r.stderr and len(r.stderr.splitlines()) == 1


def test_our_own_symlink_is_followed_once_and_the_run_lives_at_its_target(
        tmp_path: Path) -> None:
    real = tmp_path / "real"
    real.mkdir(mode=0o700)
    (tmp_path / "mine").symlink_to(real)
    r = run_cli(*DEMO1, "--state-dir", str(tmp_path / "mine" / "state"))
    assert r.returncode == 0, r.stderr
    assert (real / "state" / "journal.jsonl").exists()


@pytest.mark.parametrize("name", ["autopilot.lock", "autopilot.log", "journal.jsonl",
                                  "logs/p1_bugfix_demo-nothink_v1.launcher.log"])
def test_a_symlinked_state_file_is_refused_and_its_target_untouched(
        state_dir: Path, tmp_path: Path, name: str) -> None:
    target = tmp_path / "root-owned.conf"
    target.write_text("precious\n")
    (state_dir / "logs").mkdir(parents=True, mode=0o700)
    os.chmod(state_dir, 0o700)
    (state_dir / name).symlink_to(target)
    r = run_cli(*DEMO1, "--state-dir", str(state_dir))
    assert r.returncode == 2 and "is a symlink" in r.stderr and name in r.stderr
    assert target.read_text() == "precious\n"


def test_cleanup_never_takes_a_preset_path_from_plan_json(state_dir: Path,
                                                          tmp_path: Path) -> None:
    assert run_cli(*DEMO1, "--state-dir", str(state_dir)).returncode == 0
    victim = tmp_path / "victim"
    cells = [c for c in json.loads((state_dir / "plan.json").read_text())["tasks"]]
    for t in cells:
        (victim / t).mkdir(parents=True)
    evil = tmp_path / "evil.toml"
    evil.write_text((ROOT / "presets" / "demo.toml").read_text().replace(
        "[harness]", f'[harness]\nscratch_dirs = ["{victim}/{{task}}"]', 1))
    plan = json.loads((state_dir / "plan.json").read_text())
    # The preset path and the name are both the attacker's: the path is never used...
    (state_dir / "plan.json").write_text(json.dumps({**plan, "preset_path": str(evil)}))
    r = run_cli("cleanup", "--state-dir", str(state_dir))
    assert r.returncode == 0, r.stderr
    assert all((victim / t).is_dir() for t in cells)
    # ... the run's own record is (autopilot.state.resolved) ...
    (state_dir / "plan.json").write_text(json.dumps({**plan, "preset": str(evil)}))
    r = run_cli("cleanup", "--state-dir", str(state_dir))
    assert r.returncode == 0, r.stderr
    assert all((victim / t).is_dir() for t in cells)
    # ... and without one (a state dir from before records) a name that is a path is
    # refused outright.
    older = {k: v for k, v in plan.items() if k != "resolved_sha256"}
    (state_dir / "plan.json").write_text(json.dumps({**older, "preset": str(evil)}))
    r = run_cli("cleanup", "--state-dir", str(state_dir))
    assert r.returncode == 2 and "is not a preset name; pass --preset" in r.stderr
    assert all((victim / t).is_dir() for t in cells)


def test_state_files_are_private_whatever_the_umask(state_dir: Path) -> None:
    r = subprocess.run([sys.executable, "-m", "autopilot.cli", *DEMO1, "--state-dir",
                        str(state_dir)], env=cli_env(), capture_output=True, text=True,
                       timeout=180, preexec_fn=lambda: os.umask(0))
    assert r.returncode == 0, r.stderr[-2000:]
    assert stat.S_IMODE(state_dir.stat().st_mode) == 0o700
    written = [p for p in state_dir.rglob("*")
               if p.is_file() and "cells" not in p.relative_to(state_dir).parts]
    assert {"journal.jsonl", "autopilot.lock", "autopilot.log", "status.json",
            "plan.json", "heartbeat.json"} <= {p.name for p in written}
    loose = {str(p.relative_to(state_dir)): oct(stat.S_IMODE(p.stat().st_mode))
             for p in written if stat.S_IMODE(p.stat().st_mode) != 0o600}
    assert loose == {}
    logs = state_dir / "logs"
    assert stat.S_IMODE(logs.stat().st_mode) == 0o700


def test_identity_is_exact_not_within_a_tolerance() -> None:
    with victims(1) as (p,):
        ident = identify(p.pid)
        assert ident is not None and ident.ticks == start_ticks(p.pid)
        assert verify(ident) is not None
        # A decoy on the same pid started one clock tick (10 ms) later, or with a
        # create_time 40 ms off (inside the old 50 ms window): not ours.
        assert verify(ProcIdentity(p.pid, ident.create_time, ident.ticks + 1)) is None
        assert verify(ProcIdentity(p.pid, ident.create_time + 0.04)) is None
        assert verify(ProcIdentity(p.pid, ident.create_time)) is not None
        assert psutil.Process(p.pid).is_running()
