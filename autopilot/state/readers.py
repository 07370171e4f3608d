"""Reading a run back from its state dir: the plan record, and the preset and plan of a
run, for every verb that is not the run itself (validate, report, summarize, board, the
dashboard and its server; cleanup and regrade through ``load_trusted``).

One module, so that the cli, the board and the dashboard read a state dir the same way
and none of them imports another to do it.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from autopilot.config import NAME_RE, Preset
from autopilot.errors import ConfigError, StateDirError
from autopilot.loader import load_preset
from autopilot.plan import Plan
from autopilot.state import resolved
from autopilot.state.fsguard import template_problems
from autopilot.state.statedir import check_trusted
from autopilot.state.untrusted import owner_of, state_json


def unreadable(state_dir: Path) -> str | None:
    """Why a run that is there cannot be read (its state dir is private to its owner),
    or None: "no run yet" would send the user looking in the wrong place."""
    for path in (state_dir, state_dir / "status.json", state_dir / "plan.json"):
        try:
            if path.is_dir():
                os.listdir(path)
            elif path.exists():
                path.open("rb").close()
        except PermissionError:
            owner = path.stat().st_uid if path.exists() else "?"
            return (f"{path}: permission denied (state files are private to their owner, "
                    f"uid {owner}: run as that user or root)")
    return None


@dataclass(frozen=True)
class PlanRecord:
    """plan.json as the readers use it (autopilot.run.recovery.record_plan writes it). A
    state file: each field shape-checked, a field of the wrong shape read as absent, so
    it can only make a reader refuse (a digest that matches nothing), never choose."""

    preset: str | None = None  # the preset's name
    preset_path: str | None = None
    overlays: tuple[str, ...] = ()  # its config_path: one path or a list
    target_n: int | None = None
    resolved_sha256: str | None = None  # where present: the preset the run resolved
    tasks: tuple[str, ...] | None = None
    arms: tuple[str, ...] | None = None

    @classmethod
    def of(cls, doc: Any) -> PlanRecord | None:
        if not isinstance(doc, dict):
            return None
        target_n, digest = doc.get("target_n"), doc.get("resolved_sha256")
        return cls(
            preset=_text(doc.get("preset")), preset_path=_text(doc.get("preset_path")),
            overlays=tuple(overlays_of(doc.get("config_path"))),
            target_n=target_n if type(target_n) is int and target_n > 0 else None,
            # present but no text: a digest nothing matches (refused), not "none recorded"
            resolved_sha256=(digest if isinstance(digest, str) else "")
            if "resolved_sha256" in doc else None,
            tasks=_texts(doc.get("tasks")), arms=_texts(doc.get("arms")))


def _text(value: Any) -> str | None:
    return value if isinstance(value, str) and value else None


def _texts(value: Any) -> tuple[str, ...] | None:
    if isinstance(value, list) and all(isinstance(x, str) for x in value):
        return tuple(value)
    return None


def plan_record(state_dir: Path) -> PlanRecord:
    """plan.json, or ConfigError saying why there is none to read."""
    rec = PlanRecord.of(state_json(state_dir, "plan.json"))
    if rec is None:
        denied = unreadable(state_dir)
        raise ConfigError(denied or f"{state_dir}: no plan.json here (not a state dir of a run)")
    return rec


def overlays_of(recorded: Any) -> list[str]:
    """plan.json's ``config_path`` (a state file: shape-checked): one path or a list."""
    if isinstance(recorded, str) and recorded:
        return [recorded]
    if isinstance(recorded, list) and all(isinstance(x, str) and x for x in recorded):
        return list(recorded)
    return []


def load_recorded(state_dir: Path) -> tuple[Preset, Plan]:
    """The preset and plan a state dir was run with, for read-only verbs: the resolved
    preset the run recorded (autopilot.state.resolved), never the reader's environment
    or a preset file plan.json names."""
    rec = plan_record(state_dir)
    if rec.resolved_sha256 is not None:
        preset = resolved.load(state_dir, rec.resolved_sha256)
    else:
        preset = _unrecorded(state_dir, rec)
    return preset, _plan(preset, rec)


def _plan(preset: Preset, rec: PlanRecord) -> Plan:
    return Plan(preset, rec.target_n or preset.run.target_n or 1)


def _unrecorded(state_dir: Path, rec: PlanRecord) -> Preset:
    """A run from before runs recorded their preset: loaded again, as then, but only
    for the state dir's owner (another user's plan.json would choose the preset and
    this shell's environment would be expanded into it)."""
    owner = owner_of(state_dir)
    if owner != os.geteuid():
        raise ConfigError(f"{state_dir}: this run recorded no resolved preset ({resolved.FILE}"
                          f"; made before runs did) and is uid {owner}'s: read it as that "
                          "user, or resume it once to write the record")
    preset_ref = rec.preset_path or rec.preset
    if rec.preset_path and not Path(rec.preset_path).is_file():
        preset_ref = rec.preset
    return load_preset(str(preset_ref), overlay=list(rec.overlays),
                       checks=(template_problems,))


def record_problem(state_dir: Path) -> str | None:
    """Why the board may not read this state dir (None: it may): it must pass the
    ownership checks and hold a resolved preset matching its plan.json."""
    try:
        check_trusted(state_dir)
        rec = plan_record(state_dir)
        if rec.resolved_sha256 is None:
            return (f"{state_dir}: no resolved preset recorded ({resolved.FILE}); "
                    "resume the run once to write it")
        resolved.load(state_dir, rec.resolved_sha256)
    except (ConfigError, StateDirError) as e:
        return str(e)
    return None


def load_trusted(state_dir: Path, ref: str | None,
                 overlay: str | list[str] | None) -> tuple[Preset, Plan]:
    """The preset and plan for a verb that deletes or runs commands (cleanup, regrade):
    the state dir must pass the ownership checks, the preset comes from the user (or the
    recorded *name* among the preset dirs), and its plan must be the one recorded."""
    check_trusted(state_dir)
    rec = plan_record(state_dir)
    if not ref and not overlay and rec.resolved_sha256 is not None:
        # The run's own record, in a state dir that passed the checks: what it ran with,
        # whatever this shell's environment says.
        preset = resolved.load(state_dir, rec.resolved_sha256)
        return preset, _plan(preset, rec)
    if not ref:
        name = rec.preset
        if name is None or not NAME_RE.fullmatch(name):
            raise ConfigError(f"{state_dir}/plan.json: recorded preset {name!r} is not a "
                              "preset name; pass --preset")
        ref = name
    preset = load_preset(ref, overlay=overlay, checks=(template_problems,))
    plan = _plan(preset, rec)
    # The cells must be the run's (a fixed grader may change the identity: that is what
    # regrade is for), so the recorded tasks and arms are compared, not the identity.
    if (rec.tasks, rec.arms) != (tuple(task.id for task in preset.tasks),
                                 tuple(arm.label for arm in preset.arms)):
        given = [f"--config {overlay_path!r}" for overlay_path in rec.overlays]
        if rec.preset_path is not None:
            given.insert(0, f"--preset {rec.preset_path!r}")
        hint = " ".join(given)
        raise ConfigError(f"{state_dir}: preset {ref!r} does not give this run's tasks and "
                          "arms: pass the --preset and --config the run was made with"
                          + (f" (plan.json says {hint}; check them first)" if hint else ""))
    return preset, plan
