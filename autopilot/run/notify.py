"""Milestone push notifications through apprise; never raises, never slows the run.

A milestone is queued (non-blocking) and handed by a task of the supervisor's task
group to one lane per service: a daemon thread of its own that sends that service's
messages in order (apprise's senders block, and their timeouts are per socket operation,
so a receiver that trickles a byte a second holds its sender for ever). A slow service
delays only its own messages; each message has ``timeout_secs`` from its submission to
reach each service, and one that did not (or had not when the run exits) is logged (URL
privacy-masked) and handed to ``on_failure`` for the journal: nothing is dropped without
a record. The same milestone for the same subject is not re-sent within
``cooldown_secs``.

Priorities reach the phone two ways: services that carry a priority in their URL
(Pushover ``priority=``, ntfy ``priority=``) get it set per message unless the URL pins
one, and services loaded from an apprise config file can be routed by tag — a service
tagged with a priority (``normal``/``high``/``emergency``) or a milestone kind gets only
those; an untagged one gets everything.
"""

from __future__ import annotations

import queue
import re
import threading
import time
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlsplit

import anyio

from autopilot.logsetup import get_logger
from autopilot.state.runevents import MilestoneKind

log = get_logger(__name__)

# kind -> (apprise notify type, priority). apprise itself is imported on first send:
# a run without notification URLs never pays for loading its plugins.
MILESTONES: dict[MilestoneKind, tuple[str, str]] = {
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
    at: float = field(default_factory=time.monotonic)  # submitted: its deadline runs from here


@dataclass
class Delivery:
    """One message to one service."""

    msg: Message
    target: str  # privacy-masked, for logs and the journal
    make: Callable[[], Any]  # the apprise service (built in the lane's thread)
    deadline: float
    done: threading.Event = field(default_factory=threading.Event)
    ok: bool = False
    why: str = "service reported failure"
    abandoned: bool = False  # past its deadline: the lane skips it, its failure is said


class Lane:
    """One service's deliveries, in order, in a daemon thread of its own (never holds the
    interpreter's exit)."""

    def __init__(self) -> None:
        self._q: queue.SimpleQueue[Delivery] = queue.SimpleQueue()
        self._thread: threading.Thread | None = None

    def put(self, delivery: Delivery) -> None:
        self._q.put(delivery)
        if self._thread is None:
            self._thread = threading.Thread(target=self._work, daemon=True,
                                            name=f"notify-{delivery.target}")
            self._thread.start()

    def _work(self) -> None:
        while True:
            delivery = self._q.get()
            if not delivery.abandoned and time.monotonic() < delivery.deadline:
                try:
                    svc = delivery.make()
                    if svc is None:
                        delivery.why = "not a notification URL apprise knows"
                    else:
                        delivery.ok = bool(svc.notify(body=delivery.msg.body,
                                                      title=delivery.msg.title,
                                                      notify_type=delivery.msg.notify_type))
                except Exception as e:
                    delivery.why = f"{type(e).__name__} while sending"
            delivery.done.set()


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
        before_send: Callable[[], Awaitable[None]] | None = None,
    ) -> None:
        self.urls = list(dict.fromkeys(urls))
        # awaited before a message leaves the machine (the journal's events on disk)
        self.before_send = before_send
        self.config_file = config_file
        self.cooldown = cooldown_secs
        self.timeout = timeout_secs
        self.on_failure = on_failure
        self.clock = clock  # the cool-down's; deadlines are real time (the lanes' threads)
        self._last: dict[tuple[str, str], float] = {}
        self._send, self._recv = anyio.create_memory_object_stream[Message](100)
        self._config_services: list[Any] | None = None
        self._lanes: dict[str, Lane] = {}
        self._open: list[Delivery] = []
        self._opened: anyio.Event | None = None  # the watcher's wake-up while none is open
        self._queued = 0
        self.sent: list[tuple[str, bool]] = []

    @property
    def enabled(self) -> bool:
        return bool(self.urls or self.config_file)

    @property
    def pending(self) -> int:
        """Messages queued, and deliveries not yet settled."""
        return self._queued + len(self._open)

    # ------------------------------------------------------------------ services

    def targets(self, priority: str, kind: str) -> list[tuple[str, str, Callable[[], Any]]]:
        """(lane key, masked name, maker) of every service ``kind`` goes to. A URL's
        service is built in its lane (with the message's priority); a config file's are
        loaded once, here (blocking: called in a worker thread)."""
        import apprise

        out: list[tuple[str, str, Callable[[], Any]]] = []
        for url in self.urls:
            def make(url: str = url) -> Any:
                return apprise.Apprise.instantiate(with_priority(url, priority))

            out.append((f"url:{url}", _mask_raw(url), make))
        for i, svc in enumerate(self._from_config()):
            tags = set(getattr(svc, "tags", set()) or set())
            if not tags or tags & {priority, kind, "all", "always"}:
                def given(svc: Any = svc) -> Any:
                    return svc

                out.append((f"config:{i}", masked(svc), given))
        return out

    def _from_config(self) -> list[Any]:
        import apprise

        if self._config_services is None:
            self._config_services = []
            if self.config_file:
                cfg = apprise.AppriseConfig()
                cfg.add(self.config_file)
                sender = apprise.Apprise()
                sender.add(cfg)
                self._config_services = list(sender.find(tag="all"))
        return self._config_services

    # ------------------------------------------------------------------ sending

    def submit(self, kind: MilestoneKind, payload: dict[str, Any]) -> bool:
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
            self._failed(kind, "(all)", "not sent: 100 milestones already queued")
            return False
        self._queued += 1
        return True

    async def _dispatch(self, msg: Message) -> list[Delivery]:
        """``msg`` into the lane of every service it goes to."""
        try:
            targets = await anyio.to_thread.run_sync(self.targets, msg.priority, msg.kind)
        except Exception as e:  # an unreadable config file: said, never raised
            self._failed(msg.kind, "(all)", f"services not loaded: {type(e).__name__}")
            return []
        out = []
        for key, target, make in targets:
            delivery = Delivery(msg, target, make, msg.at + self.timeout)
            self._lanes.setdefault(key, Lane()).put(delivery)
            out.append(delivery)
        return out

    def _settle(self, delivery: Delivery, why: str) -> None:
        self.sent.append((delivery.msg.kind, delivery.ok))
        if delivery.ok:
            log.info("notify_sent", kind=delivery.msg.kind, url=delivery.target,
                     priority=delivery.msg.priority)
        else:
            self._failed(delivery.msg.kind, delivery.target, why)

    async def send(self, msg: Message) -> list[tuple[str, bool]]:
        """Deliver ``msg`` to every service and wait (``notify-test``): each lane has
        ``timeout`` seconds; (target, delivered) per service."""
        msg.at = time.monotonic()
        deliveries = await self._dispatch(msg)
        while any(not delivery.done.is_set() for delivery in deliveries) \
                and time.monotonic() < msg.at + self.timeout:
            await anyio.sleep(0.02)
        for delivery in deliveries:
            late = not delivery.done.is_set()
            delivery.abandoned = delivery.abandoned or late
            self._settle(delivery, f"timed out after {self.timeout:.0f}s" if late else delivery.why)
        return [(delivery.target, delivery.ok and delivery.done.is_set())
                for delivery in deliveries]

    async def run(self) -> None:
        async with anyio.create_task_group() as tg:
            tg.start_soon(self._watch)
            async with self._recv:
                async for msg in self._recv:
                    try:
                        if self.before_send is not None:
                            await self.before_send()
                        self._open += await self._dispatch(msg)
                        if self._opened is not None:
                            self._opened.set()
                    finally:
                        self._queued -= 1

    async def _watch(self) -> None:
        """Settle what each lane did: delivered, refused, or past its deadline."""
        while True:
            if not self._open:  # nothing to settle: sleep until a message goes out
                self._opened = anyio.Event()
                await self._opened.wait()
                self._opened = None
            # A lane finishes in its worker thread (a threading.Event): looked at often
            # while one is open, never while none is.
            await anyio.sleep(0.05)
            now, still = time.monotonic(), []
            for delivery in self._open:
                if delivery.done.is_set():
                    self._settle(delivery, delivery.why)
                elif now >= delivery.deadline:
                    delivery.abandoned = True
                    self._settle(delivery, f"not delivered within {self.timeout:.0f}s")
                else:
                    still.append(delivery)
            self._open = still

    async def drain(self, timeout: float) -> None:
        """At shutdown: let what is queued go out, bounded by ``timeout``; what is still
        not delivered then is recorded as such, never dropped silently."""
        with anyio.move_on_after(timeout):
            while self.pending > 0:
                await anyio.sleep(0.02)
        for delivery in self._open:
            delivery.abandoned = True
            self._settle(delivery, "not delivered before the run exited")
        self._open = []
        while True:
            try:
                msg = self._recv.receive_nowait()
            except (anyio.WouldBlock, anyio.EndOfStream, anyio.ClosedResourceError):
                break
            self._queued -= 1
            self._failed(msg.kind, "(all)", "not sent before the run exited")

    def _failed(self, kind: str, url: str, why: str) -> None:
        log.warning("notify_failed", kind=kind, url=url, why=why)
        if self.on_failure is not None:
            try:
                self.on_failure(kind, url, why)
            except Exception:
                log.exception("notify_failure_hook_error")


def _mask_raw(url: str) -> str:
    return target_label(url)
