"""``autopilot init NAME``: a starter preset, its harness and its grader (docs/presets.md's
"Writing your own preset" example, which a test runs as written)."""

from __future__ import annotations

from importlib.resources import files
from pathlib import Path

from autopilot.config import NAME_RE
from autopilot.errors import ConfigError

PLACEHOLDER = "my-bench"
# (template, file written): the harness and grader sit beside the preset, named after it.
FILES = (("preset.toml.in", "{name}.toml"), ("harness.py.in", "{name}_harness.py"),
         ("grader.py.in", "{name}_grader.py"))


def starter_files(name: str) -> dict[str, str]:
    """File name -> text of the starter for ``name``."""
    return {out.format(name=name): files(__package__).joinpath(tmpl).read_text()
            .replace(PLACEHOLDER, name) for tmpl, out in FILES}


def write_starter(name: str, directory: Path) -> list[Path]:
    """Write the starter into ``directory``; refuses (nothing written) if the name is not
    a plain name or any of the files exists."""
    if not NAME_RE.fullmatch(name) or ".." in name:
        raise ConfigError(f"init: {name!r} is not a preset name (a letter or digit first, "
                          "then letters, digits, '.', '_', '-')")
    if not directory.is_dir():
        raise ConfigError(f"init: {directory} is not a directory")
    texts = starter_files(name)
    clash = [directory / f for f in texts if (directory / f).exists()]
    if clash:
        raise ConfigError(f"init: {clash[0]} exists; nothing written (choose another name)")
    written = []
    for fname, text in texts.items():
        path = directory / fname
        path.write_text(text)
        written.append(path)
    return written
