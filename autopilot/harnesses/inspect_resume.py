"""A cell's next attempt reuses the samples an earlier one finished, as Inspect's own
``inspect eval-retry`` does: the earlier attempt's log (moved by the autopilot to
``<state dir>/attempts/<cell>/attempt-<k>/``) is put back where it was written, with
Inspect's sample buffer beside it, and ``eval-retry`` first recovers what a killed
process finished but never flushed (``inspect_ai.log._recover``: the buffer's
completed samples), then runs only the samples without a final score (unrun, cut off,
errored). What each sample's score came from is kept in ``inspect-reuse.json``: which
attempt scored it, so the grade and the ledger say how much was reused.

An earlier attempt is reused only when it ran the same eval (its ``inspect-cmd.json``
is this attempt's command exactly: the task, its args, the model, the generation
settings) and is one of this run's own attempts (``attempt-0`` holds outputs that were
there before the run: never reused). A log that finished (``success``) is never
reused: the attempt failed for a reason after Inspect was done, so it is run afresh.
"""

from __future__ import annotations

import json
import re
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Any

CMD_FILE = "inspect-cmd.json"
REUSE_FILE = "inspect-reuse.json"
# attempt-<k> or attempt-<k>.<m> (a second move of the same number: context.move_aside)
ATTEMPT_DIR = re.compile(r"^attempt-(\d{1,6})(?:\.(\d{1,6}))?$")
# flags that eval-retry takes anew; everything else (the task's args, sample ids,
# --limit, epochs, generation settings) is replayed from the log by eval-retry itself
RETRY_FLAGS = frozenset({"--max-connections", "--max-retries", "--timeout",
                         "--max-samples", "--max-sandboxes", "--max-subprocesses",
                         "--retry-on-error", "--log-buffer", "--attempt-timeout"})
RETRY_SWITCHES = frozenset({"--no-fail-on-error", "--continue-on-fail"})  # no value


@dataclass(frozen=True)
class Prior:
    attempt: int       # the attempt number whose log is reused
    dir: Path          # attempts/<cell>/attempt-<k>[.<m>]
    log: Path          # its .eval log
    inherited: dict[str, int]  # sample key -> attempt that scored it, before that one


def newest_log(logs: Path) -> Path | None:
    found = sorted((path for path in logs.glob("*.eval") if path.is_file()),
                   key=lambda p: p.stat().st_mtime)
    return found[-1] if found else None


def sample_key(sample_id: Any, epoch: Any) -> str:
    return f"{sample_id}#{epoch}"


def write_cmd(out: Path, cmd: list[str]) -> None:
    (out / CMD_FILE).write_text(json.dumps({"argv": cmd}))


def read_json(path: Path, limit: int = 4 << 20) -> Any:
    """A JSON file an earlier attempt (the harness: untrusted) wrote; None if it is
    not a small plain file of JSON."""
    try:
        if path.is_symlink() or not path.is_file() or path.stat().st_size > limit:
            return None
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return None


def read_scored_by(d: Path) -> dict[str, int]:
    """``d``'s inspect-reuse.json, shape-checked ({} when absent or odd)."""
    got = read_json(d / REUSE_FILE)
    raw = got.get("scored_by") if isinstance(got, dict) else None
    if not isinstance(raw, dict):
        return {}
    return {str(k): v for k, v in raw.items() if type(v) is int and v >= 1}


def prior_attempt(previous: Path | None, attempt: int, cmd: list[str]) -> Prior | None:
    """The latest of this cell's earlier attempts (1..attempt-1) that ran ``cmd`` and
    left an unfinished log; None when there is none."""
    if previous is None or attempt < 2 or not previous.is_dir():
        return None
    found: list[tuple[int, int, Path]] = []
    for entry in previous.iterdir():
        match = ATTEMPT_DIR.match(entry.name)
        if match and 1 <= int(match[1]) < attempt and entry.is_dir() and not entry.is_symlink():
            found.append((int(match[1]), int(match[2] or 0), entry))
    for k, _, entry in sorted(found, reverse=True):
        said = read_json(entry / CMD_FILE)
        if not isinstance(said, dict) or said.get("argv") != cmd:
            continue  # another eval (the preset changed), or nothing on record
        log = newest_log(entry / "logs")
        if log is None or log.is_symlink():
            continue
        return Prior(k, entry, log, read_scored_by(entry))
    return None


@dataclass(frozen=True)
class Resumed:
    log: Path                  # the restored, recovered log eval-retry continues
    before: dict[str, str]     # its samples with a final score: key -> uuid
    carried: dict[str, int]    # key -> the attempt that scored it


def resume(prior: Prior, out: Path) -> Resumed | None:
    """Put the earlier attempt's log back at the path it was written to (the output
    dir is the same for every attempt of a cell), with Inspect's sample buffer in this
    attempt's data dir (Inspect finds a crashed log's buffer by the log's path), and
    recover into it what the killed process finished but never flushed. The original
    stays in ``attempts/`` as evidence. None when it finished (``success``: not
    reused) or cannot be read."""
    from inspect_ai.log import read_eval_log, recover_eval_log
    from inspect_ai.log._recover import RecoveryNotAvailable

    try:
        header = read_eval_log(str(prior.log), header_only=True)
    except Exception:  # a torn or foreign file: nothing to reuse
        return None
    if header.status == "success":
        return None
    dest = out / "logs" / prior.log.name
    dest.parent.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(prior.log, dest)
    if header.status == "started":  # killed: its last samples may be in the buffer only
        buffer = prior.dir / ".inspect" / "data" / "inspect_ai" / "samplebuffer"
        if buffer.is_dir() and not buffer.is_symlink():
            copy = out / ".inspect" / "data" / "inspect_ai" / "samplebuffer"
            shutil.copytree(buffer, copy, symlinks=True, dirs_exist_ok=True)
            if unpin(copy):
                print(f"inspect_run: attempt {prior.attempt}'s sample buffer names a pid "
                      "a process still has (its eval not yet reaped, or the pid "
                      "recycled): recovered as the ended attempt's", flush=True)
        try:
            recover_eval_log(str(dest), overwrite=True, cleanup=True)
        except RecoveryNotAvailable as e:  # no buffer: the flushed samples are what there is
            print(f"inspect_run: nothing unflushed of attempt {prior.attempt} recovered: "
                  f"{' '.join(str(e).split())[:300]}", flush=True)
        except Exception as e:  # Inspect could not: run afresh
            print(f"inspect_run: not reusing attempt {prior.attempt}: recovery failed: "
                  f"{' '.join(str(e).split())[:300]}", flush=True)
            dest.unlink(missing_ok=True)
            return None
    before = final_samples(dest)
    carried = {k: prior.inherited.get(k, prior.attempt) for k in before}
    write_reuse(out, carried)  # on disk before the retry: a kill keeps the attribution
    return Resumed(dest, before, carried)


# Inspect names a sample buffer ``<log>.<writer pid>.db`` (with SQLite's ``-wal`` and
# ``-shm`` beside it) and recovers one only when no process has that pid: a crashed
# writer, not a live one. Pids stay below pid_max, at most 2**22 on Linux, so from here
# on no process can have them.
NO_PID = 1 << 22
_BUFFER_DB = re.compile(r"^(.+)\.(\d{1,7})\.db$")  # a pid: below 2**22


def unpin(copy: Path) -> list[Path]:
    """Rename the copied buffers whose writer pid a process still has, to a pid none can
    have; what was renamed. Their writer was an earlier attempt, ended before this one
    began, but its pid can outlive it: a killed eval not yet reaped (a zombie; the
    teardown counts it as gone) or a pid recycled since. Inspect would skip such a
    buffer, and its unflushed samples would be run, and paid for, again."""
    import psutil

    renamed: list[Path] = []
    for index, db in enumerate(sorted(path for path in copy.rglob("*.db")
                                      if path.is_file() and not path.is_symlink())):
        match = _BUFFER_DB.match(db.name)
        if match is None or not psutil.pid_exists(int(match[2])):
            continue
        new = db.with_name(f"{match[1]}.{NO_PID + index}.db")
        for side in ("-wal", "-shm"):  # SQLite finds a database's log by its name
            old_side = db.with_name(db.name + side)
            if old_side.is_file() and not old_side.is_symlink():
                old_side.replace(new.with_name(new.name + side))
        db.replace(new)
        renamed.append(new)
    return renamed


def retry_argv(python: str, log: Path, logs: Path, flags: list[str]) -> list[str]:
    """``inspect eval-retry`` of ``log`` into ``logs``, with those of ``flags`` (the
    attempt's own `inspect eval` flags) that eval-retry takes; the rest is the log's."""
    kept: list[str] = []
    i = 0
    while i < len(flags):
        flag = flags[i]
        name = flag.split("=", 1)[0]
        if name in RETRY_FLAGS:
            if "=" in flag or i + 1 >= len(flags):
                kept.append(flag)
            else:
                kept += [flag, flags[i + 1]]
                i += 1
        elif name in RETRY_SWITCHES:
            kept.append(flag)
        i += 1
    # (the log's format is the retried log's own: eval-retry has no --log-format)
    return [python, "-m", "inspect_ai", "eval-retry", str(log), "--log-dir", str(logs),
            "--display", "plain", *kept]


def final_samples(log_path: Path) -> dict[str, str]:
    """The samples of a log that hold a final score (no error), by key, with their
    uuid (a sample eval-retry carries over keeps it; a re-run gets a new one)."""
    from inspect_ai.log import read_eval_log

    log = read_eval_log(str(log_path))
    return {sample_key(sample.id, sample.epoch): str(sample.uuid) for sample in log.samples or []
            if sample.error is None and sample.scores}


def scored_by(final: Any, resumed: Resumed | None, attempt: int) -> dict[str, int]:
    """Which attempt scored each sample of the final log: a sample that kept the
    earlier log's uuid was carried over (its attempt as recorded), any other is this
    attempt's."""
    out: dict[str, int] = {}
    for sample in final.samples or []:
        key = sample_key(sample.id, sample.epoch)
        if resumed is not None and resumed.before.get(key) == str(sample.uuid):
            out[key] = resumed.carried[key]
        else:
            out[key] = attempt
    return out


def write_reuse(out: Path, mapping: dict[str, int]) -> None:
    tmp = out / f".{REUSE_FILE}.tmp"
    tmp.write_text(json.dumps({"scored_by": mapping}))
    tmp.replace(out / REUSE_FILE)
