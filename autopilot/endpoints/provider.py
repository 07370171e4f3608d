"""A hosted OpenAI-compatible provider: no lifecycle, an authenticated models-list probe.

Health is ``GET {base_url}/models`` with the key; the key's *value* is read from the env
var the preset names and never reaches a log, the journal or status.json.
"""

from __future__ import annotations

import difflib
import os
from pathlib import Path
from typing import Any

from autopilot import lazyimport
from autopilot.config import Preset
from autopilot.config import ProviderEndpoint as ProviderConfig
from autopilot.endpoints.base import Endpoint
from autopilot.errors import EndpointError


class ProviderEndpoint(Endpoint):
    engine = "provider"
    owns_lifecycle = False
    checked_live = True

    def __init__(self, preset: Preset, state_dir: Path, replica: int = 0) -> None:
        super().__init__(preset, state_dir, replica)
        assert isinstance(self.cfg, ProviderConfig)
        self.base_url = self.cfg.base_url.rstrip("/")
        self.key_env = self.cfg.api_key_env

    @property
    def url(self) -> str:
        return self.base_url

    @property
    def api_base(self) -> str:
        return self.base_url

    def api_key(self) -> str:
        """The key's value, read when it is used (never kept, logged or written)."""
        return os.environ.get(self.key_env, "") if self.key_env else ""

    def headers(self) -> dict[str, str]:
        key = self.api_key()
        return {"Authorization": f"Bearer {key}"} if key else {}

    def describe(self) -> dict[str, Any]:
        return {**super().describe(), "api_key_env": self.key_env}

    async def probe(self, check_model: bool = False) -> tuple[bool, str]:
        httpx = lazyimport.httpx()  # loaded lazily, see Endpoint.client

        try:
            resp = await self.client().get(f"{self.base_url}/models")
        except httpx.HTTPError as e:
            return False, type(e).__name__
        if resp.status_code == 429:
            # Rate limited: the provider is up, only asking us to slow down. Not an outage
            # (no cell is INVALID(endpoint_down) for it); the keeper backs the launch off.
            try:
                after = max(1.0, float(resp.headers.get("Retry-After") or 1.0))
            except ValueError:
                after = 1.0
            return True, f"throttled: HTTP 429, Retry-After {after:g}s"
        if resp.status_code in (401, 403):
            raise EndpointError(
                f"provider {self.base_url} rejected the key in ${self.key_env} "
                f"(HTTP {resp.status_code})"
            )
        if resp.status_code != 200:
            return False, f"/models answered {resp.status_code}"
        if check_model:
            ids = [str(model.get("id")) for model in resp.json().get("data", [])
                   if isinstance(model, dict)]
            if self.served_model not in ids:
                close = difflib.get_close_matches(self.served_model, ids, n=3, cutoff=0.3)
                raise EndpointError(
                    f"model {self.served_model!r} not offered by {self.base_url} "
                    f"(closest: {', '.join(close) or 'none'})"
                )
        return True, "ok"
