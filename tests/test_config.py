"""Preset loading, overlay merge, and every validation error, named file + key path."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from conftest import cli_env, run_cli, write_overlay

from autopilot.errors import ConfigError
from autopilot.loader import load_preset
from autopilot.run.admission import load_admitted
from autopilot.state.readers import load_recorded
from autopilot.templates import render_argv

DEMO = "demo"


def write(tmp_path: Path, name: str, text: str) -> str:
    p = tmp_path / name
    p.write_text(text)
    return str(p)


def minimal(extra: str = "", arms: str | None = None) -> str:
    arms = arms if arms is not None else (
        '[[arms]]\nlabel = "m-think"\nmode = "think"\n'
        '[[arms]]\nlabel = "m-nothink"\nmode = "nothink"\n'
    )
    return (
        'model = "m"\n'
        '[endpoint]\nengine = "builtin"\n'
        '[harness]\nargv = ["prog", "{cell}", ["--input", "{input_dir}"]]\n'
        '[grader]\nargv = ["grade", "{output_dir}"]\n'
        '[[tasks]]\nid = "t1"\nvars = { input_dir = "in1" }\n'
        '[[tasks]]\nid = "t2"\n'
        + arms + extra
    )


def test_builtin_preset_loads_with_name_and_defaults() -> None:
    p = load_preset(DEMO)
    assert p.name == "demo"
    assert p.endpoint.engine == "builtin"
    assert [a.label for a in p.arms] == ["demo-nothink", "demo-think"]
    assert p.run.max_passes == 6


def test_overlay_deep_merges_and_flags_win(tmp_path: Path) -> None:
    over = write(tmp_path, "over.json", json.dumps(
        {"run": {"concurrency": 7, "max_passes": 2}, "watchdog": {"stuck_secs": 99}}))
    p = load_preset(DEMO, overlay=over, flags={"max_passes": 4, "target_n": None})
    assert p.run.concurrency == 7  # overlay over preset
    assert p.run.max_passes == 4  # flag over overlay
    assert p.run.target_n == 3  # untouched preset value survives the merge (additive)
    assert p.watchdog.stuck_secs == 99
    assert p.watchdog.poll_secs == 0.2  # sibling key kept


def test_toml_overlay(tmp_path: Path) -> None:
    over = write(tmp_path, "o.toml", '[run]\nconcurrency = 3\n')
    assert load_preset(DEMO, overlay=over).run.concurrency == 3


def test_preset_by_path_and_env_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = write(tmp_path, "mine.toml", minimal())
    assert load_preset(path).name == "mine"
    monkeypatch.setenv("AUTOPILOT_PRESETS_DIR", str(tmp_path))
    assert load_preset("mine").model == "m"


def test_optional_argv_group_drops_when_unset() -> None:
    ctx = {"cell": "c", "input_dir": ""}
    assert render_argv(["p", "{cell}", ["--input", "{input_dir}"]], ctx) == ["p", "c"]
    ctx["input_dir"] = "dir"
    assert render_argv(["p", "{cell}", ["--input", "{input_dir}"]], ctx) == [
        "p", "c", "--input", "dir"]


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("model = \n", "malformed TOML"),
        (minimal('bogus = 1\n'), "bogus: unknown key"),
        (minimal('[run]\nconcurrency = "lots"\n'),
         "run.concurrency: Input should be a valid integer"),
        (minimal('[run]\nconcurrency = 0\n'),
         "run.concurrency: Input should be greater than or equal to 1"),
        (minimal(arms='[[arms]]\nlabel = "x-think"\nmode = "think"\n'
                      '[[arms]]\nlabel = "x-think"\nmode = "think"\n'), "collide"),
        (minimal(arms='[[arms]]\nlabel = "x"\nmode = "think"\n'), "does not encode its mode"),
        # issue #34: tasks "a_b" and "a" x arms "c-plain" and "b_c-plain" were 3 cells
        (minimal(arms='[[arms]]\nlabel = "c-plain"\nmode = "plain"\n'
                      '[[arms]]\nlabel = "b_c-plain"\nmode = "plain"\n')
         .replace('id = "t1"', 'id = "a_b"').replace('id = "t2"', 'id = "a"'),
         "task 'a_b' with arm 'c-plain' and task 'a' with arm 'b_c-plain' make the same "
         "cell ids"),
        (minimal(arms='[[arms]]\nlabel = "x-nothink"\nmode = "think"\n'),
         "does not encode its mode"),
        (minimal('[watchdog]\nwarn_secs = 500\n'), "warn_secs <= probe_secs <= kill_secs"),
        (minimal().replace('"grade", "{output_dir}"', '"grade", "{outptu_dir}"'),
         "grader.argv[1]: unknown placeholder {outptu_dir}"),
        (minimal().replace('id = "t2"', 'id = "t 2"'),
         "tasks[1].id: task id 't 2' must start with a letter or digit"),
        (minimal().replace('engine = "builtin"', 'engine = "tgi"'), "endpoint"),
        (minimal('[grader.verdicts]\nODD = { verdict = "INVALID" }\n'), "needs a reason"),
        # A comparator carries its unit: a bare 7 could be passes or task families.
        (minimal('[comparators]\n"27B" = 7\n'),
         "comparators: '27B' = 7: a bare number has no unit"),
        (minimal('[comparators]\n"27B" = { passes = 20 }\n'),
         "comparators.27B: give passes/of together"),
        (minimal('[comparators]\n"27B" = { families = 13, families_of = 12 }\n'),
         "families/families_of: 13 is more than 12"),
        (minimal().replace('[harness]\n', '[harness]\ncompose_project_pattern = "("\n'),
         "harness.compose_project_pattern: not a regular expression"),
        (minimal().replace('[harness]\n', '[harness]\ncompose_project_pattern = ".*"\n'),
         "must not match every name"),
    ],
)
def test_validation_errors_name_file_and_key(tmp_path: Path, text: str, expected: str) -> None:
    path = write(tmp_path, "bad.toml", text)
    with pytest.raises(ConfigError) as e:
        load_preset(path)
    msg = str(e.value)
    assert expected in msg
    assert str(path) in msg
    assert "\n" not in msg


def test_error_in_overlay_names_the_overlay(tmp_path: Path) -> None:
    over = write(tmp_path, "over.json", json.dumps({"run": {"concurrency": "x"}}))
    with pytest.raises(ConfigError) as e:
        load_preset(DEMO, overlay=over)
    assert str(e.value).startswith(f"{over}: run.concurrency")


def test_malformed_json_overlay(tmp_path: Path) -> None:
    over = write(tmp_path, "over.json", "{not json")
    with pytest.raises(ConfigError, match="malformed JSON"):
        load_preset(DEMO, overlay=over)


def test_flag_error_names_the_flag() -> None:
    with pytest.raises(ConfigError, match=r"^--concurrency: "):
        load_preset(DEMO, flags={"concurrency": 0})


def test_unknown_preset_lists_available() -> None:
    with pytest.raises(ConfigError, match=r"unknown preset \(available: .*demo"):
        load_preset("nope")


def test_config_is_frozen() -> None:
    p = load_preset(DEMO)
    with pytest.raises(Exception):
        p.run.concurrency = 9  # type: ignore[misc]


def test_env_expansion_with_defaults(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    text = minimal('[vars]\nroot = "${BENCH_ROOT:-/opt/bench}"\nmodel = "${BENCH_M}"\n')
    path = write(tmp_path, "p.toml", text)
    monkeypatch.setenv("BENCH_M", "m1")
    monkeypatch.delenv("BENCH_ROOT", raising=False)
    assert load_preset(path).vars == {"root": "/opt/bench", "model": "m1"}
    monkeypatch.setenv("BENCH_ROOT", "/data/bench")
    assert load_preset(path).vars["root"] == "/data/bench"
    monkeypatch.setenv("BENCH_ROOT", "")  # set but empty: the default, as in a shell
    assert load_preset(path).vars["root"] == "/opt/bench"
    monkeypatch.setenv("BENCH_M", "")
    with pytest.raises(ConfigError, match=r"vars.model: \$\{BENCH_M\} is set but empty"):
        load_preset(path)
    monkeypatch.delenv("BENCH_M")
    with pytest.raises(ConfigError, match=r"vars.model: \$\{BENCH_M\} is not set"):
        load_preset(path)


def test_several_configs_apply_in_order_and_the_run_remembers_them(tmp_path: Path) -> None:
    import json

    from conftest import run_cli, write_overlay

    first = write_overlay(tmp_path / "a.json", {"vars": {"think_secs": "0"},
                                                "tasks": [{"id": "p1_bugfix"}],
                                                "run": {"concurrency": 1}})
    second = write_overlay(tmp_path / "b.json", {"run": {"concurrency": 2}})
    state = tmp_path / "state"
    r = run_cli("--preset", "demo", "--target-n", "1", "--config", str(first), "--config",
                str(second), "--state-dir", str(state), "--quiet")
    assert r.returncode == 0, r.stderr[-2000:]
    status = json.loads((state / "status.json").read_text())
    assert status["concurrency"] == 2  # the later file wins
    assert status["totals"]["total"] == 2  # and the earlier one still applies (one task)
    plan = json.loads((state / "plan.json").read_text())
    assert plan["config_path"] == [str(first), str(second)]
    val = run_cli("validate", "--state-dir", str(state))  # read with both, in order
    assert val.returncode == 0 and "PASS=" in val.stdout, val.stdout + val.stderr
    bad = write_overlay(tmp_path / "c.json", {"run": {"concurrency": 0}})
    r = run_cli("--preset", "demo", "--target-n", "1", "--config", str(first), "--config",
                str(bad), "--dry-run", "--state-dir", str(tmp_path / "s2"))
    assert r.returncode == 2 and r.stderr.startswith(f"autopilot: error: {bad}: run.concurrency")


def test_a_config_that_is_no_file_says_which(tmp_path: Path) -> None:
    from conftest import run_cli

    none = str(tmp_path / "none.toml")
    for given, why in (("", "'': empty (a file's path is expected)"),
                       (str(tmp_path), f"{str(tmp_path)!r}: not a file"),
                       (none, f"{none!r}: not found")):
        r = run_cli("--preset", "demo", "--target-n", "1", "--config", given, "--dry-run",
                    "--state-dir", str(tmp_path / "s"))
        assert r.returncode == 2 and r.stderr == f"autopilot: error: --config {why}\n"


def test_the_environments_stall_overrides_are_a_loader_layer(tmp_path: Path) -> None:
    env = {"AUTOPILOT_STALL_WARN_S": "2.5", "AUTOPILOT_STALL_KILL_S": "40",
           "AUTOPILOT_STALL_GRACE_S": ""}  # empty: not set
    p = load_preset("demo", environ=env)
    assert (p.watchdog.warn_secs, p.watchdog.kill_secs) == (2.5, 40)
    assert p.watchdog.teardown_grace_secs == load_preset("demo").watchdog.teardown_grace_secs
    # None: no layer (the readers of a state dir never take their shell's values)
    assert load_preset("demo").watchdog.warn_secs == 2
    # A bad value names the variable it came from.
    with pytest.raises(ConfigError) as e:
        load_preset("demo", environ={"AUTOPILOT_STALL_PROBE_S": "soon"})
    assert str(e.value).startswith("AUTOPILOT_STALL_PROBE_S: watchdog.probe_secs: ")
    with pytest.raises(ConfigError) as e:
        load_preset("demo", environ={"AUTOPILOT_STALL_WARN_S": "1000"})
    assert str(e.value).endswith("demo.toml with AUTOPILOT_STALL_WARN_S: watchdog: expected "
                                 "warn_secs <= probe_secs <= kill_secs")


def test_the_limits_in_force_reach_status_json_and_the_resolved_record(
        state_dir: Path, tmp_path: Path) -> None:
    over = write_overlay(tmp_path / "o.json", {
        "vars": {"think_secs": "0"}, "tasks": [{"id": "p1_bugfix", "stuck_secs": 700}],
        "arms": [{"label": "demo-nothink", "mode": "nothink"}]})
    r = run_cli("--preset", "demo", "--target-n", "1", "--config", str(over),
                "--state-dir", str(state_dir), "--quiet",
                env=cli_env(AUTOPILOT_STALL_WARN_S="2.5", AUTOPILOT_STALL_KILL_S="44"))
    assert r.returncode == 0, r.stderr[-2000:]
    status = json.loads((state_dir / "status.json").read_text())
    assert status["thresholds"] == {"warn_secs": 2.5, "probe_secs": 3, "kill_secs": 44,
                                    "stuck_secs": 4,
                                    "tasks": {"p1_bugfix": {"stuck_secs": 700}}}
    preset, _ = load_recorded(state_dir)  # what every later verb and a Ray node see
    assert (preset.watchdog.warn_secs, preset.watchdog.kill_secs) == (2.5, 44)
    bad = run_cli("--preset", "demo", "--target-n", "1", "--config", str(over),
                  "--state-dir", str(tmp_path / "st2"), "--quiet",
                  env=cli_env(AUTOPILOT_STALL_KILL_S="-1"))
    assert bad.returncode == 2 and bad.stderr.count("\n") == 1
    assert bad.stderr.startswith("autopilot: error: AUTOPILOT_STALL_KILL_S: watchdog.kill_secs: ")


def test_the_backends_own_check_is_admissions_and_names_the_file(tmp_path: Path) -> None:
    # Without shared storage a Ray node ships back only what lies under the state dir:
    # an output dir elsewhere parses, and is refused before a run is made of it.
    over = write_overlay(tmp_path / "o.json", {
        "backend": {"kind": "ray", "shared_state_dir": False},
        "harness": {"output_dir": str(tmp_path / "out/{cell}")}})
    assert load_preset("demo", overlay=str(over)).backend.kind == "ray"
    with pytest.raises(ConfigError) as e:
        load_admitted("demo", overlay=str(over))
    assert str(e.value).startswith(f"{over}: harness.output_dir: ")
    assert "outside {state_dir}" in str(e.value)
