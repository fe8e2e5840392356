"""What a driver or a worker does with each frame the head sends it: a table of small
handlers, as the head's (_head/frames.py).

    CoreClient._dispatch(frames) --> FRAMES[kind](client, msg) -> True: wake the threads
        waiting in get()/wait() (a result or a reply came)
    a worker's own kinds (EXECUTE, CANCEL_TASK, STEAL, ...: _worker/frames.py) join the
        table of its client (CoreClient(frames=...)): one lookup for every frame

Handlers run on the thread that holds the client's read lock (one at a time), so what
they leave for after the batch (``woken``: lent workers with room again) has that one
writer; the results, owned ids and streams are changed under the ref lock, as every
reader of them takes it.
"""
from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any, Protocol

from .. import _ids
from .._objects.io import ObjectIO
from .._objects.refs import RefCounts
from .._protocol import pb
from .._protocol import wire as _wire
from .direct import DirectCalls
from .direct_core import Loan

_log = logging.getLogger("orchestra")


class Reader(Protocol):
    """What the handlers use of the CoreClient (_runtime/client.py)."""

    refs: RefCounts
    results: dict[bytes, pb.ObjectData]
    owned: set[bytes]
    streams: dict[bytes, Any]
    direct: DirectCalls
    objects: ObjectIO
    # requests waiting: req id -> [reply], or what to call with it (request_later)
    replies: dict[int, list[pb.Reply | None] | Callable[[pb.Reply], None]]
    closing_reason: str
    woken: list[Loan]   # lent workers with room again, pumped after the batch

    def send(self, kind: int, msg: Any) -> None: ...
    def warn(self, text: str) -> None: ...


Handler = Callable[[Reader, Any], bool]


def _objects(c: Reader, msg: pb.Objects) -> bool:
    """Objects pushed here: results of this process's tasks, items of its streams, ones
    it subscribed to."""
    direct = c.direct
    with c.refs.lock:
        local, results, owned, streams = c.refs.local, c.results, c.owned, c.streams
        for d in msg.objects:
            oid = d.object_id
            if oid in local:
                results[oid] = d
            elif streams and oid[:_ids.TASK_ID_LEN] in streams:
                streams[oid[:_ids.TASK_ID_LEN]].arrived(c, oid, d)
            owned.discard(oid)
        if direct.watching():
            c.woken.extend(direct.pushed(msg.objects))
    return True


def _reply(c: Reader, msg: pb.Reply) -> bool:
    slot = c.replies.pop(msg.req_id, None)
    if isinstance(slot, list):
        slot[0] = msg
    elif slot is not None:
        slot(msg)
    return True


def _drop_maps(c: Reader, msg: pb.SegmentNames) -> bool:
    c.objects.drop_maps(msg.names)
    return False


def _release_maps(c: Reader, msg: pb.SegmentNames) -> bool:
    back = c.objects.release_maps(msg.names)
    if back:   # spares the store wants for a put that finds no room
        c.send(_wire.REF_DELTA, pb.RefDelta(give_back=back))
    return False


def _map_ahead(c: Reader, msg: pb.SegmentNames) -> bool:
    c.objects.map_ahead(list(msg.names))
    return False


def _actor_address(c: Reader, msg: pb.ActorAddress) -> bool:
    c.direct.actor_address(msg)
    return False


def _loan(c: Reader, msg: pb.Loan) -> bool:
    c.direct.lent.granted(msg)
    return False


def _loan_recall(c: Reader, msg: pb.LoanRecall) -> bool:
    c.direct.lent.recalled(msg.worker_id)
    return False


def _release_call(c: Reader, msg: pb.TaskDone) -> bool:
    c.direct.release_call(msg.task_id)
    return False


def _stalled(c: Reader, msg: pb.Stalled) -> bool:
    _log.warning("%s", msg.text)
    return False


def _warning(c: Reader, msg: pb.ClusterWarning) -> bool:
    c.warn(msg.text)   # e.g. a request that waits for a node to join
    return False


def _closing(c: Reader, msg: pb.Closing) -> bool:
    c.closing_reason = msg.reason   # the head's last frame: why it stops
    return False


FRAMES: dict[int, Handler] = {
    _wire.OBJECTS: _objects,
    _wire.REPLY: _reply,
    _wire.DROP_MAPS: _drop_maps,
    _wire.RELEASE_MAPS: _release_maps,
    _wire.MAP_AHEAD: _map_ahead,
    _wire.ACTOR_ADDRESS: _actor_address,
    _wire.LOAN: _loan,
    _wire.LOAN_RECALL: _loan_recall,
    _wire.RELEASE_CALL: _release_call,
    _wire.STALLED: _stalled,
    _wire.WARNING: _warning,
    _wire.CLOSING: _closing,
}


def with_owner(own: dict[int, Callable[[Any], None]]) -> dict[int, Handler]:
    """FRAMES and the kinds a worker handles itself (each wakes the waiting threads, as
    what it starts may end a wait)."""
    table = dict(FRAMES)
    for kind, fn in own.items():
        table[kind] = _owned(fn)
    return table


def _owned(fn: Callable[[Any], None]) -> Handler:
    def handle(_c: Reader, msg: Any) -> bool:
        fn(msg)
        return True
    return handle


__all__ = ["FRAMES", "Handler", "Reader", "with_owner"]
