"""The demo simulator as an endpoint. It is a fake, named as one: see autopilot.demo."""

from __future__ import annotations

import sys

from autopilot.config import BuiltinEndpoint as BuiltinConfig
from autopilot.endpoints.base import Endpoint


class BuiltinEndpoint(Endpoint):
    engine = "builtin"
    progress_api = "slots"

    def argv(self) -> list[str]:
        cfg = self.preset.endpoint
        assert isinstance(cfg, BuiltinConfig)
        argv = [
            sys.executable, "-m", "autopilot.demo.endpoint",
            "--host", self.host, "--port", str(self.port), "--model", self.served_model,
            "--seed", self.preset.vars.get("seed", "7"),
            "--latency", str(cfg.latency_secs), "--startup-delay", str(cfg.startup_delay_secs),
        ]
        # The crash fault fires in the first generation only, so a restart heals it.
        if cfg.crash_after_requests and (self.generation == 0 or cfg.crash_every_generation):
            argv += ["--crash-after", str(cfg.crash_after_requests)]
        if cfg.never_ready:
            argv.append("--never-ready")
        return argv

