"""The head's heartbeats with its joined nodes (orchestra/_head/heartbeats.py): a node
silent past the timeout is dead, but not when the head's own loop was the one busy (its
nodes' frames of that time still unread in its sockets), and a long batch of frames
still sends the nodes a heartbeat. Real RemoteNode objects, no processes."""
from __future__ import annotations

import asyncio
import time
from typing import Any

import pytest

from orchestra._head import heartbeats as hb
from orchestra._head.remote_node import RemoteNode

pytestmark = pytest.mark.timeout(30)


class _Head:
    def __init__(self, loop: asyncio.AbstractEventLoop, nodes: dict[int, Any]) -> None:
        self.stopping = False
        self.cfg = {"node_timeout_s": 10.0}
        self.nodes = nodes
        self.loop = loop


class _Transport:
    def __init__(self) -> None:
        self.written: list[bytes] = []

    def write(self, data: bytes) -> None:
        self.written.append(data)


@pytest.fixture
def loop():
    loop = asyncio.new_event_loop()
    yield loop
    loop.close()


def _nodes(loop: asyncio.AbstractEventLoop, heard_s_ago: float) -> tuple[dict[int, Any], list[str]]:
    said: list[str] = []
    nodes: dict[int, Any] = {}
    for nid in (2, 3):
        node = RemoteNode(nid, None, loop, {}, joined=True)
        node.last_heard = time.monotonic() - heard_s_ago
        node.silent = lambda why, nid=nid: said.append(f"{nid} dead: {why}")   # type: ignore[method-assign]
        node.heartbeat = lambda nid=nid: said.append(f"{nid} beat")   # type: ignore[method-assign]
        nodes[nid] = node
    return nodes, said


def test_silence_counts_only_while_the_head_listened():
    assert hb.silence_counts(100.0, 99.0)
    assert hb.silence_counts(100.0, 98.0)
    assert not hb.silence_counts(100.0, 97.5)   # the loop was busy for 2.5 periods


def test_a_node_silent_past_the_timeout_is_dead(loop):
    nodes, said = _nodes(loop, heard_s_ago=11.0)
    beats = hb.Heartbeats(_Head(loop, nodes))
    beats.ticked = time.monotonic() - 1.0   # the last tick came on time
    beats.tick()
    assert said == ["2 dead: no heartbeat for 10 s", "3 dead: no heartbeat for 10 s"]


def test_nodes_are_not_judged_at_the_tick_after_the_heads_own_loop_was_busy(loop):
    # The head's loop held for 17 s by one batch: the nodes' heartbeats of that time are
    # unread in its sockets, and uvloop runs this timer before it polls them.
    nodes, said = _nodes(loop, heard_s_ago=17.0)
    beats = hb.Heartbeats(_Head(loop, nodes))
    beats.ticked = time.monotonic() - 17.0
    beats.tick()
    assert said == ["2 beat", "3 beat"]
    # the next tick, on time, judges again (the frames were read meanwhile or not at all)
    said.clear()
    beats.ticked = time.monotonic() - 1.0
    beats.tick()
    assert said == ["2 dead: no heartbeat for 10 s", "3 dead: no heartbeat for 10 s"]


def test_a_long_batch_writes_a_heartbeat_once_a_period(loop):
    nodes, _ = _nodes(loop, heard_s_ago=0.0)
    written = []
    for node in nodes.values():
        t = _Transport()
        written.append(t.written)
        node.conn = type("Conn", (), {"transport": t})()
    beats = hb.Heartbeats(_Head(loop, nodes))
    beats.beat_if_due()
    assert written == [[], []]   # the last heartbeat is not a period old yet
    beats.beaten = time.monotonic() - hb.HEARTBEAT_S
    beats.beat_if_due()
    beats.beat_if_due()
    assert written == [[hb._BEAT], [hb._BEAT]]
