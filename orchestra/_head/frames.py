"""What the head does with each frame a connection sends, and with each request: two
tables of handlers, looked up by frame kind and by the request's body.

    Conn.data_received -> Head.handle -> FRAMES[kind](head, conn, msg) for each frame
        -> SchedulerState's event methods, and the connection's node for the objects it
        holds (seal, pin, unpin) -> Head.carry_out once per batch
    REQUEST frame -> REQUESTS[body](head, conn, req, reply) -> True: reply now; False:
        the handler answers later (a node's step, the workers' reports, a pull)

Handlers run on the head's loop thread, the one owner of the scheduler's state. A frame
kind or request body missing from the tables is ignored (a request gets an empty reply).
"""
from __future__ import annotations

import asyncio
from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING, Any, Protocol

from .._node.node import Node
from .._protocol import pb
from .._protocol import wire as _wire
from .._scheduler.instructions import Durable
from .._scheduler.jobs import JobBook
from .._scheduler.model import cluster_free, cluster_total
from .._scheduler.state import SchedulerState
from ..exceptions import InfeasibleResourcesError
from . import inbound, outbound
from .inbound import call_in
from .outbound import group_info
from .remote_node import RemoteNode
from .state_query import StateQueries

if TYPE_CHECKING:
    from .state_store import HeadState


class Conn(Protocol):
    """What a handler uses of a connection (head.Conn)."""

    conn_id: int
    node: Node | RemoteNode


class Waiter(Protocol):
    """Who waits for an object to be sealed (Head.watch_object): a gRPC reader's
    concurrent.futures.Future, or a reader's pull on the loop (pulls._Then)."""

    def done(self) -> bool: ...
    def set_result(self, data: pb.ObjectData) -> None: ...


class Reads(Protocol):
    """What a handler may use of the head's Pulls (_head/pulls.py, which imports this
    module): where a reader finds an object, and copies fetched ahead."""

    def locate(self, conn: Any, req_id: int, object_id: bytes, since: float = 0.0) -> None: ...
    def prefetch(self, node_id: int, object_ids: Iterable[bytes]) -> None: ...


class Head(Protocol):
    """What a handler may use of the head (head.Head): its state, its connections, and
    the steps it shares with them."""

    state: SchedulerState
    events: StateQueries
    conns: dict[int, Any]
    loop: asyncio.AbstractEventLoop
    local: Node | RemoteNode   # the node of the head's own machine

    durable: HeadState | None   # its state store, if it keeps one
    jobs: JobBook               # a job per driver session (_head/jobs.py)

    @property
    def pulls(self) -> Reads: ...   # where objects are read, copies between nodes

    def queue(self, conn: Any, data: bytes) -> None: ...
    def watch_object(self, oid: bytes, fut: Waiter) -> None: ...
    def queue_if_open(self, conn: Any, data: bytes) -> None: ...
    def carry_out(self) -> None: ...
    def request(self, conn: Any, req: pb.Request) -> None: ...
    def hello(self, conn: Any, hello: pb.Hello) -> None: ...
    def forward_logs(self, conn: Any, msg: pb.LogLines) -> None: ...
    def shutdown(self, reason: str) -> None: ...


FrameHandler = Callable[[Head, Conn, Any], None]
RequestHandler = Callable[[Head, Conn, Any, Any], bool]


# ---------------------------------------------------------------------- frames
def _submit(head: Head, conn: Conn, msg: pb.Submit) -> None:
    cid = conn.conn_id
    head.events.table.submitted(cid, msg.calls)
    submit = head.state.submit
    for call in msg.calls:
        submit(cid, call_in(call))


def _seal_on_node(conn: Conn, data: pb.ObjectData) -> None:
    """A result or put in shared memory: its segment, written by the connection's
    process, is sealed in that node's store before the state hears of it."""
    if data.WhichOneof("data") == "segment":
        conn.node.seal(data.segment.name, data.object_id, data.segment.size)


def _task_done(head: Head, conn: Conn, msg: pb.TaskDone) -> None:
    for d in msg.returns:
        _seal_on_node(conn, d)
    head.state.task_done(conn.conn_id, inbound.task_done(msg))


def _ref_delta(head: Head, conn: Conn, msg: pb.RefDelta) -> None:
    cid, node, state = conn.conn_id, conn.node, head.state
    if msg.pin:
        node.pin(cid, msg.pin)
    if msg.pending:
        state.directory.register_pending(cid, msg.pending)
    state.directory.ref_delta(cid, msg.incr, msg.decr)
    if msg.unpin:
        node.unpin(cid, msg.unpin)
    for name in msg.give_back:   # spares it did not fill (the store checks the writer)
        node.abort_segment(cid, name)


def _objects(head: Head, conn: Conn, msg: pb.Objects) -> None:
    for d in msg.objects:
        _seal_on_node(conn, d)
        head.state.directory.put(conn.conn_id, inbound.data_in(d))


def _adopt(head: Head, conn: Conn, msg: pb.AdoptCalls) -> None:
    head.events.table.adopted(conn.conn_id, msg.worker_id, msg.calls)
    head.state.adoption.adopt_calls(conn.conn_id, inbound.adopt_calls(msg))


def _release_call(head: Head, conn: Conn, msg: pb.TaskDone) -> None:
    # Ordered after the actor's own ref changes, which came before it on this connection.
    caller = head.conns.get(msg.owner)
    if caller is not None:
        head.queue(caller, _wire.encode(_wire.RELEASE_CALL, pb.TaskDone(task_id=msg.task_id)))


def _generator_item(head: Head, conn: Conn, msg: pb.GeneratorItem) -> None:
    _seal_on_node(conn, msg.data)
    head.state.streams.generator_item(conn.conn_id, inbound.generator_item(msg))
    if msg.index == 1:
        # A stream's first item goes out now, not after the rest of a read that a fast
        # producer filled with hundreds more (~10 ms later).
        head.carry_out()


def _log_flush(head: Head, conn: Conn, msg: pb.LogFlush) -> None:
    head.queue(conn, _wire.encode(_wire.LOG_FLUSH, msg))   # every line sent before it


def _subscribe(head: Head, conn: Conn, msg: pb.Subscribe) -> None:
    head.state.directory.subscribe(conn.conn_id, msg.ids)


def _function(head: Head, conn: Conn, msg: pb.RegisterFunctionRequest) -> None:
    head.state.register_function(inbound.function_in(msg))


def _blocked(head: Head, conn: Conn, msg: pb.Blocked) -> None:
    head.state.blocked(conn.conn_id, msg.blocked, msg.object_ids, msg.task_id, msg.task_name)


def _return_tasks(head: Head, conn: Conn, msg: pb.ReturnTasks) -> None:
    head.state.return_tasks(conn.conn_id, msg.task_ids)


def _cancel(head: Head, conn: Conn, msg: pb.CancelRequest) -> None:
    head.state.cancel(msg.object_id, msg.force, msg.recursive)


def _loan_return(head: Head, conn: Conn, msg: pb.LoanReturn) -> None:
    head.state.loans.return_loan(conn.conn_id, msg.worker_id)


def _loan_request(head: Head, conn: Conn, msg: pb.LoanRequest) -> None:
    # A driver asks for one more lent worker.
    head.state.loans.lend_idle(conn.conn_id, dict(msg.resources), int(msg.pinned_node))


def _request(head: Head, conn: Conn, msg: pb.Request) -> None:
    head.request(conn, msg)


def _hello(head: Head, conn: Conn, msg: pb.Hello) -> None:
    head.hello(conn, msg)


def _worker_address(head: Head, conn: Conn, msg: pb.WorkerAddress) -> None:
    head.state.worker_pool.worker_address(conn.conn_id, msg.address)


def _generator_ack(head: Head, conn: Conn, msg: pb.GeneratorAck) -> None:
    head.state.streams.generator_ack(msg.task_id, msg.consumed)


def _log_lines(head: Head, conn: Conn, msg: pb.LogLines) -> None:
    head.forward_logs(conn, msg)


def _task_events(head: Head, conn: Conn, msg: pb.TaskEventBatch) -> None:
    head.events.worker_batch(conn.conn_id, msg)


def _metrics(head: Head, conn: Conn, msg: pb.MetricsBatch) -> None:
    head.events.metrics.add(msg)


def _shutdown(head: Head, conn: Conn, msg: pb.AckReply) -> None:
    head.loop.call_soon(head.shutdown, "the driver called shutdown()")


def _job_end(head: Head, conn: Conn, msg: pb.AckReply) -> None:
    head.jobs.ending(conn.conn_id)   # (its connection's end ends the job: SUCCEEDED)


FRAMES: dict[int, FrameHandler] = {
    _wire.SUBMIT: _submit,
    _wire.TASK_DONE: _task_done,
    _wire.REF_DELTA: _ref_delta,
    _wire.OBJECTS: _objects,
    _wire.SUBSCRIBE: _subscribe,
    _wire.FUNCTION: _function,
    _wire.BLOCKED: _blocked,
    _wire.RETURN_TASKS: _return_tasks,
    _wire.CANCEL: _cancel,
    _wire.ADOPT: _adopt,
    _wire.LOAN_RETURN: _loan_return,
    _wire.LOAN_REQUEST: _loan_request,
    _wire.RELEASE_CALL: _release_call,
    _wire.REQUEST: _request,
    _wire.HELLO: _hello,
    _wire.WORKER_ADDRESS: _worker_address,
    _wire.GENERATOR_ITEM: _generator_item,
    _wire.GENERATOR_ACK: _generator_ack,
    _wire.LOG_LINES: _log_lines,
    _wire.LOG_FLUSH: _log_flush,
    _wire.TASK_EVENTS: _task_events,
    _wire.METRICS: _metrics,
    _wire.SHUTDOWN: _shutdown,
    _wire.JOB_END: _job_end,
}


# ---------------------------------------------------------------------- requests
def _create_segment(head: Head, conn: Conn, req: pb.Request, reply: pb.Reply) -> bool:
    # Frees decided earlier in this batch of frames must happen before the store judges
    # the room (they wait in state.out until carry_out otherwise).
    head.carry_out()
    conn.node.create_segment(conn.conn_id, req)   # the node answers
    return False


def _abort_segment(head: Head, conn: Conn, req: pb.Request, reply: pb.Reply) -> bool:
    conn.node.abort_segment(conn.conn_id, req.abort_segment)
    if type(conn.node) is RemoteNode:   # answered once the node did it
        data = _wire.encode(_wire.REPLY, reply)
        conn.node.after_node(lambda: head.queue_if_open(conn, data))
        return False
    return True


def _locate(head: Head, conn: Conn, req: pb.Request, reply: pb.Reply) -> bool:
    if type(conn.node) is RemoteNode:
        # The reader found the segment gone: the node spilled it, and its relocation may
        # still be on its way here. Answered after it.
        conn.node.after_node(lambda: head.pulls.locate(conn, req.req_id, req.locate))
    else:
        head.pulls.locate(conn, req.req_id, req.locate)
    return False


def _prefetch(head: Head, conn: Conn, req: pb.Request, reply: pb.Reply) -> bool:
    head.pulls.prefetch(conn.node.node_id, req.prefetch.object_ids)
    return False   # never answered


def _state_query(head: Head, conn: Conn, req: pb.Request, reply: pb.Reply) -> bool:
    head.events.query(conn, req)   # answered once the workers reported
    return False


def _once_kept(head: Head, conn: Conn, reply: pb.Reply) -> bool:
    """Answer a request that changed a record of the state store (a detached actor or
    group made, killed, removed) once the record is written, so that a head killed
    right after does what the answer said (at once when the store does not answer: the
    record is written once it is back). True: answer now (nothing to wait for)."""
    durable = head.durable
    if durable is None or reply.error or not any(type(i) is Durable for i in head.state.out):
        return True
    head.carry_out()   # the record goes to the store's thread
    data = _wire.encode(_wire.REPLY, reply)

    def answer() -> None:
        head.queue_if_open(conn, data)
        head.carry_out()
    durable.after_written(answer)
    return False


def _create_actor(head: Head, conn: Conn, req: pb.Request, reply: pb.Reply) -> bool:
    head.events.table.submitted(conn.conn_id, (req.create_actor,))
    try:
        existing = head.state.create_actor(conn.conn_id, call_in(req.create_actor))
        if existing is not None:   # get_if_exists: the live one's handle
            reply.actor.CopyFrom(outbound.spec_out(existing))
            return True
    except ValueError as exc:
        reply.error, reply.error_kind = str(exc), "ValueError"
    return _once_kept(head, conn, reply)


def _get_actor_in(head: Head, conn: Conn, req: pb.Request, reply: pb.Reply) -> bool:
    lookup = req.get_actor_in
    try:
        reply.actor.CopyFrom(outbound.spec_out(head.state.actor_table.get(
            lookup.name, lookup.namespace, conn=conn.conn_id)))
    except ValueError as exc:
        reply.error, reply.error_kind = str(exc), "ValueError"
    return True


def _get_actor(head: Head, conn: Conn, req: pb.Request, reply: pb.Reply) -> bool:
    try:
        reply.actor.CopyFrom(outbound.spec_out(head.state.actor_table.get(
            req.get_actor, conn=conn.conn_id)))
    except ValueError as exc:
        reply.error, reply.error_kind = str(exc), "ValueError"
    return True


def _kill_actor(head: Head, conn: Conn, req: pb.Request, reply: pb.Reply) -> bool:
    kill = req.kill_actor
    head.state.actor_table.kill(kill.actor_id, kill.no_restart, kill.reason)
    return _once_kept(head, conn, reply)


def _group(body: str) -> RequestHandler:
    """Placement groups (_scheduler/groups.py): create, remove, find by name, list."""
    def handle(head: Head, conn: Conn, req: pb.Request, reply: pb.Reply) -> bool:
        groups = head.state.groups
        try:
            if body == "create_placement_group":
                groups.create(conn.conn_id, inbound.group_spec(req.create_placement_group))
                head.state.schedule()
            elif body == "remove_placement_group":
                groups.remove(req.remove_placement_group)
            elif body == "get_placement_group":
                reply.placement_groups.append(group_info(groups.by_name(req.get_placement_group)))
            else:
                reply.placement_groups.extend(group_info(i) for i in groups.table(
                    req.placement_group_table))
        except (ValueError, InfeasibleResourcesError) as exc:
            reply.error, reply.error_kind = str(exc), type(exc).__name__
        return _once_kept(head, conn, reply)
    return handle


def _cluster_resources(head: Head, conn: Conn, reply: pb.Reply) -> None:
    reply.resources.update(cluster_total(head.state.nodes))


def _available_resources(head: Head, conn: Conn, reply: pb.Reply) -> None:
    reply.resources.update(cluster_free(head.state.nodes))


def _debug(head: Head, conn: Conn, reply: pb.Reply) -> None:
    reply.debug.CopyFrom(head.events.debug_info())


def _pending(head: Head, conn: Conn, reply: pb.Reply) -> None:
    reply.pending_tasks = head.state.pending_tasks(conn.conn_id, False)


def _pending_own(head: Head, conn: Conn, reply: pb.Reply) -> None:
    reply.pending_tasks = head.state.pending_tasks(conn.conn_id, True)


def _sync(head: Head, conn: Conn, reply: pb.Reply) -> None:
    pass   # the reply says every frame sent before the request was handled


def _nodes(head: Head, conn: Conn, reply: pb.Reply) -> None:
    reply.nodes.extend(head.events.nodes_info())


QUERIES: dict[str, Callable[[Head, Conn, Any], None]] = {
    "cluster_resources": _cluster_resources,
    "available_resources": _available_resources,
    "debug": _debug,
    "pending": _pending,
    "pending_own": _pending_own,
    "sync": _sync,
    "nodes": _nodes,
}


def _query(head: Head, conn: Conn, req: pb.Request, reply: pb.Reply) -> bool:
    answer = QUERIES.get(req.query)
    if answer is None:
        reply.error = f"unknown query {req.query!r}"
    else:
        answer(head, conn, reply)
    return True


REQUESTS: dict[str, RequestHandler] = {
    "create_segment": _create_segment,
    "abort_segment": _abort_segment,
    "locate": _locate,
    "prefetch": _prefetch,
    "state_query": _state_query,
    "create_actor": _create_actor,
    "get_actor_in": _get_actor_in,
    "get_actor": _get_actor,
    "kill_actor": _kill_actor,
    "query": _query,
    **{body: _group(body) for body in ("create_placement_group", "remove_placement_group",
                                       "get_placement_group", "placement_group_table")},
}
