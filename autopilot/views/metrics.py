"""Prometheus metrics of a run, for ``dashboard --serve`` (``/metrics``) and the
supervisor's node_exporter textfile (``--metrics-textfile``): one builder, so both say
the same thing.

Names follow Prometheus conventions: the ``autopilot_`` prefix, base units (seconds),
``_total`` for counters. Every series carries the run's ``preset`` label so several runs
can share one node_exporter. Input is a Ledger (replayed from the journal, or the live
supervisor's), the status snapshot and the heartbeat's liveness: the counts match the
journal's by construction.
"""

from __future__ import annotations

import contextlib
import math
import os
import secrets
import stat
from collections import Counter
from pathlib import Path
from typing import Any

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.registry import Collector

from autopilot.escape import finite
from autopilot.state.ledger import Ledger
from autopilot.state.liveness import Liveness
from autopilot.state.statusdoc import read as read_status

# What a cell's ledger status is called in the metric (one state label per cell).
STATES = {"PASS": "pass", "FAIL": "fail", "invalid": "invalid", "quarantined": "quarantined",
          "ungraded": "ungraded", "running": "running", "grading": "running", "ran": "running",
          "pending": "pending"}


class RunCollector(Collector):
    def __init__(self, ledger: Ledger, status: dict[str, Any], live: Liveness) -> None:
        self.ledger, self.status, self.live = ledger, status, live

    def collect(self) -> Any:
        doc = read_status(self.status)  # every field its type or its default
        preset = doc.preset
        cells = GaugeMetricFamily("autopilot_cells", "Cells of the plan by arm and state",
                                  labels=["preset", "arm", "state"])
        by: Counter[tuple[str, str]] = Counter()
        invalid: Counter[tuple[str, str]] = Counter()
        arms = sorted({cell.arm for cell in self.ledger.cells.values()})
        for cell in self.ledger.cells.values():
            state = STATES.get(cell.status, "pending")
            by[(cell.arm, state)] += 1
            if state == "invalid":
                invalid[(cell.arm, cell.reason or "unknown")] += 1
        for arm in arms:
            for state in sorted(set(STATES.values())):
                cells.add_metric([preset, arm, state], by[(arm, state)])
        yield cells
        inv = GaugeMetricFamily("autopilot_invalid_cells",
                                "Cells whose latest verdict is INVALID, by arm and reason",
                                labels=["preset", "arm", "reason"])
        for (arm, reason), count in sorted(invalid.items()):
            inv.add_metric([preset, arm, reason], count)
        yield inv
        kills = CounterMetricFamily("autopilot_cell_kills", "Watchdog kills of cells by kind",
                                    labels=["preset", "kind"])
        for kind in sorted({"stall", "deadline", "teardown", *self.ledger.kills}):
            kills.add_metric([preset, kind], self.ledger.kills[kind])
        yield kills
        eps = doc.endpoints or [doc.endpoint]  # one endpoint: status.json's "endpoint"
        endpoint_up = GaugeMetricFamily("autopilot_endpoint_up",
                                        "1 when the model endpoint answers",
                                        labels=["preset", "replica"])
        restarts = CounterMetricFamily("autopilot_endpoint_restarts", "Endpoint restarts",
                                       labels=["preset", "replica"])
        down = CounterMetricFamily("autopilot_endpoint_down_seconds",
                                   "Seconds the endpoint was down", labels=["preset", "replica"])
        for i, endpoint in enumerate(eps):
            replica = str(endpoint.get("replica", i))
            endpoint_up.add_metric([preset, replica], 1 if endpoint.get("state") == "up" else 0)
            restarts.add_metric([preset, replica], _num(endpoint.get("restarts")))
            down.add_metric([preset, replica], _num(endpoint.get("down_secs")))
        yield from (endpoint_up, restarts, down)
        yield _counter("autopilot_notify_failures", "Notifications that failed to send",
                       [preset], self.ledger.notify_failures)
        yield _counter("autopilot_request_failovers",
                       "Model requests the gateway sent to another replica than the cell's",
                       [preset], self.ledger.failovers)
        age = self.live.age_secs
        yield _gauge("autopilot_heartbeat_age_seconds",
                     "Seconds since the supervisor's last heartbeat", [preset],
                     math.nan if age is None else max(0.0, age))
        yield _gauge("autopilot_stale",
                     "1 when the run is not finished and its supervisor is frozen or gone",
                     [preset], 1 if self.live.state in ("stale", "gone", "unknown") else 0)
        eta = doc.eta_secs
        yield _gauge("autopilot_eta_seconds", "Estimated seconds to the end of the run",
                     [preset], _num(eta) if eta is not None else math.nan)
        info = GaugeMetricFamily("autopilot_run_info", "The run (value 1): phase and model",
                                 labels=["preset", "model", "phase", "target_n"])
        info.add_metric([preset, doc.model, doc.phase, str(doc.target_n or "")], 1)
        yield info


def _num(v: Any) -> float:
    return finite(v)


def _gauge(name: str, doc: str, values: list[str], value: float) -> GaugeMetricFamily:
    gauge = GaugeMetricFamily(name, doc, labels=["preset"])
    gauge.add_metric(values, value)
    return gauge


def _counter(name: str, doc: str, values: list[str], value: float) -> CounterMetricFamily:
    counter = CounterMetricFamily(name, doc, labels=["preset"])
    counter.add_metric(values, value)
    return counter


def registry(ledger: Ledger, status: dict[str, Any], live: Liveness) -> CollectorRegistry:
    reg = CollectorRegistry(auto_describe=False)
    reg.register(RunCollector(ledger, status, live))
    return reg


def exposition(ledger: Ledger, status: dict[str, Any], live: Liveness) -> bytes:
    """The text exposition format (``/metrics``)."""
    return generate_latest(registry(ledger, status, live))


def textfile_dir_problem(directory: Path) -> str | None:
    """Why a textfile directory is unsafe to write into (as root, say), or None. A
    directory others may write into, without the sticky bit, lets them swap our temp file
    or the target for a symlink between our checks and our writes."""
    try:
        info = os.stat(directory)
    except OSError as e:
        return f"directory {directory}: {e.strerror}"
    if not stat.S_ISDIR(info.st_mode):
        return f"{directory} is not a directory"
    if info.st_mode & (stat.S_IWOTH | stat.S_IWGRP) and not info.st_mode & stat.S_ISVTX:
        return (f"directory {directory} is writable by others without the sticky bit "
                "(chmod o-w,g-w or +t)")
    return None


def write_textfile(path: Path, ledger: Ledger, status: dict[str, Any], live: Liveness) -> None:
    """For node_exporter's textfile collector: a scrape never reads half a file. Our own
    atomic write (prometheus_client's opens ``PATH.<pid>.<thread>`` with a plain
    ``open``, which follows a symlink planted there): a fresh temp name created with
    ``O_CREAT | O_EXCL | O_NOFOLLOW`` in the same directory, fsync'd, renamed over the
    target (a rename replaces a planted symlink, never writes through it)."""
    why = textfile_dir_problem(path.parent)
    if why:
        raise PermissionError(0, why, str(path))
    data = generate_latest(registry(ledger, status, live))
    tmp = path.with_name(f".{path.name}.{secrets.token_hex(8)}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC,
                 0o644)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise


def write_run_textfile(path: Path, ledger: Ledger, status: dict[str, Any]) -> None:
    """The live run's textfile (``--metrics-textfile``), from its status snapshot; a
    failure is logged, never raised: monitoring must never end the run."""
    from autopilot.logsetup import get_logger
    from autopilot.state.liveness import FINAL_PHASES

    phase = status.get("phase")
    live = Liveness("finished" if isinstance(phase, str) and phase in FINAL_PHASES
                    else "live", 0.0, "")
    try:
        write_textfile(path, ledger, status, live)
    except OSError as e:
        get_logger(__name__).warning("metrics_textfile_failed", path=str(path), error=str(e))
