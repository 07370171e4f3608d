"""Scratch removal under the hardened service (#27): the autopilot runs as a non-root
user (uid 65534), the harness's sandbox (a real container on a real dockerd) writes
root-owned files into the cell's scratch dir, as MMBT's does into tooling/workspace.
They are removed through the same Docker daemon (a throwaway container mounting exactly
that dir), never sudo; without an image to do it with, the refusal is journaled and the
cell's next attempt does not start on the dirty workspace.

Running as another user needs this interpreter reachable by it: where its prefix sits
under a directory that user may not enter (pyenv under root's 0700 home), the run gets a
private mount namespace in which that directory is a 0755 tmpfs holding only the
interpreter's prefix, bound back. Nothing changes outside that namespace."""

from __future__ import annotations

import json
import os
import shutil
import stat
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest
from conftest import ROOT, cli_env, container_names, end_runs_under, events

pytestmark = pytest.mark.slow

NOBODY = 65534
HARNESS = '''
import os, subprocess, sys
scratch, image, log = sys.argv[1:4]
os.makedirs(scratch, exist_ok=True)
attempt = sys.argv[sys.argv.index("--attempt") + 1]
with open(log, "a") as f:
    f.write(f"{os.geteuid()} attempt {attempt}\\n")
# the sandbox: root inside the container, so its files on the host are root's
subprocess.run(["docker", "run", "--rm", "--network", "none", "-v", scratch + ":/workspace",
                image, "sh", "-c", "mkdir -p /workspace/sub/deep && echo x > "
                "/workspace/sub/deep/f && echo y > /workspace/top"], check=True)
if os.environ.get("FAIL_FIRST_ATTEMPT") and attempt == "1":
    sys.exit(3)  # a crash: INVALID, retried
os.execv(sys.executable, [sys.executable, "-m", "autopilot.demo.harness", *sys.argv[4:]])
'''
DEMO = ["{cell}", "--task", "{task}", "--arm", "{arm}", "--n", "{n}", "--attempt",
        "{attempt}", "--host", "{host}", "--port", "{port}", "--model", "{model}",
        "--out", "{output_dir}", "--think-secs", "0"]


def as_nobody(argv: list[str], stash: Path) -> list[str]:
    base = Path(sys.base_prefix).resolve()
    blocked = next((a for a in reversed(base.parents)
                    if a != Path("/") and not a.stat().st_mode & stat.S_IXOTH), None)
    script = "set -e\n"
    if blocked is not None:
        stash.mkdir()
        script += (f'mount --bind "{base}" "{stash}"\n'
                   f'mount -t tmpfs -o mode=755 tmpfs "{blocked}"\n'
                   f'mkdir -p "{base}"\nmount --bind "{stash}" "{base}"\n')
    script += f'exec setpriv --reuid={NOBODY} --regid={NOBODY} --clear-groups -- "$@"\n'
    return ["unshare", "--mount", "--propagation", "private", "--", "sh", "-c", script,
            "sh", *argv]


@pytest.fixture
def work(docker_host: str) -> Iterator[Path]:
    if os.geteuid() != 0 or not shutil.which("setpriv") or not shutil.which("unshare"):
        pytest.skip("needs root, setpriv and unshare to run the autopilot as another user")
    sock = Path(docker_host.removeprefix("unix://"))
    if not docker_host.startswith("unix://") or not sock.exists():
        pytest.skip(f"needs the private dockerd's unix socket (got {docker_host})")
    # Outside pytest's 0700 base: the other user must reach the state dir.
    d = Path(tempfile.mkdtemp(prefix="ap-nonroot-", dir="/tmp"))
    d.chmod(0o755)
    os.chown(d, NOBODY, NOBODY)
    owner = sock.stat().st_uid
    os.chown(sock, NOBODY, -1)  # the test's own dockerd: the service user is in its group
    try:
        yield d
    finally:
        os.chown(sock, owner, -1)
        end_runs_under(d)
        shutil.rmtree(d)  # as root: the root-owned files too


def run_as_nobody(work: Path, docker_host: str, image: str, remove_image: str,
                  **env: str) -> subprocess.CompletedProcess[str]:
    harness = work / "harness.py"
    harness.write_text(HARNESS)
    overlay = work / "o.json"
    overlay.write_text(json.dumps({
        "tasks": [{"id": "p1_bugfix"}], "arms": [{"label": "demo-nothink", "mode": "nothink"}],
        "harness": {"argv": ["{python}", str(harness), "{state_dir}/scratch/{cell}", image,
                             str(work / "harness.log"), *DEMO],
                    "scratch_dirs": ["{state_dir}/scratch/{cell}"],
                    "scratch_remove_image": remove_image,
                    "pass_env": ["DOCKER_HOST", "FAIL_FIRST_ATTEMPT"]},
        "trust": {"infra_retries": 1}, "run": {"concurrency": 1}}))
    argv = [sys.executable, "-m", "autopilot.cli", "--preset", "demo", "--target-n", "1",
            "--config", str(overlay), "--state-dir", str(work / "state"), "--quiet"]
    return subprocess.run(as_nobody(argv, work / "stash"), capture_output=True, text=True,
                          timeout=240, cwd=ROOT,
                          env=cli_env(DOCKER_HOST=docker_host, HOME=str(work), **env))


def test_root_owned_scratch_is_removed_through_docker(docker_host: str, test_images,
                                                      work: Path) -> None:
    r = run_as_nobody(work, docker_host, test_images["busybox"], test_images["busybox"])
    assert r.returncode == 0, r.stdout[-1500:] + r.stderr[-3000:]
    state = work / "state"
    assert state.stat().st_uid == NOBODY  # the autopilot really ran as that user
    assert (work / "harness.log").read_text().split()[0] == str(NOBODY)
    evs = events(state)
    cell = "p1_bugfix_demo-nothink_v1"
    assert [e["path"] for e in evs if e["event"] == "scratch_removed_via_docker"] == [
        str(state / "scratch" / cell)]
    assert not [e for e in evs if e["event"] == "scratch_not_removed"]
    assert not (state / "scratch" / cell).exists()
    assert {e["verdict"] for e in evs if e["event"] == "cell_verdict"} <= {"PASS", "FAIL"}
    assert not {n for n in container_names(docker_host) if n.startswith("autopilot-scratch-")}


def test_without_a_way_to_remove_it_the_next_attempt_does_not_start(
        docker_host: str, test_images, work: Path) -> None:
    r = run_as_nobody(work, docker_host, test_images["busybox"], "",
                      FAIL_FIRST_ATTEMPT="1")
    state = work / "state"
    assert r.returncode == 1, r.stdout[-1500:] + r.stderr[-3000:]  # quarantined: INCOMPLETE
    evs = events(state)
    cell = "p1_bugfix_demo-nothink_v1"
    refused = [e for e in evs if e["event"] == "scratch_not_removed"]
    assert refused and all(e["path"] == str(state / "scratch" / cell) for e in refused)
    assert "Permission denied" in refused[0]["why"]
    assert "harness.scratch_remove_image" in refused[0]["why"]
    # the harness ran once: attempt 2 was refused before it was spawned
    assert (work / "harness.log").read_text().splitlines() == [f"{NOBODY} attempt 1"]
    second = [e for e in evs if e["event"] == "cell_exited" and e["attempt"] == 2]
    assert second and "scratch dir not removed" in second[0]["error"]
    assert any(e["event"] == "cell_quarantined" for e in evs)
    # root's files are still there, untouched by anything but their owner
    assert (state / "scratch" / cell / "sub" / "deep" / "f").stat().st_uid == 0
    # `cleanup`, as the same user, says what it cannot remove without an image...
    overlay = work / "o.json"
    argv = [sys.executable, "-m", "autopilot.cli", "cleanup", "--state-dir", str(state),
            "--config", str(overlay)]
    env = cli_env(DOCKER_HOST=docker_host, HOME=str(work))
    c = subprocess.run(as_nobody(argv, work / "stash2"), capture_output=True, text=True,
                       timeout=120, cwd=ROOT, env=env)
    assert c.returncode == 0, c.stderr
    assert "harness.scratch_remove_image" in c.stdout
    assert (state / "scratch" / cell).exists()
    # ...and removes it through Docker with one
    doc = json.loads(overlay.read_text())
    doc["harness"]["scratch_remove_image"] = test_images["busybox"]
    overlay.write_text(json.dumps(doc))
    c = subprocess.run(as_nobody(argv, work / "stash3"), capture_output=True, text=True,
                       timeout=120, cwd=ROOT, env=env)
    assert c.returncode == 0, c.stderr
    assert f"dir {state / 'scratch' / cell}" in c.stdout
    assert not (state / "scratch" / cell).exists()
    assert not {n for n in container_names(docker_host) if n.startswith("autopilot-scratch-")}
