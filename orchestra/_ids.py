"""Ids minted by each process without asking anyone.

task id   = 8-byte process prefix + 4-byte counter           (12 bytes)
object id = task id + 4-byte return index, big endian        (16 bytes)
A put's object id uses a task id of its own with index 0. The prefix is random per
process (and re-drawn after fork), so ids from different processes never collide.

node id   = an int inside the cluster (0: the head's own node; joined nodes 2, 3, ...),
            shown to users as 16 lowercase hex digits (node_hex / node_from_hex)
"""
from __future__ import annotations

import itertools
import os

TASK_ID_LEN = 12

_prefix = os.urandom(8)
_counter = itertools.count(1)


def _reseed() -> None:
    """A forked child draws a fresh prefix, or its ids would repeat the parent's."""
    global _prefix, _counter
    _prefix, _counter = os.urandom(8), itertools.count(1)


os.register_at_fork(after_in_child=_reseed)


def next_task_id() -> bytes:
    return _prefix + next(_counter).to_bytes(4, "big")


def object_id(task_id: bytes, index: int) -> bytes:
    """The id of the task's return (or generator item) number ``index``."""
    return task_id + index.to_bytes(4, "big")


def return_ids(task_id: bytes, num_returns: int) -> list[bytes]:
    """The ids of a task's ``num_returns`` returns, in order."""
    return [task_id + i.to_bytes(4, "big") for i in range(num_returns)]


# An actor's id: its creation's task id and this index. A handle counts it as an object
# (the handle's token), which the head makes with the actor.
ACTOR_INDEX = b"\xff\xff\xff\xff"


def actor_id(task_id: bytes) -> bytes:
    return task_id + ACTOR_INDEX


def is_actor_id(object_id_: bytes) -> bool:
    return object_id_.endswith(ACTOR_INDEX) and len(object_id_) == TASK_ID_LEN + 4


def task_of(object_id_: bytes) -> bytes:
    return object_id_[:TASK_ID_LEN]


def machine_id() -> str:
    """Which object stores this process can map: one kernel boot and one /dev/shm (a
    node in a mount namespace of its own, with a private /dev/shm, is another machine)."""
    try:
        with open("/proc/sys/kernel/random/boot_id") as f:
            boot = f.read().strip()
    except OSError:
        boot = "?"
    try:
        shm = os.stat("/dev/shm")
        where = f"{shm.st_dev}:{shm.st_ino}"
    except OSError:
        where = "?"
    return f"{boot}/{where}"


NODE_HEX_LEN = 16
_HEX = frozenset("0123456789abcdefABCDEF")


def node_hex(node_id: int) -> str:
    """A node's public id: its int as 16 lowercase hex digits (node 0: "0000000000000000")."""
    return f"{node_id:016x}"


def node_from_hex(s: str) -> int:
    """The int of a public node id; ValueError naming the bad value and the form expected."""
    if not isinstance(s, str) or len(s) != NODE_HEX_LEN or not _HEX.issuperset(s):
        raise ValueError(f"bad node id {s!r}: a node id is {NODE_HEX_LEN} hex digits, as "
                         "orchestra.nodes() lists them (its 'NodeID') and "
                         "get_runtime_context().get_node_id() returns them")
    return int(s, 16)
