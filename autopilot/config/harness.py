"""How a cell's harness is run (``[harness]``) and watched (``[watchdog]``).

Part of the configuration schema (autopilot.config re-exports every name); the code
that runs and watches an attempt is in autopilot.cell.
"""

from __future__ import annotations

import re
from typing import Literal

from pydantic import Field, field_validator, model_validator

from autopilot.config.base import Frozen as _Frozen
from autopilot.config.matrix import Argv


class TerminalRow(_Frozen):
    """A transcript row that says the harness's work is done (e.g. ``finish_reason``
    = ``stop``): with the process still alive after the grace, a hung teardown."""

    field: str
    """The row's key to read (a dotted path into the JSON row)."""
    values: list[str]
    """The values of that key that mean the work is done."""


class Harness(_Frozen):
    """The program each cell runs: one process per attempt, its files and its user."""

    argv: Argv
    """The harness's command line, a list of templates (never a shell string); an inner
    list is an optional group that drops out where a placeholder in it is empty."""
    cwd: str | None = None
    """The harness's working directory (a template; default: the supervisor's)."""
    env: dict[str, str] = Field(default_factory=dict)
    """Extra environment of the harness (templates; ``{api_key}`` may be used only here)."""
    pass_env: list[str] = Field(default_factory=list)
    """Variables withheld from children by default (credential-like names, the
    autopilot's own notify config: autopilot.cell.childenv) that the harness does need."""
    output_dir: str = "{state_dir}/cells/{cell}"
    """Where a cell's outputs land (a template): moved aside per attempt, graded after."""
    transcript: str = "{output_dir}/transcript.jsonl"
    """The harness's JSONL transcript (a template): its growth is progress."""
    completion: list[str] = Field(default_factory=lambda: ["{output_dir}/summary.json"])
    """Files whose presence says the harness finished its work (templates)."""
    summary: str = "{output_dir}/summary.json"
    """The harness's own summary (a template): token counts and the finish reason."""
    wall_budget_secs: float = Field(default=3000, gt=0)
    """A cell's wall budget; its deadline is this plus ``watchdog.deadline_overhead_secs``,
    never over ``watchdog.deadline_cap_secs``."""
    items: str = ""
    """A JSON file (a template) where a harness that runs many items (an Inspect task's
    samples) keeps ``{"total", "done", "reused"}`` current: an attempt cut before all
    were done is INVALID(interrupted), resumed, never the model's FAIL, and the wall
    budget can scale with the count (``item_budget_secs``). "": a cell is one item."""
    item_budget_secs: float = Field(default=0, ge=0)
    """With ``items``: a cell's wall budget is this per item still to run (never below
    ``wall_budget_secs``; a task's own ``wall_budget_secs`` replaces it). 0: fixed."""
    sandbox_container: str = ""
    """The name of the Docker container the harness runs its model's commands in (a
    template, e.g. MMBT's ``bench-sandbox-{cell}``): removed, if it is this run's, when
    the attempt ends, at start-up and in ``cleanup``. "": none."""
    scratch_dirs: list[str] = Field(default_factory=list)
    """Directories emptied before each attempt (templates; each must stay inside the
    run's roots)."""
    scratch_remove_image: str = ""
    """An image with find and rm on the sandboxes' Docker daemon: a scratch dir holding
    files the autopilot cannot remove (a root-owned sandbox's) is emptied by a
    throwaway container of it that mounts exactly that dir (never sudo). "": not tried."""
    compose_projects: str = ""
    """A file (template) where the harness lists the Docker Compose projects it started,
    one per line (Inspect's sandboxes): at an attempt's end, at start-up and in
    ``cleanup`` their containers and networks are removed. "": none."""
    compose_project_pattern: str = r"^inspect-[a-z\d\-_]*-i[a-z\d]{6,}$"
    """Only listed project names matching this regular expression are removed (default:
    the names Inspect gives its projects)."""
    terminal_row: TerminalRow | None = None
    """A transcript row that says the work is done (``[harness.terminal_row]``)."""
    max_context: int = Field(default=0, ge=0)
    """The most a request of the harness may ask for, prompt + max_tokens (0: unknown):
    preflight refuses an endpoint that cannot serve it (vLLM's max_model_len)."""
    user: Literal["auto", "same", "cell"] = "auto"
    """Who a harness (and its grader) runs as: "cell", a uid of its own per live cell
    from ``uids`` (needs root); "same", the supervisor's user; "auto", "cell" wherever it
    can be had here, else "same", saying why."""
    uids: tuple[int, int] = (61184, 65519)
    """The [first, last] uids a "cell" user is drawn from (default: systemd's
    DynamicUser= range; gid = uid)."""
    groups: tuple[str, ...] = ()
    """A cell user's only supplementary groups, e.g. ``["docker"]``."""

    @field_validator("uids")
    @classmethod
    def _uids(cls, v: tuple[int, int]) -> tuple[int, int]:
        first, last = v
        if not 1000 <= first <= last < 2**31 - 1:
            raise ValueError("expected [first, last] with 1000 <= first <= last")
        return v

    @field_validator("argv")
    @classmethod
    def _argv(cls, v: Argv) -> Argv:
        if not v or not isinstance(v[0], str):
            raise ValueError("argv must start with the program (a string)")
        return v

    @field_validator("compose_project_pattern")
    @classmethod
    def _pattern(cls, v: str) -> str:
        try:
            re.compile(v)
        except re.error as e:
            raise ValueError(f"not a regular expression ({e})") from None
        if not v or re.fullmatch(v, ""):  # "" or ".*" would take any project listed
            raise ValueError("must not match every name (an empty name included)")
        return v


class Watchdog(_Frozen):
    """The tiers that watch every attempt: no progress for ``warn_secs`` warns, for
    ``probe_secs`` probes the endpoint, for ``kill_secs`` kills; a frozen transcript is
    killed after ``stuck_secs`` whatever else moves. In the supervisor's environment,
    ``AUTOPILOT_STALL_{WARN,PROBE,KILL,GRACE}_S`` override the tiers and the teardown
    grace."""

    poll_secs: float = Field(default=2.0, gt=0)
    """How often each attempt's progress is read."""
    warn_secs: float = Field(default=90, gt=0)
    """No progress this long: WARN (said, nothing done)."""
    probe_secs: float = Field(default=180, gt=0)
    """No progress this long: PROBE the endpoint (a dead endpoint is restarted)."""
    kill_secs: float = Field(default=300, gt=0)
    """No progress this long: KILL the attempt's process tree (INVALID(stall))."""
    stuck_secs: float = Field(default=1200, gt=0)
    """The transcript has not grown this long: KILL, even while the endpoint is busy."""
    teardown_grace_secs: float = Field(default=10, ge=0)
    """The harness's work is done (completion files, terminal row) but its process lives
    on this long: killed as a hung teardown, its outputs graded (teardown-masked)."""
    kill_grace_secs: float = Field(default=5, ge=0)
    """Between SIGTERM and SIGKILL when a process tree is killed."""
    deadline_overhead_secs: float = Field(default=600, ge=0)
    """Added to the wall budget for start-up and teardown before the hard deadline."""
    deadline_cap_secs: float = Field(default=3600, gt=0)
    """The hard deadline is never later than this after the attempt starts."""
    substance: bool = False
    """Read the transcript for substance (liveness is not progress): a scroll loop or a
    runaway generation is a WARN."""
    substance_kill: bool = False
    """A substance finding KILLs the attempt (INVALID(stall) with the reason)."""
    scroll_loop_streak: int = Field(default=30, ge=2)
    """This many identical tool calls in a row (digit runs ignored) is a scroll loop."""
    runaway_secs: float = Field(default=0, ge=0)
    """A transcript stale this long after a model response is a runaway generation
    (0: off)."""
    tool_field: str = "tool_calls"
    """The transcript row's key that holds tool calls ("openai" rows)."""
    role_field: str = "role"
    """The transcript row's key that holds the speaker's role ("openai" rows)."""
    transcript_schema: Literal["openai", "mmbt"] = "openai"
    """The rows' shape: "openai" (role / tool_calls messages) or "mmbt" (the MMBT
    harness's ``{"type": "model"}`` and ``{"type": "tool", "args": {...}}`` rows)."""
    endpoint_progress: bool = True
    """The endpoint decoding tokens (llama-server /slots, vLLM /metrics) counts as
    progress, so a long think turn is not killed as a stall."""

    @model_validator(mode="after")
    def _tiers(self) -> Watchdog:
        if not self.warn_secs <= self.probe_secs <= self.kill_secs:
            raise ValueError("expected warn_secs <= probe_secs <= kill_secs")
        return self
