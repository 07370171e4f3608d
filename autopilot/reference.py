"""The option reference, built from the code: a JSON Schema of a preset (``autopilot
schema``: what an editor's TOML support validates and completes against) and the
markdown page ``docs/reference.md`` (``autopilot schema --markdown``), both from the
models' field descriptions (their docstrings), so neither can drift from what the loader
accepts (``tests/test_reference.py`` holds the page and the shipped presets to them).
"""

from __future__ import annotations

import json
import types
import typing
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any, Literal

from pydantic import BaseModel
from pydantic.fields import FieldInfo
from pydantic.json_schema import GenerateJsonSchema, JsonSchemaValue
from pydantic_core import core_schema

from autopilot.config import ENGINE_MODELS, Preset
from autopilot.config.endpoint import EndpointCommon
from autopilot.fielddocs import describe, models_in

SCHEMA_DIALECT = "https://json-schema.org/draft/2020-12/schema"
# A value written as ``${VAR}`` or ``${VAR:-default}`` is expanded by the loader before
# validation: in the file as written, a number, a flag, a port or a choice may be such a
# string.
ENV_REF: JsonSchemaValue = {"type": "string", "pattern": r"\$\{[A-Za-z_][A-Za-z0-9_]*"}
EXTENDS = ("The preset this one is built on (a name among the preset dirs, or a .toml "
           "path): its tables are deep-merged under this file's.")


class _PresetSchema(GenerateJsonSchema):
    """pydantic's schema, with an env reference allowed wherever a scalar is typed."""

    def int_schema(self, schema: core_schema.IntSchema) -> JsonSchemaValue:
        return {"anyOf": [super().int_schema(schema), ENV_REF]}

    def float_schema(self, schema: core_schema.FloatSchema) -> JsonSchemaValue:
        return {"anyOf": [super().float_schema(schema), ENV_REF]}

    def bool_schema(self, schema: core_schema.BoolSchema) -> JsonSchemaValue:
        return {"anyOf": [super().bool_schema(schema), ENV_REF]}

    def literal_schema(self, schema: core_schema.LiteralSchema) -> JsonSchemaValue:
        return {"anyOf": [super().literal_schema(schema), ENV_REF]}


def json_schema(partial: bool = False) -> dict[str, Any]:
    """The JSON Schema of a preset file. ``partial``: of a file that gives only some keys
    (one that ``extends`` another, a ``--config`` overlay): nothing is required."""
    describe([Preset, EndpointCommon, *ENGINE_MODELS.values()])
    schema = Preset.model_json_schema(schema_generator=_PresetSchema)
    schema = {"$schema": SCHEMA_DIALECT, **schema, "title": "bench-autopilot preset"}
    schema["properties"] = {"extends": {"type": "string", "description": EXTENDS},
                            **schema["properties"]}
    # The loader's shorthands (validators that run before the model's own): `gateway =
    # false`, and a verdict word mapped straight to its verdict (`PASS = "PASS"`).
    gateway = schema["properties"]["gateway"]
    schema["properties"]["gateway"] = {
        "anyOf": [{"$ref": gateway.pop("$ref")}, {"type": "boolean"}], **gateway}
    verdicts = schema["$defs"]["Grader"]["properties"]["verdicts"]
    verdicts["additionalProperties"] = {"anyOf": [verdicts["additionalProperties"],
                                                  {"enum": ["PASS", "FAIL"]}]}
    # a rate card entry as a bare [in, out] pair
    rates = schema["properties"]["rate_card"]
    rates["additionalProperties"] = {"anyOf": [rates["additionalProperties"], {
        "type": "array", "items": {"type": "number", "minimum": 0},
        "minItems": 2, "maxItems": 2}]}
    if partial:
        _drop_required(schema)
    return schema


def _drop_required(node: Any) -> None:
    if isinstance(node, dict):
        node.pop("required", None)
        for value in node.values():
            _drop_required(value)
    elif isinstance(node, list):
        for value in node:
            _drop_required(value)


# ---------------------------------------------------------------- the markdown page

@dataclass(frozen=True)
class Option:
    key: str  # the key as a preset writes it, its table included: watchdog.warn_secs
    type: str
    default: str  # "" when the key is required
    description: str


@dataclass(frozen=True)
class Table:
    header: str  # as TOML writes it: [watchdog], [[tasks]], [endpoint] engine = "vllm"
    doc: str
    options: tuple[Option, ...]


def _container(annotation: Any) -> Any:
    """list or dict for a field that holds several tables, else None."""
    args = [arg for arg in typing.get_args(annotation) if arg is not type(None)]
    if typing.get_origin(annotation) in (typing.Union, types.UnionType) and len(args) == 1:
        return _container(args[0])
    return typing.get_origin(annotation) if typing.get_origin(annotation) in (list, dict) \
        else None


def type_name(annotation: Any) -> str:
    """A field's type in a TOML user's words."""
    origin, args = typing.get_origin(annotation), typing.get_args(annotation)
    if origin is Literal:
        return " | ".join(json.dumps(arg) for arg in args)
    if origin in (typing.Union, types.UnionType):
        names = [type_name(arg) for arg in args if arg is not type(None)]
        return " | ".join(names) + (" or none" if type(None) in args else "")
    if origin is list or (origin is tuple and len(args) == 2 and args[1] is Ellipsis):
        return f"list of {type_name(args[0])}"
    if origin is tuple:
        return "[" + ", ".join(type_name(arg) for arg in args) + "]"
    if origin is dict:
        return f"table of {type_name(args[1])}"
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return "table"
    plain: dict[Any, str] = {str: "string", int: "integer", float: "number", bool: "boolean",
                             Any: "any"}
    return plain.get(annotation) or str(getattr(annotation, "__name__", annotation))


def default_text(field: FieldInfo) -> str:
    if field.is_required():
        return ""
    value = field.get_default(call_default_factory=True)
    if isinstance(value, BaseModel):
        return "its table's defaults"
    return json.dumps(value, default=str)


def _options(model: type[BaseModel], prefix: str, skip: Any = ()) -> tuple[Option, ...]:
    return tuple(Option(f"{prefix}{name}", type_name(f.annotation), default_text(f),
                        " ".join((f.description or "").split()))
                 for name, f in model.model_fields.items() if name not in skip)


def _doc(model: type[BaseModel]) -> str:
    return " ".join((model.__doc__ or "").split())


def _visit_field(field: FieldInfo, key: str, out: dict[str, Table]) -> None:
    for inner in models_in(field.annotation):
        many = _container(field.annotation)
        if many is dict:
            _visit_model(inner, f"[{key}.NAME]", f"{key}.NAME.", out)
        else:
            _visit_model(inner, f"[[{key}]]" if many is list else f"[{key}]", f"{key}.", out)


def _visit_model(model: type[BaseModel], header: str, prefix: str, out: dict[str, Table],
                 skip: Any = ()) -> None:
    if header in out:  # [endpoint.docker]: the same table of two engines
        return
    out[header] = Table(header, _doc(model), _options(model, prefix, skip))
    for name, f in model.model_fields.items():
        if name not in skip:
            _visit_field(f, f"{prefix}{name}", out)


def tables() -> list[Table]:
    """Every table of a preset, in the order the page gives them."""
    describe([Preset, EndpointCommon, *ENGINE_MODELS.values()])
    top = tuple(o for o, f in zip(_options(Preset, ""), Preset.model_fields.values(),
                                  strict=True) if not models_in(f.annotation))
    out = {"(top level)": Table("(top level)", _doc(Preset),
                                (Option("extends", "string", "none", EXTENDS), *top))}
    for name, f in Preset.model_fields.items():
        if name != "endpoint":
            _visit_field(f, name, out)
            continue
        _visit_model(EndpointCommon, "[endpoint]", "endpoint.", out)
        for engine, model in ENGINE_MODELS.items():
            _visit_model(model, f'[endpoint] engine = "{engine}"', "endpoint.", out,
                         skip=EndpointCommon.model_fields)
    return list(out.values())


def options() -> Iterator[Option]:
    for table in tables():
        yield from table.options


def _cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def reference_markdown() -> str:
    """docs/reference.md: every option of a preset, its type, default and description."""
    lines = ["# Option reference", "",
             "Every key a preset may set, generated from the code (`autopilot schema "
             "--markdown > docs/reference.md`; a test keeps this page equal to it). The "
             "same descriptions are in the JSON Schema that `autopilot schema` prints, for "
             "an editor's TOML support; `autopilot schema --partial` is the schema of a "
             "file that gives only some keys (one that `extends` another, a `--config` "
             "overlay). A number, a flag, a port or a choice may also be written as `${VAR}` or "
             "`${VAR:-default}`, expanded from the environment at load.", ""]
    for table in tables():
        lines += [f"## {table.header}", ""]
        if table.doc:
            lines += [table.doc, ""]
        lines += ["| key | type | default | description |", "| --- | --- | --- | --- |"]
        for option in table.options:
            default = f"`{_cell(option.default)}`" if option.default else "required"
            lines.append(f"| `{option.key}` | {_cell(option.type)} | {default} "
                         f"| {_cell(option.description)} |")
        lines.append("")
    return "\n".join(lines)
