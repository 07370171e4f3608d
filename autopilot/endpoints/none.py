"""``engine = "none"``: a job whose harness talks to no model endpoint.

Nothing is started, probed or restarted; the endpoint is always "up", so the keeper,
the watchdog and the run proceed exactly as with a real one, and an endpoint outage can
never be what a cell's verdict blames.
"""

from __future__ import annotations

from typing import Any

from autopilot.endpoints.base import Endpoint


class NoEndpoint(Endpoint):
    engine = "none"
    owns_lifecycle = False

    @property
    def url(self) -> str:
        return ""

    @property
    def api_base(self) -> str:
        return ""

    def describe(self) -> dict[str, Any]:
        return {**super().describe(), "url": "", "pid": None}

    async def start(self) -> None:
        return None

    async def probe(self, check_model: bool = False) -> tuple[bool, str]:
        return True, "no endpoint"

    async def stop(self) -> None:
        return None
