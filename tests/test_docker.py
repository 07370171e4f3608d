"""Against a real (private) Docker engine: the endpoint container's lifecycle through
aiodocker, sandbox removal after a cell, orphan sweeps after a SIGKILLed supervisor, and
`cleanup` removing exactly the plan's containers."""

from __future__ import annotations

import json
import os
import signal
import sys
from pathlib import Path

import pytest
from conftest import (
    cli_env,
    container_names,
    docker_cli,
    events,
    fake_llama_binds,
    run_cli,
    spawn_cli,
    wait_for,
    write_overlay,
)

pytestmark = pytest.mark.slow

PY = os.path.realpath(sys.executable)


def llama_overlay(tmp: Path, images: dict[str, str], name: str, **extra: object) -> str:
    binds = fake_llama_binds()
    doc = {
        "endpoint": {
            "engine": "llamacpp", "mode": "docker", "model_path": "/models/fake.gguf",
            "startup_timeout_secs": 40, "probe_interval_secs": 0.5, "down_restart_secs": 1,
            "restart_backoff_secs": 0.5,
            "docker": {"image": images["llama"], "container_name": name, "gpus": "none",
                       "binds": binds},
            "env": {"FAKE_PYTHON": PY, "FAKE_AUTOPILOT_ROOT": "/repo"},
        },
        "vars": {"think_secs": "0.15"},
        **extra,
    }
    return str(write_overlay(tmp / "docker.json", doc))


def env(host: str) -> dict[str, str]:
    return cli_env(DOCKER_HOST=host)


def test_endpoint_container_killed_outside_is_recreated(docker_host: str, test_images,
                                                         state_dir: Path,
                                                         tmp_path: Path) -> None:
    name = f"llama-autopilot-test-{os.getpid()}"
    over = llama_overlay(tmp_path, test_images, name)
    proc = spawn_cli("--preset", "demo", "--target-n", "2", "--config", over,
                     "--state-dir", str(state_dir), "--quiet", env=env(docker_host),
                     log=tmp_path / "run.log")
    wait_for(lambda: sum(e["event"] == "cell_verdict" for e in events(state_dir)) >= 3, 120,
             "cells graded against the container")
    assert name in container_names(docker_host)
    labels = json.loads(docker_cli(docker_host, "inspect", name).stdout)[0]["Config"]["Labels"]
    assert labels["autopilot.state_dir"] == str(state_dir)
    docker_cli(docker_host, "kill", name)
    rc = proc.wait(240)
    assert rc == 0, (tmp_path / "run.log").read_text()[-3000:]
    evs = events(state_dir)
    assert sum(e["event"] == "endpoint_restart" for e in evs) == 1
    assert sum(e["event"] == "endpoint_started" for e in evs) == 2
    assert name not in container_names(docker_host)  # nothing left behind
    assert "container" in (state_dir / "endpoint.log").read_text()
    # what served the model: the image's id, not only its (movable) tag
    image_id = json.loads(docker_cli(docker_host, "image", "inspect",
                                     test_images["llama"]).stdout)[0]["Id"]
    ident = json.loads((state_dir / "identity.jsonl").read_text().splitlines()[-1])
    assert ident["endpoint"]["image"] == test_images["llama"]
    assert ident["endpoint"]["image_id"]["id"] == image_id
    rep = run_cli("report", "--state-dir", str(state_dir), env=env(docker_host)).stdout
    assert f"- image_id: id {image_id}" in rep


def test_sigkilled_supervisor_leftovers_are_swept(docker_host: str, test_images,
                                                  state_dir: Path, tmp_path: Path) -> None:
    name = f"llama-autopilot-sweep-{os.getpid()}"
    over = llama_overlay(tmp_path, test_images, name)
    args = ["--preset", "demo", "--target-n", "1", "--config", over,
            "--state-dir", str(state_dir), "--quiet"]
    proc = spawn_cli(*args, env=env(docker_host), log=tmp_path / "run.log")
    first = wait_for(lambda: next((e for e in events(state_dir)
                                   if e["event"] == "endpoint_started"), None), 120)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    assert name in container_names(docker_host)  # the orphan
    old_id = json.loads(docker_cli(docker_host, "inspect", name).stdout)[0]["Id"]
    r = run_cli(*args, env=env(docker_host), timeout=240)
    assert r.returncode == 0, r.stderr[-3000:]
    status = json.loads((state_dir / "status.json").read_text())
    assert {"container": name} in status["orphans_cleaned"]
    assert name not in container_names(docker_host)
    assert first["container"] == name and old_id


HANG_WITH_SANDBOX = (
    "import os, subprocess, sys, time\n"
    "cell = sys.argv[1]\n"
    "subprocess.run(['docker', 'run', '-d', '--network', 'none', '--name',\n"
    "                'bench-sandbox-' + cell, sys.argv[2], 'sleep', '3600'], check=True)\n"
    "print('sandbox up', flush=True)\n"
    "time.sleep(3600)\n"
)


def test_killed_cell_sandbox_is_removed(docker_host: str, test_images, state_dir: Path,
                                         tmp_path: Path) -> None:
    script = tmp_path / "harness.py"
    script.write_text(HANG_WITH_SANDBOX)
    over = write_overlay(tmp_path / "o.json", {
        "tasks": [{"id": "p1_bugfix"}], "arms": [{"label": "demo-nothink", "mode": "nothink"}],
        "harness": {"argv": ["{python}", str(script), "{cell}", test_images["busybox"]],
                    "sandbox_container": "bench-sandbox-{cell}"},
        "watchdog": {"stuck_secs": 2, "warn_secs": 1, "probe_secs": 1.5, "kill_secs": 2},
        "trust": {"infra_retries": 0}})
    r = run_cli("--preset", "demo", "--target-n", "1", "--config", str(over),
                "--state-dir", str(state_dir), "--quiet", env=env(docker_host), timeout=240)
    assert r.returncode == 1  # the one cell stalled and was quarantined
    evs = events(state_dir)
    assert any(e["event"] == "cell_killed" for e in evs)
    assert "bench-sandbox-p1_bugfix_demo-nothink_v1" not in container_names(docker_host)


PLANT_STALE_SANDBOX = (
    "import os, subprocess, sys\n"
    "cell, image, marker = sys.argv[1], sys.argv[2], sys.argv[3]\n"
    "def sandbox(name):\n"
    "    subprocess.run(['docker', 'run', '-d', '--network', 'none', '--name',\n"
    "                    'bench-sandbox-' + name, image, 'sleep', '3600'], check=True)\n"
    "if not os.path.exists(marker):  # the first cell plants one under the next's name,\n"
    "    open(marker, 'w').close()    # as a late `docker run` of a killed harness would\n"
    "    other = 'p2_extract' if cell.startswith('p1') else 'p1_bugfix'\n"
    "    sandbox(other + cell[cell.index('_demo'):])\n"
    "sandbox(cell)\n"
    "os.execv(sys.executable, [sys.executable, '-m', 'autopilot.demo.harness', cell,\n"
    "                          *sys.argv[4:]])\n"
)


def test_stale_sandbox_under_a_cells_name_costs_it_nothing(docker_host: str, test_images,
                                                           state_dir: Path,
                                                           tmp_path: Path) -> None:
    script = tmp_path / "harness.py"
    script.write_text(PLANT_STALE_SANDBOX)
    demo_args = ["--task", "{task}", "--arm", "{arm}", "--n", "{n}", "--attempt", "{attempt}",
                 "--host", "{host}", "--port", "{port}", "--model", "{model}",
                 "--out", "{output_dir}", "--think-secs", "0"]
    over = write_overlay(tmp_path / "o.json", {
        "tasks": [{"id": "p1_bugfix"}, {"id": "p2_extract"}],
        "arms": [{"label": "demo-nothink", "mode": "nothink"}],
        "harness": {"argv": ["{python}", str(script), "{cell}", test_images["busybox"],
                             str(tmp_path / "planted"), *demo_args],
                    "sandbox_container": "bench-sandbox-{cell}"},
        "run": {"concurrency": 1}, "trust": {"infra_retries": 0}})
    r = run_cli("--preset", "demo", "--target-n", "1", "--config", str(over),
                "--state-dir", str(state_dir), "--quiet", env=env(docker_host), timeout=240)
    assert r.returncode == 0, r.stderr[-2000:]
    evs = events(state_dir)
    verdicts = [e for e in evs if e["event"] == "cell_verdict"]
    assert len(verdicts) == 2 and all(e["attempt"] == 1 and e["verdict"] in ("PASS", "FAIL")
                                      for e in verdicts)
    assert "stale_sandbox_removed" in (state_dir / "autopilot.log").read_text()
    assert not {n for n in container_names(docker_host) if n.startswith("bench-sandbox-")}


def test_two_runs_with_the_same_cell_ids_on_one_daemon_keep_each_others_sandboxes(
        docker_host: str, test_images, state_dir: Path, tmp_path: Path) -> None:
    """MMBT names its sandbox after the cell and mounts its checkout's workspace: a
    sandbox of another run (another checkout) under one of our cells' names is spared by
    the start-up sweep, the attempt's own removals and cleanup; a stale one mounting our
    checkout is removed."""
    mine, theirs = tmp_path / "checkout-a", tmp_path / "checkout-b"
    other = "bench-sandbox-p1_bugfix_demo-nothink_v1"  # the other run's, live
    stale = "bench-sandbox-p2_extract_demo-nothink_v1"  # a killed predecessor's of ours
    docker_cli(docker_host, "run", "-d", "--network", "none", "--name", other, "-v",
               f"{theirs}/workspace/p1_bugfix_demo-nothink_v1:/workspace",
               test_images["busybox"], "sleep", "3600")
    docker_cli(docker_host, "create", "--network", "none", "--name", stale, "-v",
               f"{mine}/workspace/p2_extract_demo-nothink_v1:/workspace",
               test_images["busybox"], "sleep", "60")
    try:
        over = write_overlay(tmp_path / "o.json", {
            "vars": {"think_secs": "0", "checkout": str(mine)},
            "tasks": [{"id": "p1_bugfix"}, {"id": "p2_extract"}],
            "arms": [{"label": "demo-nothink", "mode": "nothink"}], "baseline": None,
            "harness": {"sandbox_container": "bench-sandbox-{cell}",
                        "output_dir": "{checkout}/logs/{cell}",
                        "scratch_dirs": ["{checkout}/workspace/{cell}"]}})
        args = ["--preset", "demo", "--target-n", "1", "--config", str(over),
                "--state-dir", str(state_dir), "--quiet"]
        # Live, the other run's sandbox under one of our cells' names: refused, exit 3,
        # naming it (a harness like MMBT's would `docker rm -f` it at its cell's start).
        r = run_cli(*args, env=env(docker_host))
        assert r.returncode == 3, r.stderr[-2000:]
        [line] = r.stderr.strip().splitlines()
        assert line.startswith(f"autopilot: error: sandbox container {other} is another "
                               f"run's and live (it mounts {theirs}")
        assert not [e for e in events(state_dir) if e["event"] == "cell_spawning"]
        running = json.loads(docker_cli(docker_host, "inspect", other).stdout)[0]
        assert running["State"]["Running"]
        docker_cli(docker_host, "stop", "-t", "0", other)  # that run's cell is over
        r = run_cli(*args, env=env(docker_host))
        assert r.returncode == 0, r.stderr[-2000:]
        names = container_names(docker_host)
        assert other in names and stale not in names
        log = (state_dir / "autopilot.log").read_text()
        assert "sandbox_spared" in log and str(theirs) in log
        c = run_cli("cleanup", "--state-dir", str(state_dir), env=env(docker_host))
        assert c.returncode == 0, c.stderr
        assert f"spared container {other} (it mounts {theirs}" in c.stdout
        assert other in container_names(docker_host)
    finally:
        docker_cli(docker_host, "rm", "-f", other, stale, check=False)


FOREIGN_SANDBOX_APPEARS = (
    "import subprocess, sys\n"
    "cell, image, theirs = sys.argv[1], sys.argv[2], sys.argv[3]\n"
    "if cell.startswith('p1'):  # the other run starts a cell of the same id meanwhile\n"
    "    name = 'bench-sandbox-p2_extract' + cell[cell.index('_demo'):]\n"
    "    subprocess.run(['docker', 'run', '-d', '--network', 'none', '--name', name,\n"
    "                    '-v', theirs + ':/workspace', image, 'sleep', '2'], check=True)\n"
    "else:  # as MMBT's harness does first: remove a sandbox under its own name\n"
    "    seen = subprocess.run(['docker', 'inspect', '-f', '{{.State.Status}}',\n"
    "                           'bench-sandbox-' + cell], capture_output=True, text=True)\n"
    "    open(sys.argv[4] + '/seen', 'w').write(seen.stdout.strip())\n"
    "    subprocess.run(['docker', 'rm', '-f', 'bench-sandbox-' + cell], check=True)\n"
    "open(sys.argv[4] + '/summary.json', 'w').write('{\"total_completion_tokens\": 3}')\n"
)


def test_a_cell_waits_while_another_runs_sandbox_holds_its_name(
        docker_host: str, test_images, state_dir: Path, tmp_path: Path) -> None:
    """A live sandbox of another run appears under a cell's name after start-up: that
    cell is not launched into it (its harness would remove it) until it is gone; the
    other run's container is never removed by this run's harness."""
    theirs = tmp_path / "checkout-b"
    theirs.mkdir()
    script = tmp_path / "harness.py"
    script.write_text(FOREIGN_SANDBOX_APPEARS)
    name = "bench-sandbox-p2_extract_demo-nothink_v1"
    over = write_overlay(tmp_path / "o.json", {
        "tasks": [{"id": "p1_bugfix"}, {"id": "p2_extract"}],
        "arms": [{"label": "demo-nothink", "mode": "nothink"}], "baseline": None,
        "harness": {"argv": ["{python}", str(script), "{cell}", test_images["busybox"],
                             str(theirs), "{output_dir}"],
                    "sandbox_container": "bench-sandbox-{cell}", "completion": []},
        "grader": {"argv": ["/bin/sh", "-c", "echo '{{\"verdict\": \"PASS\"}}' > $0",
                            "{grade_file}"]},
        "trust": {"arm_checks": []}, "run": {"concurrency": 1}})
    try:
        r = run_cli("--preset", "demo", "--target-n", "1", "--config", str(over),
                    "--state-dir", str(state_dir), "--quiet", env=env(docker_host))
        assert r.returncode == 0, r.stderr[-2000:]
        log = (state_dir / "autopilot.log").read_text()
        assert "sandbox_taken" in log and str(theirs) in log
        # Our p2 harness started only once theirs had run its course: it found it exited.
        seen = state_dir / "cells" / "p2_extract_demo-nothink_v1" / "seen"
        assert seen.read_text() == "exited"
    finally:
        docker_cli(docker_host, "rm", "-f", name, check=False)


def test_cleanup_removes_exactly_the_plan_containers(docker_host: str, test_images,
                                                      state_dir: Path, tmp_path: Path) -> None:
    over = write_overlay(tmp_path / "o.json", {
        "vars": {"think_secs": "0"}, "tasks": [{"id": "p1_bugfix"}, {"id": "p2_extract"}],
        "harness": {"sandbox_container": "bench-sandbox-{cell}"}})
    args = ["--preset", "demo", "--target-n", "1", "--config", str(over),
            "--state-dir", str(state_dir), "--quiet"]
    assert run_cli(*args, env=env(docker_host)).returncode == 0
    plan_names = ["bench-sandbox-p1_bugfix_demo-nothink_v1",
                  "bench-sandbox-p2_extract_demo-think_v1"]
    decoys = ["bench-sandbox-p1_bugfix_demo-nothink_v1-decoy", "bench-sandbox-p1_bugfix"]
    for n in plan_names + decoys:
        docker_cli(docker_host, "create", "--network", "none", "--name", n,
                   test_images["busybox"], "sleep", "60")
    endpoint = f"ep-{os.getpid()}"
    docker_cli(docker_host, "create", "--network", "none", "--name", endpoint, "--label",
               f"autopilot.state_dir={state_dir}", "--label", "autopilot.role=endpoint",
               test_images["busybox"], "sleep", "60")
    (state_dir / "scratch" / "p1_bugfix_demo-think_v1").mkdir(parents=True)
    r = run_cli("cleanup", "--endpoint", "--state-dir", str(state_dir), "--config", str(over),
                env=env(docker_host))
    assert r.returncode == 0, r.stderr
    names = container_names(docker_host)
    assert not set(plan_names) & names and endpoint not in names
    assert set(decoys) <= names
    assert f"removed container {endpoint}" in r.stdout
    assert not (state_dir / "scratch" / "p1_bugfix_demo-think_v1").exists()
    for n in decoys:
        docker_cli(docker_host, "rm", "-f", n)


def test_two_endpoint_replicas_as_containers(docker_host: str, test_images, state_dir: Path,
                                             tmp_path: Path) -> None:
    name = f"llama-autopilot-rep-{os.getpid()}"
    over = llama_overlay(tmp_path, test_images, name)
    doc = json.loads(Path(over).read_text())
    doc["endpoint"]["replicas"] = 2
    doc["tasks"] = [{"id": "p1_bugfix"}, {"id": "p2_extract"}]
    Path(over).write_text(json.dumps(doc))
    r = run_cli("--preset", "demo", "--target-n", "2", "--config", over, "--state-dir",
                str(state_dir), "--quiet", env=env(docker_host), timeout=300)
    assert r.returncode == 0, r.stderr[-3000:]
    evs = events(state_dir)
    started = {e.get("replica") for e in evs if e["event"] == "endpoint_started"}
    assert started == {0, 1}
    ran = {e["replica"] for e in evs if e["event"] == "cell_started"}
    assert ran == {0, 1}  # both containers served cells
    left = container_names(docker_host)
    assert name not in left and f"{name}-1" not in left  # both removed at the end


COMPOSE_LIKE = (
    "import os, subprocess, sys\n"
    "listing, image = sys.argv[1], sys.argv[2]\n"
    "# what Compose makes for an Inspect sandbox: containers labelled with the project\n"
    "subprocess.run(['docker', 'run', '-d', '--network', 'none', '--label',\n"
    "                'com.docker.compose.project=inspect-words-iab12cd', '--name',\n"
    "                'inspect-words-iab12cd-default-1', image, 'sleep', '3600'], check=True)\n"
    "with open(listing, 'a') as f:\n"
    "    f.write('inspect-words-iab12cd\\nprod-db\\n')  # prod-db: not an Inspect name\n"
    "os.execv(sys.executable, [sys.executable, '-m', 'autopilot.demo.harness', *sys.argv[3:]])\n"
)


def test_compose_projects_a_cell_listed_are_removed_and_nothing_else(
        docker_host: str, test_images, state_dir: Path, tmp_path: Path) -> None:
    """Inspect's sandboxes are Compose projects named inspect-<task>-i<id>; the harness
    lists the ones it started. At the attempt's end, and in `cleanup`, exactly the listed
    projects with an Inspect name are removed (by Compose's label): an unlisted Inspect
    project and a listed name that is not an Inspect name survive."""
    script = tmp_path / "harness.py"
    script.write_text(COMPOSE_LIKE)
    img = test_images["busybox"]
    for project in ("inspect-other-i999999", "prod-db"):  # someone else's
        docker_cli(docker_host, "create", "--network", "none", "--label",
                   f"com.docker.compose.project={project}", "--name", f"{project}-x-1",
                   img, "sleep", "60")
    demo = ["{cell}", "--task", "{task}", "--arm", "{arm}", "--n", "{n}", "--attempt",
            "{attempt}", "--host", "{host}", "--port", "{port}", "--model", "{model}",
            "--out", "{output_dir}", "--think-secs", "0"]
    over = write_overlay(tmp_path / "o.json", {
        "tasks": [{"id": "p1_bugfix"}], "arms": [{"label": "demo-nothink", "mode": "nothink"}],
        "harness": {"argv": ["{python}", str(script), "{output_dir}/compose-projects.txt",
                             img, *demo],
                    "compose_projects": "{output_dir}/compose-projects.txt"},
        "preflight": {"docker": True}})
    args = ["--preset", "demo", "--target-n", "1", "--config", str(over),
            "--state-dir", str(state_dir)]
    try:
        r = run_cli(*args, "--quiet", env=env(docker_host), timeout=240)
        assert r.returncode == 0, r.stderr[-2000:]
        names = container_names(docker_host)
        assert "inspect-words-iab12cd-default-1" not in names  # the cell's: removed
        assert {"inspect-other-i999999-x-1", "prod-db-x-1"} <= names  # not ours: kept
        log = (state_dir / "autopilot.log").read_text()
        assert "compose_projects_removed" in log
        # left again (as by a killed cell): `cleanup` removes it from the same listing
        docker_cli(docker_host, "create", "--network", "none", "--label",
                   "com.docker.compose.project=inspect-words-iab12cd", "--name",
                   "inspect-words-iab12cd-default-1", img, "sleep", "60")
        c = run_cli("cleanup", "--state-dir", str(state_dir), "--config", str(over),
                    env=env(docker_host))
        assert c.returncode == 0, c.stderr
        assert "container inspect-words-iab12cd-default-1" in c.stdout
        names = container_names(docker_host)
        assert "inspect-words-iab12cd-default-1" not in names
        assert {"inspect-other-i999999-x-1", "prod-db-x-1"} <= names
    finally:
        for n in ("inspect-other-i999999-x-1", "prod-db-x-1",
                  "inspect-words-iab12cd-default-1"):
            docker_cli(docker_host, "rm", "-f", n, check=False)


def test_the_inspect_wrapper_lists_the_projects_that_appear_while_it_runs(
        docker_host: str, test_images, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Only an Inspect-named project that appears after the wrapper first looked is
    its eval's: one there before (another cell's) and one of another name never are."""
    import threading

    from autopilot.harnesses.inspect_run import track

    monkeypatch.setenv("DOCKER_HOST", docker_host)
    listing = tmp_path / "compose-projects.txt"
    names = ("inspect-other-i9z8y7x", "inspect-arith-i0a1b2c", "not-inspect")

    def create(project: str) -> None:
        docker_cli(docker_host, "create", "--network", "none", "--label",
                   f"com.docker.compose.project={project}", "--name", f"{project}-1",
                   test_images["busybox"], "sleep", "60")

    listed, stop = threading.Event(), threading.Event()
    watcher = threading.Thread(target=track, args=(listing, listed, stop, 0.1), daemon=True)
    try:
        create(names[0])
        watcher.start()
        assert listed.wait(30), "the first listing"
        for project in names[1:]:
            create(project)
        wait_for(lambda: listing.exists() and listing.read_text().strip(), 30,
                 "the new project listed")
        stop.set()
        watcher.join(30)
        assert listing.read_text().splitlines() == ["inspect-arith-i0a1b2c"]
    finally:
        stop.set()
        for project in names:
            docker_cli(docker_host, "rm", "-f", f"{project}-1", check=False)
