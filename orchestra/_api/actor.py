"""@orchestra.remote on classes: ActorClass, ActorHandle, ActorMethod, get_actor, kill.

    Counter.remote(*args) --Request(create_actor)--> head: reserve resources, start a
        dedicated worker, run the constructor there --> ActorHandle
    handle.inc.remote(x) --Submit(Call with actor_id, method)--> head --> the actor's
        worker, in the order the head received them (so each caller's order holds);
        once the head has sent the caller's calls there and given it the address of the
        actor's process, later calls go straight to that process and their answers
        straight back (Submitter.submit_actor, ActorRoute in _runtime/direct_core.py)

A handle holds a counted pseudo-ref whose id is the actor id: pickling a handle into a
task, an actor or an object keeps the actor alive like any ObjectRef; when the last
handle anywhere is gone, an unnamed actor is stopped and its resources return.
"""
from __future__ import annotations

import inspect
from typing import Any, Generic, TypeVar

from .. import _ids
from .._checks import is_int
from .._objects.errors import note_private_detached
from .._objects.serialization import dumps_function
from .._resources import check_feasible, make_request
from .._runtime import context as _context
from .._runtime import runtime_env as _runtime_env
from .._runtime import verbs as _verbs
from .._runtime.calls import build_call
from .._runtime.generators import (
    DYNAMIC,
    NONE,
    STREAMING,
    ObjectRefGenerator,
    check_backpressure,
    close_stream,
    generator_mode,
    is_generator_function,
    open_stream,
)
from .._runtime.object_ref import ObjectRef
from .remote_function import GROUP_OPTIONS, legacy_group, placement_of, unknown_options

ACTOR_OPTIONS = frozenset({"num_cpus", "num_gpus", "resources", "max_restarts", "max_concurrency",
                           "name", "scheduling_strategy", "memory", "namespace", "get_if_exists",
                           "lifetime", "max_task_retries", "runtime_env", *GROUP_OPTIONS})
DEFAULT_ASYNC_CONCURRENCY = 1000
# The actor's class, for type checkers: ActorClass[T].remote() is an ActorHandle[T].
T = TypeVar("T")


def method(*args: Any, **options: Any) -> Any:
    """``@orchestra.method(num_returns=N)`` on an actor method: its calls return N refs
    (0: None), as ``handle.m.options(num_returns=N).remote()`` would.

    ``args``: none (TypeError otherwise); ``options``: ``num_returns`` alone."""
    if args or set(options) != {"num_returns"}:
        raise TypeError("@orchestra.method takes one keyword option, num_returns, e.g. "
                        "@orchestra.method(num_returns=2); got "
                        f"{', '.join([repr(a) for a in args] + sorted(options)) or 'nothing'}")
    n = _check_num_returns(options["num_returns"])

    def decorator(fn: Any) -> Any:
        if not callable(fn):
            raise TypeError(f"@orchestra.method goes on a method, not on {fn!r}")
        fn.__orchestra_num_returns__ = n
        return fn
    return decorator


def _check_num_returns(n: object) -> int:
    if not is_int(n, 0):
        raise ValueError(f"num_returns must be an int >= 0, got {n!r}")
    return n


# Every actor answers this method (as Ray's do): True once its constructor has run.
READY = "__ray_ready__"


def _public_methods(cls: type) -> tuple[list[str], bool, list[str], dict[str, int]]:
    """Public method names, whether any is async, which are generators, and
    @orchestra.method num_returns."""
    names, is_async, generators, num_returns = [], False, [], {}
    for name, member in inspect.getmembers(cls):
        if name.startswith("__") or not callable(member):
            continue
        names.append(name)
        if inspect.iscoroutinefunction(member) or inspect.isasyncgenfunction(member):
            is_async = True
        if is_generator_function(member):
            generators.append(name)
        n = getattr(member, "__orchestra_num_returns__", None)
        if n is not None and n != 1:
            num_returns[name] = n
    return names, is_async, generators, num_returns


def _validate(opts: dict[str, Any], cls_name: str) -> dict[str, Any]:
    unknown = set(opts) - ACTOR_OPTIONS
    if unknown:
        raise unknown_options(unknown, ACTOR_OPTIONS, f"actor class {cls_name}")
    mr = opts.get("max_restarts", 0)
    if not is_int(mr, -1):
        raise ValueError(f"max_restarts must be an int >= 0, or -1 for no limit; got {mr!r}")
    mc = opts.get("max_concurrency")
    if mc is not None and (not is_int(mc, 1)):
        raise ValueError(f"max_concurrency must be an int >= 1, got {mc!r}")
    name = opts.get("name")
    if name is not None and (not isinstance(name, str) or not name):
        raise ValueError(f"name must be a non-empty string, got {name!r}")
    mtr = opts.get("max_task_retries", 0)
    if not is_int(mtr, -1):
        raise ValueError(f"max_task_retries must be an int >= 0, or -1 for no limit; got {mtr!r}")
    ns = opts.get("namespace")
    if ns is not None and (not isinstance(ns, str) or not ns):
        raise ValueError(f"namespace must be a non-empty string, got {ns!r}")
    if opts.get("get_if_exists") and not name:
        raise ValueError("get_if_exists=True needs name=: it finds the live actor of that name")
    lifetime = opts.get("lifetime")
    if lifetime not in (None, "detached", "non_detached"):
        raise ValueError(f"lifetime={lifetime!r}: use None (the actor ends with its driver) or "
                         "\"detached\"")
    if lifetime == "detached" and not name:
        raise ValueError("lifetime=\"detached\" needs name=: nothing could reach the actor "
                         "after its driver exits but get_actor(name)")
    _runtime_env.check(opts.get("runtime_env"))
    # Actors hold no CPU unless asked (as in Ray): many can live on few cores.
    make_request(opts.get("num_cpus"), opts.get("num_gpus"), opts.get("resources"), default_cpus=0,
                 memory=opts.get("memory"))
    placement_of(opts.get("scheduling_strategy"))
    return opts


class ActorClass(Generic[T]):
    """A class whose instances live in their own worker process: ``Cls.remote(...)``.

    Made by ``@orchestra.remote`` on a class (``ActorClass[T]`` to a type checker).
    ``cls``: the class. ``options``: the actor options (see ``orchestra.remote``).
    ``function_id``: the id its class is registered under (``options()`` keeps it)."""

    def __init__(self, cls: type[T], options: dict[str, Any], function_id: bytes | None = None) -> None:
        self._cls = cls
        options = legacy_group(options)
        self._options = _validate(dict(options), cls.__name__)
        self._function_id = function_id or _ids.next_task_id() + b"\0" * 4
        self._methods, self._is_async, self._generators, self._num_returns = _public_methods(cls)
        self._resources = make_request(options.get("num_cpus"), options.get("num_gpus"),
                                       options.get("resources"), default_cpus=0,
                                       memory=options.get("memory"))
        self._client: _context.Client | None = None
        self._register_frame = b""
        self.__name__ = cls.__name__
        self.__qualname__ = cls.__qualname__
        self.__doc__ = cls.__doc__
        self.__module__ = cls.__module__

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        raise TypeError(f"actor class {self._cls.__name__} cannot be instantiated directly: use "
                        f"{self._cls.__name__}.remote(...) to start an actor")

    def options(self, **options: Any) -> ActorClass[T]:
        """A copy with some options changed (``name=``, ``namespace=``, ``lifetime=``,
        resources, ...; see ``orchestra.remote``).

        ``options``: actor options, over this one's."""
        return ActorClass(self._cls, {**self._options, **options}, self._function_id)

    def remote(self, *args: Any, **kwargs: Any) -> ActorHandle[T]:
        """Start an actor: a worker process of its own runs ``cls(*args, **kwargs)`` and
        then its method calls. Returns its handle at once.

        ``args``, ``kwargs``: the constructor's arguments (ObjectRefs among the
        top-level ones arrive as their values)."""
        client = _context.current_client()
        if client is not self._client:
            if not (client.info.joinable or client.info.infeasible_waits):
                check_feasible(self._resources, [dict(client.info.node_resources)],
                               f"actor {self._cls.__name__}")
            self._register_frame = _verbs.function_frame(
                self._function_id, self._cls.__qualname__, dumps_function(self._cls))
            self._client = client
        client.submitter.register_function(self._function_id, self._register_frame)
        opts = self._options
        tid = _ids.next_task_id()
        actor_id = _ids.actor_id(tid)
        concurrency = opts.get("max_concurrency") or (DEFAULT_ASYNC_CONCURRENCY if self._is_async else 1)
        detached = opts.get("lifetime") == "detached"
        if detached and not client.info.joinable:
            note_private_detached("actor")
        spec = _verbs.actor_spec(actor_id=actor_id, name=opts.get("name") or "",
                            max_restarts=opts.get("max_restarts", 0), max_concurrency=concurrency,
                            is_async=self._is_async, methods=self._methods,
                            class_name=self._cls.__qualname__,
                            generator_methods=self._generators,
                            namespace=opts.get("namespace") or client.namespace,
                            get_if_exists=bool(opts.get("get_if_exists")), detached=detached,
                            max_task_retries=opts.get("max_task_retries", 0),
                            method_num_returns=self._num_returns)
        call = build_call(client, tid, self._function_id, args, kwargs, num_returns=0,
                          resources=self._resources, name=f"{self._cls.__qualname__}.__init__")
        call.actor.CopyFrom(spec)
        placement = placement_of(opts.get("scheduling_strategy"))
        if placement is not None:
            call.placement.CopyFrom(placement)
        env = _runtime_env.merge(client.runtime_env, _runtime_env.check(opts.get("runtime_env")))
        if env is not None:
            call.runtime_env.CopyFrom(env)
        live = _verbs.create_actor(client, call)   # ValueError: the name is taken
        # (The client now: a restarted head's, if the request was made again there.)
        client = _context.current_client()
        if live is not None:   # get_if_exists: the live actor of that name
            return ActorHandle(live, client)
        handle: ActorHandle[T] = ActorHandle(spec, client, counted=True)
        return handle

    def bind(self, *args: Any, **kwargs: Any) -> Any:
        """A node of a lazy graph that starts this actor when the graph executes
        (``orchestra.dag``); ``node.method.bind(...)`` calls its methods there.

        ``args``, ``kwargs``: the constructor's arguments; they may hold other nodes."""
        from .dag import ClassNode
        return ClassNode(self, args, kwargs)

    def __reduce__(self) -> tuple[Any, ...]:
        return (ActorClass, (self._cls, self._options, self._function_id))

    def __repr__(self) -> str:
        return f"<ActorClass {self._cls.__qualname__}>"


class ActorHandle(Generic[T]):
    """A reference to a running actor; ``handle.method.remote(...)`` calls it
    (``ActorHandle[T]`` to a type checker, ``T`` the actor's class). Pass it to tasks and
    other actors freely: the actor lives while any handle does (or while it is named
    and detached).

    Made by ``Cls.remote(...)`` and ``get_actor(name)``: ``spec`` is the actor's
    description, ``client`` this process's connection, ``counted`` whether the head
    already counts this handle's reference."""

    def __init__(self, spec: Any, client: _context.Client, counted: bool = False) -> None:
        self._spec = spec
        self._actor_id = spec.actor_id
        self._methods = frozenset(spec.methods)
        self._generators = frozenset(spec.generator_methods)
        self._num_returns = dict(spec.method_num_returns)
        self._token: ObjectRef[None] = ObjectRef(spec.actor_id, client, counted=counted)

    def __getattr__(self, name: str) -> ActorMethod:
        """The actor's method ``name``, to call with ``.remote(...)``; AttributeError
        naming the methods there are for a name that is not one."""
        if name == READY:
            return ActorMethod(self, name, None)
        if name.startswith("_") and name not in self.__dict__.get("_methods", ()):
            raise AttributeError(name)
        if name not in self._methods:
            raise AttributeError(f"actor {self._spec.class_name} has no method {name!r}; "
                                 f"its methods: {', '.join(sorted(self._methods)) or 'none'}")
        return ActorMethod(self, name, self._num_returns.get(name))

    def __reduce__(self) -> tuple[Any, ...]:
        # The token pickles as a ref contained in whatever holds the handle.
        return (_rebuild_handle, (self._spec.SerializeToString(), self._token))

    def __repr__(self) -> str:
        return f"ActorHandle({self._spec.class_name}, {self._actor_id.hex()})"

    def __eq__(self, other: object) -> bool:
        return isinstance(other, ActorHandle) and other._actor_id == self._actor_id

    def __hash__(self) -> int:
        return hash(self._actor_id)


def _rebuild_handle(spec_bytes: bytes, token: ObjectRef[None]) -> ActorHandle[Any]:
    h: ActorHandle[Any] = ActorHandle.__new__(ActorHandle)
    spec = _verbs.actor_spec_from(spec_bytes)
    h._spec = spec
    h._actor_id = spec.actor_id
    h._methods = frozenset(spec.methods)
    h._generators = frozenset(spec.generator_methods)
    h._num_returns = dict(spec.method_num_returns)
    h._token = token
    return h


class ActorMethod:
    """A method of an actor, reached through its handle: ``handle.m.remote(...)`` calls
    it, ``handle.m.options(num_returns=...)`` changes how many refs a call returns.

    ``handle``: the actor's handle. ``name``: the method's name. ``num_returns``: the
    refs per call (None: 1, or a stream for a generator method; "dynamic" or
    "streaming" for a generator method). ``backpressure``: items a streaming call may
    run ahead of its reader (0: no limit)."""

    __slots__ = ("_handle", "_name", "_num_returns", "_generator", "_backpressure")

    def __init__(self, handle: ActorHandle[Any], name: str, num_returns: int | str | None,
                 backpressure: int = 0) -> None:
        self._handle = handle
        self._name = name
        # A generator method streams its items unless num_returns says otherwise
        # (_runtime/generators.py); its one return is the stream's end.
        if num_returns is None:
            self._generator = STREAMING if name in handle._generators else NONE
            self._num_returns = 1
        elif isinstance(num_returns, str):
            self._generator = generator_mode(num_returns, name in handle._generators,
                                             f"{handle._spec.class_name}.{name}()")
            self._num_returns = 1
        else:
            self._generator = NONE
            self._num_returns = num_returns
        self._backpressure = backpressure

    def options(self, *, num_returns: int | str | None = None,
                _generator_backpressure_num_objects: int | None = None) -> ActorMethod:
        """This method with other call options.

        ``num_returns``: refs per call (an int >= 0, or "dynamic"/"streaming" for a
        generator method). ``_generator_backpressure_num_objects``: for a streaming
        call, how many items may wait unread before the method pauses."""
        if not isinstance(num_returns, (str, type(None))) and (
                not is_int(num_returns, 0)):
            raise ValueError(f"num_returns must be an int >= 0, \"dynamic\" or \"streaming\"; "
                             f"got {num_returns!r}")
        return ActorMethod(self._handle, self._name, num_returns,
                           check_backpressure(_generator_backpressure_num_objects))

    def remote(self, *args: Any, **kwargs: Any) -> Any:
        """Call the method on the actor; returns the ObjectRef of its result at once
        (a list for ``num_returns=N``, None for 0, an ObjectRefGenerator for a
        generator method). Calls from one caller run in the order they were made.

        ``args``, ``kwargs``: the method's arguments (top-level ObjectRefs arrive as
        their values)."""
        return _context.once_more_on_a_new_head(
            _context.current_client(), lambda client: self._remote(client, args, kwargs))

    def _remote(self, client: _context.Client, args: tuple[Any, ...],
                kwargs: dict[str, Any]) -> Any:
        h = self._handle
        key = (h._actor_id, self._name, self._num_returns, self._generator, self._backpressure)
        template = client.submitter.templates.get(key)
        if template is None:
            template = _verbs.method_template(
                num_returns=self._num_returns, max_retries=h._spec.max_task_retries,
                actor_id=h._actor_id, method=self._name, name=f"{h._spec.class_name}.{self._name}",
                generator=self._generator, generator_backpressure=self._backpressure)
            client.submitter.templates[key] = template
        if self._generator == STREAMING:
            tid = _ids.next_task_id()
            stream = open_stream(client, tid)
            try:
                end = client.submitter.submit_actor(
                    h._actor_id, h._token, template, 1, args, kwargs,
                    f"{h._spec.class_name}.{self._name}", tid)
            except BaseException:
                close_stream(client, tid)
                raise
            return ObjectRefGenerator(client, stream, end[0], self._backpressure)
        refs = client.submitter.submit_actor(
            h._actor_id, h._token, template, self._num_returns, args, kwargs,
            f"{h._spec.class_name}.{self._name}")
        if self._num_returns == 1:
            return refs[0]
        return None if self._num_returns == 0 else refs

    def bind(self, *args: Any, **kwargs: Any) -> Any:
        """A node of a lazy graph that calls this method when the graph executes
        (``orchestra.dag``).

        ``args``, ``kwargs``: the method's arguments; they may hold other nodes."""
        from .dag import ClassMethodNode
        mode = {NONE: self._num_returns, DYNAMIC: "dynamic", STREAMING: "streaming"}
        opts = {"num_returns": mode[self._generator]}
        return ClassMethodNode(self._handle, self._name, args, kwargs, opts)

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        raise TypeError(f"actor method {self._name}() cannot be called directly: use "
                        f"handle.{self._name}.remote(...)")


def get_actor(name: str, namespace: str | None = None) -> ActorHandle[Any]:
    """The handle of the named actor in ``namespace`` (None: this driver's); ValueError
    if no live actor there has that name.

    ``name``: the name given by ``Cls.options(name=...)``. ``namespace``: where to look
    (``init(namespace=...)`` or ``options(namespace=...)`` set it)."""
    if not isinstance(name, str) or not name:
        raise TypeError(f"get_actor() takes an actor name (str), got {name!r}")
    if namespace is not None and (not isinstance(namespace, str) or not namespace):
        raise TypeError(f"get_actor(namespace=) takes a non-empty string, got {namespace!r}")
    client = _context.current_client()
    spec = _verbs.find_actor(client, name, namespace or client.namespace)   # ValueError: none
    return ActorHandle(spec, client)


def kill(handle: ActorHandle[Any], *, no_restart: bool = True) -> None:
    """Stop the actor now. Pending and later calls raise ActorDiedError.

    ``handle``: the actor's handle. ``no_restart``: True (the default) ends it for
    good; False lets an actor with restarts left (``max_restarts``) start again."""
    if not isinstance(handle, ActorHandle):
        raise TypeError(f"kill() takes an ActorHandle, got {type(handle).__name__}")
    client = _context.current_client()
    client.submitter.retire_route(handle._actor_id)
    _verbs.kill_actor(client, handle._actor_id, bool(no_restart))


def exit_actor() -> None:
    """End the current actor from one of its methods (sync or async), as Ray's does.

    The method's caller and every later call get ActorDiedError saying the actor
    exited on purpose; the actor is not restarted, whatever its max_restarts. Outside
    an actor: TypeError."""
    if not _context.in_actor():
        raise TypeError("exit_actor() is called outside an actor: call it inside an actor "
                        "method to end that actor; to stop an actor from outside, use "
                        "orchestra.kill(handle)")
    raise _context.ActorExitRequest()
