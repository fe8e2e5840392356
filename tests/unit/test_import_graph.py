"""The package's modules import each other without a cycle.

Read from the source with ``ast``: every import of a module of orchestra counts, at the
top of a module, inside a function, or under ``if TYPE_CHECKING:`` (a cycle hidden from
the interpreter is still one for a reader, and for mypy). The generated ``_proto``
modules are left aside.
"""
from __future__ import annotations

import ast
import pathlib
import sys

import pytest

pytestmark = pytest.mark.timeout(30)

PACKAGE = pathlib.Path(__file__).resolve().parents[2] / "orchestra"

# The scheduler core: these never reach back into _scheduler.
SCHEDULER_HELPERS = ["_sched_types", "_instructions", "_actor_state", "_blocking", "_loans",
                     "_placement"]


def import_graph() -> dict[str, set[str]]:
    """Module name (``_scheduler``, ``__init__``) -> the package modules it imports."""
    modules = {p.stem for p in PACKAGE.glob("*.py")}
    graph: dict[str, set[str]] = {}
    for name in modules:
        tree = ast.parse((PACKAGE / f"{name}.py").read_text())
        deps: set[str] = set()
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom):
                if node.level > 1:
                    continue   # above the package: none today
                if node.level == 1:
                    target = node.module
                elif node.module == "orchestra" or (node.module or "").startswith("orchestra."):
                    target = node.module.partition(".")[2] or None
                else:
                    continue
                if target is None:   # from . import x: a module, or a name of __init__
                    deps |= {a.name if a.name in modules else "__init__" for a in node.names}
                else:
                    deps.add(target.split(".")[0])
            elif isinstance(node, ast.Import):
                for alias in node.names:
                    if alias.name.startswith("orchestra."):
                        deps.add(alias.name.split(".")[1])
        graph[name] = {d for d in deps if d in modules and d != name}
    return graph


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
        for w in sorted(graph[v]):
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


def test_the_package_has_no_import_cycle():
    unexpected = cycles(import_graph())
    assert unexpected == [], f"import cycles: {unexpected}"


def test_the_scheduler_core_is_in_no_cycle():
    in_cycles = set().union(*cycles(import_graph()))
    assert in_cycles.isdisjoint({"_scheduler", *SCHEDULER_HELPERS})


@pytest.mark.parametrize("helper", SCHEDULER_HELPERS)
def test_a_scheduler_helper_does_not_import_the_scheduler(helper):
    assert "_scheduler" not in import_graph()[helper]


def test_the_graph_sees_imports_under_type_checking_and_in_functions(tmp_path, monkeypatch):
    (tmp_path / "_a.py").write_text("from typing import TYPE_CHECKING\n"
                                    "if TYPE_CHECKING:\n    from ._b import B\n")
    (tmp_path / "_b.py").write_text("def f():\n    from . import _a\n")
    monkeypatch.setattr(sys.modules[__name__], "PACKAGE", tmp_path)
    assert cycles(import_graph()) == [{"_a", "_b"}]
