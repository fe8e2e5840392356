"""Objects copied between nodes for their readers, on the head's loop: where a reader on
a node maps an object, and the pulls that bring a copy there.

    prefetch (wait(fetch_local=True)) -> a pull of each object not on the waiter's node
    locate (a reader asks) -> the copy on its node | the object being made again:
        answered once it is | none there: pull -> node.pull(source data server, key,
        size) -> pulled: the copy added to the object (add_copy), readers answered
    a pull failed while the object lives -> asked again every _RELOCATE_RETRY_S until
        the source node's fate is known (rebuilt, a copy elsewhere, or lost for good)
    a node died -> node_gone: pulls to it fail

Several readers of one object on one node share one pull (``pending``).
"""
from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Iterable
from typing import Any, Protocol

from .._node.node import Node
from .._node.process import routable
from .._protocol import pb
from .._protocol import wire as _wire
from .._scheduler.data import Data
from .._scheduler.state import SchedulerState
from .frames import Conn, Waiter
from .inbound import segment_in
from .outbound import data_out
from .remote_node import RemoteNode


class Head(Protocol):
    """What pulls use of the head (head.Head)."""

    state: SchedulerState
    conns: dict[int, Any]
    cfg: dict[str, Any]
    loop: asyncio.AbstractEventLoop
    nodes: dict[int, Node | RemoteNode]
    local: Node | RemoteNode
    data_address: str
    token: str

    def queue_if_open(self, conn: Any, data: bytes) -> None: ...
    def watch_object(self, oid: bytes, fut: Waiter) -> None: ...
    def carry_out(self) -> None: ...

# A reader's pull of an object from a node that may be dying is tried again this often,
# for as long as a node may stay silent before it is declared dead, and this much more.
_RELOCATE_RETRY_S = 0.2
_RELOCATE_SLACK_S = 2.0


class Pulls:
    """The head's pulls (see the module docstring)."""

    def __init__(self, head: Head, clock: Callable[[], float] = time.monotonic) -> None:
        self.head = head
        self.clock = clock   # the retries' (tests drive their own)
        # (object id, node id) -> what to call with (data, error) once that node has it.
        self.pending: dict[tuple[bytes, int], list[Callable[[Data | None, str], None]]] = {}
        # A head started again from its store learns its objects from the drivers and
        # nodes as they come back (the drivers make their lost work again): until this
        # time (clock), a reader of an object it does not know yet (a task carried over
        # the restart, locating its argument) waits for it instead of being told it was
        # freed (_head/rejoin.py restore sets it).
        self.recover_until = 0.0

    def locate(self, conn: Conn, req_id: int, object_id: bytes, since: float = 0.0) -> None:
        """Answer where an object's data is now, for a reader on the connection's node
        (a reader found its segment gone, or it is on another node: pulled first).
        ``since``: when a first pull of it failed (see answer)."""
        o = self.head.state.objects.get(object_id)

        def answer(data: Data | None, error: str) -> None:
            if data is None and error and object_id in self.head.state.objects \
                    and self.head.conns.get(conn.conn_id) is conn:
                # The pull failed, the object lives: its node may be dying, which this
                # head learns a moment later (its connection closes; silent: after
                # node_timeout_s). Then the object is made again, has a copy elsewhere,
                # or is lost for good: ask again until one of those is known, rather
                # than fail a reader of an object that a retry would rebuild.
                now = self.clock()
                first = since or now
                if now - first < float(self.head.cfg.get("node_timeout_s", 10.0)) + _RELOCATE_SLACK_S:
                    self.head.loop.call_later(_RELOCATE_RETRY_S, self.locate, conn, req_id,
                                         object_id, first)
                    return
            reply = pb.Reply(req_id=req_id)
            if data is None:
                reply.error = error or f"object {object_id.hex()} was freed while it was being read"
                reply.error_kind = "ObjectLostError"
            else:
                reply.object.CopyFrom(data_out(data))
            self.head.queue_if_open(conn, _wire.encode(_wire.REPLY, reply))
        if o is None:
            if self.clock() < self.recover_until and self.head.conns.get(conn.conn_id) is conn:
                self.head.loop.call_later(_RELOCATE_RETRY_S, self.locate, conn, req_id,
                                          object_id, since)
                return
            answer(None, "")
            return
        if o.data is None:   # being made again (its node died): answered once it is
            self.head.watch_object(object_id, _Then(lambda d: self.locate(conn, req_id, object_id)))
            return
        if self.head.conns.get(conn.conn_id) is not conn:
            return   # the reader is gone
        data = self.head.state.directory.copy_on(object_id, conn.node.node_id)
        if data is not None:
            answer(data, "")
        else:
            self.pull(conn.node.node_id, object_id, answer)

    def prefetch(self, node_id: int, object_ids: Iterable[bytes]) -> None:
        """Copy to node ``node_id`` those of the objects that are segments on another
        node and have no copy there yet (wait(fetch_local=True); nobody waits on it)."""
        state = self.head.state
        for oid in object_ids:
            o = state.objects.get(oid)
            if o is not None and o.data is not None and state.directory.copy_on(oid, node_id) is None:
                self.pull(node_id, oid)

    def pull(self, node_id: int, object_id: bytes,
              then: Callable[[Data | None, str], None] | None = None) -> None:
        """Have node ``node_id`` pull a copy of the object from a node that holds one;
        ``then(data, error)`` once it is there. Several readers: one pull."""
        key = (object_id, node_id)
        waiting = self.pending.get(key)
        if waiting is not None:
            if then is not None:
                waiting.append(then)
            return
        o = self.head.state.objects.get(object_id)
        dest = self.head.nodes.get(node_id)
        src_seg = None
        if o is not None and o.data is not None:
            src_seg = o.data.segment
        src = self.head.nodes.get(src_seg.node_id) if src_seg is not None else None
        address = (self.head.data_address if src is self.head.local else getattr(src, "data_address", ""))
        if src is self.head.local and type(dest) is RemoteNode and dest.conn is not None:
            # Listening on a wildcard (--host 0.0.0.0): the address that node reached.
            address = routable(address, dest.conn.transport.get_extra_info("sockname"))
        if dest is None or src_seg is None or not address:
            why = (f"object {object_id.hex()} cannot be copied to node {node_id}: "
                   + ("it is gone" if src_seg is None else "its node has no data server"))
            if then is not None:
                then(None, why)
            return
        self.pending[key] = [then] if then is not None else []
        dest.pull(object_id, address, src_seg.path or src_seg.name, src_seg.size, self.head.token)

    def pulled(self, node_id: int, object_id: bytes, segment: pb.Segment | None,
               error: str) -> None:
        """Node ``node_id`` has its copy (or failed): answer what waited for it."""
        waiting = self.pending.pop((object_id, node_id), [])
        data = None
        if not error:
            assert segment is not None, "a pull without an error names its copy"
            if self.head.state.directory.add_copy(object_id, segment_in(segment)):
                data = self.head.state.directory.copy_on(object_id, node_id)
            else:
                error = f"object {object_id.hex()} was freed while it was being copied"
                node = self.head.nodes.get(node_id)
                if node is not None:
                    node.free_segment(segment.name)
        for then in waiting:
            then(data, error)
        self.head.carry_out()

    def node_gone(self, node_id: int, reason: str) -> None:
        """Node ``node_id`` died: the pulls to it fail."""
        for key in [k for k in self.pending if k[1] == node_id]:
            for then in self.pending.pop(key):
                then(None, f"node {node_id} died while pulling the object: {reason}")


class _Then:
    """A watch_object() waiter that calls back on the loop (not a thread's future)."""

    __slots__ = ("fn", "_done")

    def __init__(self, fn: Callable[[pb.ObjectData], None]) -> None:
        self.fn = fn
        self._done = False

    def done(self) -> bool:
        return self._done

    def set_result(self, data: pb.ObjectData) -> None:
        self._done = True
        self.fn(data)
