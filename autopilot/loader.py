"""Finding presets, reading TOML/JSON, ``extends``, ``${ENV:-default}``, overlay merge,
and validation into a frozen ``Preset`` with one-line errors.

Four layers, later wins: the preset TOML, an optional ``--config`` overlay (TOML or
JSON, deep-merged: tables merge, everything else is replaced), the environment's
overrides (``AUTOPILOT_STALL_*``, when the caller hands an environment), then
command-line flags. Every error names the file, variable or flag the offending key came
from, the key path, and what was expected.

The loader only parses and validates. Checks that need the rest of the house (that a
destructive path template stays inside the run, that the backend can carry the settings
out) are handed in by the caller as ``checks`` (``autopilot.run.admission`` for a run),
so this module imports nothing above the foundations.
"""

from __future__ import annotations

import difflib
import json
import os
import re
import tomllib
import typing
from collections.abc import Callable, Iterable, Mapping, Sequence
from importlib import resources
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ValidationError

from autopilot.config import ENGINE_MODELS, NAME_RE, PRESETS_ENV, EnvRef, Preset
from autopilot.errors import ConfigError
from autopilot.templates import TemplateError, check_templates

# A check handed to load_preset: (config key, why) for each problem, the first reported.
Check = Callable[[Preset], list[tuple[str, str]]]

# The environment's layer: a variable -> the key it sets. It lands in the preset, so the
# value in force is the one status.json, the resolved record and every Ray node see.
ENV_KEYS: dict[str, tuple[str, str]] = {
    "AUTOPILOT_STALL_WARN_S": ("watchdog", "warn_secs"),
    "AUTOPILOT_STALL_PROBE_S": ("watchdog", "probe_secs"),
    "AUTOPILOT_STALL_KILL_S": ("watchdog", "kill_secs"),
    "AUTOPILOT_STALL_GRACE_S": ("watchdog", "teardown_grace_secs"),
}


def builtin_presets_dir() -> Path:
    """The shipped presets: ``autopilot.presets`` as installed, or the checkout's
    top-level ``presets/`` when the package is imported from a checkout (``python -m
    autopilot`` in its root: the checkout's ``autopilot/`` shadows the install, and
    ``presets/`` is not inside it)."""
    try:
        return Path(str(resources.files("autopilot.presets")))
    except ModuleNotFoundError:
        return Path(__file__).resolve().parent.parent / "presets"


def preset_dirs() -> list[Path]:
    dirs = []
    if os.environ.get(PRESETS_ENV):
        dirs += [Path(entry) for entry in os.environ[PRESETS_ENV].split(os.pathsep) if entry]
    dirs.append(builtin_presets_dir())
    return dirs


def find_preset(name: str) -> Path:
    """``NAME`` among the preset dirs, or a path to a ``.toml`` file."""
    if name.endswith(".toml") or os.sep in name:
        path = Path(name)
        if not path.is_file():
            raise ConfigError(f"preset file {name}: not found")
        return path
    if not NAME_RE.fullmatch(name.removeprefix("_")) or ".." in name:  # "_base": see below
        raise ConfigError(f"--preset {name!r}: not a preset name or a .toml path")
    for folder in preset_dirs():
        candidate = folder / f"{name}.toml"
        if candidate.is_file():
            return candidate
    available = ", ".join(sorted(known for known, _ in list_presets())) or "none"
    raise ConfigError(f"--preset {name!r}: unknown preset (available: {available})")


def list_presets() -> list[tuple[str, str]]:
    """(name, one-line description) of every preset found, first dir wins."""
    found: dict[str, str] = {}
    for folder in preset_dirs():
        if not folder.is_dir():
            continue
        for path in sorted(folder.glob("*.toml")):
            if path.stem in found or path.stem.startswith("_"):
                continue  # "_name": a base for `extends`, not runnable by itself
            try:
                desc = str(_read_doc(path).get("description", ""))
            except ConfigError as e:
                desc = f"(unreadable: {e})"
            found[path.stem] = desc.splitlines()[0] if desc else ""
    return sorted(found.items())


def _read_with_extends(path: Path, seen: tuple[Path, ...] = ()) -> dict[str, Any]:
    """A preset may say ``extends = "NAME"``: the named preset is loaded first and this
    one deep-merged over it (shared task tables live in one file)."""
    doc = _read_doc(path)
    base = doc.pop("extends", None)
    if base is None:
        return doc
    if not isinstance(base, str):
        raise ConfigError(f"{path}: extends: expected a preset name")
    try:
        base_path = find_preset(base)
    except ConfigError as e:  # say which file holds the bad extends
        raise ConfigError(f"{path}: extends = {base!r}: {e}") from None
    if base_path.resolve() in seen:
        raise ConfigError(f"{path}: extends: cycle through {base_path}")
    return deep_merge(_read_with_extends(base_path, (*seen, path.resolve())), doc)


def _read_doc(path: Path) -> dict[str, Any]:
    try:
        raw = path.read_bytes()
    except OSError as e:
        raise ConfigError(f"{path}: cannot read ({e.strerror})") from None
    try:
        doc = json.loads(raw) if path.suffix == ".json" else tomllib.loads(raw.decode("utf-8"))
    except (tomllib.TOMLDecodeError, json.JSONDecodeError, UnicodeDecodeError) as e:
        kind = "JSON" if path.suffix == ".json" else "TOML"
        raise ConfigError(f"{path}: malformed {kind}: {e}") from None
    if not isinstance(doc, dict):
        raise ConfigError(f"{path}: expected a table at the top level")
    return doc


_ENV_REF = re.compile(r"\$\{([A-Za-z_][A-Za-z0-9_]*)(?::-([^}]*))?\}")


def expand_env(value: Any, where: str = "", refs: list[EnvRef] | None = None) -> Any:
    """``${NAME}`` / ``${NAME:-default}`` in string values, so machine-specific paths,
    images and ports stay out of presets. An unset variable without a default is an
    error naming it (a silently empty path would fail much later). Each expansion is
    recorded in ``refs``, so preflight can say which variable set a missing path."""
    if isinstance(value, str):
        def repl(match: re.Match[str]) -> str:
            name, default = match.group(1), match.group(2)
            # Shell semantics: `:-` also replaces a variable that is set but empty (an
            # exported BENCH_DIR= must not turn every path into /tooling/...).
            if os.environ.get(name):
                if refs is not None:
                    refs.append(EnvRef(name, os.environ[name], False, where))
                return os.environ[name]
            if default is not None:
                if refs is not None:
                    refs.append(EnvRef(name, default, True, where))
                return default
            how = "is set but empty" if name in os.environ else "is not set"
            raise TemplateError(where, f"${{{name}}} {how} and has no default")
        return _ENV_REF.sub(repl, value)
    if isinstance(value, dict):
        return {k: expand_env(v, f"{where}.{k}" if where else str(k), refs)
                for k, v in value.items()}
    if isinstance(value, list):
        return [expand_env(v, f"{where}[{i}]", refs) for i, v in enumerate(value)]
    return value


def deep_merge(base: Mapping[str, Any], over: Mapping[str, Any]) -> dict[str, Any]:
    out = dict(base)
    for k, v in over.items():
        if isinstance(v, Mapping) and isinstance(out.get(k), Mapping):
            out[k] = deep_merge(out[k], v)
        else:
            out[k] = v
    return out


def _leaf_paths(doc: Mapping[str, Any], prefix: tuple[str, ...] = ()) -> set[tuple[str, ...]]:
    paths = set()
    for k, v in doc.items():
        path = (*prefix, str(k))
        paths.add(path)
        if isinstance(v, Mapping):
            paths |= _leaf_paths(v, path)
    return paths


def _model_at(loc: tuple[Any, ...]) -> type[BaseModel] | None:
    """The pydantic model that holds the last key of ``loc`` (for suggestions)."""
    from autopilot.config import ENGINE_MODELS

    model: Any = Preset
    for part in loc[:-1]:
        if isinstance(part, int):
            continue
        if model is None:  # inside the endpoint union: the engine tag names the model
            model = ENGINE_MODELS.get(str(part))
            if model is None:
                return None
            continue
        field = model.model_fields.get(str(part))
        if field is None:
            return None
        model = _inner_model(field.annotation)
    return model if isinstance(model, type) and issubclass(model, BaseModel) else None


def _inner_model(annotation: Any) -> Any:
    """The model inside ``list[X]``, ``X | None``, ``dict[str, X]``; None for a union of
    several models (the endpoint: the tag in the loc picks one)."""
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return annotation
    found = [_inner_model(arg) for arg in typing.get_args(annotation)]
    found = [model for model in found if model is not None]
    return found[0] if len(found) == 1 else None


def did_you_mean(loc: tuple[Any, ...]) -> str:
    """`` (did you mean 'argv'?)`` for a mistyped key, or ``[run] concurrency`` for a
    key written in the wrong table; empty when nothing is close."""
    key = str(loc[-1])
    model = _model_at(loc)
    if model is not None:
        close = difflib.get_close_matches(key, list(model.model_fields), n=1, cutoff=0.6)
        if close:
            return f" (did you mean {close[0]!r}?)"
    if len(loc) == 1:  # a top-level key that belongs in a table
        for name, field in Preset.model_fields.items():
            inner = _inner_model(field.annotation)
            if inner is not None and key in inner.model_fields:
                return f" (did you mean [{name}] {key}?)"
    return ""


def _fmt_loc(loc: Iterable[Any]) -> str:
    out = ""
    for part in loc:
        if isinstance(part, int):
            out += f"[{part}]"
        elif part in ENGINE_MODELS and out == "endpoint":
            continue  # the discriminator tag pydantic inserts; not a key the user wrote
        else:
            out += ("." if out else "") + str(part)
    return out


def load_preset(
    preset: str,
    *,
    overlay: str | Sequence[str] | None = None,
    flags: Mapping[str, Any] | None = None,
    environ: Mapping[str, str] | None = None,
    checks: Sequence[Check] = (),
) -> Preset:
    """Load, merge and validate. ``overlay``: one ``--config`` file or several, merged
    in order (a later one wins); ``environ``: the environment whose ``ENV_KEYS`` are a
    layer (None: none is); ``checks``: run after validation, in order. Raises
    ConfigError with a one-line message."""
    preset_path = find_preset(preset)
    doc = _read_with_extends(preset_path)
    layers: list[tuple[Path, set[tuple[str, ...]]]] = []  # each overlay and its keys
    for given in ([overlay] if isinstance(overlay, str) else list(overlay or [])):
        overlay_path = Path(given)
        if not overlay_path.is_file():
            what = ("not a file" if overlay_path.exists() else "not found") if given \
                else "empty (a file's path is expected)"
            raise ConfigError(f"--config {given!r}: {what}")
        over = _read_doc(overlay_path)
        layers.append((overlay_path, _leaf_paths(over)))
        doc = deep_merge(doc, over)
    doc.setdefault("name", preset_path.stem)
    env_keys: dict[tuple[str, ...], str] = {}
    for var, (table, key) in ENV_KEYS.items():
        if environ is not None and environ.get(var, "") != "":
            section = dict(doc.get(table, {})) if isinstance(doc.get(table), Mapping) else {}
            section[key] = environ[var]  # a string: pydantic parses it as the field's type
            doc[table] = section
            env_keys[(table, key)] = var
    flag_keys: set[tuple[str, ...]] = set()
    if flags:
        run = dict(doc.get("run", {})) if isinstance(doc.get("run"), Mapping) else {}
        for k, v in flags.items():
            if v is not None:
                run[k] = v
                flag_keys.add(("run", k))
        doc["run"] = run

    def origin(loc: tuple[Any, ...]) -> str:
        keys = tuple(str(part) for part in loc if not isinstance(part, int))
        for i in range(len(keys), 0, -1):
            if keys[:i] in flag_keys:
                return "--" + keys[-1].replace("_", "-")
            if keys[:i] in env_keys:
                return env_keys[keys[:i]]
            for path, keys_of in reversed(layers):  # the last file to set it
                if keys[:i] in keys_of:
                    return str(path)
        # A table's own check (watchdog's tier order) over keys the environment set.
        under = [var for key, var in env_keys.items() if key[:len(keys)] == keys and keys]
        return f"{preset_path} with {', '.join(under)}" if under else str(preset_path)

    refs: list[EnvRef] = []
    try:
        doc = expand_env(doc, refs=refs)
    except TemplateError as e:
        path = tuple(re.sub(r"\[\d+\]", "", e.path).split("."))
        raise ConfigError(f"{origin(path)}: {e.path}: {e.msg}") from None

    try:
        result = Preset.model_validate(doc)
    except ValidationError as e:
        # Every error at once (one fix-and-retry per typo is a slow hour), one line.
        msgs = []
        for err in e.errors():
            loc = tuple(err["loc"])
            msg = err["msg"]
            if err["type"] == "extra_forbidden":
                msg = "unknown key" + did_you_mean(loc)
            elif msg.startswith("Value error, "):
                msg = msg.removeprefix("Value error, ")
            where = _fmt_loc(loc) or "(top level)"
            got = ""
            if err["type"] not in ("extra_forbidden", "missing", "value_error"):
                got = f" (got {err.get('input')!r})"
            source = origin(loc)
            msgs.append(f"{source}: {msg}{got}" if source.startswith("--")
                        else f"{source}: {where}: {msg}{got}")
        raise ConfigError("; ".join(dict.fromkeys(msgs))) from None
    try:
        check_templates(result)
    except TemplateError as e:
        raise ConfigError(f"{origin(tuple(e.path.split('.')))}: {e.path}: {e.msg}") from None
    for run_check in checks:
        problems = run_check(result)
        if problems:
            key, why = problems[0]
            more = f" (and {len(problems) - 1} more)" if len(problems) > 1 else ""
            raise ConfigError(f"{origin(tuple(key.split('[')[0].split('.')))}: {key}: "
                              f"{why}{more}")
    result.set_env_refs(tuple(dict.fromkeys(refs)))
    return result
