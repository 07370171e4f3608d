"""The FAKE vendor APIs (autopilot/demo/vendor.py) as a test starts them: a child on
127.0.0.1 that says ``ready PORT`` once it listens (a handshake, not a sleep), killed by
its pid when the test ends; and where the agent CLIs are (tools/install-agents)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

from conftest import ROOT, reap_or_kill

FAKE = ROOT / "autopilot" / "demo" / "vendor.py"


class Vendor:
    def __init__(self, tmp: Path, dialect: str, key: str, models: str = "fake-model",
                 *args: str) -> None:
        self.dialect, self.key = dialect, key
        self.record = tmp / f"vendor-{dialect}-{os.urandom(3).hex()}.jsonl"
        self.proc = subprocess.Popen(
            [sys.executable, str(FAKE), "--dialect", dialect, "--key", key, "--models",
             models, "--record", str(self.record), *args],
            stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
        assert self.proc.stdout is not None
        line = self.proc.stdout.readline()  # blocks until it listens (or dies: "")
        if not line.startswith("ready "):
            self.close()
            raise RuntimeError(f"vendor fake {dialect} did not start: {line!r}")
        self.port = int(line.split()[1])

    @property
    def origin(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def requests(self) -> list[dict[str, Any]]:
        if not self.record.exists():
            return []
        return [json.loads(x) for x in self.record.read_text().splitlines() if x.strip()]

    def close(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
        if self.proc.returncode is None:
            self.proc.returncode = reap_or_kill(self.proc.pid, 5)
        if self.proc.stdout is not None:
            self.proc.stdout.close()


def agents_bin() -> Path | None:
    """The agent CLIs' bin dir (tools/install-agents), or None when not installed."""
    where = os.environ.get("AUTOPILOT_AGENTS_BIN") or str(
        Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache")
        / "bench-autopilot" / "agents" / "node_modules" / ".bin")
    d = Path(where)
    return d if all((d / b).exists() for b in ("claude", "codex", "gemini", "opencode")) \
        else None
