"""Every deletion and move goes through autopilot.fsguard: hostile and careless paths
(empty, relative, '..', '/', home, cwd, the state dir, a symlink out) are refused and
nothing is touched; paths inside the run's roots are removed."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from conftest import events, run_cli, write_overlay

from autopilot.fsguard import UnsafePath, check, move_tree, remove_tree, run_roots
from autopilot.loader import load_preset


@pytest.fixture
def run(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> tuple[Path, Path, Path]:
    state = tmp_path / "state"
    root = tmp_path / "bench" / "tooling" / "workspace"
    root.mkdir(parents=True)
    state.mkdir()
    monkeypatch.chdir(tmp_path / "bench")
    return state, root, tmp_path


@pytest.mark.parametrize("bad", ["", ".", "relative/dir", "/", "{root}/..", "{root}/x/../..",
                                 "{root}", "{tmp}", "{tmp}/bench", "{state}", "{home}"])
def test_hostile_paths_are_refused_and_nothing_is_removed(run, bad: str) -> None:
    state, root, tmp = run
    (root / "keep").mkdir()
    path = bad.format(root=root, tmp=tmp, state=state, home=Path.home())
    with pytest.raises(UnsafePath):
        remove_tree(path, (state, root), state)
    assert (root / "keep").is_dir() and state.is_dir()


def test_inside_a_root_is_removed_and_a_symlink_out_is_not_followed(run) -> None:
    state, root, tmp = run
    victim = tmp / "victim"
    (victim / "data").mkdir(parents=True)
    (root / "cell_v1" / "sub").mkdir(parents=True)
    assert remove_tree(root / "cell_v1", (state, root), state)
    assert not (root / "cell_v1").exists()
    (root / "link").symlink_to(victim)
    assert remove_tree(root / "link", (state, root), state)  # the link, not its target
    assert (victim / "data").is_dir()
    (root / "ln2").symlink_to(victim)
    with pytest.raises(UnsafePath, match="symlink"):
        remove_tree(root / "ln2" / "data", (state, root), state)
    assert (victim / "data").is_dir()
    with pytest.raises(UnsafePath):
        move_tree(victim, state / "attempts" / "x", (state, root), state)
    assert victim.is_dir()


def test_roots_come_from_the_static_part_of_the_templates(tmp_path: Path,
                                                          monkeypatch) -> None:
    monkeypatch.setenv("BENCH_DIR", "/srv/mmbt")
    roots = run_roots(load_preset("qwen3.6-27b"), tmp_path / "st")
    assert roots == (tmp_path / "st", Path("/srv/mmbt/tooling/logs"),
                     Path("/srv/mmbt/tooling/workspace"))
    assert check("/srv/mmbt/tooling/workspace/_input_p1_bugfix_x_v1", roots, tmp_path / "st")
    with pytest.raises(UnsafePath, match="outside the run's roots"):
        check("/srv/mmbt/tooling/graders", roots, tmp_path / "st")


@pytest.mark.slow
def test_an_empty_scratch_placeholder_deletes_nothing(state_dir: Path, tmp_path: Path,
                                                      monkeypatch) -> None:
    # The reproduced bug: scratch_dirs = ["{scratch}"] with scratch = "" was Path("") = cwd.
    work = tmp_path / "cwd"
    work.mkdir()
    (work / "precious.txt").write_text("keep me")
    over = write_overlay(tmp_path / "o.json", {
        "vars": {"think_secs": "0", "scratch": ""}, "tasks": [{"id": "p1_bugfix"}],
        "arms": [{"label": "demo-nothink", "mode": "nothink"}],
        "harness": {"scratch_dirs": ["{scratch}"]}})
    r = run_cli("--preset", "demo", "--target-n", "1", "--config", str(over),
                "--state-dir", str(state_dir), "--quiet", cwd=work)
    assert r.returncode == 0, r.stderr[-2000:]
    assert (work / "precious.txt").read_text() == "keep me"
    refused = [e for e in events(state_dir) if e["event"] == "unsafe_path_refused"]
    assert refused and all("not an absolute path" in e["why"] for e in refused)
    c = run_cli("cleanup", "--state-dir", str(state_dir), cwd=work)
    assert c.returncode == 0 and (work / "precious.txt").exists()
    assert os.listdir(work) == ["precious.txt"]
