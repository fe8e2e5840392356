"""The package's modules import each other without a cycle, and each layer imports only
the layers below it (docs/architecture.md, "The package map").

Read from the source with ``ast``: every import of a module of orchestra counts, at the
top of a module, inside a function, or under ``if TYPE_CHECKING:`` (a cycle or a layer
crossed only there is still one for a reader, and for mypy). The generated ``_proto``
modules are left aside.
"""
from __future__ import annotations

import ast
import pathlib
import re
import sys

import pytest

pytestmark = pytest.mark.timeout(30)

PACKAGE = pathlib.Path(__file__).resolve().parents[2] / "orchestra"

# Each top-level part of the package (a subpackage, or a module of the top level) and its
# layer: a module imports modules of its own part, and of parts of lower layers only.
# Two parts on one layer are independent of each other.
LAYERS: dict[str, int] = {
    "exceptions": 0, "_proto": 0,        # the public errors; generated code
    "_checks": 0,                        # checks of what users pass
    "_ids": 1, "_resources": 1,          # ids, resource requests
    "_platform": 1,                      # processes, titles, GPUs, start-up code
    "_protocol": 2,                      # frames, messages, authentication, connections
    "_objects": 3, "_observe": 3,        # values and the store / logs, events, dashboard
    "_scheduler": 4, "_runtime": 4,      # the head's I/O-free core / a driver's and worker's
    "_node": 5,                          # a node: its store, its workers
    "_head": 6, "_api": 6,               # the head process / the public API's implementation
    "_gang": 7,                          # gangs and the coordinator, built on actors
    "_libs": 7,                          # Pool, executor, joblib, Dask, ActorPool, Queue
    "_cluster": 8,                       # starting clusters
    "public": 9,                         # __init__, util, actor, compat, ... (PUBLIC)
    # entry points: the command, and the worker process, which runs users' code
    "_cli": 10, "_worker": 10, "__main__": 11,
}
# The public modules, one part: they re-export, and some need the whole API.
PUBLIC = {"__init__", "actor", "dag", "util", "compat", "cluster_utils", "coordinator"}

# The scheduler core's helpers never reach back into its state machine.
SCHEDULER_HELPERS = ["_scheduler.model", "_scheduler.instructions", "_scheduler.actors",
                     "_scheduler.blocking", "_scheduler.lineage", "_scheduler.loans",
                     "_scheduler.placement", "_scheduler.groups", "_scheduler.durable"]


def modules() -> dict[str, pathlib.Path]:
    """Dotted name below the package (``_scheduler.state``, ``util``, ``__init__``) -> file."""
    found: dict[str, pathlib.Path] = {}
    for path in PACKAGE.rglob("*.py"):
        rel = path.relative_to(PACKAGE)
        if rel.parts[0] == "_proto":
            continue
        parts = list(rel.with_suffix("").parts)
        if parts[-1] == "__init__" and len(parts) > 1:
            parts.pop()
        found[".".join(parts)] = path
    return found


_GRAPHS: dict[pathlib.Path, dict[str, set[str]]] = {}


def import_graph() -> dict[str, set[str]]:
    """Module name -> the package modules it imports (a package's name: its __init__).
    Read once per package directory (the tests only read it)."""
    if PACKAGE not in _GRAPHS:
        _GRAPHS[PACKAGE] = _read_graph()
    return _GRAPHS[PACKAGE]


def _read_graph() -> dict[str, set[str]]:
    mods = modules()
    graph: dict[str, set[str]] = {}
    for name, path in mods.items():
        is_package = path.name == "__init__.py" and name != "__init__"
        here = name.split(".") if is_package else name.split(".")[:-1]
        if name == "__init__":
            here = []
        deps: set[str] = set()

        def add(target: str, deps: set[str] = deps) -> None:
            # the module itself, or the package whose attribute it names
            if target.split(".")[0] == "_proto":
                deps.add("_proto")
                return
            while target and target not in mods:
                target = target.rpartition(".")[0]
            deps.add(target or "__init__")

        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom):
                if node.level:
                    base = here[: len(here) - (node.level - 1)] if node.level > 1 else here
                    prefix = ".".join(base + ([node.module] if node.module else []))
                elif node.module == "orchestra" or (node.module or "").startswith("orchestra."):
                    prefix = node.module.partition(".")[2]
                else:
                    continue
                for alias in node.names:
                    full = f"{prefix}.{alias.name}" if prefix else alias.name
                    add(full if full in mods else prefix)
            elif isinstance(node, ast.Import):
                for alias in node.names:
                    if alias.name.startswith("orchestra."):
                        add(alias.name.partition(".")[2])
        graph[name] = {d for d in deps if d != name and (d in mods or d in ("__init__", "_proto"))}
    return graph


def part(module: str) -> str:
    top = module.split(".")[0]
    return "public" if top in PUBLIC else top


def cycles(graph: dict[str, set[str]]) -> list[set[str]]:
    """The strongly connected components of more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[set[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph.get(v, ())):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = set()
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.add(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(component)

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return found


def violations(graph: dict[str, set[str]]) -> list[str]:
    """Imports that cross into a part of the same or a higher layer."""
    bad = []
    for mod, deps in sorted(graph.items()):
        for dep in sorted(deps):
            a, b = part(mod), part(dep)
            if a != b and LAYERS[b] >= LAYERS[a]:
                bad.append(f"{mod} (layer {LAYERS[a]}) imports {dep} (layer {LAYERS[b]})")
    return bad


def test_every_part_of_the_package_has_a_layer():
    assert sorted({part(m) for m in modules()} - set(LAYERS)) == []
    assert PUBLIC <= {m.split(".")[0] for m in modules()}


def test_the_package_has_no_import_cycle():
    unexpected = cycles(import_graph())
    assert unexpected == [], f"import cycles: {unexpected}"


def test_each_layer_imports_only_the_layers_below_it():
    assert violations(import_graph()) == []


def test_nothing_inside_the_package_imports_util():
    # orchestra.util holds re-exports for users; the implementations live in _api.
    users = sorted(m for m, deps in import_graph().items()
                   if any(d.split(".")[0] == "util" for d in deps) and part(m) != "public")
    assert users == []


def test_the_subpackages_init_modules_are_empty():
    # Import time is part of init()'s cost: a subpackage's __init__ imports nothing.
    for path in PACKAGE.glob("_*/__init__.py"):
        if path.parent.name != "_proto":
            assert path.read_text().strip() == "", path


# What the libraries built on the API may use: the API's implementation, as a user's code
# would use the public API, and the public errors and types (an ObjectRef, the checks of
# what users pass); never the runtime, the protocol or the objects' internals.
LIBS_MAY_IMPORT = {"_api", "exceptions", "_checks", "_runtime.object_ref"}


def test_the_libraries_import_only_the_api_and_the_public_types():
    graph = import_graph()
    crossing = sorted(f"{mod} imports {dep}" for mod, deps in graph.items()
                      if part(mod) == "_libs" for dep in deps
                      if part(dep) != "_libs" and dep not in LIBS_MAY_IMPORT
                      and part(dep) not in LIBS_MAY_IMPORT)
    assert crossing == []
    assert any(part(m) == "_libs" for m in graph)


def test_the_worker_process_does_not_import_the_api():
    # The worker runs users' code: it needs the runtime, not the driver's API layer
    # (what a method raises to end its actor, ActorExitRequest, lives in _runtime). Only
    # a worker of `orchestra run --ray` installs Ray's names, which are the whole API.
    users = sorted(f"{mod} imports {dep}" for mod, deps in import_graph().items()
                   if part(mod) == "_worker" for dep in deps
                   if part(dep) in ("_api", "_libs", "_gang", "public") and dep != "compat.ray")
    assert users == []


def test_the_api_asks_the_head_only_through_the_verbs():
    # _runtime/verbs.py builds each Request and reads its Reply, and makes the messages a
    # driver sends; the API layer does neither (no pb.Request, no client.request) and
    # imports nothing of the protocol.
    speaking = sorted(f"{mod} imports {dep}" for mod, deps in import_graph().items()
                      if part(mod) == "_api" for dep in deps if part(dep) == "_protocol"
                      or dep.startswith("_proto"))
    assert speaking == []
    found = []
    for name, path in modules().items():
        if part(name) != "_api":
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Attribute) and (
                    node.attr == "request" or node.attr == "Request"
                    and isinstance(node.value, ast.Name) and node.value.id == "pb"):
                found.append(f"{name}:{node.lineno} .{node.attr}")
    assert found == []


# A class that does most of the work makes its readers bounce between it and the helper
# files it hands work to: one with more methods than this is split along what it owns.
MAX_METHODS = 40


def test_no_class_has_more_than_forty_methods():
    big = []
    for name, path in modules().items():
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ClassDef):
                n = sum(isinstance(x, (ast.FunctionDef, ast.AsyncFunctionDef)) for x in node.body)
                if n > MAX_METHODS:
                    big.append(f"{name}.{node.name}: {n} methods")
    assert big == []


@pytest.mark.parametrize("helper", SCHEDULER_HELPERS)
def test_a_scheduler_helper_does_not_import_the_scheduler_state(helper):
    assert "_scheduler.state" not in import_graph()[helper]


# The scheduler knows no frame kind and no protobuf message: its events (events.py),
# instructions (instructions.py), calls (call.py) and values (data.py) are in its own
# words, and the head's edge alone (_head/inbound.py, _head/outbound.py) turns frames
# into them and them into frames.
def test_the_scheduler_imports_nothing_of_the_protocol():
    graph = import_graph()
    core = {m for m in graph if m.startswith("_scheduler")}
    assert sorted(m for m in core if any(d.startswith(("_protocol", "_proto")) for d in graph[m])) == []


def test_the_scheduler_uses_no_protobuf_api():
    """Nor does it reach into a message it was handed (a ``wire`` it forwards): no
    protobuf method is called under _scheduler."""
    api = re.compile(r"\.(HasField|WhichOneof|CopyFrom|MergeFrom|ClearField|Clear|"
                     r"SerializeToString|ParseFromString|FromString|ListFields)\(")
    hits = [f"{p.name}:{n}: {line.strip()}" for p in sorted((PACKAGE / "_scheduler").glob("*.py"))
            for n, line in enumerate(p.read_text().splitlines(), 1) if api.search(line)]
    assert hits == []


def test_the_scheduler_reads_an_objects_value_as_its_own_data_not_the_message():
    """An object's value is _scheduler/data.py's Data (the edge's data_in / data_out turn
    ObjectData into it and back): no scheduler module names the protocol's ObjectData or
    Segment, or asks a message which of its data it holds."""
    wire_words = re.compile(r"pb\.ObjectData|pb\.Segment|WhichOneof\(.data.\)"
                            r"|HasField\(.segment.\)|\.inline\b")
    found = [f"{path.name}:{i}: {line.strip()}"
             for path in sorted((PACKAGE / "_scheduler").glob("*.py"))
             for i, line in enumerate(path.read_text().splitlines(), 1)
             if wire_words.search(line) and not line.lstrip().startswith("#")]
    assert found == []


def test_only_the_heads_edge_turns_instructions_into_frames():
    graph = import_graph()
    encoders = {m for m, deps in graph.items() if "_scheduler.instructions" in deps
                and "_protocol.wire" in deps}
    assert sorted(m for m in encoders if not m.startswith("_head.")) == []
    head = (PACKAGE / "_head" / "head.py").read_text()
    assert "_wire.encode(ins" not in head and "FRAME_OF" in head


def test_the_graph_sees_imports_under_type_checking_and_in_functions(tmp_path, monkeypatch):
    (tmp_path / "_a.py").write_text("from typing import TYPE_CHECKING\n"
                                    "if TYPE_CHECKING:\n    from ._b import B\n")
    (tmp_path / "_b.py").write_text("def f():\n    from . import _a\n")
    monkeypatch.setattr(sys.modules[__name__], "PACKAGE", tmp_path)
    assert cycles(import_graph()) == [{"_a", "_b"}]


def test_an_import_up_a_layer_or_across_one_is_found(tmp_path, monkeypatch):
    for pkg in ("_protocol", "_objects", "_observe"):
        (tmp_path / pkg).mkdir()
        (tmp_path / pkg / "__init__.py").write_text("")
    (tmp_path / "_protocol" / "wire.py").write_text("def f():\n    from .._objects import store\n")
    (tmp_path / "_objects" / "store.py").write_text("from .._observe.log import x\n")
    (tmp_path / "_observe" / "log.py").write_text("from orchestra._protocol.wire import f\n")
    monkeypatch.setattr(sys.modules[__name__], "PACKAGE", tmp_path)
    assert violations(import_graph()) == [
        "_objects.store (layer 3) imports _observe.log (layer 3)",
        "_protocol.wire (layer 2) imports _objects.store (layer 3)",
    ]
