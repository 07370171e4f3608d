"""The shipped presets load, and the origin-interface ones really drive an origin-shaped
harness (a FAKE checkout: tooling/harness.py, graders/, tasks/) with no code change."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from conftest import FAKEBIN, ROOT, cli_env, events, run_cli, write_overlay

from autopilot.loader import list_presets, load_preset
from autopilot.plan import Plan

SHIPPED = ["demo", "demo-chaos", "397b", "qwen3.6-27b", "step3p7", "provider-example"]


def test_every_shipped_preset_loads() -> None:
    names = [n for n, _ in list_presets()]
    assert set(SHIPPED) <= set(names) and "_mmbt" not in names
    for name in SHIPPED:
        p = load_preset(name)
        assert Plan(p, 2).cells and p.description


def test_origin_presets_shape() -> None:
    p = load_preset("397b")
    assert p.endpoint.engine == "llamacpp" and p.endpoint.mode == "docker"
    assert [a.label for a in p.arms] == ["397b-nothink", "397b-think"]
    assert len(p.tasks) == 12 and p.baseline and sum(p.baseline.passes.values()) == 82
    assert p.harness.sandbox_container == "bench-sandbox-{cell}"
    assert load_preset("step3p7").endpoint.engine == "vllm"
    assert load_preset("provider-example").endpoint.engine == "provider"


def fake_checkout(root: Path) -> Path:
    bench = root / "bench"
    (bench / "tooling").mkdir(parents=True)
    shutil.copy(ROOT / "tests" / "fake_bench" / "harness.py", bench / "tooling" / "harness.py")
    p = load_preset("qwen3.6-27b")
    for t in p.tasks:
        for key in ("task_file", "grader", "input_dir", "ground_truth"):
            rel = t.vars.get(key)
            if not rel:
                continue
            target = bench / ("graders/" + rel if key == "grader" else rel)
            target.parent.mkdir(parents=True, exist_ok=True)
            if key == "grader":
                shutil.copy(ROOT / "tests" / "fake_bench" / "grade.py", target)
            elif key == "input_dir":
                target.mkdir(exist_ok=True)
            else:
                target.write_text("{}")
    return bench


@pytest.mark.slow
def test_qwen_preset_drives_an_origin_shaped_checkout(state_dir: Path, tmp_path: Path) -> None:
    bench = fake_checkout(tmp_path)
    over = write_overlay(tmp_path / "o.json", {
        "harness": {"sandbox_container": ""}, "run": {"concurrency": 3},
        "endpoint": {"startup_timeout_secs": 30}})
    env = cli_env(BENCH_DIR=str(bench), AUTOPILOT_LLAMA_SERVER=str(FAKEBIN / "llama-server"),
                  QWEN27B_GGUF="/models/fake.gguf")
    r = run_cli("--preset", "qwen3.6-27b", "--target-n", "1", "--config", str(over),
                "--state-dir", str(state_dir), "--quiet", env=env, timeout=300)
    assert r.returncode == 0, r.stderr[-3000:]
    logs = bench / "tooling" / "logs"
    assert len(list(logs.iterdir())) == 24
    market = json.loads((logs / "p3_market_qwen27b-think_v1" / "receipt.json").read_text())
    assert market["input_mount"] is None  # the optional group dropped for p3_market
    assert market["thinking"] == "on"
    bugfix = json.loads((logs / "p1_bugfix_qwen27b-nothink_v1" / "receipt.json").read_text())
    assert bugfix["input_mount"] == "inputs/p1_bugfix" and bugfix["thinking"] == "off"
    extract = json.loads((logs / "p2_extract_qwen27b-nothink_v1" / "grade.json").read_text())
    assert extract["ground_truth"].endswith("ground_truth/p2_extract.json")
    assert json.loads((logs / "p1_bugfix_qwen27b-nothink_v1" / "grade.json").read_text())[
        "ground_truth"] is None
    verdicts = [e for e in events(state_dir) if e["event"] == "cell_verdict"]
    assert {e["verdict"] for e in verdicts} <= {"PASS", "FAIL"} and len(verdicts) == 24
    scratch = state_dir / "scratch"  # extracted workspaces are removed after grading
    assert not scratch.exists() or not any(scratch.iterdir())
