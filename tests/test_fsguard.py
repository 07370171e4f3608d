"""Every deletion and move goes through autopilot.state.fsguard: hostile and careless paths
(empty, relative, '..', '/', home, cwd, the state dir, a symlink out) are refused and
nothing is touched; paths inside the run's roots are removed."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from conftest import run_cli, write_overlay

from autopilot.errors import ConfigError
from autopilot.loader import load_preset
from autopilot.run.admission import load_admitted
from autopilot.state.fsguard import UnsafePath, check, move_tree, remove_tree, run_roots


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


def test_a_3000_level_tree_with_symlink_loops_is_removed_without_recursion(run) -> None:
    """A model's commands can build a tree deeper than Python's recursion limit, PATH_MAX
    and the fd limit, with symlinks back up at every level (issue #34: rmtree raised
    RecursionError and the cell was wedged for good). Built by descriptor, as it must be."""
    import os

    state, root, tmp = run
    victim = tmp / "victim"
    victim.mkdir()
    (victim / "keep").write_text("x")
    top = root / "cell_v1"
    top.mkdir()
    fd = os.open(top, os.O_RDONLY | os.O_DIRECTORY)
    try:
        for _ in range(3000):
            os.mkdir("d", dir_fd=fd)
            os.symlink("..", "loop", dir_fd=fd)
            os.symlink(str(victim), "out", dir_fd=fd)
            f = os.open("f", os.O_WRONLY | os.O_CREAT, 0o600, dir_fd=fd)
            os.close(f)
            down = os.open("d", os.O_RDONLY | os.O_DIRECTORY, dir_fd=fd)
            os.close(fd)
            fd = down
    finally:
        os.close(fd)
    assert remove_tree(top, (state, root), state)
    assert not os.path.lexists(top)
    assert (victim / "keep").read_text() == "x"  # never followed out


def test_roots_come_from_the_static_part_of_the_templates(tmp_path: Path,
                                                          monkeypatch) -> None:
    monkeypatch.setenv("BENCH_DIR", "/srv/mmbt")
    roots = run_roots(load_preset("qwen3.6-27b"), tmp_path / "st")
    assert roots == (tmp_path / "st", Path("/srv/mmbt/tooling/logs"),
                     Path("/srv/mmbt/tooling/workspace"))
    assert check("/srv/mmbt/tooling/workspace/_input_p1_bugfix_x_v1", roots, tmp_path / "st")
    with pytest.raises(UnsafePath, match="outside the run's roots"):
        check("/srv/mmbt/tooling/graders", roots, tmp_path / "st")


def test_an_empty_scratch_placeholder_is_a_config_error_and_deletes_nothing(
        state_dir: Path, tmp_path: Path) -> None:
    # The reproduced bug: scratch_dirs = ["{scratch}"] with scratch = "" was Path("") = cwd,
    # and the run emptied it. The template shows it: refused at load, nothing written.
    work = tmp_path / "cwd"
    work.mkdir()
    (work / "precious.txt").write_text("keep me")
    over = write_overlay(tmp_path / "o.json", {
        "vars": {"think_secs": "0", "scratch": ""}, "tasks": [{"id": "p1_bugfix"}],
        "arms": [{"label": "demo-nothink", "mode": "nothink"}],
        "harness": {"scratch_dirs": ["{scratch}"]}})
    r = run_cli("--preset", "demo", "--target-n", "1", "--config", str(over),
                "--state-dir", str(state_dir), "--quiet", cwd=work)
    assert r.returncode == 2
    assert r.stderr.count("\n") == 1 and "harness.scratch_dirs[0]" in r.stderr
    assert "refused '': not an absolute path" in r.stderr and str(over) in r.stderr
    assert not state_dir.exists()
    assert os.listdir(work) == ["precious.txt"]


@pytest.mark.parametrize(("scratch", "why"), [
    ("{scratch}/{task}/..", "'.' or '..'"),
    ("{scratch}", "it is or contains"),          # the cwd itself
    ("/{cell}", "it is or contains"),            # one level under /: no root to stay in
    ("relative/{cell}", "not an absolute path"),
])
def test_unsafe_scratch_templates_are_refused_at_admission(tmp_path: Path, scratch: str,
                                                           why: str, monkeypatch) -> None:
    monkeypatch.chdir(tmp_path)
    over = write_overlay(tmp_path / "o.json", {
        "vars": {"scratch": str(tmp_path)}, "harness": {"scratch_dirs": [scratch]}})
    load_preset("demo", overlay=str(over))  # parses: the check is admission's, not the loader's
    with pytest.raises(ConfigError, match=r"harness\.scratch_dirs") as e:
        load_admitted("demo", overlay=str(over))
    assert f"{over}: harness.scratch_dirs[0]: unsafe path" in str(e.value)
    assert why in str(e.value) or "outside the run's roots" in str(e.value)


@pytest.mark.parametrize("bad", ["..", ".", "-rf", "p1\n", ".hidden", "a..b"])
def test_path_like_ids_are_refused_by_the_loader(tmp_path: Path, bad: str) -> None:
    over = write_overlay(tmp_path / "o.json", {"tasks": [{"id": bad}]})
    with pytest.raises(ConfigError, match="task id"):
        load_preset("demo", overlay=str(over))
    over = write_overlay(tmp_path / "a.json", {"arms": [{"label": bad + "-think",
                                                         "mode": "think"}]})
    with pytest.raises(ConfigError, match="arm label"):
        load_preset("demo", overlay=str(over))


def test_a_task_id_climbing_out_of_the_output_dir_is_refused(tmp_path: Path) -> None:
    # task '..' with output_dir ".../logs/{task}" moved an unrelated dir into attempts/
    over = write_overlay(tmp_path / "o.json", {
        "tasks": [{"id": ".."}], "harness": {"output_dir": str(tmp_path / "logs/{task}")}})
    with pytest.raises(ConfigError, match="task id"):  # the loader's: the id's shape
        load_preset("demo", overlay=str(over))
