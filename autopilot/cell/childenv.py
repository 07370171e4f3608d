"""What a child process (harness, grader, endpoint) inherits from the supervisor's env.

A harness is untrusted code that may print its environment into a transcript we then
publish. So the supervisor hands on its environment minus what is not the child's:
the autopilot's own notification config (``AUTOPILOT_NOTIFY_*``: an ntfy topic or a
webhook path is a credential), every variable the preset names as a secret, and every
variable whose *name* looks like a credential (``*KEY*``, ``*TOKEN*``, ``*SECRET*``,
``*PASSW*``, ``*CREDENTIAL*``, ``*COOKIE*``). A child that needs one says so with its
role's ``pass_env``; a provider's ``api_key_env`` is passed to the harness, which is
what talks to the provider. ``--dry-run`` lists what each role gets and what is withheld.
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping
from typing import Literal

from autopilot.config import Preset

Role = Literal["harness", "grader", "endpoint"]

_CREDENTIAL_NAME = re.compile(r"KEY|TOKEN|SECRET|PASSW|CREDENTIAL|COOKIE", re.IGNORECASE)
_OWN_PREFIX = "AUTOPILOT_NOTIFY_"


def passed(preset: Preset, role: Role) -> frozenset[str]:
    """Names this role is given although they would be withheld."""
    if role == "harness":
        names = list(preset.harness.pass_env)
        if preset.endpoint.engine == "provider" and preset.endpoint.api_key_env:
            names.append(preset.endpoint.api_key_env)
    elif role == "grader":
        names = list(preset.grader.pass_env)
    else:
        names = list(preset.endpoint.pass_env)
    return frozenset(names)


def withheld_name(name: str, secrets: frozenset[str]) -> bool:
    return (name.startswith(_OWN_PREFIX) or name in secrets
            or bool(_CREDENTIAL_NAME.search(name)))


def child_env(preset: Preset, role: Role,
              environ: Mapping[str, str] | None = None) -> dict[str, str]:
    """The environment ``role`` inherits (before the autopilot adds its own variables)."""
    environ = os.environ if environ is None else environ
    keep = passed(preset, role)
    secrets = frozenset(preset.preflight.secrets)
    return {k: v for k, v in environ.items() if k in keep or not withheld_name(k, secrets)}


def withheld(preset: Preset, role: Role,
             environ: Mapping[str, str] | None = None) -> list[str]:
    """Names present in the environment that ``role`` does not get (for --dry-run)."""
    environ = os.environ if environ is None else environ
    given = child_env(preset, role, environ)
    return sorted(k for k in environ if k not in given)


def urls_from_env(value: str | None = None) -> list[str]:
    """Notification URLs from ``AUTOPILOT_NOTIFY_URLS`` (comma or space separated)."""
    value = os.environ.get("AUTOPILOT_NOTIFY_URLS", "") if value is None else value
    return [u for u in re.split(r"[,\s]+", value) if u]


def secret_values(preset: Preset) -> list[str]:
    """Values of the env vars the preset names as secret (never logged anywhere)."""
    names = list(preset.preflight.secrets)
    if preset.endpoint.engine == "provider" and preset.endpoint.api_key_env:
        names.append(preset.endpoint.api_key_env)
    # A notification URL is a credential too (an ntfy topic, a webhook path).
    return [os.environ[n] for n in names if os.environ.get(n)] + [
        *preset.notify.urls, *urls_from_env()]
