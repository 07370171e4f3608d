"""Shared helpers: run the real CLI as a subprocess, wait on handshakes (file contents,
journal events), never on fixed sleeps."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import psutil
import pytest

ROOT = Path(__file__).resolve().parent.parent


def cli_env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("AUTOPILOT_", "NOTIFY_SOCKET", "WATCHDOG_"))}
    env["PYTHONUNBUFFERED"] = "1"
    env.update(extra)
    return env


def run_cli(*args: str, timeout: float = 180, env: dict[str, str] | None = None,
            prog: str = "autopilot") -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", f"autopilot.{'cli' if prog == 'autopilot' else 'dashboard.cli'}",
         *args],
        capture_output=True, text=True, timeout=timeout, env=env or cli_env(), cwd=ROOT,
    )


def spawn_cli(*args: str, env: dict[str, str] | None = None,
              log: Path | None = None) -> subprocess.Popen[bytes]:
    out = log.open("ab") if log else subprocess.DEVNULL
    return subprocess.Popen(
        [sys.executable, "-m", "autopilot.cli", *args], env=env or cli_env(), cwd=ROOT,
        stdout=out, stderr=subprocess.STDOUT,
    )


def wait_for(pred: Callable[[], Any], timeout: float = 60, what: str = "condition") -> Any:
    """Poll a predicate on observable state (a handshake), failing loudly on timeout."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = pred()
        if value:
            return value
        time.sleep(0.05)
    raise AssertionError(f"timed out waiting for {what}")


def events(state_dir: Path) -> list[dict[str, Any]]:
    path = state_dir / "journal.jsonl"
    if not path.exists():
        return []
    out = []
    for line in path.read_text().splitlines():
        try:
            out.append(json.loads(line))
        except ValueError:
            pass
    return out


def write_overlay(path: Path, doc: dict[str, Any]) -> Path:
    path.write_text(json.dumps(doc))
    return path


def alive_identities(evs: list[dict[str, Any]]) -> list[int]:
    """Pids from cell_started / endpoint_started events whose identity still lives."""
    alive = []
    for ev in evs:
        if ev.get("event") in ("cell_started", "endpoint_started") and ev.get("pid"):
            try:
                p = psutil.Process(ev["pid"])
                if ev.get("create_time") and abs(p.create_time() - ev["create_time"]) < 0.05 \
                        and p.status() != psutil.STATUS_ZOMBIE:
                    alive.append(ev["pid"])
            except psutil.NoSuchProcess:
                pass
    return alive


def token_holders(tokens: set[str]) -> list[int]:
    found = []
    for p in psutil.process_iter():
        try:
            if p.environ().get("AUTOPILOT_CELL_TOKEN") in tokens and \
                    p.status() != psutil.STATUS_ZOMBIE:
                found.append(p.pid)
        except (psutil.Error, OSError):
            pass
    return found


@pytest.fixture
def state_dir(tmp_path: Path) -> Path:
    return tmp_path / "state"
