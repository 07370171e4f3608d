"""A run records what it resolved (autopilot.state.resolved): every later verb reads
that record, never the reader's environment or a preset file a state dir names."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
from pathlib import Path

import pytest
from conftest import ROOT, events, run_cli, write_overlay

from autopilot.errors import ConfigError
from autopilot.loader import load_preset
from autopilot.state import resolved

pytestmark = pytest.mark.timeout(240)


def bare_env(**extra: str) -> dict[str, str]:
    """A shell with nothing of the run's: no BENCH_DIR-like variables, no HOME."""
    return {"PATH": "/usr/bin:/bin", "PYTHONUNBUFFERED": "1", **extra}


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A COMPLETE demo run whose outputs live under ``${AP_OUT}``, set only for the run."""
    base = tmp_path_factory.mktemp("resolved")
    out = base / "out"
    out.mkdir()
    overlay = write_overlay(base / "ov.json", {
        "harness": {"output_dir": "${AP_OUT}/{cell}"},
        "tasks": [{"id": "p1_bugfix"}]})
    state = base / "state"
    r = run_cli("--preset", "demo", "--config", str(overlay), "--target-n", "1",
                "--state-dir", str(state), env=bare_env(AP_OUT=str(out)))
    assert r.returncode == 0, r.stdout + r.stderr
    return state


def test_a_complete_run_reads_the_same_from_a_shell_without_its_variables(
        run_dir: Path) -> None:
    env = bare_env()
    v = run_cli("validate", "--state-dir", str(run_dir), env=env)
    assert v.returncode == 0 and "PASS=2" in v.stdout, v.stdout + v.stderr
    rep = run_cli("report", "--state-dir", str(run_dir), env=env)
    assert rep.returncode == 0 and "Trust: valid 2 · invalid 0" in rep.stdout, rep.stderr
    dash = run_cli("--oneline", "--state-dir", str(run_dir), env=env, prog="dashboard")
    assert "COMPLETE" in dash.stdout and "P2" in dash.stdout, dash.stdout + dash.stderr
    # cleanup reads the record too (it used to need the run's variables to load)
    c = run_cli("cleanup", "--state-dir", str(run_dir), env=env)
    assert c.returncode == 0, c.stderr


def test_the_record_is_the_resolved_preset_and_plan_json_holds_its_digest(
        run_dir: Path) -> None:
    blob = (run_dir / resolved.FILE).read_bytes()
    plan = json.loads((run_dir / "plan.json").read_text())
    assert plan["resolved_sha256"] == hashlib.sha256(blob).hexdigest()
    doc = json.loads(blob)
    out = doc["preset"]["harness"]["output_dir"]
    assert "${" not in out and out.endswith("/out/{cell}")
    assert {"name": "AP_OUT", "key": "harness.output_dir"}.items() <= doc["env"][0].items()


def test_a_record_changed_after_the_run_is_refused(run_dir: Path, tmp_path: Path) -> None:
    copy = tmp_path / "state"
    shutil.copytree(run_dir, copy)
    doc = json.loads((copy / resolved.FILE).read_text())
    doc["preset"]["harness"]["output_dir"] = "/elsewhere/{cell}"
    (copy / resolved.FILE).write_text(json.dumps(doc))
    r = run_cli("validate", "--state-dir", str(copy), env=bare_env())
    assert r.returncode == 2
    assert "sha256 is not the one plan.json records" in r.stderr
    assert len(r.stderr.strip().splitlines()) == 1


def test_a_resume_with_another_overlay_journals_what_changed(run_dir: Path,
                                                            tmp_path: Path) -> None:
    copy = tmp_path / "state"
    shutil.copytree(run_dir, copy)
    plan = json.loads((copy / "plan.json").read_text())
    more = write_overlay(tmp_path / "more.json", {"run": {"concurrency": 1}})
    r = run_cli("--preset", "demo", "--config", plan["config_path"], "--config", str(more),
                "--target-n", "1", "--state-dir", str(copy),
                env=bare_env(AP_OUT=str(run_dir.parent / "out")))
    assert r.returncode == 0, r.stdout + r.stderr
    changed = [e for e in events(copy) if e["event"] == "preset_changed"]
    assert len(changed) == 1 and changed[0]["keys"] == ["run.concurrency"]
    assert json.loads((copy / resolved.FILE).read_text())["preset"]["run"]["concurrency"] == 1


def test_secret_values_and_notification_urls_never_reach_the_record(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("AP_TOKEN", "tok-4f9a1c2e-secret")
    overlay = write_overlay(tmp_path / "ov.json", {
        "vars": {"token": "Bearer ${AP_TOKEN}"},
        "preflight": {"secrets": ["AP_TOKEN"]},
        "notify": {"urls": ["ntfy://private-topic-77"]}})
    preset = load_preset("demo", overlay=str(overlay))
    blob = resolved.encode(resolved.document(preset))
    assert b"tok-4f9a1c2e-secret" not in blob and b"private-topic-77" not in blob
    doc = json.loads(blob)
    assert doc["preset"]["vars"]["token"] == "Bearer ${AP_TOKEN}"
    assert doc["preset"]["notify"]["urls"] == ["***"]
    assert [e["value"] for e in doc["env"] if e["name"] == "AP_TOKEN"] == ["${AP_TOKEN}"]


@pytest.fixture
def foreign(tmp_path: Path) -> Path:
    """A state dir of another user (uid 65534), whose preset says ``${ROOT_ENV_SECRET}``."""
    if os.geteuid() != 0:
        pytest.skip("needs root to make a state dir owned by another user")
    state = tmp_path / "theirs"
    state.mkdir(mode=0o700)
    preset = tmp_path / "theirs.toml"
    doc = (ROOT / "presets" / "demo.toml").read_text().replace(
        'model = "demo-sim-1"', 'model = "m-${ROOT_ENV_SECRET:-none}"')
    preset.write_text(doc)
    (state / "plan.json").write_text(json.dumps({
        "preset": "demo", "preset_path": str(preset), "target_n": 1,
        "tasks": ["p1_bugfix"], "arms": ["demo-nothink", "demo-think"]}))
    for p in (state, state / "plan.json"):
        os.chown(p, 65534, 65534)
    return state


def test_another_users_plan_json_cannot_make_a_view_expand_a_variable(
        foreign: Path, tmp_path: Path) -> None:
    env = bare_env(ROOT_ENV_SECRET="root-env-secret-91")
    for verb in ("validate", "report"):
        r = run_cli(verb, "--state-dir", str(foreign), env=env)
        assert r.returncode == 2, r.stdout
        assert "recorded no resolved preset" in r.stderr and "uid 65534" in r.stderr
        assert "root-env-secret-91" not in r.stdout + r.stderr
    b = run_cli("board", str(foreign), "--out", str(tmp_path / "board"), env=env)
    assert b.returncode == 2 and "board:" in b.stderr
    assert not (tmp_path / "board").exists()


def test_a_record_is_read_as_data_never_expanded(foreign: Path, tmp_path: Path) -> None:
    """Their record says ``${ROOT_ENV_SECRET}`` literally: a view shows it as such."""
    doc = resolved.document(load_preset("demo", overlay=str(write_overlay(
        tmp_path / "ov.json", {"tasks": [{"id": "p1_bugfix"}]}))))
    doc["preset"]["model"] = "m-${ROOT_ENV_SECRET}"
    blob = resolved.encode(doc)
    (foreign / resolved.FILE).write_bytes(blob)
    plan = json.loads((foreign / "plan.json").read_text())
    (foreign / "plan.json").write_text(json.dumps(
        {**plan, "resolved_sha256": hashlib.sha256(blob).hexdigest()}))
    for p in (foreign / resolved.FILE, foreign / "plan.json"):
        os.chown(p, 65534, 65534)
    env = bare_env(ROOT_ENV_SECRET="root-env-secret-91")
    r = run_cli("report", "--state-dir", str(foreign), env=env)
    assert r.returncode == 0, r.stderr
    # shown as the record says it (markdown-escaped), never with the reader's value
    assert "m-$\\{ROOT\\_ENV\\_SECRET\\}" in r.stdout and "root-env-secret-91" not in r.stdout
    b = run_cli("board", str(foreign), "--out", str(tmp_path / "board"), env=env)
    assert b.returncode == 2 and "untrusted state dir" in b.stderr, b.stderr


def test_a_records_free_text_is_escaped_where_it_is_shown(run_dir: Path,
                                                          tmp_path: Path) -> None:
    """The record is a state file: a model name with a terminal escape and markup is
    shown escaped by the report (markdown) and summarize (the terminal)."""
    copy = tmp_path / "state"
    shutil.copytree(run_dir, copy)
    doc = json.loads((copy / resolved.FILE).read_text())
    doc["preset"]["model"] = "m\x1b[31m<script>x</script>|**b**"
    blob = resolved.encode(doc)
    (copy / resolved.FILE).write_bytes(blob)
    plan = json.loads((copy / "plan.json").read_text())
    (copy / "plan.json").write_text(json.dumps(
        {**plan, "resolved_sha256": hashlib.sha256(blob).hexdigest()}))
    rep = run_cli("report", "--state-dir", str(copy), env=bare_env())
    assert rep.returncode == 0, rep.stderr
    title = rep.stdout.splitlines()[0]
    assert "\x1b" not in rep.stdout and "<script>" not in title and "\\|" in title
    s = run_cli("summarize", "demo-think", "--state-dir", str(copy), env=bare_env())
    assert s.returncode == 0 and "\x1b" not in s.stdout


def test_a_plan_record_of_the_wrong_shape_can_only_refuse(run_dir: Path, tmp_path: Path) -> None:
    """plan.json is a state file (autopilot.state.readers.PlanRecord): a field of the
    wrong shape is read as absent, and a digest that is no text is one nothing matches,
    never a reason to load a preset the record names instead."""
    from autopilot.state.readers import PlanRecord, load_recorded, plan_record

    assert PlanRecord.of([1]) is None and PlanRecord.of("plan") is None
    odd = PlanRecord.of({"preset": 7, "preset_path": "", "config_path": ["a", 3],
                         "target_n": True, "tasks": ["t", 1], "arms": "a",
                         "resolved_sha256": {"x": 1}})
    assert odd == PlanRecord(resolved_sha256="")  # every field absent, the digest refused
    assert PlanRecord.of({"target_n": 3, "config_path": "o.toml", "tasks": ["t"]}) == \
        PlanRecord(target_n=3, overlays=("o.toml",), tasks=("t",))
    copy = tmp_path / "state"
    shutil.copytree(run_dir, copy)
    plan = json.loads((copy / "plan.json").read_text())
    assert plan_record(copy).resolved_sha256 == plan["resolved_sha256"]
    assert plan_record(copy).tasks == tuple(plan["tasks"])
    (copy / "plan.json").write_text(json.dumps({**plan, "resolved_sha256": 12}))
    with pytest.raises(ConfigError, match=r"sha256 is not the one plan\.json records"):
        load_recorded(copy)
    r = run_cli("report", "--state-dir", str(copy), env=bare_env())
    assert r.returncode == 2 and "sha256 is not the one" in r.stderr, r.stderr
