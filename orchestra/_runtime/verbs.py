"""What the API asks the head, as verbs: each builds its Request, waits for the Reply
(CoreClient.request: the head's error raised as its class) and returns Python values,
so that the API layer builds no request and reads no reply itself.

    orchestra.get_actor / kill       -> find_actor, kill_actor (create_actor: Actor.remote)
    placement_group / remove / get   -> create_placement_group, remove_placement_group,
                                        placement_group_named, placement_group_rows
    nodes / cluster_resources / ...  -> nodes, resources, pending_tasks, debug_info
    orchestra.util.state.list_*      -> state_query (rows as JSON)

An actor's spec (pb.ActorSpec) and a call (pb.Call) are still the API's data: the handle
keeps the spec the head answers with, as the call it submits is built by the API.
"""
from __future__ import annotations

import json
from typing import Any, Protocol

from .._ids import node_hex
from .._protocol import pb


class Requester(Protocol):
    """What the verbs use of the CoreClient."""

    def request(self, req: pb.Request, timeout_s: float = 60.0) -> pb.Reply: ...


# ---------------------------------------------------------------------- actors
def create_actor(client: Requester, call: pb.Call) -> pb.ActorSpec | None:
    """Create the actor ``call`` makes (its spec in ``call.actor``). ValueError when its
    name is taken; the live actor's spec when get_if_exists found one (None: created)."""
    reply = client.request(pb.Request(create_actor=call))
    return reply.actor if reply.HasField("actor") else None


def find_actor(client: Requester, name: str, namespace: str) -> pb.ActorSpec:
    """The spec of the live actor ``name`` in ``namespace``; ValueError when none."""
    return client.request(pb.Request(get_actor_in=pb.ActorLookup(
        name=name, namespace=namespace))).actor


def kill_actor(client: Requester, actor_id: bytes, no_restart: bool) -> None:
    """End the actor now (``no_restart``: for good; else it restarts if it may)."""
    client.request(pb.Request(kill_actor=pb.KillActor(actor_id=actor_id,
                                                      no_restart=no_restart)))


# ---------------------------------------------------------------------- placement groups
def create_placement_group(client: Requester, group_id: bytes, bundles: list[dict[str, float]],
                           strategy: str, name: str, detached: bool) -> None:
    """Reserve ``bundles`` under ``group_id`` (ready once its ready object is sealed)."""
    spec = pb.PlacementGroupSpec(group_id=group_id, strategy=strategy, name=name,
                                 detached=detached,
                                 bundles=[pb.PlacementBundle(resources=b) for b in bundles])
    client.request(pb.Request(create_placement_group=spec))


def remove_placement_group(client: Requester, group_id: bytes) -> None:
    client.request(pb.Request(remove_placement_group=group_id))


def placement_group_named(client: Requester, name: str) -> tuple[bytes, list[dict[str, float]]]:
    """The live group ``name``: its id and bundles. ValueError when none."""
    info = client.request(pb.Request(get_placement_group=name)).placement_groups[0]
    return info.spec.group_id, [dict(b.resources) for b in info.spec.bundles]


def placement_group_rows(client: Requester, group_id: bytes = b"") -> list[dict[str, Any]]:
    """The record of the group ``group_id`` (b"": of every group), as
    placement_group_table() shows them."""
    reply = client.request(pb.Request(placement_group_table=group_id))
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
    for n in client.request(pb.Request(query="nodes")).nodes:
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
    return dict(client.request(pb.Request(query=which), timeout_s=30).resources)


def pending_tasks(client: Requester, own_only: bool = False) -> int:
    """The head's count of this driver's unfinished tasks (and, unless ``own_only``,
    those any worker submitted)."""
    query = "pending_own" if own_only else "pending"
    return int(client.request(pb.Request(query=query), timeout_s=10).pending_tasks)


def debug_info(client: Requester) -> pb.SchedulerDebugInfoReply:
    """The scheduler's tables as the head keeps them (tests and tools read them)."""
    return client.request(pb.Request(query="debug"), timeout_s=30).debug


def state_query(client: Requester, what: str, filters: list[list[Any]], limit: int,
                detail: bool = False, timeout: float = 30.0) -> Any:
    """The rows of ``what`` (tasks, actors, objects, ..., or "summary") as the head
    answers them (orchestra.util.state); ValueError for a bad filter."""
    req = pb.Request(state_query=pb.StateQuery(what=what, filters_json=json.dumps(filters),
                                               limit=int(limit), detail=detail))
    return json.loads(client.request(req, timeout_s=timeout).state_json)


__all__ = ["create_actor", "create_placement_group", "debug_info", "find_actor", "kill_actor",
           "nodes", "pending_tasks", "placement_group_named", "placement_group_rows",
           "remove_placement_group", "resources", "state_query"]
