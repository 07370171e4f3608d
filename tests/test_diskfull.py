"""A full disk or a short write loses nothing and ends cleanly: one line, exit 1, no
harness left running, a journal of whole lines, and a resume that counts nothing twice.
The disk is a real 8 MiB tmpfs, filled by a real file."""

from __future__ import annotations

import errno
import json
import os
import subprocess
import sys
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psutil
import pytest
from conftest import cli_env, events, run_cli, wait_for, write_overlay

from autopilot.cell.procs import RUN_TOKEN_ENV, run_token
from autopilot.state.journal import Journal, read_events


@pytest.fixture
def small_disk(tmp_path: Path) -> Iterator[Path]:
    mnt = tmp_path / "disk"
    mnt.mkdir()
    r = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=8m,mode=0700", "tmpfs",
                        str(mnt)], capture_output=True, text=True)
    if r.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here (needs root): {r.stderr.strip()}")
    try:
        yield mnt
    finally:
        subprocess.run(["umount", "-l", str(mnt)], check=False)


def fill(mnt: Path) -> Path:
    """Take every free byte of the tmpfs (raw writes: a buffered close would raise)."""
    filler = mnt / "filler"
    fd = os.open(filler, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
    try:
        for size in (65536, 4096, 1):
            while True:
                try:
                    os.write(fd, b"\0" * size)
                except OSError as e:
                    assert e.errno == errno.ENOSPC
                    break
    finally:
        os.close(fd)
    return filler


def run_marked(state: Path) -> list[int]:
    """Live processes carrying the run's marker: harnesses, graders, the endpoint."""
    token, found = run_token(state), []
    for p in psutil.process_iter():
        try:
            if p.environ().get(RUN_TOKEN_ENV) == token and p.status() != psutil.STATUS_ZOMBIE:
                found.append(p.pid)
        except (psutil.Error, OSError):
            pass
    return found


def test_a_short_write_is_cut_back_and_never_glues_onto_the_next_record(
        small_disk: Path) -> None:
    j = Journal(small_disk / "journal.jsonl", fsync=False)
    j.append("first", n=1)
    good = (small_disk / "journal.jsonl").stat().st_size
    filler = fill(small_disk)
    with pytest.raises(OSError) as e:
        j.append("too_big", blob="x" * 20000)  # part of it fits, the rest does not
    assert e.value.errno == errno.ENOSPC
    assert (small_disk / "journal.jsonl").stat().st_size == good  # cut back, not torn
    filler.unlink()
    j.append("after", n=2)
    j.close()
    result = read_events(small_disk / "journal.jsonl")
    assert [ev["event"] for ev in result.events] == ["first", "after"]
    assert result.torn_lines == []


def test_a_full_disk_hands_over_and_kills_no_work_and_resume_counts_nothing_twice(
        small_disk: Path, tmp_path: Path) -> None:
    """The state dir's filesystem fills mid-run: the supervisor hands over (exit 140,
    one line naming the disk) instead of killing its running attempts: their data paths
    and the endpoint go on. Once space is freed the resume re-attaches (or adopts what
    ended meanwhile): every cell one verdict, the model loaded once, a journal of whole
    lines, and nothing of the run left at the end."""
    state = small_disk / "state"
    over = write_overlay(tmp_path / "o.json", {"vars": {"think_secs": "0.3"},
                                               "preflight": {"min_free_gb": 0}})
    args = ["--preset", "demo", "--target-n", "2", "--concurrency", "2", "--config",
            str(over), "--state-dir", str(state), "--quiet"]
    p = subprocess.Popen([sys.executable, "-m", "autopilot", *args], env=cli_env(),
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        wait_for(lambda: sum(e["event"] == "cell_started" for e in events(state)) >= 3,
                 what="cells running")
        filler = fill(small_disk)
        _, err = p.communicate(timeout=120)
    finally:
        if p.poll() is None:
            p.kill()
            p.wait()
    assert p.returncode == 140, err.decode()[-3000:]
    lines = err.decode().strip().splitlines()
    assert lines[-1].startswith("AUTOPILOT_HANDED_OVER: disk full: "), lines[-3:]
    assert str(small_disk) in lines[-1]
    assert "Traceback" not in err.decode() and "ExceptionGroup" not in err.decode()
    assert run_marked(state)  # the endpoint (and attempts) go on: no work was killed
    assert read_events(state / "journal.jsonl").torn_lines == []
    kinds = [e["event"] for e in events(state)]
    assert "cell_killed" not in kinds and "cell_abandoned" not in kinds

    filler.unlink()
    (state / ".status.json.leftover.tmp").write_text("{")  # as a kill leaves them
    r = run_cli(*args)
    assert r.returncode == 0, r.stderr[-3000:]
    assert not list(state.glob(".*.tmp"))
    evs = events(state)
    verdicts = Counter(e["cell"] for e in evs if e["event"] == "cell_verdict"
                       and e["verdict"] in ("PASS", "FAIL"))
    status = json.loads((state / "status.json").read_text())
    assert status["phase"] == "COMPLETE"
    assert len(verdicts) == status["totals"]["total"] and set(verdicts.values()) == {1}
    assert sum(e["event"] == "endpoint_spawned" for e in evs) == 1
    # The data paths waited for space to record their attempts' ends: none was lost.
    assert [e for e in evs if e["event"] == "cell_verdict"
            and e.get("reason") == "datapath_lost"] == []
    assert os.listdir(small_disk) == ["state"]
    assert run_marked(state) == []


FILL_ONCE = (
    'mkdir -p "$1"\n'
    'if [ ! -e "$2/filled" ]; then\n'
    '  : > "$2/filled"; cat /dev/zero > "$2/filler" 2>/dev/null\n'
    '  echo "No space left on device" >&2; exit 1\n'
    'fi\n'
    "echo '{{\"total_completion_tokens\": 3}}' > \"$1/summary.json\"\n"
)


def test_a_disk_below_the_floor_pauses_launching_and_charges_no_cell(
        small_disk: Path, tmp_path: Path) -> None:
    """The harness's own disk fills (its outputs live on the small tmpfs, the state dir
    does not): that attempt is INVALID(disk_full) and spends no retry (infra_retries 0
    would quarantine it), launching waits with a milestone, and resumes once space is
    back; the run ends COMPLETE."""
    state = tmp_path / "state"
    over = write_overlay(tmp_path / "o.json", {
        "tasks": [{"id": "p1_bugfix"}, {"id": "p2_extract"}],
        "harness": {"argv": ["/bin/sh", "-c", FILL_ONCE, "harness", "{output_dir}",
                             str(small_disk)],
                    "output_dir": str(small_disk) + "/cells/{cell}"},
        "grader": {"argv": ["/bin/sh", "-c", "echo '{{\"verdict\": \"PASS\"}}' > \"$1\"",
                            "grade", "{grade_file}"]},
        "trust": {"arm_checks": [], "infra_retries": 0}, "baseline": None,
        "run": {"disk_floor_mb": 2, "disk_check_secs": 0.2},
        "preflight": {"min_free_gb": 0.002}})
    args = ["--preset", "demo", "--target-n", "1", "--concurrency", "1", "--config",
            str(over), "--state-dir", str(state), "--quiet"]
    p = subprocess.Popen([sys.executable, "-m", "autopilot.cli", *args], env=cli_env(),
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        def first_verdict() -> dict | None:
            assert p.poll() is None, p.communicate()[1].decode()[-2000:]  # still running
            return next((e for e in events(state) if e["event"] == "cell_verdict"), None)

        wait_for(lambda: first_verdict() is not None, 60, "the filling cell's verdict")
        v = first_verdict()
        assert v is not None and v["verdict"] == "INVALID" and v["reason"] == "disk_full"
        wait_for(lambda: any(e.get("kind") == "disk_low" for e in events(state)), 30,
                 "the disk_low milestone")
        (small_disk / "filler").unlink()
        out, err = p.communicate(timeout=120)
    finally:
        if p.poll() is None:
            p.kill()
            p.wait(10)
    assert p.returncode == 0, err.decode()[-3000:]
    assert out.decode().strip().splitlines()[-1] == "AUTOPILOT_COMPLETE"
    evs = events(state)
    kinds = [e.get("kind") if e["event"] == "milestone" else e["event"] for e in evs]
    low, ok = kinds.index("disk_low"), kinds.index("disk_ok")
    assert low < ok and "cell_spawning" not in kinds[low:ok]  # nothing launched meanwhile
    milestone = evs[low]
    assert milestone["where"].startswith(str(small_disk)) and milestone["floor_mb"] == 2.0
    assert "cell_quarantined" not in kinds
    verdicts = [(e["cell"], e["verdict"]) for e in evs if e["event"] == "cell_verdict"]
    assert verdicts.count((v["cell"], "PASS")) == 1  # the charged-nothing cell re-ran
    assert sum(vd == "PASS" for _, vd in verdicts) == 4
    status = json.loads((state / "status.json").read_text())
    assert status["phase"] == "COMPLETE"


async def test_a_full_disk_fails_no_request_and_tears_no_log_line(
        small_disk: Path, upstream: Any) -> None:
    """A data path's gateway log on a full disk: the harness's requests are still served
    and metered (the meter goes into exit.json); the lines that did not fit are counted
    ``unwritten``, and the log is cut back to whole lines."""
    from gateway_fake import client, here

    from autopilot.gateway.proxy import Gateway

    log = small_disk / "gateway.jsonl"
    gw = Gateway()
    try:
        async with gw.attempt("c1", 1, {}, here(upstream), log) as att, client(att) as c:
            ok = await c.post("/v1/chat/completions", json={"model": "m", "messages": []})
            assert ok.status_code == 200
            filler = fill(small_disk)
            for _ in range(40):  # past what the log's last page still holds
                r = await c.post("/v1/chat/completions", json={"model": "m", "messages": []})
                assert r.status_code == 200
            meter, unwritten = att.meter, att.unwritten
    finally:
        await gw.close()
    filler.unlink()
    assert meter.requests == 41 and meter.completion_tokens > 0
    lines = log.read_text().splitlines()
    assert unwritten > 0 and len(lines) + unwritten == 41
    assert all(json.loads(line)["status"] == 200 for line in lines)  # whole lines only


def test_a_data_path_waits_for_space_to_record_its_attempts_end(small_disk: Path) -> None:
    """exit.json (the attempt's end and meter) is written once space is back, never
    given up: the data path retries while the disk is full."""
    import asyncio
    import threading

    from autopilot.datapath import process, wire

    target = small_disk / wire.EXIT
    filler = fill(small_disk)
    tries = []

    def write() -> None:
        tries.append(1)
        wire.write_private_json(target, {"code": 0, "meter": {"requests": 7}})

    process.SPACE_RETRY_SECS = 0.05
    t = threading.Thread(target=lambda: asyncio.run(process._when_space(write)), daemon=True)
    t.start()
    try:
        wait_for(lambda: len(tries) >= 2, 30, "the data path retrying on a full disk")
        assert not target.exists() and t.is_alive()
    finally:
        filler.unlink()
    t.join(30)
    assert not t.is_alive()
    assert json.loads(target.read_text())["meter"] == {"requests": 7}
