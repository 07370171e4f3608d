"""What the watchdog sees of a running ``inspect eval``: a line appended to the cell's
progress log (the preset's ``transcript``) whenever Inspect shows work the gateway does
not, so that only a frozen eval looks frozen; and, for a cell of many samples, how far
the eval got (``items.json``: the preset's ``harness.items``).

Four signs, all Inspect's own or its process's:
- its **live sample buffer** changed (``inspect_ai/log/_recorders/buffer``: the
  database ``inspect view`` reads while an eval runs; its etag moves with every event a
  sample logs: a model call to a grader served elsewhere, a scorer's step, a sample
  starting or ending);
- a **scorer is at work**: a running sample's buffer has a scorer's span open (Inspect
  opens one per scorer, and logs nothing more until it returns): a scorer awaiting an
  external judge, or a model-graded scorer's grader, for minutes;
- a **command Inspect runs is alive**: a process under ``inspect eval`` (a local
  sandbox's ``exec``, a ``docker exec`` into a sandbox, a tool's subprocess). Inspect
  logs an exec only when it ends, so for a 75 s command the buffer is silent; the child
  is the evidence, and Inspect's own timeout (or the cell's deadline) bounds it;
- the eval **computes**: its processes used at least ``BUSY_SHARE`` of a core since
  the last poll (a scorer or solver working in process).
A solver that awaits nothing forever has none of them, and is killed as a stall; a
scorer that awaits forever is ended by the cell's deadline.

The buffer is read through the module ``inspect view`` uses (private to Inspect, pinned
with the ``[inspect]`` extra): if an Inspect without it is installed, only the process
signs are used, and the first line of the log says so.
"""

from __future__ import annotations

import contextlib
import json
import os
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import psutil

from autopilot.proctree import descendants

BUSY_SHARE = 0.3  # of one core, between two polls: an idle Inspect uses a few percent


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
        kids = descendants(psutil.Process(pid))
    except psutil.Error:
        return None
    for kid in kids:
        try:
            if kid.status() != psutil.STATUS_ZOMBIE:
                return f"{kid.name()}[{kid.pid}]"
        except psutil.Error:
            continue
    return None


def cpu_seconds(pid: int) -> float:
    """CPU time used so far by ``pid`` and its live descendants."""
    total = 0.0
    try:
        root = psutil.Process(pid)
        procs = [root, *descendants(root)]
    except psutil.Error:
        return total
    for proc in procs:
        try:
            times = proc.cpu_times()
            total += times.user + times.system
        except psutil.Error:
            continue
    return total


@dataclass
class EvalWatch:
    """What the reader remembers of the eval between polls."""
    logs: Path
    reused: frozenset[str] = frozenset()  # samples an earlier attempt finished
    totals: dict[str, int] = field(default_factory=dict)  # log -> its samples x epochs
    spans: dict[str, dict[str, str]] = field(default_factory=dict)  # sample -> open spans
    seen_event: dict[str, int] = field(default_factory=dict)  # sample -> last event id

    def _total(self, log: Path) -> int | None:
        if log.name not in self.totals:
            from inspect_ai.log import read_eval_log

            try:
                head = read_eval_log(str(log), header_only=True)
            except Exception:  # not yet readable: the next poll
                return None
            ids = head.eval.dataset.sample_ids
            count = len(ids) if ids is not None else head.eval.dataset.samples
            if count is None:
                return None
            self.totals[log.name] = count * (head.eval.config.epochs or 1)
        return self.totals[log.name]

    def progress(self) -> tuple[int, int] | None:
        """(total, done) of the newest eval under ``logs``: its samples x epochs, and
        those finished with a score, flushed to its log or completed in its buffer."""
        from inspect_ai.log._recorders.buffer.buffer import sample_buffer

        logs = sorted(self.logs.glob("*.eval"), key=lambda p: p.stat().st_mtime)
        if not logs:
            return None
        log = logs[-1]
        total = self._total(log)
        if total is None:
            return None
        from inspect_ai.log import read_eval_log_sample_summaries

        done = set(self.reused)
        # flushed to the log (a sample a killed eval left carries its error); a log
        # being written is read at the next poll, the buffer holding what is not flushed
        with contextlib.suppress(Exception):
            done |= {f"{x.id}#{x.epoch}" for x in read_eval_log_sample_summaries(str(log))
                     if x.error is None and x.scores}
        got: Any = sample_buffer(str(log)).get_samples()
        if got is not None and got != "NotModified":
            done |= {f"{x.id}#{x.epoch}" for x in got.samples
                     if x.completed_at and x.error is None}
        return total, min(len(done), total)

    def scoring(self) -> str | None:
        """A running sample with a scorer's span open (its id), or None."""
        from inspect_ai.log._recorders.buffer.buffer import running_tasks, sample_buffer

        for name in running_tasks(str(self.logs)) or []:
            buf = sample_buffer(os.path.join(str(self.logs), name))
            got: Any = buf.get_samples()
            if got is None or got == "NotModified":
                continue
            for sample in got.samples:
                if sample.completed_at:
                    continue
                key = f"{sample.id}#{sample.epoch}"
                data = buf.get_sample_data(sample.id, sample.epoch,
                                           after_event_id=self.seen_event.get(key))
                open_spans = self.spans.setdefault(key, {})
                for e in data.events if data is not None else []:
                    self.seen_event[key] = max(self.seen_event.get(key, 0), e.id)
                    event = e.event if isinstance(e.event, dict) else {}
                    if event.get("event") == "span_begin":
                        open_spans[str(event.get("id"))] = str(event.get("type"))
                    elif event.get("event") == "span_end":
                        open_spans.pop(str(event.get("id")), None)
                if "scorer" in open_spans.values():
                    return str(sample.id)
        return None


def final_items(logs: Path, items: Path, reused: frozenset[str]) -> None:
    """Where an eval that did not finish ended: what the supervisor counts of it (a
    finished eval's count is its grade's)."""
    with contextlib.suppress(Exception):  # nothing readable: the last periodic word stands
        got = EvalWatch(logs, reused).progress()
        if got is not None:
            write_items(items, *got, len(reused))


def write_items(path: Path, total: int, done: int, reused: int) -> None:
    """The cell's progress for the supervisor (harness.items), replaced whole."""
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps({"total": total, "done": done, "reused": reused}))
    tmp.replace(path)


def report(logs: Path, progress: Path, pid: int, stop: threading.Event,
           every: float = 1.0, items: Path | None = None,
           reused: frozenset[str] = frozenset()) -> None:
    """Until ``stop``: a line in ``progress`` for each poll that saw work, and, with
    ``items``, the eval's progress there whenever it moves."""
    readable = True
    try:
        buffer_etag(logs)
    except ImportError:
        readable = False
    watch = EvalWatch(logs, reused)
    last: str | None = None
    said: tuple[int, int] | None = None
    cpu = cpu_seconds(pid)
    with progress.open("a", buffering=1) as out:
        if not readable:
            out.write("inspect_progress: this Inspect has no sample buffer to read; "
                      "only running commands and CPU time count\n")
        while not stop.wait(every):
            seen = []
            if readable:
                try:
                    tag = buffer_etag(logs)
                    scorer = watch.scoring() if tag == last else None
                    now = watch.progress() if items is not None and tag != last else None
                except Exception:  # a buffer or log being written or removed: next poll
                    tag = scorer = now = None
                if tag is not None and tag != last:
                    seen.append(f"events {tag}")
                    last = tag
                if scorer is not None:
                    seen.append(f"scoring sample {scorer}")
                if items is not None and now is not None and now != said:
                    write_items(items, *now, len(reused))
                    said = now
            child = busy_child(pid)
            if child is not None:
                seen.append(f"running {child}")
            now_cpu = cpu_seconds(pid)
            used, cpu = now_cpu - cpu, now_cpu
            if used >= BUSY_SHARE * every:
                seen.append(f"computing {used:.1f}s cpu")
            if seen:
                out.write(f"{time.time():.1f} {'; '.join(seen)}\n")
