"""What the cli hands a run besides its preset and plan."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any


@dataclass(frozen=True)
class RunOptions:
    state_dir: Path
    allow_plan_change: bool = False
    notify_config: str | None = None
    console_log: bool = True
    preset_path: str | None = None
    config_path: str | list[str] | None = None  # the --config files (several: a list)
    identity: dict[str, Any] | None = None  # preflight's per-launch identity record
    warnings: tuple[str, ...] = ()
    publish: bool = False
    results_repo: str | None = None
    resume_command: str = ""  # said on a stop signal: how to carry on
    live_view: bool = False  # a terminal: the progress panel (autopilot.run.liveview)
    metrics_textfile: Path | None = None  # node_exporter textfile, see autopilot.views.metrics
