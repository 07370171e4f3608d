"""What the watchdog sees of a running ``inspect eval``: a line appended to the cell's
progress log (the preset's ``transcript``) whenever Inspect shows work the gateway does
not, so that only a frozen eval looks frozen.

Two signs, both Inspect's own:
- its **live sample buffer** changed (``inspect_ai/log/_recorders/buffer``: the
  database ``inspect view`` reads while an eval runs; its etag moves with every event a
  sample logs: a model call to a grader served elsewhere, a scorer's step, a sample
  starting or ending);
- a **command Inspect runs is alive**: a process under ``inspect eval`` (a local
  sandbox's ``exec``, a ``docker exec`` into a sandbox, a tool's subprocess). Inspect
  logs an exec only when it ends, so for a 75 s command the buffer is silent; the child
  is the evidence, and Inspect's own timeout (or the cell's deadline) bounds it.
A solver that awaits nothing forever has neither, and is killed as a stall.

The buffer is read through the module ``inspect view`` uses (private to Inspect, pinned
with the ``[inspect]`` extra): if an Inspect without it is installed, only the process
sign is used, and the first line of the log says so.
"""

from __future__ import annotations

import os
import threading
import time
from pathlib import Path
from typing import Any

import psutil


def buffer_etag(logs: Path) -> str | None:
    """The combined etag of the running evals' sample buffers under ``logs`` (None:
    none running, or no buffer to read)."""
    from inspect_ai.log._recorders.buffer.buffer import running_tasks, sample_buffer

    tags = []
    for name in running_tasks(str(logs)) or []:
        got: Any = sample_buffer(os.path.join(str(logs), name)).get_samples()
        if got is not None and got != "NotModified":
            tags.append(f"{name}:{got.etag}")
    return ";".join(tags) or None


def busy_child(pid: int) -> str | None:
    """A command running under ``pid`` (its name and pid), or None."""
    try:
        kids = psutil.Process(pid).children(recursive=True)
    except psutil.Error:
        return None
    for kid in kids:
        try:
            if kid.status() != psutil.STATUS_ZOMBIE:
                return f"{kid.name()}[{kid.pid}]"
        except psutil.Error:
            continue
    return None


def report(logs: Path, progress: Path, pid: int, stop: threading.Event,
           every: float = 1.0) -> None:
    """Until ``stop``: a line in ``progress`` for each poll that saw work."""
    readable = True
    try:
        buffer_etag(logs)
    except ImportError:
        readable = False
    last: str | None = None
    with progress.open("a", buffering=1) as out:
        if not readable:
            out.write("inspect_progress: this Inspect has no sample buffer to read; "
                      "only running commands count\n")
        while not stop.wait(every):
            seen = []
            if readable:
                try:
                    tag = buffer_etag(logs)
                except Exception:  # a buffer being written or removed: next poll
                    tag = None
                if tag is not None and tag != last:
                    seen.append(f"events {tag}")
                    last = tag
            child = busy_child(pid)
            if child is not None:
                seen.append(f"running {child}")
            if seen:
                out.write(f"{time.time():.1f} {'; '.join(seen)}\n")
