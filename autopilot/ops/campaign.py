"""``autopilot campaign ROSTER.toml``: many models, one after another, one board.

A roster names presets (with overlays); each entry is an ordinary run (the same
``autopilot`` command, a subprocess) in its own state dir under the campaign dir, so
everything a run guarantees (journal, resume, lock, exact-pid kill, milestones) holds
per entry. What the campaign adds:

  * order: entries on a local engine (builtin, llamacpp, vllm) run one after another, and
    the next starts only once the previous entry's endpoint is *checked* gone (no process
    still carrying its run marker; no container labelled with its state dir), so two
    models never share a GPU; hosted-provider entries run beside them, each provider with
    its own cap on entries at once;
  * re-entry: a resumed campaign skips COMPLETE entries and resumes the rest; an entry
    that ends INCOMPLETE is reported and does not block the others; entries die with the
    campaign (PR_SET_PDEATHSIG), so a ``kill -9`` leaves no entry driving on;
  * one lock (exit 3 for a second driver), its own journal (``campaign.jsonl``) and
    milestones per entry and for the campaign.
"""

from __future__ import annotations

import asyncio
import ctypes
import os
import signal
import subprocess
import sys
import tomllib
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import anyio
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from autopilot.cell.childenv import urls_from_env
from autopilot.cell.procs import existing_run_token, journaled_identity, marked_processes, verify
from autopilot.config import NAME_RE, Rate
from autopilot.errors import ConfigError
from autopilot.logsetup import get_logger
from autopilot.run.notify import Notifier
from autopilot.state.budget import Spend, of_events
from autopilot.state.eventbase import EventBase, record_of
from autopilot.state.journal import Journal, state_events
from autopilot.state.lock import RunLock
from autopilot.state.runevents import (
    CampaignBlocked,
    CampaignBudgetReached,
    CampaignFinished,
    CampaignStarted,
    EntryFinished,
    EntrySkipped,
    EntryStarted,
)
from autopilot.state.statedir import check_trusted, ensure_private_dir, open_append
from autopilot.state.untrusted import state_json

log = get_logger(__name__)

JOURNAL = "campaign.jsonl"


class _Strict(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")


class Entry(_Strict):
    name: str
    preset: str
    config: str | None = None  # an overlay, relative to the roster file
    target_n: int | None = Field(default=None, ge=1)

    @field_validator("name")
    @classmethod
    def _name(cls, v: str) -> str:
        if not NAME_RE.fullmatch(v) or ".." in v:
            raise ValueError(f"entry name {v!r} must be a plain name (it names a directory)")
        return v


class CampaignTable(_Strict):
    name: str
    target_n: int | None = Field(default=None, ge=1)
    # Spend limits across every entry: checked before each entry starts (each entry's
    # own [budget] limits it inside); reached, no further entry starts.
    budget_tokens: int | None = Field(default=None, ge=1)
    budget_usd: float | None = Field(default=None, gt=0)


class Roster(_Strict):
    campaign: CampaignTable
    providers: dict[str, int] = Field(default_factory=dict)  # host -> entries at once
    entries: list[Entry] = Field(min_length=1)


@dataclass(frozen=True)
class Planned:
    entry: Entry
    state_dir: Path
    preset_ref: str
    overlay: str | None
    target_n: int
    provider: str | None  # the provider's host for hosted entries; None: a local engine
    rate: Rate | None = None  # the entry model's price (rate card)


def load_roster(path: Path, target_n: int | None, campaign_dir: Path | None = None
                ) -> tuple[Roster, list[Planned]]:
    """The roster, validated, with every entry's preset loaded (bad input: ConfigError);
    ``campaign_dir`` defaults to campaign_dir_for(the campaign's name)."""
    from autopilot.run.admission import load_admitted

    try:
        doc = tomllib.loads(path.read_text(encoding="utf-8"))
    except OSError as e:
        raise ConfigError(f"{path}: cannot read ({e.strerror})") from None
    except tomllib.TOMLDecodeError as e:
        raise ConfigError(f"{path}: malformed TOML: {e}") from None
    try:
        roster = Roster.model_validate(doc)
    except ValidationError as e:
        errs = "; ".join(f"{'.'.join(map(str, err['loc']))}: {err['msg']}" for err in e.errors())
        raise ConfigError(f"{path}: {errs}") from None
    if not NAME_RE.fullmatch(roster.campaign.name) or ".." in roster.campaign.name:
        raise ConfigError(f"{path}: campaign.name {roster.campaign.name!r}: a plain name")
    campaign_dir = campaign_dir or campaign_dir_for(roster.campaign.name, None)
    names = [e.name for e in roster.entries]
    if len(set(names)) != len(names):
        raise ConfigError(f"{path}: entries: names must be unique")
    out = []
    for entry in roster.entries:
        overlay = str((path.parent / entry.config).absolute()) if entry.config else None
        ref = entry.preset
        if ref.endswith(".toml") or os.sep in ref:
            ref = str((path.parent / ref).absolute())
        target = target_n or entry.target_n or roster.campaign.target_n
        try:
            preset = load_admitted(ref, overlay=overlay,
                                   flags={"target_n": target} if target else None)
        except ConfigError as e:
            raise ConfigError(f"{path}: entry {entry.name}: {e}") from None
        if preset.run.target_n is None:
            raise ConfigError(f"{path}: entry {entry.name}: no target N (set "
                              "[campaign] target_n, the entry's, or --target-n)")
        provider = None
        if preset.endpoint.hosted:
            provider = preset.endpoint.hosted_at()
        out.append(Planned(entry, campaign_dir / entry.name, ref, overlay,
                           preset.run.target_n, provider, preset.rate_for()))
    for host, cap in roster.providers.items():
        if cap < 1:
            raise ConfigError(f"{path}: providers.{host}: the cap must be >= 1")
    return roster, out


def order_text(planned: list[Planned], caps: dict[str, int]) -> str:
    local = [entry_plan.entry.name for entry_plan in planned if entry_plan.provider is None]
    lines = [f"local, one after another: {' -> '.join(local) or 'none'}"]
    by_host: dict[str, list[str]] = {}
    for entry_plan in planned:
        if entry_plan.provider is not None:
            by_host.setdefault(entry_plan.provider, []).append(entry_plan.entry.name)
    for host, names in by_host.items():
        lines.append(f"beside them, provider {host} (at most {caps.get(host, 1)} at once): "
                     + ", ".join(names))
    return "\n".join(lines)


def entry_argv(entry_plan: Planned, *extra: str) -> list[str]:
    argv = [sys.executable, "-m", "autopilot.cli", "--preset", entry_plan.preset_ref,
            "--target-n", str(entry_plan.target_n), "--state-dir", str(entry_plan.state_dir),
            "--quiet"]
    if entry_plan.overlay:
        argv += ["--config", entry_plan.overlay]
    return argv + list(extra)


def entry_phase(state_dir: Path) -> str | None:
    status = state_json(state_dir, "status.json")
    phase = status.get("phase") if isinstance(status, dict) else None
    return phase if isinstance(phase, str) else None


def endpoint_leftovers(state_dir: Path) -> list[int]:
    """Processes an entry's run left alive: anything carrying its run marker, and the
    endpoint processes its journal names (exact identity). Empty means gone."""
    token = existing_run_token(state_dir)
    alive = {proc.pid for proc, _ in marked_processes(token)} if token else set()
    for record in state_events(state_dir):
        if record.get("event") in ("endpoint_spawned", "endpoint_started") \
                and not record.get("attached"):
            ident = journaled_identity(record)
            if ident is not None and verify(ident) is not None:
                alive.add(ident.pid)
    return sorted(alive)


async def container_leftovers(state_dir: Path, preset_ref: str, overlay: str | None) -> list[str]:
    """Containers labelled with the entry's state dir that still exist (Docker presets)."""
    from autopilot.loader import load_preset
    from autopilot.run.preflight import needs_docker

    if not needs_docker(load_preset(preset_ref, overlay=overlay)):
        return []
    from autopilot.cell.sandbox import LABEL_STATE, Docker

    docker = Docker()
    try:
        return sorted(await docker.names(label=f"{LABEL_STATE}={state_dir}"))
    finally:
        await docker.close()


_PR_SET_PDEATHSIG = 1


def _die_with_parent() -> None:
    # In the child, before exec: a SIGKILLed campaign takes its entries along (SIGTERM:
    # they stop like a person pressed Ctrl-C, and the resumed campaign resumes them).
    libc = ctypes.CDLL(None, use_errno=True)
    libc.prctl(_PR_SET_PDEATHSIG, signal.SIGTERM, 0, 0, 0)


class Campaign:
    def __init__(self, roster_path: Path, campaign_dir: Path, planned: list[Planned],
                 caps: dict[str, int], table: CampaignTable | None = None) -> None:
        self.table = table
        self.roster_path = roster_path
        self.dir = campaign_dir
        self.planned = planned
        self.caps = caps
        self.lock = RunLock(campaign_dir)
        self.journal: Journal | None = None
        self.results: dict[str, str] = {}
        self.running: dict[str, int] = {}  # entry -> pid of its supervisor
        self.notifier = Notifier(urls_from_env(), cooldown_secs=0)
        self.stopping = False
        self.failed: str | None = None

    def emit(self, event: str | EventBase, **fields: Any) -> None:
        assert self.journal is not None
        kind, fields = record_of(event, fields)
        self.journal.append(kind, **fields)
        log.info(kind, **fields)

    async def run(self) -> int:
        check_trusted(self.dir)
        self.lock.acquire()
        try:
            ensure_private_dir(self.dir)
            self.journal = Journal(self.dir / JOURNAL)
            self.emit(CampaignStarted(roster=str(self.roster_path),
                      entries=[entry_plan.entry.name for entry_plan in self.planned]))
            async with anyio.create_task_group() as tg:
                tg.start_soon(self.notifier.run)
                tg.start_soon(self._signals, tg.cancel_scope)
                async with anyio.create_task_group() as work:
                    work.start_soon(self._locals)
                    for host in dict.fromkeys(entry_plan.provider for entry_plan in self.planned
                                              if entry_plan.provider):
                        work.start_soon(self._providers, host)
                await self._finish()
                await self.notifier.drain(5)
                tg.cancel_scope.cancel()
            return 0 if all(v == "COMPLETE" for v in self.results.values()) \
                and len(self.results) == len(self.planned) else 1
        finally:
            if self.journal is not None:
                self.journal.close()
            self.lock.release()

    async def _signals(self, scope: anyio.CancelScope) -> None:
        with anyio.open_signal_receiver(signal.SIGINT, signal.SIGTERM) as signals:
            async for sig in signals:
                self.stopping = True
                for pid in list(self.running.values()):
                    try:
                        os.kill(pid, sig)  # our own child, by its exact pid
                    except ProcessLookupError:
                        pass

    async def _locals(self) -> None:
        previous: Planned | None = None
        for entry_plan in [other for other in self.planned if other.provider is None]:
            if self.stopping or self.failed:
                return
            if previous is not None:
                left = endpoint_leftovers(previous.state_dir)
                containers = await container_leftovers(previous.state_dir,
                                                       previous.preset_ref, previous.overlay)
                if left or containers:
                    # Two models must never share a GPU: the rest of the local entries wait
                    # for a person (`autopilot cleanup --endpoint` on that entry).
                    self.failed = (f"entry {previous.entry.name} left its endpoint running "
                                   f"(pids {left}, containers {containers}); not starting "
                                   f"{entry_plan.entry.name}")
                    self.emit(CampaignBlocked(why=self.failed))
                    return
            await self._entry(entry_plan, previous_gone=previous.entry.name if previous else None)
            previous = entry_plan

    async def _providers(self, host: str) -> None:
        limit = anyio.Semaphore(max(1, self.caps.get(host, 1)))

        async def one(entry_plan: Planned) -> None:
            async with limit:
                if not self.stopping:
                    await self._entry(entry_plan)

        async with anyio.create_task_group() as tg:
            for entry_plan in self.planned:
                if entry_plan.provider == host:
                    tg.start_soon(one, entry_plan)

    def _budget_reached(self) -> str | None:
        """The campaign's budget against what every entry's journal says it spent."""
        table = self.table
        if table is None or (table.budget_tokens is None and table.budget_usd is None):
            return None
        total, usd, unpriced = Spend(), 0.0, False
        for entry_plan in self.planned:
            spent = of_events(state_events(entry_plan.state_dir).typed())
            total = total + spent
            cost = spent.usd(entry_plan.rate)
            unpriced |= cost is None and spent.tokens > 0
            usd += cost or 0.0
        if table.budget_tokens is not None and total.tokens >= table.budget_tokens:
            return f"campaign budget reached: {total.tokens} tokens of {table.budget_tokens}"
        if table.budget_usd is not None:
            if unpriced:
                return "campaign budget unusable: an entry's model is unpriced (not $0)"
            if usd >= table.budget_usd:
                return f"campaign budget reached: ${usd:.4f} of ${table.budget_usd:g}"
        return None

    async def _entry(self, entry_plan: Planned, previous_gone: str | None = None) -> None:
        name = entry_plan.entry.name
        if entry_phase(entry_plan.state_dir) == "COMPLETE":
            self.results[name] = "COMPLETE"
            self.emit(EntrySkipped(entry=name, why="already COMPLETE"))
            return
        why = self._budget_reached()
        if why:
            if not self.failed:
                self.failed = why
                self.emit(CampaignBudgetReached(why=why))
                self.notifier.submit("budget_reached", {"alarm": "campaign", "why": why})
            return
        ensure_private_dir(entry_plan.state_dir)
        with open_append(self.dir / f"{name}.log") as out:
            # asyncio directly: anyio's open_process has no preexec_fn for PDEATHSIG.
            proc = await asyncio.create_subprocess_exec(
                *entry_argv(entry_plan), stdout=out, stderr=out, stdin=subprocess.DEVNULL,
                preexec_fn=_die_with_parent)
            self.running[name] = proc.pid
            self.emit(EntryStarted(entry=name, pid=proc.pid, state_dir=str(entry_plan.state_dir),
                      previous_endpoint_gone=previous_gone, provider=entry_plan.provider))
            try:
                code = await proc.wait()
            finally:
                self.running.pop(name, None)
        phase = entry_phase(entry_plan.state_dir) or "unknown"
        outcome = "COMPLETE" if code == 0 and phase == "COMPLETE" else "INCOMPLETE"
        self.results[name] = outcome
        self.emit(EntryFinished(entry=name, code=code, outcome=outcome, phase=phase))
        self.notifier.submit("campaign_entry_finished", {
            "alarm": name, "entry": name, "outcome": outcome, "exit_code": code,
            "progress": f"{len(self.results)}/{len(self.planned)} entries done"})

    async def _finish(self) -> None:
        done = [name for name, result in self.results.items() if result == "COMPLETE"]
        incomplete = [entry_plan.entry.name for entry_plan in self.planned
                      if self.results.get(entry_plan.entry.name) != "COMPLETE"]
        outcome = "COMPLETE" if not incomplete else "INCOMPLETE"
        self.emit(CampaignFinished(outcome=outcome, complete=done, incomplete=incomplete,
                  why=self.failed))
        self.notifier.submit("campaign_complete" if outcome == "COMPLETE"
                             else "campaign_incomplete",
                             {"alarm": "campaign", "complete": done, "incomplete": incomplete})
        if outcome == "COMPLETE":
            print(f"CAMPAIGN_COMPLETE {len(done)} entries", flush=True)
        else:
            print(f"CAMPAIGN_INCOMPLETE {', '.join(incomplete)}"
                  + (f" ({self.failed})" if self.failed else ""), flush=True)


def campaign_dir_for(name: str, state_dir: str | None) -> Path:
    """``--state-dir`` if given, else ``<$AUTOPILOT_STATE_DIR or this user's state
    base>-campaigns/<name>``."""
    from autopilot.cliutil import state_base

    if state_dir:
        return Path(state_dir).absolute()
    base = os.environ.get("AUTOPILOT_STATE_DIR") or str(state_base())
    return (Path(base + "-campaigns") / name).absolute()
