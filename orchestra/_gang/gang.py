"""Gangs: ``orchestra.gang(cls, size, ...)`` starts ``size`` actors that know their ranks.

Data flow::

    driver: gang(Trainer, 4, args=..., num_gpus=1)
        check the cluster can ever hold 4 x the member request (InfeasibleResourcesError)
        Coordinator(4, token=<fresh secret>) on 127.0.0.1 (on a cluster: this node's address,
            which members on other nodes reach), port 0: a gRPC server on threads of this
            process that serves only clients sending the token (the members)
        4 x ActorClass(<member subclass of Trainer>).remote(GangSpec(member=i, token), *args)
            (actor creation is asynchronous: the 4 constructors run at once, one per process)
        -> Gang(actors, coordinator)

    member i's constructor: _gang_member.join(spec)  (Connect and EnumerateDevices barriers,
        ranks, heartbeat thread), then Trainer.__init__(*args)

    liveness: members heartbeat the coordinator; one silent for heartbeat_interval_s x
        max_missing_heartbeats aborts the gang: members' gang calls raise GangAbortedError
        (or the members exit, with exit_on_abort=True), and gang.check() in the driver raises
        GangMemberDiedError naming the member index and its actor.

Ownership: a ``Gang`` owns its coordinator and its actor handles. ``Gang.shutdown()`` (also
``with gang:``) kills the members, then stops the coordinator; a gang dropped without
shutdown stops its coordinator when garbage-collected (its actors stop with their last
handle), and ``orchestra.shutdown()`` stops the coordinators of every gang left. Members
never restart: a restarted member would re-join with a new client, which the coordinator
treats as a crash of the whole gang anyway; restart the gang instead.
"""
from __future__ import annotations

import inspect
import os
import weakref
from collections.abc import Iterator, Mapping, Sequence
from types import TracebackType
from typing import TYPE_CHECKING, Any, cast

from .._api import session as _session
from .._api.actor import ActorClass, ActorHandle, kill
from .._api.scheduling_strategies import NodeAffinitySchedulingStrategy
from .._checks import is_int
from .._ids import node_hex
from .._resources import format_resources, make_request
from .._runtime import context as _context
from ..exceptions import InfeasibleResourcesError, OrchestraError
from . import member as _gang_member
from .errors import GangError, GangMemberDiedError
from .member import GangSpec

if TYPE_CHECKING:
    from .._runtime.object_ref import ObjectRef
    from .coordinator import Coordinator

__all__ = ["Gang", "gang", "stop_coordinators"]

DEFAULT_TIMEOUT_S = 60.0
_EPS = 1e-9
_INFO_METHOD = "_orchestra_gang_info"   # one underscore: _public_methods() lists it

# Every gang not yet shut down, for orchestra.shutdown(); weak, so a dropped gang is freed.
_live_gangs: weakref.WeakSet[Gang] = weakref.WeakSet()


def _member_class(base: type) -> type:
    """A subclass of ``base`` whose constructor joins the gang before ``base.__init__`` runs.

    Same name, methods and docstring as ``base``, so handles, errors and reprs read as the
    user's class; cloudpickle ships it by value (it is not importable), ``base`` by reference.
    """
    def __init__(self: Any, spec: GangSpec, *args: Any, **kwargs: Any) -> None:
        _gang_member.join(spec)
        try:
            cast(Any, base).__init__(self, *args, **kwargs)
        except BaseException:
            # Go silent at once: the peers then fail within the heartbeat timeout instead of
            # waiting for a member whose constructor never finished.
            _gang_member.leave()
            raise

    def info(self: Any) -> dict[str, Any]:
        return _gang_member.member_info()

    return type(base.__name__, (base,), {
        "__init__": __init__, _INFO_METHOD: info, "__doc__": base.__doc__,
        "__module__": base.__module__, "__qualname__": base.__qualname__})


def _resolve_options(cls: object, num_gpus: float | None, num_cpus: float | None,
                     resources: Mapping[str, float] | None) -> tuple[type, dict[str, Any]]:
    """The user's class and the members' actor options (the ActorClass's, then overrides)."""
    if isinstance(cls, ActorClass):
        base, options = cls._cls, dict(cls._options)
    elif inspect.isclass(cls):
        base, options = cls, {}
    else:
        raise TypeError(f"orchestra.gang() takes a class or an @orchestra.remote class, got "
                        f"{type(cls).__name__} {cls!r}")
    name = base.__qualname__
    if options.get("name"):
        raise ValueError(f"gang members of {name} cannot share the actor name "
                         f"{options['name']!r} (names are unique); drop name= and use "
                         "gang.actors[i]")
    if options.get("max_restarts", 0) != 0:
        raise ValueError(f"gang members of {name} cannot restart (max_restarts="
                         f"{options['max_restarts']}): a restarted member re-joins as a new "
                         "client and the coordinator aborts the gang; drop max_restarts and "
                         "start a new gang when one fails")
    if num_gpus is not None:
        options["num_gpus"] = num_gpus
    options.setdefault("num_gpus", 1)
    if num_cpus is not None:
        options["num_cpus"] = num_cpus
    if resources is not None:
        options["resources"] = dict(resources)
    return base, options


def _plan_nodes(size: int, options: Mapping[str, Any], spread: bool,
                client: _context.Client) -> list[str | None]:
    """Which node each member should go to, by the nodes' free resources now: filling
    one node before the next (the driver's node first), or dealt out in turn (spread).
    None: no node has room for it now (it goes wherever it fits when it does)."""
    req = make_request(options.get("num_cpus"), options.get("num_gpus"),
                       options.get("resources"), default_cpus=0)
    cost = dict(req) if "CPU" in req else {**req, "CPU": 1.0}   # a member takes a CPU's room
    mine = node_hex(client.info.node_id)
    nodes = sorted((n for n in _session.nodes() if n["Alive"]),
                   key=lambda n: (n["NodeID"] != mine, n["NodeID"]))
    free = {n["NodeID"]: dict(n.get("AvailableResources") or n["Resources"]) for n in nodes}

    def take(nid: str) -> bool:
        room = free[nid]
        if all(room.get(k, 0.0) + _EPS >= v for k, v in cost.items()):
            for k, v in cost.items():
                room[k] = room.get(k, 0.0) - v
            return True
        return False
    plan: list[str | None] = []
    turn = 0
    for _ in range(size):
        chosen = None
        for i in range(len(nodes)):
            nid = nodes[(turn + i) % len(nodes)]["NodeID"] if spread else nodes[i]["NodeID"]
            if take(nid):
                chosen = nid
                if spread:
                    turn = (turn + i + 1) % len(nodes)
                break
        plan.append(chosen)
    return plan


def _check_capacity(name: str, size: int, options: Mapping[str, Any],
                    totals: Mapping[str, float]) -> None:
    """All members must fit at once, or the first ones wait in Connect for the rest forever."""
    req = make_request(options.get("num_cpus"), options.get("num_gpus"),
                       options.get("resources"), default_cpus=0)
    short = {k: v * size for k, v in req.items() if v * size > totals.get(k, 0.0) + _EPS}
    if short:
        need, have = format_resources(short), format_resources(totals)
        raise InfeasibleResourcesError(
            f"a gang of {size} {name} members needs {need} at once, but the cluster has "
            f"{have}; start fewer members, ask less per member (num_gpus=, num_cpus=, "
            "resources=), or start the cluster with more, e.g. orchestra.init(num_gpus=...)")


def _check_positive(what: str, value: object, *, integer: bool = False) -> None:
    kinds: tuple[type, ...] = (int,) if integer else (int, float)
    if isinstance(value, bool) or not isinstance(value, kinds) or not cast(float, value) > 0:
        kind = "int" if integer else "number"
        raise ValueError(f"{what} must be a positive {kind}, got {value!r}")


def gang(cls: Any, size: int, *, args: Sequence[Any] = (), kwargs: Mapping[str, Any] | None = None,
         num_gpus: float | None = None, num_cpus: float | None = None,
         resources: Mapping[str, float] | None = None, timeout_s: float = DEFAULT_TIMEOUT_S,
         heartbeat_interval_s: float = 10.0, max_missing_heartbeats: int = 10,
         exit_on_abort: bool = False, spread: bool = False) -> Gang:
    """Start ``size`` actors of ``cls`` as one gang; returns at once with a ``Gang``.

    ``cls`` is a plain class or an ``@orchestra.remote`` class (its options apply; those
    given here win: ``num_gpus``, ``num_cpus`` and ``resources`` per member). Every
    member's constructor first joins the gang (all members must be
    running within ``timeout_s``), then runs ``cls.__init__(*args, **kwargs)``; inside it and
    in every method, ``orchestra.gang_context()`` gives the member's rank, world size, local
    rank, node rank, topology, torch/JAX rendezvous and a shared key-value store.
    ``num_gpus`` per member defaults to the class's option, else 1.

    A member silent for ``heartbeat_interval_s * max_missing_heartbeats`` (dead, hung)
    aborts the gang: the others' gang calls raise ``GangAbortedError``, or with
    ``exit_on_abort=True`` their processes exit (use it when members block in collectives
    that would otherwise hang), and ``gang.check()`` names the dead member.

    On a cluster of several nodes, members fill a node (the driver's first) before the
    next, so that members of one host share it; ``spread=True`` deals them out over the
    nodes in turn instead. Each member is sent where that plan puts it while it fits
    there (soft node affinity), else wherever it fits.
    """
    from .coordinator import Coordinator
    from .coordinator_auth import new_token

    if not is_int(size, 1):
        raise ValueError(f"size must be an int >= 1 (the number of members), got {size!r}")
    _check_positive("timeout_s", timeout_s)
    _check_positive("heartbeat_interval_s", heartbeat_interval_s)
    _check_positive("max_missing_heartbeats", max_missing_heartbeats, integer=True)
    if isinstance(args, (str, bytes)) or not isinstance(args, Sequence):
        raise TypeError(f"args must be a tuple or list of constructor arguments, got {args!r}")
    base, options = _resolve_options(cls, num_gpus, num_cpus, resources)
    name = base.__qualname__
    client = _context.current_client()
    totals = (_session.cluster_resources() if client.info.joinable
              else dict(client.info.node_resources))
    _check_capacity(name, size, options, totals)
    member_cls: ActorClass[Any] = ActorClass(_member_class(base), options)
    plan = _plan_nodes(size, options, spread, client) if client.info.joinable else None
    # One secret per gang: any local user can reach a loopback port, and without it could join
    # a forming gang as a missing member, read or replace its rendezvous keys, or claim a
    # running member's id (which aborts the gang and blames that healthy member).
    token = new_token()
    # On a cluster, members on other nodes reach the coordinator at this node's address.
    host = client.info.node_address or "127.0.0.1"
    # A cluster that speaks TLS keeps its gangs' rendezvous (NCCL ids, addresses) off the
    # wire too, with a key made from the gang's own token.
    from .._protocol import auth as _auth
    from .._protocol import tls as _tls
    cluster_token = getattr(client, "token", None) or os.environ.get("ORCHESTRA_TOKEN", "")
    secure = _auth.speaks_tls(cluster_token) and not _tls.is_loopback(host)
    coordinator = Coordinator(size, host=host, port=0, token=token, tls=secure,
                              heartbeat_interval_s=heartbeat_interval_s,
                              max_missing_heartbeats=max_missing_heartbeats,
                              enumerate_timeout_s=timeout_s, shutdown_timeout_s=timeout_s)
    address = coordinator.start()
    actors: list[ActorHandle] = []
    try:
        for member in range(size):
            spec = GangSpec(address=address, size=size, member=member, class_name=name,
                            timeout_s=float(timeout_s),
                            heartbeat_interval_s=float(heartbeat_interval_s),
                            max_missing_heartbeats=max_missing_heartbeats,
                            exit_on_abort=bool(exit_on_abort), token=token, tls=secure)
            cls_i = member_cls
            where = plan[member] if plan is not None else None
            if where is not None:
                cls_i = member_cls.options(scheduling_strategy=NodeAffinitySchedulingStrategy(
                    where, soft=True))
            actors.append(cls_i.remote(spec, *args, **(kwargs or {})))
    except BaseException:
        for handle in actors:
            _kill_quietly(handle)
        coordinator.stop(grace_s=0.0)
        raise
    return Gang(name, actors, coordinator)


def _kill_quietly(handle: ActorHandle) -> None:
    try:
        kill(handle)
    except (OrchestraError, RuntimeError, OSError):
        pass   # the session is gone or going: its workers die with it


def _stop(coordinator: Coordinator) -> None:
    coordinator.stop(grace_s=0.0)


def stop_coordinators() -> None:
    """Stop the coordinator of every gang not yet shut down; called by ``orchestra.shutdown()``
    after the cluster (and so every member) is gone."""
    for g in list(_live_gangs):
        g._shut_down = True
        _live_gangs.discard(g)
        g._finalizer()


_session.add_shutdown_hook(stop_coordinators)


class Gang:
    """The members of one gang, in rank order, and the coordinator they share.

    ``gang.actors[i]`` (also ``gang[i]``, iteration, ``len``) is member i's ``ActorHandle``:
    call methods as on any actor, or on all members with ``gang.call("method", ...)``.

    Made by ``orchestra.gang(...)``: ``class_name`` names the members' class, ``actors``
    are their handles in rank order, ``coordinator`` the gang's coordinator.
    """

    def __init__(self, class_name: str, actors: Sequence[ActorHandle],
                 coordinator: Coordinator) -> None:
        self.class_name = class_name
        self.actors: tuple[ActorHandle, ...] = tuple(actors)
        self.address = coordinator.address
        self._coordinator = coordinator
        self._shut_down = False
        # Not atexit: orchestra.shutdown() (itself run at exit) stops it after the workers.
        self._finalizer = weakref.finalize(self, _stop, coordinator)
        self._finalizer.atexit = False
        _live_gangs.add(self)

    @property
    def size(self) -> int:
        """The number of members."""
        return len(self.actors)

    def __len__(self) -> int:
        return len(self.actors)

    def __getitem__(self, member: int) -> ActorHandle:
        return self.actors[member]

    def __iter__(self) -> Iterator[ActorHandle]:
        return iter(self.actors)

    def __repr__(self) -> str:
        state = "shut down" if self._shut_down else f"coordinator {self.address}"
        return f"<Gang of {self.size} {self.class_name}, {state}>"

    def __reduce__(self) -> tuple[Any, ...]:
        raise TypeError(f"{self!r} cannot be pickled: it owns the coordinator running in this "
                        "process; pass gang.actors (actor handles pickle) to tasks and actors")

    def call(self, method: str, *args: Any, **kwargs: Any) -> list[ObjectRef]:
        """``method(*args, **kwargs)`` on every member; the refs, in rank order."""
        return [getattr(a, method).remote(*args, **kwargs) for a in self.actors]

    def wait_ready(self, timeout_s: float | None = None) -> list[dict[str, Any]]:
        """Block until every member has joined and run its constructor; one dict per member
        (member, rank, local_rank, node_rank, pid, host, gpu_ids).

        Raises ``GangMemberDiedError`` if the gang aborted, ``ActorDiedError`` if a
        constructor failed, ``GetTimeoutError`` after ``timeout_s``.
        """
        refs = self.call(_INFO_METHOD)
        try:
            info: list[dict[str, Any]] = _session.get(refs, timeout=timeout_s)
        except OrchestraError:
            self.check()   # a clearer error when the coordinator knows who died
            raise
        return info

    def dead_members(self) -> list[int]:
        """Indices of the members the coordinator declared dead (empty while all are alive)."""
        return sorted(self._coordinator.state.failed_nodes)

    def check(self) -> None:
        """Raise ``GangMemberDiedError`` if the gang aborted (naming the dead members and
        their actors), ``GangError`` if it was shut down; return if it is healthy."""
        state = self._coordinator.state
        if self._shut_down:
            raise GangError(f"{self!r} was shut down; start a new gang with orchestra.gang()")
        reason = state.aborted_reason
        if reason is None:
            return
        dead = tuple(sorted(state.failed_nodes))
        actors = tuple(self.actors[m] for m in dead)
        if dead:
            who = ", ".join(f"member {m} ({self.actors[m]!r})" for m in dead)
            what = f"{who} died or hung"
        else:
            what = "its coordinator aborted it"
        raise GangMemberDiedError(
            f"the gang of {self.size} {self.class_name} members was aborted: {what}. "
            f"Coordinator: {reason}. The other members' gang calls fail with GangAbortedError "
            "(or they exited, with exit_on_abort=True); call gang.shutdown() and start a new "
            "gang", members=dead, actors=actors, reason=reason)

    def shutdown(self) -> None:
        """Kill every member, then stop the coordinator. Idempotent."""
        if self._shut_down:
            return
        self._shut_down = True
        _live_gangs.discard(self)
        for handle in self.actors:
            _kill_quietly(handle)
        self._finalizer()

    # typing.Self is 3.11+ and orchestra supports 3.10.
    def __enter__(self) -> Gang:  # noqa: PYI034
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.shutdown()
