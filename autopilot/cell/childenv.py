"""What a child process (harness, grader, endpoint) inherits from the supervisor's env.

A harness is untrusted code that may print its environment into a transcript we then
publish, and filtering by *name* misses credentials (``DATABASE_URL=postgres://u:pass@``).
So a child gets an allow-list, never the supervisor's environment minus a pattern: a
small base that programs need to run (``PATH``, ``HOME``, the locale, ``TERM``, ``TZ``,
``TMPDIR``, the Python and Docker client basics, BLAS/OpenMP thread settings; the
endpoint also the GPU runtime's: ``LD_LIBRARY_PATH``, ``CUDA_*`` device selection, the
Hugging Face cache), no proxy settings, plus what the preset declares in the role's
``pass_env``; a provider's ``api_key_env`` goes to the harness under that name — with
the gateway as a placeholder (the real key stays in the supervisor, which adds it
upstream: autopilot.backends.base.cell_context), without it as the real key. The
autopilot's own notification config (``AUTOPILOT_NOTIFY_*``) and the preset's secrets
reach no child unless ``pass_env`` names them. ``--dry-run`` lists what each role gets
and what is withheld.
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping
from typing import Literal

from autopilot.config import Preset
from autopilot.logsetup import Redactor

Role = Literal["harness", "grader", "endpoint"]

BASE = frozenset({
    "PATH", "HOME", "USER", "LOGNAME", "SHELL", "LANG", "LANGUAGE", "TERM", "TZ", "TMPDIR",
    "PWD", "COLUMNS", "LINES", "NO_COLOR",
    "PYTHONPATH", "PYTHONUNBUFFERED", "PYTHONDONTWRITEBYTECODE", "PYTHONIOENCODING",
    "VIRTUAL_ENV", "DOCKER_HOST", "DOCKER_CONTEXT", "DOCKER_CERT_PATH", "DOCKER_TLS_VERIFY",
})
BASE_PREFIXES = ("LC_", "OPENBLAS_", "OMP_", "MKL_", "AUTOPILOT_DEMO_")
ENDPOINT_BASE = frozenset({
    "LD_LIBRARY_PATH", "CUDA_VISIBLE_DEVICES", "CUDA_DEVICE_ORDER", "CUDA_HOME",
    "NVIDIA_VISIBLE_DEVICES", "NVIDIA_DRIVER_CAPABILITIES", "HIP_VISIBLE_DEVICES",
    "ROCR_VISIBLE_DEVICES", "HF_HOME", "HF_HUB_CACHE", "HF_HUB_OFFLINE", "XDG_CACHE_HOME",
})
_OWN_PREFIX = "AUTOPILOT_NOTIFY_"


def passed(preset: Preset, role: Role) -> frozenset[str]:
    """Names the preset declares for this role (``pass_env``; the provider's key for
    the harness), given besides the base."""
    if role == "harness":
        names = list(preset.harness.pass_env)
        if preset.endpoint.key_env():
            names.append(preset.endpoint.key_env())
    elif role == "grader":
        names = list(preset.grader.pass_env)
    else:
        names = list(preset.endpoint.pass_env)
    return frozenset(names)


def allowed(name: str, role: Role, declared: frozenset[str]) -> bool:
    """Whether ``role`` inherits ``name``: declared by the preset, or in the base."""
    if name in declared:
        return True
    if name.startswith(_OWN_PREFIX):
        return False
    return name in BASE or name.startswith(BASE_PREFIXES) or (
        role == "endpoint" and name in ENDPOINT_BASE)


def child_env(preset: Preset, role: Role,
              environ: Mapping[str, str] | None = None) -> dict[str, str]:
    """The environment ``role`` inherits (before the autopilot adds its own variables)."""
    environ = os.environ if environ is None else environ
    declared = passed(preset, role)
    return {k: v for k, v in environ.items() if allowed(k, role, declared)}


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


def redactor(preset: Preset) -> Redactor:
    """What every exit (log, report, board, publish, served page) redacts: the preset's
    secret values in every encoded form (autopilot.logsetup.encoded_forms)."""
    return Redactor(secret_values(preset))


def secret_values(preset: Preset) -> list[str]:
    """Values of the env vars the preset names as secret (never logged anywhere)."""
    names = list(preset.preflight.secrets)
    if preset.endpoint.key_env():
        names.append(preset.endpoint.key_env())
    names += [arm.route.api_key_env for arm in preset.arms if arm.route and arm.route.api_key_env]
    # A notification URL is a credential too (an ntfy topic, a webhook path).
    return [os.environ[name] for name in names if os.environ.get(name)] + [
        *preset.notify.urls, *urls_from_env()]
