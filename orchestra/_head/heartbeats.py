"""The head's heartbeats with its joined nodes: each side tells the other it lives every
HEARTBEAT_S, and a side silent for cfg node_timeout_s (10 s by default) is dead.

    the head's timer, every HEARTBEAT_S --> tick(): a heartbeat to each joined node, and
        a node silent past the timeout is dead (RemoteNode.silent) ... unless the head's
        own loop was busy past the period since the last tick (silence_counts)
    a long batch of frames (Head.handle, every 256 frames) --> beat_if_due(): a
        heartbeat to each joined node, written at once, when the last is a period old

Why both: one read of a connection is handled whole, and a batch of thousands of a
driver's submits on a cluster of many workers held the head's loop for seconds (16.8 s
at 100 simulated nodes of 16 workers, tools/sim_nodes.py). The nodes then heard nothing
and took the head for gone; and the head, whose nodes' frames of that time waited unread
in its sockets (uvloop runs a due timer before it polls them), took 45 of them for dead.

Owns: the times of the last tick and of the last heartbeat written. The head's loop
calls both; nothing else reads them.
"""
from __future__ import annotations

import asyncio
import time
from typing import Any, Protocol

from .._protocol import pb
from .._protocol import wire as _wire
from .remote_node import RemoteNode

HEARTBEAT_S = 1.0
_BEAT = _wire.encode(_wire.NODE_COMMAND, pb.NodeCommand(heartbeat=True))


def silence_counts(now: float, last_tick: float, period: float = HEARTBEAT_S) -> bool:
    """Whether a node's silence may be judged at a tick at ``now``: not when the head's
    own loop was busy past two periods since the last tick at ``last_tick``."""
    return now - last_tick <= 2 * period


class Head(Protocol):
    """What the heartbeats use of the head (_head/head.py)."""

    stopping: bool
    cfg: dict[str, Any]
    nodes: dict[int, Any]
    loop: asyncio.AbstractEventLoop


class Heartbeats:
    def __init__(self, head: Head) -> None:
        self.head = head
        self.ticked = self.beaten = time.monotonic()

    def tick(self) -> None:
        """Tell joined nodes the head lives; a node silent too long is dead."""
        head = self.head
        if head.stopping:
            return
        now = time.monotonic()
        timeout = float(head.cfg.get("node_timeout_s", 10.0))
        judge = silence_counts(now, self.ticked)
        self.ticked = self.beaten = now
        for node in list(head.nodes.values()):
            if type(node) is RemoteNode and node.joined:
                if judge and now - node.last_heard > timeout:
                    node.silent(f"no heartbeat for {timeout:g} s")
                else:
                    node.heartbeat()
        head.loop.call_later(HEARTBEAT_S, self.tick)

    def beat_if_due(self) -> None:
        """Within a long batch of frames: a heartbeat to each joined node, written now,
        when the last is a period old (it says nothing else, so its place among the
        commands still buffered for that node does not matter)."""
        now = time.monotonic()
        if now - self.beaten < HEARTBEAT_S:
            return
        self.beaten = now
        for node in self.head.nodes.values():
            if type(node) is RemoteNode and node.joined and node.conn is not None \
                    and node.conn.transport is not None:
                node.conn.transport.write(_BEAT)
