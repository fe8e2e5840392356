"""What a restarted head must know and cannot learn again from its nodes and drivers:
records of actors and detached placement groups, decided here, kept in the head's state
store (_head/state_store.py). No I/O.

    ActorTable: a kept actor (detached, or a driver's) created, placed (the node its
        process runs on), restarted, dead
    PlacementGroups: a detached group created, removed
        --Durable(table, key, value | None)--> state.out --> Head.carry_out
        --> HeadState.write: the store's own thread writes it, in order, off the loop
    a head started on a store that holds records: restore(state, owner, records)
        the groups first (an actor may be placed in one), then the actors: each a new
        instance of its class (its constructor runs again, restart_count + 1; such
        restarts are not counted against its max_restarts), except one whose process
        ran on a joined node: it waits for that process (ActorTable.awaiting), which
        ActorTable.adopt takes back with its state (the restart taken back), or is
        placed as a new instance once the wait ends (release_awaiting)

Records change when a kept thing is made, placed, restarted or ends: never per task
or call, so the hot path never meets them. An actor's record holds its
constructor's call and its class (the function table is not kept: a restarted head
knows no other function until a driver registers it again). Its constructor's
arguments passed as refs name objects of the cluster before the restart, gone since:
such an actor is restored dead, its error naming the lost argument.

A head with a state store keeps the actors drivers make too (ActorTable.keep_owned;
not those in a placement group): their record names the driver by its key
(Hello.driver_key, the same on each connection of its session); restored, each is held
by the head until that driver connects again and claims it (ActorTable.claim: its
handle's hold becomes the driver's) or the drivers' time to connect again ends
(expire_unclaimed: stopped). Placement groups that are not detached end with their
creator's connection; they are not kept.
"""
from __future__ import annotations

from collections.abc import Mapping
from typing import Protocol

from .._protocol import pb
from .instructions import Durable, Instruction

ACTORS = "actors"   # kept actor id (hex) -> DurableActor
GROUPS = "groups"   # detached placement group id (hex) -> PlacementGroupSpec
NODES = "nodes"     # joined node id (decimal) serving -> b"" (_head/rejoin.py)
JOBS = "jobs"       # driver key (hex) -> DurableJob (_scheduler/jobs.py)
TABLES = (ACTORS, GROUPS, NODES, JOBS)


class _Groups(Protocol):
    def create(self, conn: int, spec: pb.PlacementGroupSpec) -> None: ...


class _Actors(Protocol):
    awaiting: dict[bytes, int]

    def restored(self, actor_id: bytes, revived: int, owner_key: bytes = b"") -> None: ...
    def reserve(self, node_id: int) -> None: ...


class Restorable(Protocol):
    """What restore() uses of the scheduler (SchedulerState)."""

    out: list[Instruction]

    @property
    def groups(self) -> _Groups: ...

    @property
    def actor_table(self) -> _Actors: ...

    def register_function(self, req: pb.RegisterFunctionRequest) -> None: ...

    def create_actor(self, conn: int, call: pb.Call) -> pb.ActorSpec | None: ...


def actor_kept(creation: pb.Call, restarts: int, revived: int,
               cls: pb.RegisterFunctionRequest | None, node_id: int = 0,
               owner_key: bytes = b"") -> Durable:
    """The record of a kept actor as it is now: its constructor's call, its restarts
    so far (``revived`` of them by restarted heads), its class, the node its process
    runs on (0: none yet), and a non-detached one's driver's key."""
    rec = pb.DurableActor(creation=creation, restarts=restarts, revived=revived,
                          node_id=node_id, owner_key=owner_key)
    if cls is not None:
        rec.cls.CopyFrom(cls)
    return Durable(ACTORS, creation.actor.actor_id.hex(), rec.SerializeToString())


def actor_gone(actor_id: bytes) -> Durable:
    return Durable(ACTORS, actor_id.hex(), None)


def group_kept(spec: pb.PlacementGroupSpec) -> Durable:
    return Durable(GROUPS, spec.group_id.hex(), spec.SerializeToString())


def group_gone(group_id: bytes) -> Durable:
    return Durable(GROUPS, group_id.hex(), None)


def restore(state: Restorable, owner: int,
            records: Mapping[str, Mapping[str, bytes]], joined_from: int = 0) -> list[str]:
    """Make again what ``records`` (table -> key -> value, as the store holds them)
    name, held by ``owner`` (the head's own pseudo-client, which lives as long as the
    head). An actor whose process ran on a joined node (id >= ``joined_from``; 0: none
    is) waits in actor_table.awaiting for that process to come back, instead of being
    placed (ActorTable.adopt / release_awaiting). Returns what could not be restored, in
    words (the head logs it); such a record is deleted (a Durable in state.out)."""
    problems: list[str] = []
    for key, value in sorted(records.get(GROUPS, {}).items()):
        try:
            spec = pb.PlacementGroupSpec.FromString(value)
            state.groups.create(owner, spec)
        except Exception as exc:   # a record no head can use: said, and dropped
            problems.append(f"placement group {key}: {exc}")
            state.out.append(Durable(GROUPS, key, None))
    # Those that wait for their process first, and what they hold kept on their nodes
    # there now, before any other is placed (one of the head's node could take its room).
    def waits(rec: pb.DurableActor) -> bool:
        return bool(joined_from) and rec.node_id >= joined_from \
            and not rec.creation.HasField("placement")
    parsed: list[tuple[bool, str, pb.DurableActor | None, Exception | None]] = []
    for key, value in sorted(records.get(ACTORS, {}).items()):
        try:
            rec = pb.DurableActor.FromString(value)
            parsed.append((not waits(rec), key, rec, None))
        except Exception as exc:
            parsed.append((True, key, None, exc))
    for later, key, rec, error in sorted(parsed, key=lambda p: (p[0], p[1])):
        try:
            if error is not None:
                raise error
            assert rec is not None
            call = rec.creation
            if not call.HasField("actor") or not rec.cls.function_id:
                raise ValueError("the record holds no actor's constructor and class")
            call.actor.restart_count = rec.restarts + 1
            call.actor.get_if_exists = False
            # Its prints went to its creator's connection id, which a restarted head
            # gives to another process: now to no driver (its log files keep them).
            call.job = 0
            state.register_function(rec.cls)
            if not later:
                state.actor_table.awaiting[call.actor.actor_id] = rec.node_id
            state.create_actor(owner, call)
            state.actor_table.restored(call.actor.actor_id, rec.revived + 1, rec.owner_key)
            if not later:   # its node may be there already
                state.actor_table.reserve(rec.node_id)
        except Exception as exc:
            problems.append(f"actor {key}: {exc}")
            state.out.append(Durable(ACTORS, key, None))
    return problems
