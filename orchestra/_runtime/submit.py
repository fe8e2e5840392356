"""A process's calls: tasks and actor methods submitted, cancelled (the CoreClient's
``submitter``).

    f.remote(...)        -> register_function (once) -> submit: encode_call (calls.py)
                            -> a worker lent here of its shape (DirectCalls.lent), else
                               a Submit frame to the head
    actor.m.remote(...)  -> submit_actor -> straight to the actor's process once its
                            address is known (DirectCalls.call_actor), else the head
    orchestra.cancel     -> cancel: the lent worker or actor running it, else the head

A driver that outlives its head writes each call in its book first (replay.py): a
restarted head gets again what it had not answered.

Owner: each call runs on the caller's thread; the functions registered and the methods'
templates are written under the GIL (a second registration of one function sends it
twice, which the head takes as the same).
"""
from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, Protocol

from .. import _ids
from .._objects.refs import RefCounts
from .._protocol import codec as _codec
from .._protocol import pb
from .._protocol import wire as _wire
from ..exceptions import ClusterLostError
from .calls import Encoder, encode_call
from .direct_core import Call, must_sync
from .object_ref import ObjectRef

if TYPE_CHECKING:
    from .direct import DirectCalls
    from .replay import ReplayBook


class Hub(Encoder, Protocol):
    """What calls use of their CoreClient (client.py imports this module)."""

    refs: RefCounts
    results: dict[bytes, pb.ObjectData]
    owned: set[bytes]
    streams: dict[bytes, Any]
    book: ReplayBook | None
    put_seq: int
    synced_seq: int

    @property
    def direct(self) -> DirectCalls: ...
    def send_raw(self, frame: bytes) -> None: ...
    def send(self, kind: int, msg: Any) -> None: ...
    def request(self, req: pb.Request, timeout_s: float = 60.0) -> pb.Reply: ...


class Submitter:
    """submit / submit_actor / cancel of one process, over its CoreClient."""

    def __init__(self, client: Hub) -> None:
        self.client = client
        self._registered: set[bytes] = set()
        self.function_frames: dict[bytes, bytes] = {}   # for lent workers
        self.templates: dict[tuple[bytes, str, int, int, int], bytes] = {}   # actor methods' Calls

    def register_function(self, function_id: bytes, req_bytes: bytes) -> None:
        if function_id not in self._registered:
            self.client.send_raw(req_bytes)
            self._registered.add(function_id)
            self.function_frames[function_id] = req_bytes

    def registered_again(self, old: Submitter) -> list[bytes]:
        """The functions ``old`` (a lost head's client) registered, taken as registered
        here: their frames, for the restarted head (reconnect.py)."""
        self.function_frames.update(old.function_frames)
        self._registered.update(old.function_frames)
        return list(old.function_frames.values())

    def submit(self, template: bytes, num_returns: int, args: Sequence[Any],
               kwargs: dict[str, Any], shape: tuple[tuple[str, float], ...] | None = None,
               name: str = "", function_id: bytes = b"", tid: bytes = b"") -> list[ObjectRef]:
        """Submit one task. ``template`` is a serialized Call with the per-function fields.
        ``shape``: its resource shape, when it may go straight to a worker lent to this
        process (then it does, if one of that shape is lent and its arguments are here).
        ``tid``: its task id, when the caller made one (a stream registered first)."""
        client = self.client
        tid = tid or _ids.next_task_id()
        refs: list[ObjectRef] = []     # puts made for large args live until the Submit is sent
        direct = client.direct
        loans = direct.lent.loans
        hold: list[ObjectRef] | None = [] if shape is not None and loans else None
        call = encode_call(client, template, tid, args, kwargs, refs, hold)
        rids = _ids.return_ids(tid, num_returns)
        out: list[ObjectRef[Any]] = [ObjectRef(rid, client, counted=True) for rid in rids]
        book = None if client.streams else client.book
        if book is not None:   # sent again to a restarted head if still needed then
            book.add(tid, call, num_returns, refs)
        if shape is not None and hold is not None and loans.get(shape) \
                and (not refs or all(r._id in client.results for r in refs)):
            if client.put_seq > client.synced_seq and must_sync(True, hold, refs, client.results, any(
                    le.peer is not None and le.peer.remote for le in loans.get(shape, ()))):
                client.request(pb.Request(query="sync"))   # the head knows every ref in the arguments
            c = Call(tid, call, refs, None, rids, name, hold)
            c.fid = function_id
            if direct.lent.submit(c, shape):
                return out
        with client.refs.lock:
            client.owned.update(rids)
        self.send_submit(call, refs, book is not None)
        del refs
        return out

    def send_submit(self, call: bytes, refs: Sequence[ObjectRef], kept: bool = False,
                    escaped: bool = False) -> None:
        """``kept``: the book keeps the call (a head lost meanwhile gets it again);
        ``escaped``: the head knows its ref arguments already (else escape() first)."""
        client = self.client
        try:
            if not escaped and (client.direct.book.unregistered or client.direct.book.via_head):
                client.escape([r._id for r in refs])
            client.send_raw(_codec.submit_frame(call))
        except ClusterLostError:
            if not kept:
                raise

    def submit_actor(self, actor_id: bytes, token: ObjectRef, template: bytes, num_returns: int,
                     args: Sequence[Any], kwargs: dict[str, Any], name: str,
                     tid: bytes = b"") -> list[ObjectRef]:
        """Call an actor: straight to its process once the head gave its address and
        every call sent through the head before is there; through the head otherwise."""
        client = self.client
        route = client.direct.routes.get(actor_id) or client.direct.route(actor_id)
        tid = tid or _ids.next_task_id()
        refs: list[ObjectRef] = []
        # Refs pickled in the arguments live here until the actor answers: the actor
        # counts those it keeps before answering (see WorkerRuntime.send_done).
        hold: list[ObjectRef] = []
        call = encode_call(client, template, tid, args, kwargs, refs, hold)
        rids = _ids.return_ids(tid, num_returns)
        out: list[ObjectRef[Any]] = [ObjectRef(rid, client, counted=True) for rid in rids]
        book, replay = None if client.streams else client.book, False
        if book is not None:   # sent again to a restarted head if retried and not answered
            replay = book.replays(template)
            book.add(tid, call, num_returns, refs, False, replay)
        if route.peer is not None and must_sync(client.put_seq > client.synced_seq, hold, refs,
                                                client.results, route.peer.remote):
            client.request(pb.Request(query="sync"))   # the head knows every ref in the arguments
        def through_head() -> None:   # under route.lock, its arguments escaped
            with client.refs.lock:
                client.owned.update(rids)
            self.send_submit(call, refs, replay, True)   # else made again (ActorMethod.remote)
        client.direct.call_actor(route, Call(tid, call, refs, token, rids, name, hold), through_head)
        return out

    def retire_route(self, actor_id: bytes) -> None:
        """The actor is being killed: later calls go through the head."""
        self.client.direct.retire_route(actor_id)

    def cancel(self, object_id: bytes, force: bool, recursive: bool = False) -> None:
        if not self.client.direct.cancel(_ids.task_of(object_id), force, recursive):
            self.client.send(_wire.CANCEL, pb.CancelRequest(object_id=object_id, force=force,
                                                            recursive=recursive))

    def cancel_submitted(self) -> None:
        """Cancel (recursively) every task this process submitted that has not answered
        yet and whose refs it still holds: a cancel(recursive=True) of the task running
        here reaches its children this way wherever they went (head, lent workers)."""
        client = self.client
        tids = {_ids.task_of(oid) for oid in list(client.owned)}
        tids.update(list(client.direct.call_route))
        for tid in tids:
            try:
                self.cancel(_ids.object_id(tid, 0), False, True)
            except ClusterLostError:
                return
