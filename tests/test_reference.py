"""The option reference is the code's: every option described, the generated page and
the JSON Schema equal to what the models say, and the schema accepting every shipped
preset as written (and refusing what the loader refuses)."""

from __future__ import annotations

import json
import re
import tomllib
import typing
from typing import Any

import jsonschema
import pytest
from conftest import ROOT, run_cli
from pydantic import BaseModel

from autopilot.config import Preset
from autopilot.fielddocs import describe
from autopilot.loader import deep_merge
from autopilot.reference import json_schema, options, reference_markdown

PRESETS = sorted(p for p in (ROOT / "presets").glob("*.toml"))


def every_field(model: type[BaseModel], prefix: str = "") -> dict[str, Any]:
    out = {}
    for name, field in model.model_fields.items():
        out[f"{model.__name__}.{name}"] = field
        for arg in [field.annotation, *typing.get_args(field.annotation),
                    *(a for x in typing.get_args(field.annotation) for a in typing.get_args(x))]:
            if isinstance(arg, type) and issubclass(arg, BaseModel):
                out |= every_field(arg)
    return out


def test_every_option_has_a_description_and_a_row_in_the_reference() -> None:
    describe([Preset])  # what `autopilot schema` and the page do first
    fields = every_field(Preset)
    assert len(fields) > 150  # the walk reaches the nested tables and every engine
    assert sorted(k for k, f in fields.items() if not (f.description or "").strip()) == []
    page = (ROOT / "docs" / "reference.md").read_text()
    keys = {o.key for o in options()}
    for key in ("watchdog.warn_secs", "gateway.enabled", "harness.compose_project_pattern",
                "preflight.command_timeout_secs", "publish.results_repo",
                "watchdog.scroll_loop_streak", "endpoint.max_model_len",
                "trust.arm_checks.expect", "comparators.NAME.families_of", "extends"):
        assert key in keys and f"| `{key}` |" in page, key
    assert all(o.description for o in options())


def test_the_reference_page_is_generated_from_the_code() -> None:
    assert (ROOT / "docs" / "reference.md").read_text() == reference_markdown() + "\n", (
        "docs/reference.md is stale: python -m autopilot schema --markdown > docs/reference.md")


def raw(path: Any) -> dict[str, Any]:
    """A preset file as written, merged over its ``extends`` base (env refs unexpanded)."""
    doc = tomllib.loads(path.read_text())
    base = doc.pop("extends", None)
    return deep_merge(raw(ROOT / "presets" / f"{base}.toml"), doc) if base else doc


@pytest.mark.parametrize("path", PRESETS, ids=lambda p: p.stem)
def test_the_json_schema_accepts_every_shipped_preset(path: Any) -> None:
    jsonschema.Draft202012Validator(json_schema(partial=True)).validate(
        tomllib.loads(path.read_text()))  # the file as an editor sees it
    if not path.stem.startswith("_"):  # a base alone is not a preset
        jsonschema.Draft202012Validator(json_schema()).validate(raw(path))


def test_the_json_schema_refuses_what_the_loader_refuses() -> None:
    check = jsonschema.Draft202012Validator(json_schema())
    good = raw(ROOT / "presets" / "demo.toml")
    assert check.is_valid(good)
    for bad in ({"watchdog": {**good["watchdog"], "warn_sec": 3}},  # a typo
                {"watchdog": {**good["watchdog"], "kill_secs": -1}},
                {"watchdog": {**good["watchdog"], "kill_secs": "soon"}},
                {"endpoint": {**good["endpoint"], "engine": "tgi"}},
                {"harness": {**good["harness"], "user": "root"}},
                {"model": None}):
        assert not check.is_valid({**good, **bad}), bad
    # The loader's shorthands and ${VAR} values are what a preset may write.
    assert check.is_valid({**good, "gateway": False,
                           "watchdog": {**good["watchdog"], "kill_secs": "${KILL:-5}"}})


def test_the_schema_verb_prints_what_the_code_gives() -> None:
    r = run_cli("schema")
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout) == json_schema()
    partial = json.loads(run_cli("schema", "--partial").stdout)
    assert "required" not in json.dumps(partial) and "required" in r.stdout
    page = run_cli("schema", "--markdown")
    assert page.stdout == (ROOT / "docs" / "reference.md").read_text()


def slug(heading: str) -> str:
    """A heading's anchor as GitHub renders it."""
    text = re.sub(r"[^\w\- ]", "", heading.strip().lower())
    return text.replace(" ", "-")


def test_the_readme_is_a_front_page_and_every_link_of_the_docs_resolves() -> None:
    readme = ROOT / "README.md"
    assert len(readme.read_text().splitlines()) <= 200
    pages = [readme, *sorted((ROOT / "docs").glob("*.md"))]
    assert {p.name for p in pages} >= {"presets.md", "runbook.md", "security.md",
                                       "scale-out.md", "inspect.md", "reference.md"}
    broken = []
    for page in pages:
        for target in re.findall(r"\]\(([^)\s]+)\)", page.read_text()):
            if target.startswith(("http://", "https://", "mailto:")):
                continue
            path, _, anchor = target.partition("#")
            file = (page.parent / path).resolve() if path else page
            if not file.exists():
                broken.append(f"{page.name}: {target}")
            elif anchor and file.suffix == ".md" and anchor not in {
                    slug(h) for h in re.findall(r"^#+ (.*)$", file.read_text(), re.M)}:
                broken.append(f"{page.name}: {target} (no such heading)")
    assert broken == []
