"""Lazy computation graphs, named as in Ray's ``ray.dag``: build a graph with
``f.bind(...)``, ``Cls.bind(...)``, ``node.method.bind(...)`` and ``handle.method.bind(...)``
over an ``InputNode``, then run it with ``dag.execute(*inputs)``::

    with InputNode() as inp:
        dag = add.bind(double.bind(inp[0]), inp.y)
    orchestra.get(dag.execute(3, y=4))        # add(double(3), 4)

``execute`` submits every node once (a node several others use runs once per execute),
passes upstream results as ObjectRefs and returns at once: an ObjectRef for a task or
method call, an ActorHandle for an actor, a list for a ``MultiOutputNode``.
"""
from __future__ import annotations

from ._api.dag import (
    ClassMethodNode,
    ClassNode,
    DAGInputData,
    DAGNode,
    FunctionNode,
    InputAttributeNode,
    InputNode,
    MultiOutputNode,
)

__all__ = ["DAGNode", "InputNode", "InputAttributeNode", "MultiOutputNode", "FunctionNode",
           "ClassNode", "ClassMethodNode", "DAGInputData"]
