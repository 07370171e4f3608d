"""What a run resolved: the preset as the run saw it, kept in its state dir.

A preset is a template of the machine it runs on: ``${BENCH_DIR}`` and its kin are
expanded from the launching shell, overlays are merged, defaults are filled in. A view
that loads the preset again from *its* shell gets another preset (a shell without
``BENCH_DIR`` puts every output somewhere else and calls a COMPLETE run
``missing_output``), and a view over another user's state dir would expand the reader's
environment into a preset that user chose. So at every launch the run writes the
resolved preset here (``preset.resolved.json``: every ``${VAR}`` expanded, every default
filled in, a relative ``cwd`` made absolute, a secret's value replaced by ``${NAME}``,
notification URLs by ``***``) with its sha256 in plan.json, and every later verb reads
this record, never the reader's environment.

The record is a state file: shape-checked by the same validation as a preset, read
through ``autopilot.state.untrusted`` and refused when it does not match plan.json's
digest.
"""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from autopilot.config import EnvRef, Preset
from autopilot.errors import ConfigError
from autopilot.state.fsutil import atomic_write_text
from autopilot.state.untrusted import Refused, owner_of, read_bytes

FILE = "preset.resolved.json"
VERSION = 1
MASK = "***"


def _secret_names(preset: Preset) -> list[str]:
    names = list(preset.preflight.secrets)
    if preset.endpoint.key_env():
        names.append(preset.endpoint.key_env())
    return names


def _masked(value: Any, swaps: list[tuple[str, str]]) -> Any:
    if isinstance(value, str):
        for secret, name in swaps:
            value = value.replace(secret, name)
        return value
    if isinstance(value, dict):
        return {k: _masked(v, swaps) for k, v in value.items()}
    if isinstance(value, list):
        return [_masked(v, swaps) for v in value]
    return value


def document(preset: Preset, environ: dict[str, str] | None = None) -> dict[str, Any]:
    """The record of ``preset``: its full dump with secrets replaced by their names."""
    environ = dict(os.environ) if environ is None else environ
    names = _secret_names(preset)
    values = {ref.value: ref.name for ref in preset.env_refs() if ref.name in names}
    values |= {environ[name]: name for name in names if len(environ.get(name, "")) >= 4}
    # Longest first: a secret that contains another is replaced whole.
    swaps = [(v, f"${{{name}}}") for v, name in sorted(values.items(), key=lambda x: -len(x[0]))
             if v]
    doc = _masked(preset.model_dump(mode="json"), swaps)
    for role in ("harness", "grader"):  # a relative cwd meant the launching shell's
        cwd = doc[role].get("cwd")
        if isinstance(cwd, str) and cwd and not cwd.startswith(("/", "{")):
            doc[role]["cwd"] = os.path.join(os.getcwd(), cwd)
    doc["notify"]["urls"] = [MASK for _ in doc["notify"]["urls"]]  # each a credential
    env = [{"name": ref.name, "value": f"${{{ref.name}}}" if ref.name in names else
            _masked(ref.value, swaps), "defaulted": ref.defaulted, "key": ref.key}
           for ref in preset.env_refs()]
    return {"version": VERSION, "preset": doc, "env": env}


def encode(doc: dict[str, Any]) -> bytes:
    return json.dumps(doc, sort_keys=True, indent=1).encode() + b"\n"


def digest(blob: bytes) -> str:
    return hashlib.sha256(blob).hexdigest()


def leaves(doc: Any, prefix: str = "") -> dict[str, Any]:
    """Dotted key -> value of every leaf (a list is one leaf: its order is its meaning)."""
    if isinstance(doc, dict) and doc:
        out: dict[str, Any] = {}
        for k, v in doc.items():
            out |= leaves(v, f"{prefix}.{k}" if prefix else str(k))
        return out
    return {prefix: doc}


def changes(old: Any, new: dict[str, Any]) -> list[str]:
    """The dotted keys whose value differs between two records' presets."""
    if not isinstance(old, dict) or not isinstance(old.get("preset"), dict):
        return []
    before, after = leaves(old["preset"]), leaves(new["preset"])
    return sorted(k for k in before.keys() | after.keys() if before.get(k) != after.get(k))


def previous(state_dir: Path) -> dict[str, Any] | None:
    try:
        doc = json.loads(read_bytes(state_dir / FILE, owner=owner_of(state_dir)))
    except (OSError, ValueError):
        return None
    return doc if isinstance(doc, dict) else None


def write(state_dir: Path, preset: Preset) -> tuple[str, list[str]]:
    """Write the record; its sha256 and the keys that changed since the last one."""
    doc = document(preset)
    changed = changes(previous(state_dir), doc)
    blob = encode(doc)
    atomic_write_text(state_dir / FILE, blob.decode())
    return digest(blob), changed


def load(state_dir: Path, expected: object) -> Preset:
    """The recorded preset, refused (ConfigError, one line) unless it is there, matches
    plan.json's digest ``expected`` and validates as a preset."""
    path = state_dir / FILE
    try:
        blob = read_bytes(path, owner=owner_of(state_dir))
    except FileNotFoundError:
        raise ConfigError(f"{path}: missing (plan.json names a resolved preset)") from None
    except Refused as e:
        raise ConfigError(f"{path}: refused: {e.strerror}") from None
    except OSError as e:
        raise ConfigError(f"{path}: cannot read ({e.strerror})") from None
    if digest(blob) != expected:
        raise ConfigError(f"{path}: its sha256 is not the one plan.json records (the "
                          "record was changed after the run wrote it); not read")
    try:
        doc = json.loads(blob)
        preset = Preset.model_validate(doc["preset"])
        refs = tuple(EnvRef(str(ref["name"]), str(ref["value"]), bool(ref["defaulted"]),
                            str(ref.get("key", ""))) for ref in doc.get("env", []))
    except ValidationError as e:
        first = e.errors()[0]
        where = ".".join(str(part) for part in first["loc"]) or "(top level)"
        raise ConfigError(f"{path}: not a preset: {where}: {first['msg']}") from None
    except (ValueError, KeyError, TypeError, AttributeError) as e:
        raise ConfigError(f"{path}: malformed record ({type(e).__name__}: {e})") from None
    preset.set_env_refs(refs)
    return preset
