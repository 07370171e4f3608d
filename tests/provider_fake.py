"""Honest fakes started by tests on 127.0.0.1 (a hosted provider, an endpoint)."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from pathlib import Path

import httpx
from conftest import ROOT, wait_for


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class FakeProvider:
    """autopilot.demo.endpoint requiring a bearer key: a fake hosted OpenAI-style API."""

    def __init__(self, key: str, model: str = "sim-pro-1", extra: str = "sim-pro-2,sim-lite-1",
                 args: tuple[str, ...] = ()):
        self.port = free_port()
        self.key = key
        env = {**os.environ, "FAKE_KEY_FOR_SERVER": key}
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "autopilot.demo.endpoint", "--port", str(self.port),
             "--model", model, "--require-key-env", "FAKE_KEY_FOR_SERVER",
             "--extra-models", extra, *args],
            cwd=ROOT, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        wait_for(self._up, 20, "fake provider up")

    def _up(self) -> bool:
        try:
            return httpx.get(f"http://127.0.0.1:{self.port}/health", timeout=1).status_code == 200
        except httpx.HTTPError:
            return False

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}/v1"

    def overlay(self, path: Path, **extra: object) -> Path:
        import json

        path.write_text(json.dumps({"endpoint": {"base_url": self.base_url}, **extra}))
        return path

    def close(self) -> None:
        self.proc.kill()
        self.proc.wait()
