"""The CLI surface: bad input is one line, exit 2, and nothing written."""

from __future__ import annotations

import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest
from conftest import run_cli


@pytest.fixture
def readonly_dir(tmp_path: Path) -> Iterator[Path]:
    d = tmp_path / "ro"
    d.mkdir()
    if shutil.which("chattr") and subprocess.run(["chattr", "+i", str(d)]).returncode == 0:
        yield d
        subprocess.run(["chattr", "-i", str(d)], check=True)
    else:
        d.chmod(0o555)
        probe = d / "probe"
        try:
            probe.touch()
        except OSError:
            yield d
        else:
            probe.unlink()
            pytest.skip("cannot make a read-only directory here (root without chattr)")
        d.chmod(0o755)


def snapshot(root: Path) -> set[str]:
    return {str(p.relative_to(root)) for p in root.rglob("*")}


@pytest.mark.parametrize(
    ("args", "needle"),
    [
        (["--preset", "nope", "--target-n", "2"], "unknown preset"),
        (["--preset", "demo", "--target-n", "0"], "--target-n: must be >= 1, got 0"),
        (["--preset", "demo", "--target-n", "x"], "--target-n: expected an integer"),
        (["--preset", "demo", "--concurrency", "0"], "--concurrency: must be >= 1"),
        (["--target-n", "2"], "--preset is required"),
        (["--preset", "demo", "--bogus"], "unrecognized arguments: --bogus"),
    ],
)
def test_bad_input_one_line_exit_2_nothing_written(tmp_path: Path, args: list[str],
                                                   needle: str) -> None:
    state = tmp_path / "state"
    r = run_cli(*args, "--state-dir", str(state))
    assert r.returncode == 2, r.stderr
    assert needle in r.stderr
    assert len(r.stderr.strip().splitlines()) == 1
    assert not state.exists()
    assert r.stdout == ""


@pytest.mark.parametrize("kind", ["malformed", "unknown_key", "wrong_type", "collision"])
def test_bad_preset_files_exit_2(tmp_path: Path, kind: str) -> None:
    demo = (Path(__file__).parent.parent / "presets" / "demo.toml").read_text()
    text = {
        "malformed": demo.replace('model = "demo-sim-1"', 'model = "demo-sim-1'),
        "unknown_key": demo.replace("[run]\n", "[run]\nconcurency = 2\n"),
        "wrong_type": demo.replace("max_passes = 6", 'max_passes = "six"'),
        "collision": demo.replace('label = "demo-think"', 'label = "demo-nothink"')
                         .replace('mode = "think"', 'mode = "nothink"'),
    }[kind]
    preset = tmp_path / "p.toml"
    preset.write_text(text)
    state = tmp_path / "state"
    before = snapshot(tmp_path)
    r = run_cli("--preset", str(preset), "--target-n", "2", "--state-dir", str(state))
    assert r.returncode == 2
    assert str(preset) in r.stderr and len(r.stderr.strip().splitlines()) == 1
    assert snapshot(tmp_path) == before


def test_unwritable_state_dir(readonly_dir: Path) -> None:
    r = run_cli("--preset", "demo", "--target-n", "1", "--state-dir",
                str(readonly_dir / "state"))
    assert r.returncode == 2
    assert "not writable" in r.stderr and len(r.stderr.strip().splitlines()) == 1
    assert list(readonly_dir.iterdir()) == []


def test_state_dir_under_a_file(tmp_path: Path) -> None:
    f = tmp_path / "file"
    f.write_text("x")
    r = run_cli("--preset", "demo", "--target-n", "1", "--state-dir", str(f / "state"))
    assert r.returncode == 2 and "not a directory" in r.stderr


def test_presets_lists_shipped_presets() -> None:
    r = run_cli("presets")
    assert r.returncode == 0
    names = [line.split()[0] for line in r.stdout.splitlines()]
    assert "demo" in names and "demo-chaos" in names


def test_dashboard_without_a_run(tmp_path: Path) -> None:
    r = run_cli("--oneline", "--state-dir", str(tmp_path / "none"), prog="dashboard")
    assert r.returncode == 0 and "no run yet" in r.stdout
    assert not (tmp_path / "none").exists()
