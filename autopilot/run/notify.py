"""Milestone push notifications through apprise; never raises, never slows the run.

A milestone is queued (non-blocking) and sent by a task of the supervisor's task group
in a worker thread with a timeout: apprise's senders block, and a hanging phone-push
service must not stall cell scheduling. A failure is logged (URL privacy-masked) and
handed to ``on_failure`` for the journal. The same milestone for the same subject is not
re-sent within ``cooldown_secs``.

Priorities reach the phone two ways: services that carry a priority in their URL
(Pushover ``priority=``, ntfy ``priority=``) get it set per message unless the URL pins
one, and services loaded from an apprise config file can be routed by tag — a service
tagged with a priority (``normal``/``high``/``emergency``) or a milestone kind gets only
those; an untagged one gets everything.
"""

from __future__ import annotations

import re
import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit

import anyio

from autopilot.logsetup import get_logger

log = get_logger(__name__)

# kind -> (apprise notify type, priority). apprise itself is imported on first send:
# a run without notification URLs never pays for loading its plugins.
MILESTONES: dict[str, tuple[str, str]] = {
    "run_started": ("info", "normal"),
    "endpoint_restart": ("warning", "high"),
    "endpoint_failed": ("failure", "emergency"),
    "node_lost": ("warning", "high"),
    "arm_complete": ("success", "normal"),
    "run_complete": ("success", "high"),
    "run_incomplete": ("warning", "high"),
    "harness_anomaly": ("failure", "emergency"),
    "publish_failed": ("warning", "high"),
    "campaign_entry_finished": ("info", "normal"),
    "budget_reached": ("warning", "high"),
    "disk_low": ("warning", "high"),
    "disk_ok": ("info", "normal"),
    "campaign_complete": ("success", "high"),
    "campaign_incomplete": ("warning", "high"),
    "test": ("info", "normal"),
}
_SERVICE_PRIORITY = {
    "pover": {"normal": "normal", "high": "high", "emergency": "emergency"},
    "pushover": {"normal": "normal", "high": "high", "emergency": "emergency"},
    "ntfy": {"normal": "default", "high": "high", "emergency": "max"},
    "ntfys": {"normal": "default", "high": "high", "emergency": "max"},
}
ADVICE = {
    "endpoint_restart": "No action needed unless it repeats.",
    "endpoint_failed": "Endpoint keeps dying: check endpoint.log, GPU memory, the model path.",
    "harness_anomaly": "Harness or grader looks broken: check logs/<cell>.grade.log.",
    "node_lost": "Its cells re-run on other replicas; check the node (ray status).",
    "run_incomplete": "Re-run the same command to resume; see `dashboard` for excluded cells.",
    "run_complete": "Generate the report and publish when ready.",
    "publish_failed": "Results are safe in the state dir; fix the repo and re-run with --publish.",
    "disk_low": "Launching is paused until space is back; free some under the named path.",
}


def with_priority(url: str, priority: str) -> str:
    scheme = urlsplit(url).scheme.lower()
    table = _SERVICE_PRIORITY.get(scheme)
    if table is None or re.search(r"[?&]priority=", url):
        return url
    return f"{url}{'&' if '?' in url else '?'}priority={table[priority]}"


def masked(service: Any) -> str:
    """How a notification target is named in logs, the journal and notify-test output:
    its scheme and host only. apprise's privacy mode keeps an ntfy topic (the only
    credential on ntfy.sh), a json:// user and a webhook path."""
    try:
        return target_label(str(service.url(privacy=True)))
    except Exception:
        return "<unprintable url>"


def target_label(url: str) -> str:
    parts = urlsplit(url)
    try:
        host = parts.hostname or ""
    except ValueError:
        host = ""
    # ntfy://TOPIC and friends put the secret where a host would be: only a name that
    # looks like a host (a dot, localhost, an IP literal) is shown.
    if not host or not ("." in host or ":" in host or host == "localhost"):
        host = "***"
    return f"{parts.scheme}://{host}"


def format_message(kind: str, payload: dict[str, Any]) -> tuple[str, str]:
    """Title and body short enough for a phone lock screen."""
    what = kind.replace("_", " ")
    subject = payload.get("arm") or payload.get("model") or ""
    title = f"[{payload.get('preset', 'autopilot')}] {what}" + (f": {subject}" if subject else "")
    lines = [str(payload.get("progress") or what)]
    for key in ("why", "reason", "down_secs", "restarts", "passed", "valid", "streak",
                "last_cell"):
        if payload.get(key) not in (None, ""):
            lines.append(f"{key}: {str(payload[key])[:200]}")
    if kind in ADVICE:
        lines.append(ADVICE[kind])
    return title[:120], "\n".join(x for x in lines if x)[:900]


@dataclass
class Message:
    kind: str
    title: str
    body: str
    notify_type: str
    priority: str


class Notifier:
    def __init__(
        self,
        urls: Iterable[str] = (),
        config_file: str | None = None,
        *,
        cooldown_secs: float = 600,
        timeout_secs: float = 20,
        on_failure: Callable[[str, str, str], Any] | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.urls = list(dict.fromkeys(urls))
        self.config_file = config_file
        self.cooldown = cooldown_secs
        self.timeout = timeout_secs
        self.on_failure = on_failure
        self.clock = clock
        self._last: dict[tuple[str, str], float] = {}
        self._send, self._recv = anyio.create_memory_object_stream[Message](100)
        self._config_services: list[Any] | None = None
        self.sent: list[tuple[str, bool]] = []
        self.pending = 0  # queued or being sent

    @property
    def enabled(self) -> bool:
        return bool(self.urls or self.config_file)

    # ------------------------------------------------------------------ services

    def services(self, priority: str, kind: str) -> list[Any]:
        import apprise

        out = []
        for url in self.urls:
            svc = apprise.Apprise.instantiate(with_priority(url, priority))
            if svc is None:
                log.warning("notify_url_invalid", url=_mask_raw(url))
                continue
            out.append(svc)
        for svc in self._from_config():
            tags = set(getattr(svc, "tags", set()) or set())
            if not tags or tags & {priority, kind, "all", "always"}:
                out.append(svc)
        return out

    def _from_config(self) -> list[Any]:
        import apprise

        if self._config_services is None:
            self._config_services = []
            if self.config_file:
                cfg = apprise.AppriseConfig()
                cfg.add(self.config_file)
                a = apprise.Apprise()
                a.add(cfg)
                self._config_services = list(a.find(tag="all"))
        return self._config_services

    # ------------------------------------------------------------------ sending

    def submit(self, kind: str, payload: dict[str, Any]) -> bool:
        """Queue a milestone; False when disabled, suppressed by cool-down, or queue full."""
        if not self.enabled:
            return False
        subject = str(payload.get("arm") or payload.get("alarm") or "")
        key = (kind, subject)
        now = self.clock()
        if key in self._last and now - self._last[key] < self.cooldown:
            log.info("notify_suppressed", kind=kind, subject=subject)
            return False
        self._last[key] = now
        ntype, priority = MILESTONES.get(kind, ("info", "normal"))
        title, body = format_message(kind, payload)
        try:
            self._send.send_nowait(Message(kind, title, body, ntype, priority))
        except anyio.WouldBlock:
            log.warning("notify_dropped", kind=kind, why="queue full")
            return False
        self.pending += 1
        return True

    def _deliver(self, msg: Message) -> list[tuple[str, bool]]:
        results = []
        for svc in self.services(msg.priority, msg.kind):
            try:
                ok = bool(svc.notify(body=msg.body, title=msg.title, notify_type=msg.notify_type))
            except Exception:
                ok = False
            results.append((masked(svc), ok))
        return results

    async def send(self, msg: Message) -> list[tuple[str, bool]]:
        """Deliver ``msg`` to every target within ``timeout`` seconds in all. A sender's
        own timeouts are per socket operation, so a receiver that trickles a byte every
        two seconds holds it for ever: delivery runs in a daemon thread of its own that
        is abandoned at the deadline, and so can never hold up the run's exit (a worker
        thread of anyio's pool is not a daemon: the interpreter waits for it)."""
        results: list[tuple[str, bool]] = []
        done = threading.Event()
        box: list[list[tuple[str, bool]]] = []

        def work() -> None:
            try:
                box.append(self._deliver(msg))
            finally:
                done.set()

        threading.Thread(target=work, name=f"notify-{msg.kind}", daemon=True).start()
        with anyio.move_on_after(self.timeout) as scope:
            while not done.is_set():
                await anyio.sleep(0.02)
            results = box[0] if box else []
        if scope.cancelled_caught:
            results = [("(all)", False)]
            self._failed(msg.kind, "(all)", f"timed out after {self.timeout:.0f}s")
        for url, ok in results:
            self.sent.append((msg.kind, ok))
            if ok:
                log.info("notify_sent", kind=msg.kind, url=url, priority=msg.priority)
            elif url != "(all)":
                self._failed(msg.kind, url, "service reported failure")
        return results

    def _failed(self, kind: str, url: str, why: str) -> None:
        log.warning("notify_failed", kind=kind, url=url, why=why)
        if self.on_failure is not None:
            try:
                self.on_failure(kind, url, why)
            except Exception:
                log.exception("notify_failure_hook_error")

    async def run(self) -> None:
        async with self._recv:
            async for msg in self._recv:
                try:
                    await self.send(msg)
                finally:
                    self.pending -= 1

    async def drain(self, timeout: float) -> None:
        """At shutdown: let the queue (the final milestone) go out, bounded by timeout."""
        with anyio.move_on_after(timeout):
            while self.pending > 0:
                await anyio.sleep(0.02)


def _mask_raw(url: str) -> str:
    return target_label(url)
