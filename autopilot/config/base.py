"""The base every configuration object shares: frozen, no unknown keys, one id grammar
(autopilot.config and autopilot.config.endpoint build on it)."""

from __future__ import annotations

import re
from typing import NamedTuple

from pydantic import BaseModel, ConfigDict

# One id grammar for task ids, arm labels and preset names, checked with fullmatch (a
# trailing newline slips past ``re.match(...$)``): a letter or digit first (no leading
# '-' to read as a flag, no '.' or '..' to climb a path), then letters, digits, '.', '_',
# '-'. Ids are rendered into paths that get deleted; this keeps each one a plain name.
NAME_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]*")


class Frozen(BaseModel):
    # A field's docstring is its description: in `autopilot schema`, in the generated
    # option reference (docs/reference.md) and in an editor's TOML completion; read
    # there, not at every start-up (autopilot.fielddocs).
    # inf and nan are no setting: a lease or a timeout of 1e309 (JSON's inf) would wait
    # for ever, and nan compares false with every bound
    model_config = ConfigDict(frozen=True, extra="forbid", allow_inf_nan=False)


def check_name(value: str, what: str) -> str:
    if not NAME_RE.fullmatch(value) or ".." in value:
        raise ValueError(f"{what} {value!r} must start with a letter or digit and use only "
                         "letters, digits, '.', '_' and '-' (no '..')")
    return value


class EnvRef(NamedTuple):
    """One ``${NAME:-default}`` expansion made while loading: what set a value."""

    name: str
    value: str
    defaulted: bool  # NAME was unset; the preset's default was used
    key: str = ""  # the dotted key whose value it expanded in (grader.on_unavailable)

    def describe(self) -> str:
        if self.defaulted:
            return f"${{{self.name}}} is not set (or empty); the default {self.value!r} was used"
        return f"from ${{{self.name}}}={self.value!r}"
