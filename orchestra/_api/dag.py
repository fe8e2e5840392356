"""Lazy computation graphs: ``f.bind(...)``, ``Cls.bind(...)``, ``InputNode`` and
``dag.execute(...)``.

``bind`` records a call instead of making it: a FunctionNode (a task), a ClassNode (an
actor), a ClassMethodNode (a call of an actor's method). Their arguments may hold other
nodes, at the top level or inside lists, tuples and dicts, and ``InputNode`` (with
``inp[0]``, ``inp.key``) stands for what ``execute`` is given. ``execute`` walks the graph
once: each node is submitted once per execute however many nodes use it (keyed by the
node's identity), children before parents, without recursion (a chain of any length runs).
A task's upstream node arrives as its ObjectRef, so the task runs when its inputs exist
and the driver never waits between nodes; ``execute`` returns at once with the refs.

The walk decides only the order; each submit is the ordinary ``.remote()``.
"""
from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

_MISSING = object()


class DAGNode:
    """A node of a lazy computation graph; ``execute(*args, **kwargs)`` runs the graph
    under it and returns its result (an ObjectRef for a task or method call, an
    ActorHandle for an actor, a list for a MultiOutputNode).

    ``args``, ``kwargs``: the bound arguments, which may hold other nodes.
    ``options``: the options the call is made with."""

    def __init__(self, args: tuple[Any, ...], kwargs: dict[str, Any],
                 options: dict[str, Any] | None = None) -> None:
        self._bound_args = tuple(args)
        self._bound_kwargs = dict(kwargs)
        self._bound_options = dict(options or {})

    def get_args(self) -> tuple[Any, ...]:
        """The positional arguments bound to this node."""
        return self._bound_args

    def get_kwargs(self) -> dict[str, Any]:
        """The keyword arguments bound to this node."""
        return dict(self._bound_kwargs)

    def get_options(self) -> dict[str, Any]:
        """The options this node's call is made with."""
        return dict(self._bound_options)

    def children(self) -> list[DAGNode]:
        """The nodes this one's arguments hold, each once, in argument order."""
        seen: dict[int, DAGNode] = {}
        for value in (*self._bound_args, *self._bound_kwargs.values(), *self._upstream()):
            for node in _nodes_in(value):
                seen.setdefault(id(node), node)
        return list(seen.values())

    def _upstream(self) -> tuple[Any, ...]:
        """Nodes this one depends on besides its arguments (a method call's actor)."""
        return ()

    def execute(self, *args: Any, **kwargs: Any) -> Any:
        """Run the graph under this node: each node once, the tasks and actor calls
        submitted at once (upstream results pass as ObjectRefs); returns this node's
        result without waiting for it.

        ``args``, ``kwargs``: the graph's input, what its InputNode stands for."""
        return _run(self, DAGInputData(args, kwargs))

    def experimental_compile(self, *args: Any, **kwargs: Any) -> Any:
        """Compiled graphs (Ray's accelerated DAGs) are not available: raises
        NotImplementedError saying to call ``execute`` instead.

        ``args``, ``kwargs``: ignored."""
        raise NotImplementedError(
            "compiled graphs (experimental_compile) are not available on orchestra: call "
            "dag.execute(...) on the graph as it is (see docs/coming-from-ray.md)")

    def _resolve(self, value_of: Callable[[DAGNode], Any], inp: DAGInputData) -> Any:
        raise NotImplementedError

    def _bound(self, value_of: Callable[[DAGNode], Any]) -> tuple[tuple[Any, ...], dict[str, Any]]:
        args = tuple(_substitute(a, value_of) for a in self._bound_args)
        kwargs = {k: _substitute(v, value_of) for k, v in self._bound_kwargs.items()}
        return args, kwargs

    def __reduce__(self) -> Any:
        raise TypeError(f"{type(self).__name__} cannot be pickled: a graph runs from the "
                        "process that built it; pass dag.execute(...)'s result instead")


class DAGInputData:
    """What ``execute`` was given, for an InputNode with several values: ``[i]`` is the
    i-th positional value, ``["key"]`` and ``.key`` the keyword one.

    ``args``, ``kwargs``: execute's positional and keyword arguments."""

    def __init__(self, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
        self._args = args
        self._kwargs = kwargs

    def value(self) -> Any:
        """What the InputNode itself stands for: the one positional value when execute
        got exactly one and no keywords, else this object."""
        if len(self._args) == 1 and not self._kwargs:
            return self._args[0]
        return self

    def __getitem__(self, key: int | str) -> Any:
        try:
            return self._args[key] if isinstance(key, int) else self._kwargs[key]
        except (IndexError, KeyError):
            raise KeyError(f"the graph reads input[{key!r}], but execute() was given "
                           f"{len(self._args)} positional value(s) and keywords "
                           f"{sorted(self._kwargs)}") from None

    def __getattr__(self, key: str) -> Any:
        if key.startswith("_"):
            raise AttributeError(key)
        return self[key]


class InputNode(DAGNode):
    """The graph's input: what ``execute(...)`` is given. Use it as a context manager
    (``with InputNode() as inp:``) or plainly; ``inp[0]``, ``inp["key"]`` and ``inp.key``
    stand for one of several inputs."""

    def __init__(self) -> None:
        super().__init__((), {})

    def __enter__(self) -> InputNode:
        return self

    def __exit__(self, *exc: object) -> None:
        return None

    def __getitem__(self, key: int | str) -> InputAttributeNode:
        return InputAttributeNode(self, key, "__getitem__")

    def __getattr__(self, key: str) -> InputAttributeNode:
        if key.startswith("_"):
            raise AttributeError(key)
        return InputAttributeNode(self, key, "__getattr__")

    def _resolve(self, value_of: Callable[[DAGNode], Any], inp: DAGInputData) -> Any:
        return inp.value()

    def __repr__(self) -> str:
        return "InputNode()"


class InputAttributeNode(DAGNode):
    """One of several inputs: ``inp[key]`` or ``inp.key`` of an InputNode.

    ``parent``: the InputNode. ``key``: the position or name. ``accessor``:
    ``"__getitem__"`` or ``"__getattr__"``."""

    def __init__(self, parent: InputNode, key: int | str, accessor: str) -> None:
        super().__init__((parent,), {})
        self._key = key
        self._accessor = accessor

    def _resolve(self, value_of: Callable[[DAGNode], Any], inp: DAGInputData) -> Any:
        whole = value_of(self._bound_args[0])
        if isinstance(whole, DAGInputData):
            return whole[self._key]
        # execute() got one value: the InputNode is that value, and inp[k] / inp.k
        # index it (as in Ray).
        try:
            if self._accessor == "__getitem__":
                return whole[self._key]
            return getattr(whole, str(self._key))
        except (TypeError, LookupError, AttributeError) as e:
            raise type(e)(f"the graph reads {self!r}, but execute() was given one value, "
                          f"{whole!r:.80}, which the InputNode stands for as a whole: "
                          f"give the inputs separately (execute(a, b, key=c)) ({e})") from None

    def __repr__(self) -> str:
        return f"InputNode()[{self._key!r}]"


class FunctionNode(DAGNode):
    """A task: ``f.bind(*args, **kwargs)``; executes as ``f.remote(...)``.

    ``fn``: the RemoteFunction. ``args``, ``kwargs``: its bound arguments."""

    def __init__(self, fn: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
        super().__init__(args, kwargs, fn._options)
        self._fn = fn

    def _resolve(self, value_of: Callable[[DAGNode], Any], inp: DAGInputData) -> Any:
        args, kwargs = self._bound(value_of)
        return self._fn.remote(*args, **kwargs)

    def __repr__(self) -> str:
        return f"FunctionNode({self._fn._name})"


class ClassNode(DAGNode):
    """An actor: ``Cls.bind(*args, **kwargs)``; executes as ``Cls.remote(...)`` (one
    actor per execute, shared by every method node on it). ``node.method.bind(...)``
    makes a call of one of its methods.

    ``cls``: the ActorClass. ``args``, ``kwargs``: the constructor's bound arguments."""

    def __init__(self, cls: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
        super().__init__(args, kwargs, cls._options)
        self._cls = cls
        # The last method call bound on it: each one bound after runs after it, so the
        # calls bound on this actor run in bind order when the graph runs, outputs or
        # not (as Ray's: a1.inc.bind(2) counts though nothing takes its result).
        self._last_call: ClassMethodNode | None = None

    def __getattr__(self, name: str) -> _UnboundMethod:
        if name.startswith("_"):
            raise AttributeError(name)
        methods = self.__dict__["_cls"]._methods
        if name not in methods:
            raise AttributeError(f"actor class {self._cls.__name__} has no method {name!r}; "
                                 f"its methods: {', '.join(sorted(methods)) or 'none'}")
        return _UnboundMethod(self, name, {})

    def _resolve(self, value_of: Callable[[DAGNode], Any], inp: DAGInputData) -> Any:
        args, kwargs = self._bound(value_of)
        return self._cls.remote(*args, **kwargs)

    def __repr__(self) -> str:
        return f"ClassNode({self._cls.__name__})"


class _UnboundMethod:
    """``class_node.method``: ``.bind(...)`` makes its ClassMethodNode, ``.options(...)``
    sets ``num_returns``."""

    def __init__(self, actor: ClassNode | Any, name: str, options: dict[str, Any]) -> None:
        self._actor = actor
        self._name = name
        self._options = options

    def options(self, **options: Any) -> _UnboundMethod:
        return _UnboundMethod(self._actor, self._name, {**self._options, **options})

    def bind(self, *args: Any, **kwargs: Any) -> ClassMethodNode:
        return ClassMethodNode(self._actor, self._name, args, kwargs, self._options)


class ClassMethodNode(DAGNode):
    """A call of an actor's method: ``class_node.method.bind(...)`` (on the actor the
    graph makes) or ``handle.method.bind(...)`` (on a live actor).

    ``actor``: the ClassNode or ActorHandle. ``name``: the method. ``args``, ``kwargs``:
    its bound arguments. ``options``: the call's options (``num_returns``)."""

    def __init__(self, actor: ClassNode | Any, name: str, args: tuple[Any, ...],
                 kwargs: dict[str, Any], options: dict[str, Any]) -> None:
        super().__init__(args, kwargs, options)
        self._actor = actor
        self._method = name
        self._before: ClassMethodNode | None = None   # the call bound on it before
        if isinstance(actor, ClassNode):
            self._before, actor._last_call = actor._last_call, self

    def _upstream(self) -> tuple[Any, ...]:
        if not isinstance(self._actor, DAGNode):
            return ()
        return (self._actor,) if self._before is None else (self._actor, self._before)

    def _resolve(self, value_of: Callable[[DAGNode], Any], inp: DAGInputData) -> Any:
        handle = value_of(self._actor) if isinstance(self._actor, DAGNode) else self._actor
        method = getattr(handle, self._method)
        if self._bound_options:
            method = method.options(**self._bound_options)
        args, kwargs = self._bound(value_of)
        return method.remote(*args, **kwargs)

    def __repr__(self) -> str:
        return f"ClassMethodNode({self._method})"


class MultiOutputNode(DAGNode):
    """Several results of one graph: ``MultiOutputNode([a, b])``; executes to the list
    of its nodes' results.

    ``outputs``: the nodes (a list or tuple)."""

    def __init__(self, outputs: list[Any] | tuple[Any, ...]) -> None:
        if not isinstance(outputs, (list, tuple)):
            raise TypeError(f"MultiOutputNode takes a list of nodes, got {outputs!r}")
        super().__init__(tuple(outputs), {})

    def _resolve(self, value_of: Callable[[DAGNode], Any], inp: DAGInputData) -> Any:
        return [_substitute(a, value_of) for a in self._bound_args]

    def __repr__(self) -> str:
        return f"MultiOutputNode({len(self._bound_args)})"


def _nodes_in(value: Any) -> Iterator[DAGNode]:
    """The nodes in an argument: itself, or inside lists, tuples and dicts (not within
    other objects: those pass as they are)."""
    stack = [value]
    while stack:
        v = stack.pop()
        if isinstance(v, DAGNode):
            yield v
        elif isinstance(v, (list, tuple)):
            stack.extend(reversed(v))
        elif isinstance(v, dict):
            stack.extend(reversed(list(v.values())))


def _substitute(value: Any, value_of: Callable[[DAGNode], Any]) -> Any:
    """The argument with each node in it replaced by that node's result."""
    if isinstance(value, DAGNode):
        return value_of(value)
    if isinstance(value, list):
        return [_substitute(v, value_of) for v in value]
    if isinstance(value, tuple) and not hasattr(value, "_fields"):
        return tuple(_substitute(v, value_of) for v in value)
    if isinstance(value, dict):
        return {k: _substitute(v, value_of) for k, v in value.items()}
    return value


def order(root: DAGNode) -> list[DAGNode]:
    """The graph's nodes, each once, every node after all the nodes it uses (an
    iterative depth-first post-order; ``root`` last). Raises ValueError on a cycle."""
    done: dict[int, DAGNode] = {}
    active: set[int] = set()
    out: list[DAGNode] = []
    stack: list[tuple[DAGNode, Iterator[DAGNode]]] = [(root, iter(root.children()))]
    active.add(id(root))
    while stack:
        node, kids = stack[-1]
        child = next(kids, None)
        if child is None:
            stack.pop()
            active.discard(id(node))
            done[id(node)] = node
            out.append(node)
        elif id(child) in active:
            raise ValueError(f"the graph has a cycle through {child!r}")
        elif id(child) not in done:
            active.add(id(child))
            stack.append((child, iter(child.children())))
    return out


def _run(root: DAGNode, inp: DAGInputData) -> Any:
    results: dict[int, Any] = {}

    def value_of(node: DAGNode) -> Any:
        return results[id(node)]

    for node in order(root):
        results[id(node)] = node._resolve(value_of, inp)
    return results[id(root)]
