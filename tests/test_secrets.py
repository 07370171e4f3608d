"""Secrets stay where they belong: children do not inherit the autopilot's own secrets
or credential-like variables unless the preset passes them; a secret a harness prints
is redacted from every file the autopilot writes; a notification target is logged as
its scheme and host only."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from conftest import cli_env, run_cli, write_overlay

from autopilot.run.notify import target_label

SECRET = "sk-test-51f0c2a9e7d84b6b"
NTFY = "ntfy://bench-topic-private-31337"

# A harness that records its environment's names (each with whether its value is an
# attempt's gateway key) and prints one variable, then is the demo one.
WRAP = ("import json, os, sys; out = sys.argv[1]; os.makedirs(out, exist_ok=True); "
        "json.dump(dict((k, v.startswith('sk-autopilot-')) for k, v in os.environ.items()), "
        "open(os.path.join(out, 'env.json'), 'w')); "
        "print('key is', os.environ.get('MY_PROVIDER_KEY', 'absent'), flush=True); "
        "os.execv(sys.executable, [sys.executable, '-m', 'autopilot.demo.harness', "
        "*sys.argv[2:]])")
HARNESS = ["{python}", "-c", WRAP, "{output_dir}", "{cell}", "--task", "{task}", "--arm",
           "{arm}", "--n", "{n}", "--attempt", "{attempt}", "--host", "{host}", "--port",
           "{port}", "--model", "{model}", "--out", "{output_dir}", "--think-secs", "0"]
ONE = {"tasks": [{"id": "p1_bugfix"}], "arms": [{"label": "demo-nothink", "mode": "nothink"}]}


def run_with(state_dir: Path, tmp_path: Path, harness: dict) -> None:
    over = write_overlay(tmp_path / "o.json", {**ONE, "harness": {"argv": HARNESS, **harness},
                                               "preflight": {"secrets": ["MY_PROVIDER_KEY"]}})
    r = run_cli("--preset", "demo", "--target-n", "1", "--config", str(over), "--state-dir",
                str(state_dir), "--quiet",
                env=cli_env(OPENAI_API_KEY=SECRET + "-openai", MY_PROVIDER_KEY=SECRET,
                            AUTOPILOT_NOTIFY_URLS=NTFY, HF_TOKEN="hf_abcdef123456",
                            DATABASE_URL="postgres://u:pass@db.example/x"))
    assert r.returncode == 0, r.stderr[-3000:]


def test_children_do_not_inherit_secrets_unless_passed(state_dir: Path,
                                                       tmp_path: Path) -> None:
    run_with(state_dir, tmp_path, {})
    names = json.loads((state_dir / "cells/p1_bugfix_demo-nothink_v1/env.json").read_text())
    for withheld in ("MY_PROVIDER_KEY", "AUTOPILOT_NOTIFY_URLS", "HF_TOKEN",
                     "DATABASE_URL"):  # an allow-list: a name that hides its credential too
        assert withheld not in names
    # OPENAI_API_KEY is the attempt's gateway key, never the supervisor's own
    assert names["OPENAI_API_KEY"] is True
    assert {"PATH", "AUTOPILOT_CELL_ID", "AUTOPILOT_RUN_TOKEN"} <= set(names)
    log = (state_dir / "logs/p1_bugfix_demo-nothink_v1.launcher.log").read_text()
    assert "key is absent" in log


def test_a_secret_the_harness_prints_is_redacted_everywhere(state_dir: Path,
                                                            tmp_path: Path) -> None:
    run_with(state_dir, tmp_path, {"pass_env": ["MY_PROVIDER_KEY"]})
    names = json.loads((state_dir / "cells/p1_bugfix_demo-nothink_v1/env.json").read_text())
    assert "MY_PROVIDER_KEY" in names and names["OPENAI_API_KEY"] is True
    log = (state_dir / "logs/p1_bugfix_demo-nothink_v1.launcher.log").read_text()
    assert "key is ***" in log
    leaks = [str(p) for p in state_dir.rglob("*") if p.is_file()
             and (SECRET.encode() in p.read_bytes() or b"bench-topic-private" in p.read_bytes())]
    assert leaks == []


def test_dry_run_shows_what_each_child_gets(tmp_path: Path) -> None:
    import os

    over = write_overlay(tmp_path / "o.json", {"harness": {"pass_env": ["HF_TOKEN"]}})
    env = {"PATH": os.environ["PATH"], "HOME": "/root", "PYTHONUNBUFFERED": "1",
           "OPENAI_API_KEY": "x" * 8, "HF_TOKEN": "y" * 8, "DATABASE_URL": "z" * 8}
    r = run_cli("--preset", "demo", "--target-n", "1", "--dry-run", "--config", str(over),
                "--state-dir", str(tmp_path / "s"), env=env)
    assert r.returncode == 0, r.stderr
    base = "(besides the base: PATH, HOME, locale, TERM, TZ, ...)"
    assert f"env harness: passes HF_TOKEN {base}; withheld DATABASE_URL, OPENAI_API_KEY" \
        in r.stdout
    assert f"env grader: passes nothing extra {base}; withheld DATABASE_URL, HF_TOKEN, " \
        "OPENAI_API_KEY" in r.stdout
    assert "x" * 8 not in r.stdout and "y" * 8 not in r.stdout


@pytest.mark.parametrize(("url", "label"), [
    ("ntfy://bench-topic-private", "ntfy://***"),
    ("ntfys://ntfy.sh/bench-topic-private", "ntfys://ntfy.sh"),
    ("json://user:pass@127.0.0.1:8080/hook/secret-path", "json://127.0.0.1"),
    ("discord://webhook_id/webhook_token", "discord://***"),
])
def test_a_notification_target_is_named_by_scheme_and_host(url: str, label: str) -> None:
    assert target_label(url) == label
