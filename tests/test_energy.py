"""Local energy (#27): the pure apportioning rule, nvidia-smi's output as untrusted
input, and a run against a FAKE llama-server with a FAKE nvidia-smi (tests/fakebin:
the real tool's query format) that samples, records the GPUs, and reports kWh and cost."""

from __future__ import annotations

import itertools
import json
from pathlib import Path

import pytest
from conftest import FAKEBIN, cli_env, events, run_cli, write_overlay

from autopilot.loader import load_preset
from autopilot.run.power import rows, watts
from autopilot.views.energy import J_PER_KWH, Span, apportion, energy_of, measure

ALL = {0: None}


def test_one_cell_alone_gets_the_replicas_whole_draw() -> None:
    e = apportion([(0.0, {"0": 300.0}), (10.0, {"0": 300.0})],
                  [Span("a", 0, 0.0, 10.0)], ALL, max_gap=30)
    assert e.joules["a"] == pytest.approx(3000.0)
    assert e.coverage("a") == 1.0


def test_concurrent_cells_split_the_draw_at_each_instant() -> None:
    # 400 W throughout; a runs 0-10, b runs 5-10: a alone 0-5 (2000 J), then halves.
    e = apportion([(0.0, {"0": 400.0}), (10.0, {"0": 400.0})],
                  [Span("a", 0, 0.0, 10.0), Span("b", 0, 5.0, 10.0)], ALL, max_gap=30)
    assert e.joules["a"] == pytest.approx(2000 + 1000)
    assert e.joules["b"] == pytest.approx(1000)
    assert e.idle_joules == pytest.approx(400 * 30)  # after 10 s the last reading holds


def test_a_replica_is_charged_only_its_own_gpus() -> None:
    samples = [(0.0, {"0": 300.0, "1": 100.0}), (10.0, {"0": 300.0, "1": 100.0})]
    e = apportion(samples, [Span("a", 0, 0.0, 10.0), Span("b", 1, 0.0, 10.0)],
                  {0: frozenset({"0"}), 1: frozenset({"1"})}, max_gap=30)
    assert (e.joules["a"], e.joules["b"]) == (pytest.approx(3000), pytest.approx(1000))


def test_a_gap_in_the_samples_is_not_filled_in() -> None:
    # samples at 0 and 100 with max_gap 10: 10-100 is unknown, not 300 W held
    e = apportion([(0.0, {"0": 300.0}), (100.0, {"0": 300.0})],
                  [Span("a", 0, 0.0, 100.0)], ALL, max_gap=10)
    assert e.joules["a"] == pytest.approx(3000)
    assert e.coverage("a") == pytest.approx(0.1)


def test_energy_is_conserved_and_uuids_name_gpus() -> None:
    samples = [(float(t), {"0": 100.0 + t, "1": 50.0}) for t in range(0, 20, 2)]
    spans = [Span("a", 0, 1.0, 9.0), Span("b", 1, 3.0, 15.0), Span("c", 0, 4.0, 30.0)]
    e = energy_of(samples, {"GPU-x": "1"}, spans, {0: frozenset({"0"}), 1: frozenset(
        {"GPU-x"})}, max_gap=5)
    # every sample's reading held to the next one (or max_gap), summed over both GPUs
    held = sum((s1[0] - s0[0]) * sum(s0[1].values())
               for s0, s1 in itertools.pairwise(samples)) + 5 * sum(samples[-1][1].values())
    assert sum(e.joules.values()) + e.idle_joules == pytest.approx(held)
    assert e.joules["b"] == pytest.approx(50.0 * 12)  # GPU 1 alone, by its uuid


def test_replicas_sharing_every_gpu_are_one_draw() -> None:
    samples = [(0.0, {"0": 200.0}), (10.0, {"0": 200.0})]
    e = energy_of(samples, {}, [Span("a", 0, 0.0, 10.0), Span("b", 1, 0.0, 10.0)],
                  {0: None, 1: None}, max_gap=30)
    assert e.joules["a"] + e.joules["b"] == pytest.approx(2000)  # not 4000


@pytest.mark.parametrize(("text", "expect"), [
    ("0, GPU-a1, 71.52\n1, GPU-b2, 300.00\n", {"0": ("GPU-a1", 71.52), "1": ("GPU-b2", 300.0)}),
    ("0, GPU-a1, [N/A]\n1, GPU-b2, 12.5\n", {"1": ("GPU-b2", 12.5)}),  # no reading: absent
    ("0, GPU-a1, 1e9\n", {}),  # not a reading
    ("0, GPU-a1, -5\n", {}),
    ("x, GPU-a1, 5\n", {}),
    ("0, GPU;rm -rf /, 5\n", {}),
    ("NVIDIA-SMI has failed because it couldn't communicate with the NVIDIA driver", {}),
    ("0, GPU-a1\n", {}),
])
def test_nvidia_smi_output_is_shape_checked(text: str, expect: dict) -> None:
    assert watts(text) == expect


def test_rows_are_bounded() -> None:
    assert len(rows("0, a, 1\n" * 10_000, 3)) == 64


def overlay(tmp: Path, **more: object) -> str:
    doc = {"endpoint": {"engine": "llamacpp", "binary": str(FAKEBIN / "llama-server"),
                        "model_path": str(FAKEBIN / "llama-server"),
                        "startup_timeout_secs": 20},
           "vars": {"think_secs": "0.6"}, **more}
    return str(write_overlay(tmp / "o.json", doc))


@pytest.mark.slow
def test_a_run_samples_power_and_reports_energy_and_cost(state_dir: Path,
                                                          tmp_path: Path) -> None:
    log = tmp_path / "nvsmi.jsonl"
    # samples every 0.5 s (a gap is over 1.25 s), cells of about 2 s: every cell is seen
    # even on a loaded machine, where each fake nvidia-smi costs a Python start-up
    cost = {"nvidia_smi": str(FAKEBIN / "nvidia-smi"), "sample_secs": 0.5,
            "usd_per_kwh": 0.13}
    over = overlay(tmp_path, cost=cost, vars={"think_secs": "1.5"})
    env = cli_env(FAKE_GPU_WATTS="300,150", FAKE_NVSMI_LOG=str(log))
    r = run_cli("--preset", "demo", "--target-n", "1", "--config", over,
                "--state-dir", str(state_dir), "--quiet", env=env)
    assert r.returncode == 0, r.stderr[-2000:]
    samples = [json.loads(x) for x in (state_dir / "power.jsonl").read_text().splitlines()]
    assert len(samples) >= 3 and all(s["w"] == {"0": 300.0, "1": 150.0} for s in samples)
    calls = [json.loads(x) for x in log.read_text().splitlines()]
    assert ["--query-gpu=index,uuid,power.draw", "--format=csv,noheader,nounits"] in calls
    ident = [json.loads(x) for x in (state_dir / "identity.jsonl").read_text().splitlines()]
    gpus = ident[-1]["endpoint"]["gpus"]
    assert [g["name"] for g in gpus] == ["NVIDIA H100 80GB HBM3"] * 2

    preset = load_preset("demo", overlay=over)
    e = measure(preset, state_dir)
    assert e is not None
    cells = {ev["cell"] for ev in events(state_dir) if ev["event"] == "cell_exited"}
    assert cells and all(e.joules[c] > 0 for c in cells)
    # at most the two GPUs' 450 W over each cell's run, shared with the cells beside it
    assert all(e.joules[c] <= 450 * e.ran[c] + 1e-6 for c in cells)
    rep = run_cli("report", "--state-dir", str(state_dir), env=env)
    assert rep.returncode == 0, rep.stderr
    text = rep.stdout
    assert "sampled every 0.5 s" in text and "priced at $0.13/kWh" in text
    assert "median energy (Wh)" in text
    arms = {a.label: a for a in preset.arms}
    for arm in arms:
        row = next(x for x in text.splitlines() if x.startswith(f"| {arm} | ")
                   and x.count("|") == 6 and "%" in x)
        _, _, n, kwh, usd, _, _ = (c.strip() for c in row.split("|"))
        mine = [c for c in cells if f"_{arm}_" in c]
        assert int(n) == len(mine)
        assert float(kwh) == pytest.approx(sum(e.joules[c] for c in mine) / J_PER_KWH,
                                           rel=0.01)
        assert float(usd) == pytest.approx(float(kwh) * 0.13, rel=0.01)
    assert "| fake | H100" not in text  # the GPU's name is in section 9, escaped
    assert "NVIDIA H100 80GB HBM3" in text


@pytest.mark.slow
def test_no_samples_is_unavailable_never_zero(state_dir: Path, tmp_path: Path) -> None:
    over = overlay(tmp_path, cost={"nvidia_smi": str(tmp_path / "no-such-nvidia-smi")})
    r = run_cli("--preset", "demo", "--target-n", "1", "--config", over,
                "--state-dir", str(state_dir), "--quiet")
    assert r.returncode == 0, r.stderr[-2000:]
    assert not (state_dir / "power.jsonl").exists()
    text = run_cli("report", "--state-dir", str(state_dir)).stdout
    assert "Energy: unavailable (no power samples: " in text
    assert "no-such-nvidia-smi was not found or did not answer" in text
    assert "kWh" not in text and "median energy" not in text
