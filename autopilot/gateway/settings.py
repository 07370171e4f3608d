"""The run's gateway as the supervisor holds it: its settings, and what each attempt's
data path needs of them (``datapath_spec``: the data path serves the attempt's
listener). Nothing here imports aiohttp: a run whose grader asks no model never loads
the serving code (autopilot.gateway.proxy) in its supervisor; one whose grader does
loads it on the first grading that asks (autopilot.backends.base.RunGateway)."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from autopilot.attemptspec import GatewayLimits, GatewaySpec

if TYPE_CHECKING:
    from autopilot.config import Preset, Route


class GatewaySettings:
    """What the run's gateway is (its limits, keys, redaction, who hears of throttling
    and failover), without serving anything itself."""

    def __init__(self, redact: Callable[[str], str] = lambda s: s,
                 limits: GatewayLimits | None = None,
                 on_throttled: Callable[[], None] = lambda: None,
                 on_failover: Callable[[str, int, str, str, str], Any] | None = None) -> None:
        self.redact = redact
        self.limits = limits or GatewayLimits()
        # a 429 from upstream: the loop launches fewer cells at once (run.throttle)
        self.on_throttled = on_throttled
        # a request sent to another replica than the cell's own: (cell, attempt, from, to,
        # why), journaled by the loop as request_failover
        self.on_failover = on_failover
        # the upstream's own key (a provider's), put on every admitted request of an
        # allowed route in the header its dialect takes it in
        self.key: Callable[[], str] | None = None
        # the dialects the run's endpoint speaks, where its key is used (empty: any)
        self.dialects: frozenset[str] = frozenset()
        self.secrets: tuple[str, ...] = ()  # what a data path's records redact

    def datapath_spec(self, settings: Mapping[str, Any], upstream: list[tuple[str, str]],
                      log_path: Path, key: str = "", model: str | None = None, *,
                      route: Route | None = None, route_key: str = "",
                      dialect_settings: Mapping[Any, Mapping[str, Any]] | None = None
                      ) -> GatewaySpec:
        """What an attempt's data path needs to run its listener with this gateway's
        settings (autopilot.datapath.process). It travels on the data path's stdin only:
        the upstream's key and the attempt's key are never written to a file. ``route``:
        the arm's own route (its upstream, key, model and dialect) instead of the run's
        endpoint."""
        upstream_key = self.key() if self.key is not None else None
        rewrite, dialects = False, self.dialects
        if route is not None:
            upstream_key, model = route_key or None, route.model
            rewrite, dialects = True, route.dialects()
        return GatewaySpec(
            tuple(upstream), str(log_path), self.limits, dict(settings),
            {str(k): dict(v) for k, v in (dialect_settings or {}).items()}, key=key,
            model=model, upstream_key=upstream_key, rewrite=rewrite,
            dialects=tuple(sorted(dialects)), secrets=tuple(self.secrets))


def _number(replica: str) -> int | None:
    return int(replica) if replica.isdigit() else None  # "route": no replica of the run


def gateway_for(preset: Preset, redact: Callable[[str], str], on_throttled: Callable[[], None],
                emit: Callable[..., Any], key: Callable[[], str] | None = None,
                secrets: tuple[str, ...] = ()) -> GatewaySettings | None:
    """The gateway a preset asks for (None: harnesses talk to the endpoint directly).
    ``key``: the hosted endpoint's key, read when an attempt starts."""
    spec = preset.gateway
    if not spec.enabled or not preset.uses_gateway:
        return None
    # here, not at the top: the data path serves this module and never loads pydantic
    from autopilot.state.cellevents import RequestFailover

    settings = GatewaySettings(redact, GatewayLimits(max_request=int(spec.max_request_mb * 2**20),
                                max_records=spec.max_records, hold_429=spec.hold_429_secs,
                                body_secs=spec.body_timeout_secs,
                                upstream_read_secs=spec.upstream_read_secs),
                 on_throttled=on_throttled,
                 on_failover=lambda cell, attempt, frm, to, why: emit(RequestFailover(
                     cell=cell, attempt=attempt, replica=_number(frm), to=_number(to),
                     why=why)))
    if preset.endpoint.hosted:  # the key stays here; the harness has its attempt's
        settings.key = key
        settings.dialects = preset.endpoint.dialects
    settings.secrets = secrets
    return settings


