"""Preflight of the arms' own routes: each route's key and exact model id, checked
against the provider itself before any spend (fail closed).

Each distinct route (base URL, dialect, key variable, model) is asked once for its
models list, in its dialect's own way (its path, its key header): a key it refuses
stops the run naming the arm, the route and the variable (never the key); a model id it
does not list stops it with the closest ids it does.
"""

from __future__ import annotations

import difflib
import os

from autopilot import lazyimport
from autopilot.config import Preset, Route
from autopilot.gateway.dialects import DIALECTS

PROBE_SECS = 15.0


async def route_problems(preset: Preset) -> list[str]:
    httpx = lazyimport.httpx()
    seen: dict[Route, str] = {}
    problems: list[str] = []
    async with httpx.AsyncClient(timeout=PROBE_SECS, trust_env=False) as client:
        for arm in preset.arms:
            route = arm.route
            if route is None:
                continue
            if route in seen:
                if seen[route]:
                    problems.append(f"arm {arm.label!r}: {seen[route]}")
                continue
            why = await _probe(client, route)
            seen[route] = why or ""
            if why:
                problems.append(f"arm {arm.label!r}: {why}")
    return problems


async def _probe(client: object, r: Route) -> str | None:
    httpx = lazyimport.httpx()
    dialect = DIALECTS[r.dialect]
    key = os.environ.get(r.api_key_env, "") if r.api_key_env else ""
    where = f"route {r.origin()} ({r.dialect})"
    try:
        resp = await client.get(r.base_url + dialect.models_path,  # type: ignore[attr-defined]
                                headers=dialect.probe_headers(key) if key else {})
    except httpx.HTTPError as e:
        return f"{where} not reachable ({type(e).__name__})"
    status = resp.status_code
    keyword = resp.text[:2000].lower()
    if status in (401, 403) or (status == 400 and "api key" in keyword):
        return (f"{where} rejected the key in ${r.api_key_env or '(none)'} (HTTP {status})")
    if status != 200:
        return f"{where}: its models list answered HTTP {status}"
    try:
        ids = dialect.model_ids(resp.json())
    except ValueError:
        return f"{where}: its models list is not JSON"
    if r.model not in ids:
        close = difflib.get_close_matches(r.model, ids, n=3, cutoff=0.3)
        return (f"model {r.model!r} not offered by {where} "
                f"(closest: {', '.join(close) or 'none'})")
    return None


__all__ = ["route_problems"]
