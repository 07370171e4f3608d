"""Admission: the checks a preset must pass before a run (or a campaign entry) may be
made of it, handed to the loader so that a problem is still reported against the file,
variable or flag its key came from.

They need the rest of the house, which the loader does not import: that every
destructive path template stays inside the run (``state.fsguard``), and that the
backend can carry the settings out (a Ray node without shared storage must be able to
ship its outputs back).
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from typing import Any

from autopilot.backends.base import backend_class
from autopilot.config import Preset
from autopilot.loader import Check, load_preset
from autopilot.state.fsguard import template_problems


def backend_problems(preset: Preset) -> list[tuple[str, str]]:
    return backend_class(preset.backend.kind).load_problems(preset)


CHECKS: tuple[Check, ...] = (template_problems, backend_problems)


def load_admitted(preset: str, *, overlay: str | Sequence[str] | None = None,
                  flags: Mapping[str, Any] | None = None) -> Preset:
    """The preset a run is made of: this process's environment is its override layer
    (``loader.ENV_KEYS``) and every admission check has passed."""
    return load_preset(preset, overlay=overlay, flags=flags, environ=os.environ,
                       checks=CHECKS)
