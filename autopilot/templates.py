"""``{name}`` templates: argv lists and paths filled per cell.

An argv element that is itself a list is an *optional group*, dropped when any of its
placeholders is unset or renders empty (e.g. ``["--input-mount", "{input_dir}"]`` for the
tasks that have no input mount). ``check_templates`` proves, at load time and for every
task x arm, that each placeholder will be known, so a typo fails in seconds rather than
hours into a run.
"""

from __future__ import annotations

import string
from collections.abc import Iterable, Mapping

from autopilot.config import BUILTIN_PLACEHOLDERS, Argv, Preset, Task


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
        names = [name for part in item for name in placeholders(part)]
        if all(ctx.get(name) for name in names):
            out.extend(render(part, ctx) for part in item)
    return out


def _template_sites(preset: Preset, task: Task) -> Iterable[tuple[str, str, bool]]:
    """(key path, template, optional) for every template in the preset, for one task."""

    def argv_sites(prefix: str, argv: Argv) -> Iterable[tuple[str, str, bool]]:
        for i, item in enumerate(argv):
            if isinstance(item, str):
                yield f"{prefix}[{i}]", item, False
            else:
                for j, part in enumerate(item):
                    yield f"{prefix}[{i}][{j}]", part, True

    yield from argv_sites("harness.argv", preset.harness.argv)
    i = next(k for k, each in enumerate(preset.tasks) if each.id == task.id)
    if task.grader_argv is not None:
        yield from argv_sites(f"tasks[{i}].grader_argv", task.grader_argv)
    else:
        yield from argv_sites("grader.argv", preset.grader.argv)
    for j, required in enumerate(task.grader_requires):
        yield f"tasks[{i}].grader_requires[{j}]", required, False
    yield from argv_sites("preflight.benchmark_files", preset.preflight.benchmark_files)
    for key in ("output_dir", "transcript", "summary", "sandbox_container"):
        yield f"harness.{key}", getattr(preset.harness, key), False
    if preset.harness.cwd:
        yield "harness.cwd", preset.harness.cwd, False
    for k, v in preset.harness.env.items():
        yield f"harness.env.{k}", v, False
    for i, completion in enumerate(preset.harness.completion):
        yield f"harness.completion[{i}]", completion, False
    for i, completion in enumerate(preset.harness.scratch_dirs):
        yield f"harness.scratch_dirs[{i}]", completion, False
    yield "grader.grade_file", preset.grader.grade_file, False
    if preset.grader.cwd:
        yield "grader.cwd", preset.grader.cwd, False
    if preset.grader.extract:
        yield "grader.extract.archive", preset.grader.extract.archive, False
        yield "grader.extract.into", preset.grader.extract.into, False
    if preset.trust.tokens:
        yield "trust.tokens.file", preset.trust.tokens.file, False
    if preset.trust.finish:
        yield "trust.finish.file", preset.trust.finish.file, False
    for i, f in enumerate(preset.preflight.files):
        yield f"preflight.files[{i}]", f, False
    for f in preset.preflight.pins:
        yield f"preflight.pins.{f}", f, False
    for i, chk in enumerate(preset.trust.arm_checks):
        yield f"trust.arm_checks[{i}].file", chk.file, False
        yield f"trust.arm_checks[{i}].expect", chk.expect, False


def check_templates(preset: Preset) -> None:
    """Every placeholder of every template must be known for every task x arm."""
    for task in preset.tasks:
        for arm in preset.arms:
            known = BUILTIN_PLACEHOLDERS | set(preset.vars) | set(task.vars) | set(arm.vars)
            for path, template, optional in _template_sites(preset, task):
                try:
                    names = placeholders(template)
                except ValueError as e:
                    raise TemplateError(path, str(e)) from None
                if "api_key" in names and not path.startswith("harness.env"):
                    # An argv is readable by every local user (ps, /proc/<pid>/cmdline);
                    # the harness's environment is not.
                    raise TemplateError(path, "{api_key} (the attempt's gateway key) may "
                                        "only be used in [harness] env, not here")
                unknown = [name for name in names if name not in known]
                if unknown and not optional:
                    raise TemplateError(
                        path,
                        f"unknown placeholder {{{unknown[0]}}} for task {task.id!r} / arm "
                        f"{arm.label!r} (known: {', '.join(sorted(known))})",
                    )


class TemplateError(Exception):
    """A bad template, with the key path of where it sits in the preset."""

    def __init__(self, path: str, msg: str) -> None:
        super().__init__(msg)
        self.path = path
        self.msg = msg


def grader_argv(preset: Preset, task_id: str) -> Argv:
    """The grader command line of a task: its own, else the preset's."""
    own = preset.task(task_id).grader_argv
    return own if own is not None else preset.grader.argv
