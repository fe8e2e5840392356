"""What a restarted head takes back from the head before it, on the head's loop.

    Head.start -> restore(head): the state store's records made again
        (_scheduler/durable.py); workers' and connections' ids start above every
        earlier head's (the store counts heads: the n-th starts at (n - 1) << 32),
        joined nodes' ids above every id given so far (next_node); a kept actor
        whose process ran on a joined node waits up to adopt_wait_s for that process
        (ActorTable.awaiting), what it holds kept on its node, then is made again
    a node joins again (NodeJoin.node_id) -> node_id_for: its id of before, unless
        another node holds it or held it (then a new one), kept in the store
    a driver connects again (Hello.driver_key) -> claim: the non-detached actors it
        made (kept too: ActorTable.keep_owned) are its again, their handles' hold too;
        those no driver claimed within the reconnect timeout are stopped (_unclaimed)
    a worker that outlived the head (Hello.resume_actor or resume_task) -> the node
        it names (Head._node_for; not joined again yet: closed, it tries again);
        SchedulerState.client_connected takes it back as its actor's process
        (ActorTable.adopt) or its task's (_scheduler/kept.py), or refuses it (Closing)
        and the worker exits
    the joined nodes serving: records in the store (NODES), so that a restarted head
        waits for them and their workers of before before it runs tasks made again
        (KeptObjects.expect, node_back); a node that leaves, or a head that stops, drops
        them (node_left, stop_store)

Without a state store nothing is restored, and ids start at 1 as before.
"""
from __future__ import annotations

import asyncio
import sys
import time
from typing import Any, Protocol

from .._protocol import pb
from .._scheduler.durable import ACTORS, JOBS, NODES
from .._scheduler.durable import restore as restore_records
from .._scheduler.jobs import JobBook
from .._scheduler.state import SchedulerState
from . import jobs, records
from .state_store import CLUSTER, HeadState


class Head(Protocol):
    """What this module uses of the head (head.Head)."""

    state: SchedulerState
    durable: HeadState | None
    jobs: JobBook
    next_node_id: int
    next_conn: int
    nodes: dict[int, Any]
    gone: dict[int, Any]
    cfg: dict[str, Any]
    loop: asyncio.AbstractEventLoop
    pulls: Any   # pulls.Pulls (its recover_until)

    def carry_out(self) -> None: ...

# How long a restored actor of a joined node waits for its process: its node
# joins again within ~0.5 s of the head listening, and its worker a moment after.
ADOPT_WAIT_S = 10.0
# A driver that lost the head tries again for its reconnect time from its loss; the
# restarted head counts it from its own start, later: this much more, for the connection
# and the carrying over of its work.
UNCLAIMED_SLACK_S = 5.0


def restore(head: Head, joined_from: int, owner: int) -> None:
    """Make again what the store holds, held by ``owner`` (the head's own gRPC
    pseudo-client), and start ids above those given before (``joined_from``: the first
    id of a joined node)."""
    durable = head.durable
    if durable is None:
        return
    head.state.actor_table.keep_owned = True   # drivers' actors are kept too (claim)
    # Connections too: a process of before that outlived the head (a detached actor's)
    # prints with its creator's connection id as the job; no new driver has that id.
    base = ((durable.boots - 1) << 32) + 1
    head.state.worker_pool.first_id(base)
    head.next_conn = max(head.next_conn, base)
    head.next_node_id = max(head.next_node_id, durable.next_node)
    kept, unreadable = records.read(durable.records())
    for table, key, problem in unreadable:   # said, and dropped
        print(f"orchestra head: not restored: {problem}", file=sys.stderr, flush=True)
        durable.write(table, key, None)
    for problem in restore_records(head.state, owner, kept, joined_from):
        print(f"orchestra head: not restored: {problem}", file=sys.stderr, flush=True)
    jobs.restore(head, kept.get(JOBS, {}), UNCLAIMED_SLACK_S)
    if durable.boots > 1:   # the drivers of before make their lost work again meanwhile
        head.pulls.recover_until = head.pulls.clock() + float(
            head.cfg.get("reconnect_timeout_s", 0.0))
    nodes = {int(k) for k in durable.records().get(NODES, {}) if k.isdigit()}
    if nodes:
        head.state.kept.expect(nodes, time.monotonic())   # (Head._tick calls its tick)
    if head.state.actor_table.awaiting:
        head.loop.call_later(float(head.cfg.get("adopt_wait_s", ADOPT_WAIT_S)), _release, head)
    if head.state.actor_table.unclaimed:   # their drivers connect within their wait, or not
        wait_s = float(head.cfg.get("reconnect_timeout_s", 0.0))
        head.loop.call_later(wait_s + UNCLAIMED_SLACK_S, _unclaimed, head, wait_s)


def _release(head: Head) -> None:
    waiting = len(head.state.actor_table.awaiting)
    if waiting:
        print(f"orchestra head: {waiting} actor(s) whose process did not come back "
              "are made again", file=sys.stderr, flush=True)
        head.state.actor_table.release_awaiting()
        head.carry_out()


def _unclaimed(head: Head, wait_s: float) -> None:
    gone = head.state.actor_table.expire_unclaimed(wait_s)
    if gone:
        print(f"orchestra head: {len(gone)} actor(s) whose driver did not connect again are "
              "stopped", file=sys.stderr, flush=True)
        head.carry_out()


def claim(head: Head, conn: int, hello: pb.Hello) -> list[bytes]:
    """A driver connected (``hello``): the non-detached actors it made before a restart
    of the head are its again (HelloReply.claimed_actors)."""
    table = head.state.actor_table
    if not (table.unclaimed and hello.kind == "driver" and hello.driver_key):
        return []
    return table.claim(conn, hello.driver_key)


def node_id_for(head: Head, asked: int, joined_from: int) -> int:
    """The id of a node joining now: ``asked`` (its id before a restart of the head)
    when no node holds or held it, else the next one; the next id is kept in the store."""
    taken = asked in head.nodes or asked in head.gone
    node_id = asked if asked >= joined_from and not taken else head.next_node_id
    head.next_node_id = max(head.next_node_id, node_id + 1)
    if head.durable is not None:
        head.durable.write(CLUSTER, "next_node", str(head.next_node_id).encode())
    return node_id


def node_back(head: Head, node_id: int, workers: list[int]) -> None:
    """A joined node registered (``workers``: its workers that outlived a head before)."""
    if head.durable is not None:
        head.durable.write(NODES, str(node_id), b"")
    head.state.kept.node_joined(node_id, workers, time.monotonic())


def node_left(head: Head, node_id: int) -> None:
    """A joined node left the cluster (or died): a restarted head waits not for it."""
    if head.durable is not None:
        head.durable.write(NODES, str(node_id), None)


def stop_store(head: Head) -> None:
    """The head stopped (its nodes with it): its store written and let go; a head
    started on it later waits for none of the nodes, and makes again none of the
    actors drivers made (their drivers were told the cluster stopped)."""
    if head.durable is not None:
        jobs.stopped(head)
        rows = head.durable.records()
        for key in rows.get(NODES, {}):
            head.durable.write(NODES, key, None)
        for key, value in rows.get(ACTORS, {}).items():
            if _owned(value):
                head.durable.write(ACTORS, key, None)
        head.durable.stop()


def _owned(value: bytes) -> bool:
    """Whether an actor's record is a driver's own actor's (not a detached one's)."""
    try:
        return bool(records.decode(ACTORS, value).owner_key)
    except Exception:   # a record no head can read: restore() says so and drops it
        return False

