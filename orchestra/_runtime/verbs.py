"""What the API asks and tells the head, as verbs: each builds its Request, waits for
the Reply (CoreClient.request: the head's error raised as its class) and returns Python
values; the messages a driver sends (its hello, a function, a job's end) are made here
too, so that the API layer imports nothing of the protocol.

    orchestra.get_actor / kill       -> find_actor, kill_actor (create_actor: Actor.remote)
    placement_group / remove / get   -> create_placement_group, remove_placement_group,
                                        placement_group_named, placement_group_rows
    nodes / cluster_resources / ...  -> nodes, resources, pending_tasks, debug_info
    orchestra.util.state.list_*      -> state_query (rows as JSON)
    init() / shutdown()              -> hello, over_tcp, use_tls_files, end_job, stop_cluster
    f.remote() / Actor.remote()      -> function_frame, task_template, placement, actor_spec,
                                        method_template

An actor's spec (pb.ActorSpec) is still the handle's data: made here, kept and read by
the API as an object it does not build itself.

A request whose head died before it answered (a driver that outlives its head) is made
again on the restarted head once this process is connected to it (_ask): each is one the
head may see twice. A creation names its actor or group by an id the API chose, and
one the head has already is not made again (SchedulerState.create_actor,
PlacementGroups.create); a kill or a removal of what is gone is nothing; the rest only read.
The API binds what it makes (a handle, a ref) to the client that holds the session
after the request (context.current_client()), the restarted head's if it was made there.
"""
from __future__ import annotations

import json
import os
import socket
import sys
from typing import Any, Protocol, cast

from .._ids import node_hex
from .._protocol import pb
from .._protocol import wire as _wire
from .._protocol.connection import parse_address
from . import context as _context


class Requester(Protocol):
    """What the verbs use of the CoreClient."""

    def request(self, req: pb.Request, timeout_s: float = 60.0) -> pb.Reply: ...
    def send(self, kind: int, msg: Any) -> None: ...


def _ask(client: Requester, req: pb.Request, timeout_s: float = 60.0) -> pb.Reply:
    """``client.request(req)``, made again on the restarted head's client when the head
    died before it answered (see the module docstring); ClusterLostError when nothing
    restarts it."""
    reply: pb.Reply = _context.once_more_on_a_new_head(
        cast(_context.Client, client), lambda c: c.request(req, timeout_s))
    return reply


# ---------------------------------------------------------------------- a driver's session
def hello(namespace: str, key: bytes, machine: str, entrypoint: str, tool: bool) -> pb.Hello:
    """A driver's Hello: who it is, where it runs, its namespace and its key (the actors
    it makes are its, also on a restarted head)."""
    return pb.Hello(kind="driver", pid=os.getpid(), cwd=os.getcwd(), sys_path=sys.path,
                    machine=machine, namespace=namespace, driver_key=key,
                    entrypoint=entrypoint, tool=tool)


def over_tcp(address: str) -> bool:
    """Whether ``address`` is a cluster's HOST:PORT (else a unix socket's path)."""
    return parse_address(address)[0] != socket.AF_UNIX


def use_tls_files(cert: str | os.PathLike[str] | None, key: str | os.PathLike[str] | None,
                  ca: str | os.PathLike[str] | None) -> None:
    """Certificates of the user's own for this process's TLS (_protocol/pki.py)."""
    from .._protocol import pki
    pki.use(cert, key, ca)


def end_job(client: Requester) -> None:
    """This driver's job ends as asked (list_jobs(): SUCCEEDED)."""
    client.send(_wire.JOB_END, pb.AckReply())


def stop_cluster(client: Requester) -> None:
    """The cluster this driver started stops (its head ends)."""
    client.send(_wire.SHUTDOWN, pb.AckReply())


def placement(**fields: Any) -> pb.Placement:
    """A call's placement (scheduling_strategy=): Placement's fields."""
    return pb.Placement(**fields)


def task_template(placement: pb.Placement | None, runtime_env: Any, **fields: Any) -> bytes:
    """The encoded Call every call of one remote function starts from (Call's fields,
    its placement and runtime_env when set)."""
    call = pb.Call(**fields)
    if placement is not None:
        call.placement.CopyFrom(placement)
    if runtime_env is not None:
        call.runtime_env.CopyFrom(runtime_env)
    return call.SerializeToString()


def function_frame(function_id: bytes, name: str, pickled: bytes, num_returns: int = 0) -> bytes:
    """The frame that registers a function or class with the head (sent once per client)."""
    return _wire.encode(_wire.FUNCTION, pb.RegisterFunctionRequest(
        function_id=function_id, fnname=name, num_return_vals=num_returns, pickled=pickled))


# ---------------------------------------------------------------------- actors
def actor_spec(**fields: Any) -> pb.ActorSpec:
    """An actor's spec (ActorSpec's fields: actor_id, name, max_restarts, methods, ...)."""
    return pb.ActorSpec(**fields)


def actor_spec_from(data: bytes) -> pb.ActorSpec:
    """The spec a pickled handle carries."""
    return pb.ActorSpec.FromString(data)


def method_template(**fields: Any) -> bytes:
    """The encoded Call every call of one actor method starts from (Call's fields)."""
    return pb.Call(**fields).SerializeToString()


def create_actor(client: Requester, call: pb.Call) -> pb.ActorSpec | None:
    """Create the actor ``call`` makes (its spec in ``call.actor``). ValueError when its
    name is taken; the live actor's spec when get_if_exists found one (None: created)."""
    reply = _ask(client, pb.Request(create_actor=call))
    return reply.actor if reply.HasField("actor") else None


def find_actor(client: Requester, name: str, namespace: str) -> pb.ActorSpec:
    """The spec of the live actor ``name`` in ``namespace``; ValueError when none."""
    return _ask(client, pb.Request(get_actor_in=pb.ActorLookup(
        name=name, namespace=namespace))).actor


def kill_actor(client: Requester, actor_id: bytes, no_restart: bool) -> None:
    """End the actor now (``no_restart``: for good; else it restarts if it may)."""
    _ask(client, pb.Request(kill_actor=pb.KillActor(actor_id=actor_id,
                                                    no_restart=no_restart)))


# ---------------------------------------------------------------------- placement groups
def create_placement_group(client: Requester, group_id: bytes, bundles: list[dict[str, float]],
                           strategy: str, name: str, detached: bool) -> None:
    """Reserve ``bundles`` under ``group_id`` (ready once its ready object is sealed)."""
    spec = pb.PlacementGroupSpec(group_id=group_id, strategy=strategy, name=name,
                                 detached=detached,
                                 bundles=[pb.PlacementBundle(resources=b) for b in bundles])
    _ask(client, pb.Request(create_placement_group=spec))


def remove_placement_group(client: Requester, group_id: bytes) -> None:
    _ask(client, pb.Request(remove_placement_group=group_id))


def placement_group_named(client: Requester, name: str) -> tuple[bytes, list[dict[str, float]]]:
    """The live group ``name``: its id and bundles. ValueError when none."""
    info = _ask(client, pb.Request(get_placement_group=name)).placement_groups[0]
    return info.spec.group_id, [dict(b.resources) for b in info.spec.bundles]


def placement_group_rows(client: Requester, group_id: bytes = b"") -> list[dict[str, Any]]:
    """The record of the group ``group_id`` (b"": of every group), as
    placement_group_table() shows them."""
    reply = _ask(client, pb.Request(placement_group_table=group_id))
    return [_group_row(info) for info in reply.placement_groups]


def _group_row(info: pb.PlacementGroupInfo) -> dict[str, Any]:
    spec = info.spec
    return {
        "placement_group_id": spec.group_id.hex(),
        "name": spec.name,
        "strategy": spec.strategy,
        "state": info.state,
        "bundles": {i: dict(b.resources) for i, b in enumerate(spec.bundles)},
        "bundles_to_node_id": {i: node_hex(n - 1) for i, n in enumerate(info.bundle_nodes) if n},
        "stats": {"lifetime": "detached" if spec.detached else "non_detached"},
    }


# ---------------------------------------------------------------------- the cluster
def nodes(client: Requester) -> list[dict[str, Any]]:
    """One dict per node, alive or dead, with Ray's keys (orchestra.nodes())."""
    out = []
    for n in _ask(client, pb.Request(query="nodes")).nodes:
        d: dict[str, Any] = {
            "NodeID": node_hex(n.node_id), "Alive": n.alive, "NodeManagerAddress": n.address,
            "Resources": dict(n.resources), "AvailableResources": dict(n.available),
            "ObjectStoreCapacity": n.store_capacity, "ObjectStoreUsed": n.store_used,
            "ObjectStoreSpilled": n.spilled_bytes, "Pid": n.pid}
        if not n.alive:
            d["DeathReason"] = n.death
        out.append(d)
    return out


def resources(client: Requester, which: str) -> dict[str, float]:
    """``which``: "cluster_resources" (every node's, summed) or "available_resources"
    (what running tasks do not hold now)."""
    return dict(_ask(client, pb.Request(query=which), timeout_s=30).resources)


def pending_tasks(client: Requester, own_only: bool = False) -> int:
    """The head's count of this driver's unfinished tasks (and, unless ``own_only``,
    those any worker submitted)."""
    query = "pending_own" if own_only else "pending"
    return int(_ask(client, pb.Request(query=query), timeout_s=10).pending_tasks)


def debug_info(client: Requester) -> pb.SchedulerDebugInfoReply:
    """The scheduler's tables as the head keeps them (tests and tools read them)."""
    return _ask(client, pb.Request(query="debug"), timeout_s=30).debug


def state_query(client: Requester, what: str, filters: list[list[Any]], limit: int,
                detail: bool = False, timeout: float = 30.0) -> Any:
    """The rows of ``what`` (tasks, actors, objects, ..., or "summary") as the head
    answers them (orchestra.util.state); ValueError for a bad filter."""
    req = pb.Request(state_query=pb.StateQuery(what=what, filters_json=json.dumps(filters),
                                               limit=int(limit), detail=detail))
    return json.loads(_ask(client, req, timeout_s=timeout).state_json)


__all__ = ["actor_spec", "actor_spec_from", "create_actor", "create_placement_group",
           "debug_info", "end_job", "find_actor", "function_frame", "hello", "kill_actor",
           "method_template", "nodes", "over_tcp", "pending_tasks", "placement",
           "placement_group_named", "placement_group_rows", "remove_placement_group",
           "resources", "state_query", "stop_cluster", "task_template", "use_tls_files"]
