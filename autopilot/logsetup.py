"""structlog set-up: JSON lines to ``<state-dir>/autopilot.log``, readable console on stderr.

Events are snake_case names with context as key/values; per-cell context is bound once
with ``bind_contextvars``. A redaction processor replaces the values of the secret env
vars the preset names (and any bearer token) wherever they would appear, so a key can
never reach the log even when it sneaks into an argv or an error message.
"""

from __future__ import annotations

import base64
import json
import re
import sys
from collections.abc import Iterable, MutableMapping
from pathlib import Path
from typing import IO, Any

from autopilot.lazyimport import import_hiding

# structlog probes for rich at import time (~50 ms, about a fifth of the supervisor's
# start): tracebacks here go to a JSON file and to journald, where plain text is the
# better format (autopilot.lazyimport).
structlog: Any = import_hiding("structlog", ("rich",))
get_logger = structlog.get_logger
bind_contextvars = structlog.contextvars.bind_contextvars
unbind_contextvars = structlog.contextvars.unbind_contextvars

REDACTED = "***"
_BEARER = re.compile(r"(Bearer\s+)[A-Za-z0-9._~+/=-]+", re.IGNORECASE)
# An attempt's gateway key (autopilot.gateway.proxy.attempt_key), by its shape: one is
# made per attempt, so no list of secrets could name them all.
_ATTEMPT_KEY = re.compile(r"sk-autopilot-[0-9a-f]{32}")


def encoded_forms(secret: str) -> set[str]:
    """The ways a secret shows up in text it was pasted into: as it is, URL-encoded (a
    query string, a form body) and base64 (standard and URL-safe, at any alignment
    inside a longer encoded string: a basic-auth header, a JSON blob in a data URL)."""
    from urllib.parse import quote, quote_plus

    raw = secret.encode()
    forms = {secret, quote(secret, safe=""), quote_plus(secret)}
    for i in range(3):
        enc = base64.b64encode(b"\0" * i + raw).decode()
        # The characters that depend on the secret's bytes alone: not the ones the
        # prefix reaches into, not the last partial group.
        core = enc[-(-i * 8 // 6): (i + len(raw)) * 8 // 6]
        if len(core) >= 4:
            forms |= {core, core.translate(_URLSAFE)}
    return {f for f in forms if len(f) >= 4}


_URLSAFE = str.maketrans("+/", "-_")


class Redactor:
    def __init__(self, secrets: Iterable[str] = ()) -> None:
        plain = {secret for secret in secrets if secret and len(secret) >= 4}
        # Longest first: a form that contains another is replaced whole.
        self.secrets = sorted({f for secret in plain for f in encoded_forms(secret)}, key=len,
                              reverse=True)

    def scrub(self, value: Any) -> Any:
        if isinstance(value, str):
            for secret in self.secrets:
                value = value.replace(secret, REDACTED)
            return _ATTEMPT_KEY.sub(REDACTED, _BEARER.sub(r"\1" + REDACTED, value))
        if isinstance(value, dict):
            return {k: (REDACTED if str(k).lower() == "authorization" else self.scrub(v))
                    for k, v in value.items()}
        if isinstance(value, list | tuple):
            return [self.scrub(v) for v in value]
        return value

    def __call__(self, _: Any, __: str, event_dict: MutableMapping[str, Any]) -> Any:
        from autopilot.escape import bounded

        # Bounded first (a 5 MB value from outside costs the log 4 KB), then redacted.
        return {k: self.scrub(bounded(v)) for k, v in event_dict.items()}

    def scrub_file(self, path: Path, cap: int | None = None) -> bool:
        """Redact a spooled log in place (a harness that prints its key puts it there),
        and keep at most ``cap`` bytes of it (its head and its tail, with a line saying
        how much was cut between them); True if anything changed. A child writes its log
        directly (so it survives our restart), hence after the fact: until then the file
        is 0600 in a 0700 dir, readable only by who holds the secret anyway.

        Streamed in bounded chunks, never a whole line at once: a harness that writes
        2 GiB without a newline costs a few MB here, not the supervisor's memory (and
        the endpoint's, if the OOM killer chooses). Each chunk carries the end of the
        one before it, as long as the longest secret form, so a secret split across two
        chunks is found. Bytes are kept as they were otherwise (invalid UTF-8 included);
        the result replaces the file atomically, 0600."""
        import os
        import tempfile

        try:
            size = os.stat(path, follow_symlinks=False).st_size
        except FileNotFoundError:
            return False
        cut = cap is not None and size > cap
        # (with no secret listed, still read: an attempt key is found by its shape)
        head = tail_from = size
        if cut:
            assert cap is not None
            head, tail_from = cap // 2, size - cap // 2
        keep = max((len(secret) for secret in self.secrets), default=1) - 1
        keep = max(keep, _KEY_LEN - 1)
        changed = cut
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
        try:
            src = os.fdopen(os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC), "rb")
            with src, os.fdopen(fd, "wb") as out:
                for start, stop in ((0, head), (tail_from, size)) if cut else ((0, size),):
                    if cut and start:
                        out.write(f"\n--- [autopilot: {tail_from - head} bytes of this "
                                  "output cut here, head and tail kept] ---\n".encode())
                    src.seek(start)
                    changed |= self._scrub_stream(src, out, stop - start, keep)
            if changed:
                os.replace(tmp, path)
                return True
            os.unlink(tmp)
            return False
        except BaseException:
            if os.path.exists(tmp):
                os.unlink(tmp)
            raise

    def _scrub_stream(self, src: IO[bytes], out: IO[bytes], length: int, keep: int) -> bool:
        changed, carry, left = False, "", length
        while left > 0:
            chunk = src.read(min(SCRUB_CHUNK, left))
            if not chunk:
                break
            left -= len(chunk)
            buf = carry + chunk.decode("utf-8", "surrogateescape")
            clean = self.scrub(buf)
            changed |= clean != buf
            # The last `keep` characters wait for the next chunk: a secret may go on there.
            flush, carry = (clean[:-keep], clean[-keep:]) if keep and left else (clean, "")
            out.write(flush.encode("utf-8", "surrogateescape"))
        out.write(carry.encode("utf-8", "surrogateescape"))
        return changed


_KEY_LEN = len("sk-autopilot-") + 32
SCRUB_CHUNK = 1 << 20  # characters redacted at once (a spooled log is streamed)
SPOOL_CAP = 16 << 20  # bytes of one spooled log kept: its first and last 8 MiB


class _Tee:
    """Final processor: write the JSON line to the file, hand the dict to the console."""

    def __init__(self, file: IO[Any] | None) -> None:
        self.file = file

    def __call__(self, _: Any, __: str, event_dict: MutableMapping[str, Any]) -> Any:
        if self.file is not None:
            try:
                self.file.write(json.dumps(dict(event_dict), default=str) + "\n")
                self.file.flush()
            except (OSError, ValueError):
                # A full disk must not turn every log call into a crash: the journal's
                # own writes detect it and end the run cleanly.
                pass
        return event_dict


_current_file: IO[Any] | None = None


def configure(log_file: IO[Any] | None, secrets: Iterable[str] = (), console: bool = True,
              level: str = "info", console_floor: str | None = None) -> Redactor:
    """Route structured events to the console and to ``log_file``, a text file the
    caller opened (the run opens ``autopilot.log`` through ``state.statedir``: 0600,
    never through a symlink); it is this module's to close from then on."""
    global _current_file
    if _current_file is not None and _current_file is not log_file:
        _current_file.close()
    _current_file = log_file
    redactor = Redactor(secrets)
    processors: list[Any] = [
        structlog.contextvars.merge_contextvars,
        structlog.processors.add_log_level,
        structlog.processors.TimeStamper(fmt="iso", utc=True),
        structlog.processors.format_exc_info,
        redactor,
        _Tee(_current_file),
    ]
    # --quiet still shows errors (endpoint_failed, harness_anomaly, publish_failed): a
    # failure nobody sees is the one that costs a night.
    floor = _LEVELS[console_floor] if console_floor else 0 if console else _LEVELS["error"]
    processors += [_ConsoleFloor(floor), _terminal_safe,
                   structlog.dev.ConsoleRenderer(colors=False)]
    structlog.configure(
        processors=processors,
        wrapper_class=structlog.make_filtering_bound_logger(_LEVELS[level]),
        logger_factory=structlog.PrintLoggerFactory(_CurrentStderr()),
        cache_logger_on_first_use=False,
    )
    return redactor


def _terminal_safe(_: Any, __: str, event_dict: MutableMapping[str, Any]) -> Any:
    """Values from a harness, grader or endpoint (a verdict word, a log tail) reach the
    console: no escape sequence of theirs may. The JSON file escapes them already."""
    from autopilot.escape import clean

    return {k: clean(v, 2000) if isinstance(v, str) else v for k, v in event_dict.items()}


class _CurrentStderr:
    """Whatever ``sys.stderr`` is at the time of writing: the progress panel replaces it
    with a proxy that prints above the panel (a captured reference would garble it)."""

    def write(self, text: str) -> int:
        return sys.stderr.write(text)

    def flush(self) -> None:
        sys.stderr.flush()


class _ConsoleFloor:
    """After the file write: drop from the console what is below ``floor``."""

    def __init__(self, floor: int) -> None:
        self.floor = floor

    def __call__(self, _: Any, method: str, event_dict: MutableMapping[str, Any]) -> Any:
        if _LEVELS.get(str(event_dict.get("level", method)), 20) < self.floor:
            raise structlog.DropEvent
        return event_dict


_LEVELS = {"debug": 10, "info": 20, "warning": 30, "error": 40}
