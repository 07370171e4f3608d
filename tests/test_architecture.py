"""Fitness tests: the package keeps the shape ARCHITECTURE.md draws.

Read from the source (the AST), so they are cheap and see every import: top-level,
inside functions, and under ``TYPE_CHECKING`` alike.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest
from conftest import ROOT

PKG = ROOT / "autopilot"

# Decisions that take data and a clock: none of them may reach, however indirectly, a
# module that spawns a process, opens a socket or drives an event loop.
PURE = ["autopilot.run.runbook", "autopilot.run.snapshot", "autopilot.run.placement",
        "autopilot.run.throttle", "autopilot.cell.watchdog", "autopilot.cell.validity",
        "autopilot.state.ledger", "autopilot.state.budget", "autopilot.state.progress",
        "autopilot.views.stats", "autopilot.endpoints.policy"]
IMPURE = {"subprocess", "socket", "asyncio", "anyio", "psutil", "aiohttp", "httpx",
          "aiodocker", "multiprocessing", "ray", "apprise", "requests", "urllib.request",
          "http.client", "http.server", "autopilot.cell.procs", "autopilot.cell.sandbox"}


def module_name(path: Path) -> str:
    return ".".join(path.relative_to(ROOT).with_suffix("").parts).removesuffix(".__init__")


def imports() -> dict[str, set[str]]:
    """Every module of the package -> every module name it imports."""
    out: dict[str, set[str]] = {}
    for path in PKG.rglob("*.py"):
        name = module_name(path)
        deps: set[str] = set()
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                deps.update(a.name for a in node.names)
            elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                deps.add(node.module)
                deps.update(f"{node.module}.{a.name}" for a in node.names)
        out[name] = deps
    return out


GRAPH = imports()


def internal(dep: str) -> str | None:
    """The package module ``dep`` names (a module, or a name inside one)."""
    while dep and dep not in GRAPH:
        dep = dep.rpartition(".")[0]
    return dep or None


def edges() -> dict[str, set[str]]:
    return {m: {d for d in map(internal, deps) if d and d != m and not m.startswith(d + ".")
                and not (m.endswith("__init__") or d == "autopilot")}
            for m, deps in GRAPH.items()}


def test_the_package_has_no_import_cycle() -> None:
    g = edges()
    seen: dict[str, int] = {}
    stack: list[str] = []

    def visit(u: str) -> None:
        seen[u] = 1
        stack.append(u)
        for v in sorted(g[u]):
            if seen.get(v) == 1:
                pytest.fail("import cycle: " + " -> ".join([*stack[stack.index(v):], v]))
            if not seen.get(v):
                visit(v)
        stack.pop()
        seen[u] = 2

    for m in sorted(g):
        if not seen.get(m):
            visit(m)


FOUNDATIONS = "foundations"
# ARCHITECTURE.md's table: what each part may import (besides itself).
MAY_IMPORT = {
    FOUNDATIONS: {FOUNDATIONS},
    "state": {FOUNDATIONS},
    "gateway": {"state", FOUNDATIONS},
    "cell": {"state", FOUNDATIONS},
    "endpoints": {"cell", "state", FOUNDATIONS},
    # an attempt's data path: the gateway it serves, the cell primitives it is seen through
    "datapath": {"gateway", "cell", "state", FOUNDATIONS},
    "backends": {"datapath", "gateway", "endpoints", "cell", "state", FOUNDATIONS},
    "views": {"cell", "state", FOUNDATIONS},
    "run": {"backends", "datapath", "gateway", "endpoints", "cell", "state", "views",
            FOUNDATIONS},
    "ops": {"run", "backends", "datapath", "gateway", "endpoints", "cell", "state", "views",
            FOUNDATIONS},
}
# None: the loader's run-time checks are handed to it (autopilot.run.admission) and the
# log is handed its opened file, so no import runs back up the picture.
EXCEPTIONS: set[tuple[str, str]] = set()


def part(module: str) -> str:
    name = module.split(".")[1]
    if name in ("cli", "__main__", "boot"):  # the entry points
        return "cli"
    if not (PKG / name).is_dir() or name in ("demo", "starter", "harnesses", "config"):
        return FOUNDATIONS  # a top-level module, the configuration, the demo and starter
    return name


def test_every_import_points_down_the_layers() -> None:
    wrong = sorted((m, d) for m, deps in edges().items() for d in deps
                   if part(m) in MAY_IMPORT and part(d) != part(m)
                   and part(d) not in MAY_IMPORT[part(m)] and (m, d) not in EXCEPTIONS)
    assert wrong == []


def test_a_backend_never_imports_the_loop() -> None:
    bad = {m: sorted(d for d in deps if d.startswith("autopilot.run"))
           for m, deps in edges().items() if m.startswith("autopilot.backends")}
    assert {m: d for m, d in bad.items() if d} == {}


def test_the_views_never_import_the_loop_or_a_backend() -> None:
    bad = {m: sorted(d for d in deps if d.startswith(("autopilot.run", "autopilot.backends")))
           for m, deps in edges().items() if m.startswith("autopilot.views")}
    assert {m: d for m, d in bad.items() if d} == {}


@pytest.mark.parametrize("module", PURE)
def test_pure_policy_reaches_no_process_or_socket(module: str) -> None:
    g = edges()
    reached, todo = {module}, [module]
    while todo:
        for d in g[todo.pop()]:
            if d not in reached:
                reached.add(d)
                todo.append(d)
    found = {(m, dep) for m in reached for dep in GRAPH[m]
             if any(dep == bad or dep.startswith(bad + ".") for bad in IMPURE)}
    assert found == set()


def test_the_fitness_test_sees_an_impure_import() -> None:
    # The walk itself can fail: a module that imports subprocess is reached.
    g = edges()
    assert "autopilot.cell.procs" in g["autopilot.cell.runner"]
    assert any(d == "subprocess" for d in GRAPH["autopilot.cell.procs"])


def test_modules_stay_small() -> None:
    big = {module_name(p): n for p in PKG.rglob("*.py")
           if (n := len(p.read_text().splitlines())) > 600}
    assert big == {}


FUNCTION_CAP = 100  # lines, a def's first to its last
LONG = 50
LONG_BUDGET = 34  # functions over LONG lines: may only shrink (lower it as they go)


def function_sizes() -> dict[str, int]:
    sizes = {}
    for p in PKG.rglob("*.py"):
        for node in ast.walk(ast.parse(p.read_text())):
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                assert node.end_lineno is not None
                sizes[f"{module_name(p)}:{node.lineno}:{node.name}"] = (
                    node.end_lineno - node.lineno + 1)
    return sizes


def test_functions_stay_small() -> None:
    # Beside the module gate: a module kept under 600 lines by packing one function with
    # more jobs is not a smaller concern. No function over the cap, and the long ones
    # only fewer.
    sizes = function_sizes()
    assert {f: n for f, n in sizes.items() if n > FUNCTION_CAP} == {}
    long = sorted((n, f) for f, n in sizes.items() if n > LONG)
    assert len(long) <= LONG_BUDGET, long


# Names a newcomer can read: the share of a function's locals and parameters named in
# one or two letters, beside the loop and comprehension idioms every reader knows (an
# index, a dict's key and value, an exception, a file and its descriptor, a task group).
SHORT_IDIOMS = frozenset({"i", "j", "k", "v", "e", "f", "fd", "ok", "ts", "t0", "id", "tg",
                          "_", "__"})
SHORT_NAME_SHARE = 0.025  # may only shrink (lower it as names are given)


def short_names() -> tuple[list[str], int]:
    short, total = [], 0
    for p in PKG.rglob("*.py"):
        for fn in ast.walk(ast.parse(p.read_text())):
            if not isinstance(fn, ast.FunctionDef | ast.AsyncFunctionDef):
                continue
            names = {n.id for n in ast.walk(fn)
                     if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Store)}
            names |= {a.arg for a in ast.walk(fn)
                      if isinstance(a, ast.arg) and a.arg not in ("self", "cls")}
            total += len(names)
            short += [f"{module_name(p)}:{fn.name}:{name}" for name in sorted(names)
                      if len(name) <= 2 and name not in SHORT_IDIOMS]
    return short, total


def test_locals_are_named_for_what_they_hold() -> None:
    short, total = short_names()
    assert total > 1000  # the walk sees the package
    assert len(short) / total <= SHORT_NAME_SHARE, (len(short), total)


def test_the_data_path_loads_neither_config_nor_the_loop() -> None:
    # It starts once per attempt (autopilot.datapath.process): what it reaches is paid per
    # cell. Read the real import closure, not the AST: a lazy import would hide there.
    import subprocess
    import sys

    code = ("import sys, autopilot.datapath.process, autopilot.gateway.proxy; "
            "print(sorted(m for m in sys.modules if m.startswith(('pydantic', "
            "'autopilot.config', 'autopilot.run', 'autopilot.backends', 'structlog', "
            "'psutil', 'anyio'))))")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                       timeout=60)
    assert r.returncode == 0 and r.stdout.strip() == "[]", (r.stdout, r.stderr[-1000:])


def test_httpx_and_structlog_load_without_the_cli_and_console_they_probe_for() -> None:
    import subprocess
    import sys

    code = ("import sys; from autopilot import logsetup; from autopilot.lazyimport import "
            "httpx; h = httpx(); assert h.AsyncClient and logsetup.get_logger; "
            "print(sorted(m for m in ('rich', 'click', 'pygments') if m in sys.modules))")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                       timeout=60)
    assert r.returncode == 0 and r.stdout.strip() == "[]", r.stderr[-1000:]


def _strings(node: ast.AST) -> set[str]:
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return {node.value}
    if isinstance(node, ast.Tuple | ast.List | ast.Set):
        return {s for e in node.elts for s in _strings(e)}
    if isinstance(node, ast.Call) and getattr(node.func, "id", "") in ("frozenset", "set"):
        return {s for a in node.args for s in _strings(a)}
    return set()


def test_no_module_outside_the_endpoints_switches_on_an_engine() -> None:
    # An engine's knowledge is its own (the traits on its config model, the hooks on
    # its class): a module that compares `engine` with a name, keeps a set of engine
    # names or probes an endpoint's fields with getattr would have to change with every
    # new engine.
    from autopilot.config import ENGINE_MODELS
    from autopilot.endpoints import ENGINES

    assert set(ENGINES) == set(ENGINE_MODELS)
    names = set(ENGINE_MODELS) - {"none"}  # "none" is a word of other settings too
    found = []
    for path in PKG.rglob("*.py"):
        mod = module_name(path)
        if mod.startswith("autopilot.endpoints") or mod == "autopilot.config.endpoint":
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            where = f"{mod}:{getattr(node, 'lineno', 0)}"
            if isinstance(node, ast.Compare):
                sides = [node.left, *node.comparators]
                if any(isinstance(s, ast.Attribute) and s.attr == "engine" for s in sides) \
                        or any(_strings(s) & names for s in sides):
                    found.append(where)
            elif isinstance(node, ast.Tuple | ast.List | ast.Set | ast.Call) \
                    and len(_strings(node) & names) >= 2:
                found.append(where)
            elif isinstance(node, ast.Call) and getattr(node.func, "id", "") == "getattr" \
                    and node.args and "endpoint" in ast.unparse(node.args[0]) + (
                        (ast.unparse(node.args[0]) == "ep" and "endpoint") or ""):
                found.append(where)
    assert sorted(set(found)) == []


def test_the_endpoints_base_names_the_files_an_engine_touches() -> None:
    doc = ast.get_docstring(ast.parse((PKG / "endpoints" / "base.py").read_text())) or ""
    for name in ("autopilot/endpoints/<engine>.py", "autopilot/config/endpoint.py",
                 "autopilot/endpoints/__init__.py"):
        assert name in doc, name


def test_every_event_is_written_as_its_type() -> None:
    """Writers are typed like readers: an event is constructed as its type where it is
    emitted (``emit(CellVerdict(...))``), so mypy checks every field written; no call
    names an event by a string."""
    import ast

    found = []
    for path in sorted(PKG.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if not isinstance(node, ast.Call) or not node.args:
                continue
            name = (node.func.attr if isinstance(node.func, ast.Attribute)
                    else node.func.id if isinstance(node.func, ast.Name) else "")
            first = node.args[0]
            if name == "emit" and isinstance(first, ast.Constant) and isinstance(
                    first.value, str):
                found.append(f"{path.relative_to(PKG)}:{node.lineno} emit({first.value!r})")
    assert found == []


def test_the_supervisor_loads_no_serving_code_until_a_grader_asks_a_model() -> None:
    """The gateway serves in each attempt's data path; the supervisor holds its settings
    only (autopilot.gateway.settings), so its start imports no aiohttp: it loads the
    serving code on the first grading that asks a model."""
    import subprocess
    import sys

    probe = ("import sys, autopilot.cli, autopilot.run.supervisor, autopilot.backends.local\n"
             "from autopilot.gateway.settings import gateway_for\n"
             "from autopilot.loader import load_preset\n"
             "g = gateway_for(load_preset('inspect'), str, lambda: None, print)\n"
             "print(type(g).__name__, 'aiohttp' in sys.modules)")
    r = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True,
                       timeout=60, cwd=ROOT)
    assert r.stdout.split() == ["GatewaySettings", "False"], r.stdout + r.stderr


# Public functions of these parts whose signature carries ``dict[str, Any]``: a document
# with no type crossing a module boundary. EDGES are where a JSON document is the point
# (the channel's framing and its messages' wire form, the journal's raw records, the
# resolved record, a request's log line). Anywhere else a document read from outside (a
# journal record, Docker's inspect, a harness's transcript row, status.json) crosses as
# ``Mapping[str, object]``: mypy then has every field it reads shape-checked first.
TYPED_PARTS = ("state", "datapath", "gateway", "cell")
UNTYPED_EDGES = frozenset({
    "datapath.messages.hello", "datapath.messages.is_ready", "datapath.messages.of",
    "datapath.messages.ready", "datapath.messages.record", "datapath.messages.to_wire",
    "datapath.wire.decode", "datapath.wire.encode", "datapath.wire.read_private_json",
    "datapath.wire.spec_of", "gateway.record.as_json",
    "state.eventbase.record_of", "state.events.mistyped", "state.journal.append",
    "state.journal.events", "state.journal.iter_events", "state.ledger.apply",
    "state.resolved.changes", "state.resolved.document", "state.resolved.encode",
    "state.resolved.leaves", "state.resolved.previous",
})


def untyped_signatures() -> set[str]:
    found = set()
    for part_name in TYPED_PARTS:
        for p in (PKG / part_name).rglob("*.py"):
            mod = ".".join(p.relative_to(PKG).with_suffix("").parts)
            for node in ast.walk(ast.parse(p.read_text())):
                if not isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef) \
                        or node.name.startswith("_"):
                    continue
                args = node.args.args + node.args.kwonlyargs
                notes = [a.annotation for a in args if a.annotation] + (
                    [node.returns] if node.returns else [])
                if any("dict[str, Any]" in ast.unparse(n) for n in notes):
                    found.add(f"{mod}.{node.name}")
    return found


def test_no_new_untyped_document_crosses_a_boundary() -> None:
    found = untyped_signatures()
    assert found - UNTYPED_EDGES == set()  # a new one: give it a type
    assert UNTYPED_EDGES - found == set()  # typed since: take it off the list
