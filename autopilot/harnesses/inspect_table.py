"""The scores of an Inspect log as the wrapper already read them, so the grader need
not import Inspect (a second second of CPU per cell) to read them again.

``inspect_run`` reads the finished log with Inspect's own API for its summary; from the
same object it writes ``inspect-scores.json``: the log's status and error, each sample's
id, epoch, error and scores, and the reductions, each score value with Inspect's own
reading of it (``value_to_float``, and whether Inspect could convert it at all). The
grader uses the table only when it describes the newest log exactly (its name, size and
mtime); otherwise, or when it is missing or of another shape, it reads the log with
Inspect as before. The table is the harness's output like the log it was read from: it
is read with the same care (no links, size-capped).
"""

from __future__ import annotations

import json
import logging
import math
from dataclasses import dataclass
from pathlib import Path
from types import SimpleNamespace
from typing import Any

from autopilot.harnesses.inspect_resume import read_json

TABLE = "inspect-scores.json"
CAP = 64 << 20


@dataclass(frozen=True)
class Reading:
    """A score value as Inspect reads it."""
    raw: str  # the value as written (cut)
    number: float  # value_to_float's answer (0 where it could not convert)
    unreadable: bool  # Inspect could not convert it (it warns and counts 0)


class _Unconverted(logging.Handler):
    """Catches Inspect's own word that a value is not a score (``value_to_float`` logs
    "Unable to convert value to float" and returns 0: its metrics count a 0)."""

    def __init__(self) -> None:
        super().__init__(logging.WARNING)
        self.said = False

    def emit(self, record: logging.LogRecord) -> None:
        self.said = self.said or record.getMessage().startswith(
            "Unable to convert value to float")


def read_value(value: Any) -> Reading:
    """Inspect's own reading of one score value."""
    from inspect_ai.scorer import value_to_float

    caught = _Unconverted()
    inspect_log = logging.getLogger(value_to_float.__module__)
    inspect_log.addHandler(caught)
    try:
        number = value_to_float()(value)
    finally:
        inspect_log.removeHandler(caught)
    return Reading(str(value)[:100], float(number), caught.said)


def _enc(value: Any) -> dict[str, Any]:
    if isinstance(value, dict):
        return {"parts": {str(k): _enc(v) for k, v in value.items()}}
    read = read_value(value)
    number = read.number
    return {"raw": read.raw, "n": number if math.isfinite(number) else repr(number),
            "u": read.unreadable}


def _dec(obj: Any) -> Any:
    if "parts" in obj:
        return {k: _dec(v) for k, v in obj["parts"].items()}
    stored = obj["n"]
    number = (float(stored) if isinstance(stored, str) and stored in ("inf", "-inf", "nan")
              else stored)
    if type(number) not in (int, float) or not isinstance(obj["raw"], str):
        raise TypeError("not a reading")
    return Reading(obj["raw"], float(number), obj["u"] is True)


def _stamp(log_path: Path) -> dict[str, Any]:
    info = log_path.stat()
    return {"log": log_path.name, "size": info.st_size, "mtime_ns": info.st_mtime_ns}


def write_table(out: Path, log_path: Path, log: Any) -> None:
    """The table of ``log`` (read from ``log_path``) in ``out``, replaced whole."""
    doc = {**_stamp(log_path), "status": log.status,
           "error": log.error.message if log.error else None,
           "samples": [{"id": sample.id, "epoch": sample.epoch,
                        "error": sample.error.message if sample.error else None,
                        "scores": {k: _enc(v.value) for k, v in (sample.scores or {}).items()}}
                       for sample in log.samples or []],
           "reductions": [{"scorer": reduction.scorer, "reducer": reduction.reducer,
                           "samples": [{"sample_id": scored.sample_id, "value": _enc(scored.value)}
                                       for scored in reduction.samples]}
                          for reduction in log.reductions or []]}
    tmp = out / f".{TABLE}.tmp"
    tmp.write_text(json.dumps(doc, allow_nan=False))
    tmp.replace(out / TABLE)


def _err(message: Any) -> SimpleNamespace | None:
    return SimpleNamespace(message=str(message)) if message is not None else None


def read_table(out: Path, log_path: Path) -> Any | None:
    """A log-like object (the attributes the grader reads) from the table, when it is
    the newest log's; else None (read the log itself)."""
    doc = read_json(out / TABLE, CAP)
    if not isinstance(doc, dict):
        return None
    try:
        if {k: doc[k] for k in ("log", "size", "mtime_ns")} != _stamp(log_path):
            return None
        return SimpleNamespace(
            status=str(doc["status"]), error=_err(doc["error"]),
            samples=[SimpleNamespace(id=sample["id"], epoch=int(sample["epoch"]),
                                     error=_err(sample["error"]),
                                     scores={str(k): SimpleNamespace(value=_dec(v))
                                             for k, v in sample["scores"].items()})
                     for sample in doc["samples"]],
            reductions=[SimpleNamespace(scorer=str(reduction["scorer"]),
                                        reducer=reduction["reducer"],
                                        samples=[SimpleNamespace(sample_id=scored["sample_id"],
                                                                 value=_dec(scored["value"]))
                                                 for scored in reduction["samples"]])
                        for reduction in doc["reductions"]])
    except (KeyError, TypeError, ValueError, AttributeError, OSError):
        return None
