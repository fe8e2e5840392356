"""What a restarted head must know and cannot learn again from its nodes and drivers:
records of actors and detached placement groups, decided here, kept in the head's state
store (_head/state_store.py). No I/O.

    ActorTable: a kept actor (detached, or a driver's) created, placed (the node its
        process runs on), restarted, dead
    PlacementGroups: a detached group created, removed
        --Durable(table, key, record | None)--> state.out --> Head.carry_out: the
        record as bytes (_head/records.py) --> HeadState.write: the store's own thread
        writes it, in order, off the loop
    a head started on a store that holds records: the head's edge reads them
        (_head/records.py: those it cannot read are said and deleted there), then
        restore(state, owner, records)
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
from typing import Any, NamedTuple, Protocol

from .call import Call, FunctionDef
from .instructions import Durable, Instruction

ACTORS = "actors"   # kept actor id (hex) -> ActorRecord
GROUPS = "groups"   # detached placement group id (hex) -> its GroupSpec (groups.py)
NODES = "nodes"     # joined node id (decimal) serving -> b"" (_head/rejoin.py)
JOBS = "jobs"       # driver key (hex) -> JobRecord (_scheduler/jobs.py)
TABLES = (ACTORS, GROUPS, NODES, JOBS)


class ActorRecord(NamedTuple):
    """A kept actor as it is now: its constructor's call (``creation``), its restarts
    so far (``revived`` of them by restarted heads), its class as registered
    (``cls``; None: unknown), the node its process runs on (0: none yet), and a
    non-detached one's driver's key."""

    creation: Call
    restarts: int = 0
    revived: int = 0
    cls: FunctionDef | None = None
    node_id: int = 0
    owner_key: bytes = b""


class _Groups(Protocol):
    def create(self, conn: int, spec: Any) -> None: ...


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

    def register_function(self, fn: FunctionDef) -> None: ...

    def create_actor(self, conn: int, call: Call) -> Any: ...


def actor_kept(creation: Call, restarts: int, revived: int, cls: FunctionDef | None,
               node_id: int = 0, owner_key: bytes = b"") -> Durable:
    """The record of a kept actor as it is now (ActorRecord)."""
    assert creation.actor is not None, "a kept actor's record holds its constructor"
    return Durable(ACTORS, creation.actor.actor_id.hex(),
                   ActorRecord(creation, restarts, revived, cls, node_id, owner_key))


def actor_gone(actor_id: bytes) -> Durable:
    return Durable(ACTORS, actor_id.hex(), None)


def group_kept(spec: Any) -> Durable:
    return Durable(GROUPS, spec.group_id.hex(), spec)


def group_gone(group_id: bytes) -> Durable:
    return Durable(GROUPS, group_id.hex(), None)


def restore(state: Restorable, owner: int,
            records: Mapping[str, Mapping[str, Any]], joined_from: int = 0) -> list[str]:
    """Make again what ``records`` (table -> key -> record, as the head's edge read
    them from the store) name, held by ``owner`` (the head's own pseudo-client, which
    lives as long as the head). An actor whose process ran on a joined node (id >=
    ``joined_from``; 0: none is) waits in actor_table.awaiting for that process to come
    back, instead of being placed (ActorTable.adopt / release_awaiting). Returns what
    could not be restored, in words (the head logs it); such a record is deleted (a
    Durable in state.out)."""
    problems: list[str] = []
    for key, spec in sorted(records.get(GROUPS, {}).items()):
        try:
            state.groups.create(owner, spec)
        except Exception as exc:   # a record no head can use: said, and dropped
            problems.append(f"placement group {key}: {exc}")
            state.out.append(Durable(GROUPS, key, None))
    # Those that wait for their process first, and what they hold kept on their nodes
    # there now, before any other is placed (one of the head's node could take its room).
    def waits(rec: ActorRecord) -> bool:
        return bool(joined_from) and rec.node_id >= joined_from \
            and rec.creation.placement is None
    actors: dict[str, ActorRecord] = dict(records.get(ACTORS, {}))
    for later, key in sorted((not waits(rec), key) for key, rec in actors.items()):
        rec = actors[key]
        try:
            call = rec.creation
            if call.actor is None or rec.cls is None or not rec.cls.function_id:
                raise ValueError("the record holds no actor's constructor and class")
            call.actor.restart_count = rec.restarts + 1
            call.actor.get_if_exists = False
            # Its prints went to its creator's connection id, which a restarted head
            # gives to another process: now to no driver (its log files keep them).
            call.job = 0
            call.edited = True
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
