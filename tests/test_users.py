"""A user per cell (issue #34, ``[harness] user = "cell"``): with the supervisor as root,
each cell's harness and grader run as a uid of their own, reach their own output dir and
nothing else of the run, and every process of that uid ends with the cell. Real uids,
real setpriv, real cgroups (tools/test runs as root); the harness is /bin/sh, since the
interpreter of this checkout may live where another uid cannot go."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import psutil
import pytest
from conftest import cli_env, events, run_cli, write_overlay

from autopilot.cell.users import UidPool

pytestmark = pytest.mark.skipif(os.geteuid() != 0 or not shutil.which("setpriv"),
                                reason="needs root and setpriv (tools/test runs as root)")

# The harness: records who it is and what it could reach, leaves an env-cleared daemon
# behind, writes its summary.
HARNESS = r'''
out="$1"; state="$2"
id -u > "$out/uid"
id -G > "$out/groups"
if cat "$state/run.token" >/dev/null 2>&1; then echo READ; else echo denied; fi > "$out/token"
if echo '{{"event":"cell_verdict"}}' >> "$state/journal.jsonl" 2>/dev/null; then echo WROTE; \
  else echo denied; fi > "$out/journal"
if ls "$state/cells" >/dev/null 2>&1; then echo LISTED; else echo denied; fi > "$out/cells"
env -i /bin/sleep 900 & echo $! > "$out/daemon.pid"
echo '{{"total_completion_tokens": 3}}' > "$out/summary.json"
'''
GRADER = ["/bin/sh", "-c", 'id -u > "$2.uid"; echo \'{{"verdict": "PASS"}}\' > "$1"', "grade",
          "{grade_file}", "{output_dir}/grader"]


def run_as_cells(tmp_path: Path, env: dict[str, str], **harness: object
                 ) -> tuple[Path, list[dict]]:
    over = write_overlay(tmp_path / "o.json", {
        "tasks": [{"id": "p1_bugfix"}, {"id": "p2_extract"}],
        "arms": [{"label": "demo-nothink", "mode": "nothink"}],
        "harness": {"argv": ["/bin/sh", "-c", HARNESS, "harness", "{output_dir}",
                             "{state_dir}"], "uids": [61184, 61199],
                    **({"user": "cell"} | harness)},
        "grader": {"argv": GRADER}, "trust": {"arm_checks": []}, "baseline": None})
    state = tmp_path / "state"
    r = run_cli("--preset", "demo", "--target-n", "1", "--config", str(over),
                "--state-dir", str(state), "--quiet", env=env)
    assert r.returncode == 0, r.stdout + r.stderr[-2000:]
    return state, events(state)


def daemons(state: Path) -> list[int]:
    return [int(p.read_text()) for p in (state / "cells").glob("*/daemon.pid")]


def alive(pids: list[int]) -> list[int]:
    out = []
    for pid in pids:
        try:
            if psutil.Process(pid).status() != psutil.STATUS_ZOMBIE:
                out.append(pid)
        except psutil.NoSuchProcess:
            continue
    return out


@pytest.mark.parametrize("cgroups", ["on", "off"])
def test_each_cell_runs_as_its_own_user_and_reaches_only_its_own_dir(
        reachable: Path, cgroups: str) -> None:
    env = cli_env(**({"AUTOPILOT_CGROUPS": "off"} if cgroups == "off" else {}))
    state, evs = run_as_cells(reachable, env)
    try:
        spawns = [e for e in evs if e["event"] == "cell_spawning"]
        uids = {e["cell"]: e["uid"] for e in spawns}
        assert len(uids) == 2 and len(set(uids.values())) == 2
        assert all(61184 <= u <= 61199 for u in uids.values())
        for cell, uid in uids.items():
            out = state / "cells" / cell
            assert int((out / "uid").read_text()) == uid  # the harness's own uid
            assert int((out / "grader.uid").read_text()) == uid  # and its grader's
            assert (out / "token").read_text().strip() == "denied"
            assert (out / "journal").read_text().strip() == "denied"
            assert (out / "cells").read_text().strip() == "denied"
            assert (out / "uid").stat().st_uid == uid  # it wrote there as itself
            assert out.stat().st_uid == 0 and (out.stat().st_mode & 0o077) == 0  # let go of
        a, b = list(uids)
        peek = subprocess.run(["setpriv", f"--reuid={uids[a]}", f"--regid={uids[a]}",
                               "--clear-groups", "cat", str(state / "cells" / b / "uid")],
                              capture_output=True, text=True)
        assert peek.returncode != 0  # one cell cannot read another's outputs
        verdicts = [e for e in evs if e["event"] == "cell_verdict"]
        assert sorted(v["verdict"] for v in verdicts) == ["PASS", "PASS"]
        journal = (state / "journal.jsonl").read_text()
        assert '{"event":"cell_verdict"}\n' not in journal  # never written to
        assert alive(daemons(state)) == []  # every process of the cell's uid ended
    finally:
        for pid in alive(daemons(state)):
            os.kill(pid, 9)


REUSE = r'''
out="$1"; state="$2"; other="$state/cells/$3"
if [ -e "$other" ]; then echo exists; else echo none; fi > "$out/other"
if cat "$other/summary.json" >/dev/null 2>&1; then echo READ; else echo denied; fi > "$out/peek"
if echo '{{"total_completion_tokens": 99}}' > "$other/summary.json" 2>/dev/null; then \
  echo WROTE; else echo denied; fi > "$out/tamper"
id -u > "$out/uid"
echo '{{"total_completion_tokens": 3}}' > "$out/summary.json"
'''


def test_a_uid_handed_on_reaches_nothing_of_the_cell_that_held_it(reachable: Path) -> None:
    # One uid for two cells one after another: the second cell's harness runs as the uid
    # the first had, and still cannot read or rewrite the first's outputs.
    a, b = "p1_bugfix_demo-nothink_v1", "p2_extract_demo-nothink_v1"
    over = write_overlay(reachable / "o.json", {
        "tasks": [{"id": "p1_bugfix", "vars": {"other": b}},
                  {"id": "p2_extract", "vars": {"other": a}}],
        "arms": [{"label": "demo-nothink", "mode": "nothink"}], "run": {"concurrency": 1},
        "harness": {"argv": ["/bin/sh", "-c", REUSE, "h", "{output_dir}", "{state_dir}",
                             "{other}"], "user": "cell", "uids": [61190, 61190]},
        "grader": {"argv": GRADER}, "trust": {"arm_checks": []}, "baseline": None})
    state = reachable / "state"
    r = run_cli("--preset", "demo", "--target-n", "1", "--config", str(over),
                "--state-dir", str(state), "--quiet")
    assert r.returncode == 0, r.stdout + r.stderr[-2000:]
    order = [e["cell"] for e in events(state) if e["event"] == "cell_started"]
    first, second = (state / "cells" / c for c in order)
    assert (first / "uid").read_text() == (second / "uid").read_text() == "61190\n"
    assert (second / "other").read_text().strip() == "exists"  # it was there to take
    assert (second / "peek").read_text().strip() == "denied"
    assert (second / "tamper").read_text().strip() == "denied"
    assert '"total_completion_tokens": 3' in (first / "summary.json").read_text()
    for d in (first, second):  # let go of: back to root, 0700
        assert d.stat().st_uid == 0 and (d.stat().st_mode & 0o777) == 0o700


def test_the_uid_pool_never_gives_a_uid_twice_nor_one_in_use(tmp_path: Path) -> None:
    pool = UidPool(61200, 61203)
    # It says "ready" once setpriv has switched to 61201 (a handshake: a loaded CI box
    # could outlast any count of polls before the switch).
    busy = subprocess.Popen(["setpriv", "--reuid=61201", "--regid=61201", "--clear-groups",
                             "/bin/sh", "-c", "echo ready; exec /bin/sleep 60"],
                            stdout=subprocess.PIPE)
    try:
        assert busy.stdout is not None and busy.stdout.readline() == b"ready\n"
        assert psutil.Process(busy.pid).uids().real == 61201
        got = [pool.take("a"), pool.take("b"), pool.take("c")]
        assert 61201 not in got and len(set(got)) == 3
        with pytest.raises(LookupError):
            pool.take("d")
        pool.give(got[0])
        assert pool.take("e") == got[0]
    finally:
        busy.kill()
        busy.wait()


def test_auto_is_a_user_per_cell_where_one_can_be_had(reachable: Path) -> None:
    # No harness.user at all: /bin/sh and a state dir other users can reach, so each
    # cell gets a uid of its own, and the report says so.
    state, evs = run_as_cells(reachable, cli_env(), user="auto")
    try:
        uids = {e["cell"]: e["uid"] for e in evs if e["event"] == "cell_spawning"}
        assert len(set(uids.values())) == 2 and all(61184 <= u <= 61199
                                                    for u in uids.values())
        for cell, uid in uids.items():
            assert int((state / "cells" / cell / "uid").read_text()) == uid
            assert (state / "cells" / cell / "token").read_text().strip() == "denied"
            assert (state / "cells" / cell / "groups").read_text().split() == [str(uid)]
        started = next(e for e in evs if e["event"] == "run_started")
        assert started["harness_user"] == {"mode": "cell", "why": "auto", "groups": []}
        rep = run_cli("report", "--state-dir", str(state))
        assert rep.returncode == 0, rep.stderr
        assert "- harness user: a uid of its own per live cell (auto)" in rep.stdout
        assert "- containment: a cgroup v2 group per harness" in rep.stdout
    finally:
        for pid in alive(daemons(state)):
            os.kill(pid, 9)


def test_auto_falls_back_to_the_supervisors_user_and_says_why(tmp_path: Path) -> None:
    # pytest's tmp dirs are root's 0700: a cell's uid could not reach its output dir.
    r = run_cli("--preset", "demo", "--target-n", "1", "--dry-run",
                "--state-dir", str(tmp_path / "s"))
    line = next(x for x in r.stdout.splitlines() if x.startswith("harness user:"))
    assert line.startswith("harness user: the supervisor's (root; auto: ")
    assert "is not searchable by other users" in line
    assert "a harness can read the run's token" in line
    # Asked for outright, the same machine refuses instead of running as root.
    over = write_overlay(tmp_path / "o.json", {"harness": {"user": "cell"}})
    cell = run_cli("--preset", "demo", "--target-n", "1", "--config", str(over),
                   "--dry-run", "--state-dir", str(tmp_path / "s2"))
    assert "harness user: REFUSED: " in cell.stdout


def test_auto_leaves_a_harness_that_drives_docker_as_the_supervisor(reachable: Path) -> None:
    doc = {"harness": {"argv": ["/bin/sh", "-c", "true"],
                       "compose_projects": "{output_dir}/projects"},  # Inspect's sandboxes
           "grader": {"argv": GRADER}}
    r = run_cli("--preset", "demo", "--target-n", "1", "--dry-run", "--config",
                str(write_overlay(reachable / "o.json", doc)),
                "--state-dir", str(reachable / "s"))
    assert "harness user: the supervisor's (root; auto: the harness drives Docker" in r.stdout
    doc["harness"] |= {"user": "cell", "groups": ["docker"]}
    r = run_cli("--preset", "demo", "--target-n", "1", "--dry-run", "--config",
                str(write_overlay(reachable / "o.json", doc)),
                "--state-dir", str(reachable / "s"))
    import grp

    try:
        grp.getgrnam("docker")
    except KeyError:
        assert "REFUSED: harness.groups: no group 'docker' on this machine" in r.stdout
    else:
        assert "in group docker it reaches the Docker socket, root-equivalent" in r.stdout


def test_groups_the_preset_asks_for_are_the_harness_s_only_groups(reachable: Path) -> None:
    state, evs = run_as_cells(reachable, cli_env(), groups=["users"])
    try:
        for e in (e for e in evs if e["event"] == "cell_spawning"):
            got = (state / "cells" / e["cell"] / "groups").read_text().split()
            assert sorted(got) == sorted([str(e["uid"]), "100"])  # users is gid 100
    finally:
        for pid in alive(daemons(state)):
            os.kill(pid, 9)


def test_a_state_dir_the_cells_users_cannot_reach_is_refused(tmp_path: Path) -> None:
    over = write_overlay(tmp_path / "o.json", {"harness": {"user": "cell"}})
    r = run_cli("--preset", "demo", "--target-n", "1", "--config", str(over),
                "--state-dir", str(tmp_path / "s"))  # under pytest's 0700 dirs
    assert r.returncode == 2 and "is not searchable by other users" in r.stderr
    assert len(r.stderr.strip().splitlines()) == 1 and not (tmp_path / "s").exists()


HANG = r'''
out="$1"
env -i /bin/sleep 900 & echo $! > "$out/daemon.pid"
exec /bin/sleep 900
'''


def test_a_past_cells_process_of_its_uid_is_found_by_the_successor(reachable: Path) -> None:
    """No cgroups, a supervisor and the attempt's data path killed with SIGKILL: the
    harness's env-cleared daemon carries no marker and no parent of ours, yet it runs as
    the cell's uid, and the successor ends it by that uid."""
    import signal

    from conftest import spawn_cli, wait_for

    env = cli_env(AUTOPILOT_CGROUPS="off")
    state = reachable / "state"
    doc = {"tasks": [{"id": "p1_bugfix"}], "arms": [{"label": "demo-nothink", "mode": "nothink"}],
           "harness": {"argv": ["/bin/sh", "-c", HANG, "harness", "{output_dir}"],
                       "user": "cell", "uids": [61184, 61199]},
           "grader": {"argv": GRADER}, "trust": {"arm_checks": []}, "baseline": None}
    args = ["--preset", "demo", "--target-n", "1", "--state-dir", str(state), "--quiet"]
    first = spawn_cli(*args, "--config", str(write_overlay(reachable / "o.json", doc)),
                      env=env)
    daemon = None
    try:
        pidfile = state / "cells" / "p1_bugfix_demo-nothink_v1" / "daemon.pid"
        wait_for(lambda: pidfile.exists() and pidfile.read_text().strip(), 60, "the daemon")
        daemon = int(pidfile.read_text())
        started = wait_for(lambda: next((e for e in events(state)
                                         if e["event"] == "cell_started"), None), 60)
        first.send_signal(signal.SIGKILL)
        first.wait(30)
        for pid in (started["datapath_pid"], started["pid"]):
            with __import__("contextlib").suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        assert alive([daemon]) == [daemon]  # escaped: no marker, no parent of ours
        uid = psutil.Process(daemon).uids().real
        quick = {**doc, "harness": {**doc["harness"], "argv": [
            "/bin/sh", "-c", "echo '{{\"total_completion_tokens\": 3}}' > \"$1/summary.json\"",
            "h", "{output_dir}"]}}
        r = run_cli(*args, "--config", str(write_overlay(reachable / "q.json", quick)),
                    "--allow-plan-change", env=env)
        assert r.returncode == 0, r.stdout + r.stderr[-2000:]
        assert alive([daemon]) == []
        swept = [e for e in events(state) if e["event"] == "orphan_killed" and e.get("uid")]
        assert swept and swept[0]["uid"] == uid and daemon in swept[0]["pids"]
    finally:
        if first.poll() is None:
            first.kill()
            first.wait()
        if daemon is not None and alive([daemon]):
            os.kill(daemon, 9)


def test_a_uid_is_clean_before_it_is_handed_on() -> None:
    """What a uid left in the shared sticky dirs (a 0600 file, a directory tree, a FIFO,
    a symlink to a file of root's) is gone when the pool hands it out again, to this
    run or the next; the symlink's target and anyone else's entries stay."""
    uid = 61207
    tag = f"autopilot-scrub-{os.getpid()}"
    made = [Path(f"/tmp/{tag}-secret"), Path(f"/tmp/{tag}-dir"), Path(f"/dev/shm/{tag}"),
            Path(f"/var/tmp/{tag}-fifo"), Path(f"/tmp/{tag}-link")]
    target = Path(f"/tmp/{tag}-roots")
    theirs = Path(f"/tmp/{tag}-theirs")
    try:
        made[0].write_text("the last cell's answer")
        made[0].chmod(0o600)
        (made[1] / "deep" / "er").mkdir(parents=True)
        (made[1] / "deep" / "er" / "notes").write_text("x")
        made[2].write_text("shm")
        os.mkfifo(made[3])
        target.write_text("root's own")
        made[4].symlink_to(target)
        theirs.write_text("another uid's")
        for p in made:
            for sub in [p, *(p.rglob("*") if p.is_dir() and not p.is_symlink() else [])]:
                os.chown(sub, uid, uid, follow_symlinks=False)
        os.chown(theirs, uid + 1, uid + 1)
        assert UidPool(uid, uid).take("next") == uid
        assert [p for p in made if os.path.lexists(p)] == []
        assert target.read_text() == "root's own" and target.stat().st_uid == 0
        assert theirs.read_text() == "another uid's"
    finally:
        for p in [*made, target, theirs]:
            if p.is_dir() and not p.is_symlink():
                shutil.rmtree(p, ignore_errors=True)
            elif os.path.lexists(p):
                p.unlink()


def test_a_uid_drawn_again_by_the_next_run_finds_nothing_of_the_last(
        reachable: Path) -> None:
    """Two runs, one uid: run 1's cell leaves a 0600 file in /tmp; run 2's cell, as the
    same uid, finds it gone (every run draws from the same range)."""
    left = f"/tmp/autopilot-left-{os.getpid()}"
    script = ('id -u > "$1/uid"; if [ -e "$2" ]; then cat "$2" > "$1/found" 2>&1 || '
              'echo denied > "$1/found"; else echo gone > "$1/found"; fi; '
              'umask 077; echo "run secret" > "$2"; '
              'echo \'{{"total_completion_tokens": 3}}\' > "$1/summary.json"')
    found = []
    try:
        for run in ("one", "two"):
            over = write_overlay(reachable / f"{run}.json", {
                "tasks": [{"id": "p1_bugfix"}],
                "arms": [{"label": "demo-nothink", "mode": "nothink"}],
                "harness": {"argv": ["/bin/sh", "-c", script, "h", "{output_dir}", left],
                            "user": "cell", "uids": [61191, 61191]},
                "grader": {"argv": GRADER}, "trust": {"arm_checks": []},
                "baseline": None})
            state = reachable / run
            r = run_cli("--preset", "demo", "--target-n", "1", "--config", str(over),
                        "--state-dir", str(state), "--quiet")
            assert r.returncode == 0, r.stdout + r.stderr[-2000:]
            [cell] = list((state / "cells").iterdir())
            assert (cell / "uid").read_text() == "61191\n"
            found.append((cell / "found").read_text().strip())
    finally:
        if os.path.lexists(left):
            os.unlink(left)
    assert found == ["gone", "gone"]
