"""gRPC control plane of the head: the Scheduler and ObjStore services of orchestra.proto.

Served on ``unix:<session dir>/grpc.sock`` (mode 0600 in a 0700 directory: only this
user can connect, which matters because cloudpickle is code execution). gRPC threads
never touch scheduler state: each RPC becomes a call on the head's event loop thread
(``Head.call``), the same state the unix-socket frames drive. gRPC clients act as one
pseudo-client, GRPC_CONN: tasks they submit and objects they push are held by it until
they DecrementCount them.

Node-to-node RPCs (RegisterObjStore, DeliverObj, StreamObj) answer UNIMPLEMENTED until
more nodes can join; InvokeCall is not served (workers take tasks as frames).
"""
from __future__ import annotations

import concurrent.futures
import os
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, NoReturn, TypeVar

from .. import _ids
from .._protocol import pb
from . import inbound
from .inbound import data_in
from .outbound import segment_out

if TYPE_CHECKING:
    import grpc

    from .frames import Head

T = TypeVar("T")

GRPC_CONN = 0
_RPC_TIMEOUT_S = 30.0


def start(head: Head, path: str) -> grpc.Server:
    """Start the gRPC server; returns it (call .stop(grace) to end it)."""
    import grpc

    from .._proto import orchestra_pb2_grpc as rpc

    pool = concurrent.futures.ThreadPoolExecutor(max_workers=4, thread_name_prefix="orchestra-grpc")
    server = grpc.server(pool)
    rpc.add_SchedulerServicer_to_server(_Scheduler(head), server)
    rpc.add_ObjStoreServicer_to_server(_ObjStore(head), server)
    server.add_insecure_port(f"unix:{path}")
    server.start()
    os.chmod(path, 0o600)
    return server


def _on_loop(head: Head, fn: Callable[[], T], context: grpc.ServicerContext) -> T:
    """Run ``fn`` on the head's loop thread and return its result (or abort the RPC)."""
    import grpc
    fut: concurrent.futures.Future[T] = concurrent.futures.Future()

    def run() -> None:
        try:
            fut.set_result(fn())
        except Exception as exc:  # noqa: BLE001 - handed to the RPC caller
            fut.set_exception(exc)
        head.carry_out()

    head.loop.call_soon_threadsafe(run)
    try:
        return fut.result(timeout=_RPC_TIMEOUT_S)
    except concurrent.futures.TimeoutError:
        context.abort(grpc.StatusCode.DEADLINE_EXCEEDED, "the head did not answer within 30 s")
    except ValueError as exc:
        context.abort(grpc.StatusCode.INVALID_ARGUMENT, str(exc))
    raise AssertionError("context.abort() raises")


class _Scheduler:
    def __init__(self, head: Head) -> None:
        self.head = head

    def _unimplemented(self, context: grpc.ServicerContext, what: str) -> NoReturn:
        import grpc
        context.abort(grpc.StatusCode.UNIMPLEMENTED,
                      f"{what}: this cluster has one node; workers and the store connect "
                      "through the head's unix socket")
        raise AssertionError("context.abort() raises")

    def RegisterWorker(self, request: pb.RegisterWorkerRequest,
                       context: grpc.ServicerContext) -> pb.RegisterWorkerReply:
        self._unimplemented(context, "RegisterWorker")

    def RegisterObjStore(self, request: pb.RegisterObjStoreRequest,
                         context: grpc.ServicerContext) -> pb.RegisterObjStoreReply:
        self._unimplemented(context, "RegisterObjStore")

    def RegisterFunction(self, request: pb.RegisterFunctionRequest,
                         context: grpc.ServicerContext) -> pb.AckReply:
        if not request.function_id or not request.pickled:
            import grpc
            context.abort(grpc.StatusCode.INVALID_ARGUMENT, "function_id and pickled are required")
        fn = inbound.function_in(request)
        _on_loop(self.head, lambda: self.head.state.register_function(fn), context)
        return pb.AckReply()

    def RemoteCall(self, request: pb.RemoteCallRequest, context: grpc.ServicerContext) -> pb.RemoteCallReply:
        call = request.call
        state = self.head.state
        if call.function_id not in state.functions:
            import grpc
            context.abort(grpc.StatusCode.FAILED_PRECONDITION,
                          "unknown function_id: RegisterFunction it first")
        if len(call.task_id) != 12:
            import grpc
            context.abort(grpc.StatusCode.INVALID_ARGUMENT, "task_id must be 12 bytes")
        _on_loop(self.head, lambda: state.submit(GRPC_CONN, inbound.call_in(call)), context)
        return pb.RemoteCallReply(result=_ids.return_ids(call.task_id, call.num_returns))

    def IncrementCount(self, request: pb.ChangeCountRequest, context: grpc.ServicerContext) -> pb.AckReply:
        directory = self.head.state.directory
        _on_loop(self.head, lambda: directory.ref_delta(GRPC_CONN, request.objref, []), context)
        return pb.AckReply()

    def DecrementCount(self, request: pb.ChangeCountRequest, context: grpc.ServicerContext) -> pb.AckReply:
        directory = self.head.state.directory
        _on_loop(self.head, lambda: directory.ref_delta(GRPC_CONN, [], request.objref), context)
        return pb.AckReply()

    def PushObj(self, request: pb.PushObjRequest, context: grpc.ServicerContext) -> pb.PushObjReply:
        obj = request.obj
        if obj.WhichOneof("data") != "inline" or len(obj.object_id) != 16:
            import grpc
            context.abort(grpc.StatusCode.INVALID_ARGUMENT,
                          "PushObj takes an inline object with a 16-byte object_id")
        data = data_in(obj)
        _on_loop(self.head, lambda: self.head.state.directory.put(GRPC_CONN, data), context)
        return pb.PushObjReply(objref=obj.object_id)

    def RequestObj(self, request: pb.RequestObjRequest,
                   context: grpc.ServicerContext) -> pb.ObjectData | None:
        import grpc
        fut: concurrent.futures.Future[pb.ObjectData] = concurrent.futures.Future()
        _on_loop(self.head, lambda: self.head.watch_object(request.objref, fut), context)
        try:
            return fut.result(timeout=request.timeout_s or None)
        except concurrent.futures.TimeoutError:
            context.abort(grpc.StatusCode.DEADLINE_EXCEEDED,
                          f"object {request.objref.hex()} not ready within {request.timeout_s:g} s")
        return None

    def ObjReady(self, request: pb.ObjReadyRequest, context: grpc.ServicerContext) -> pb.AckReply:
        self._unimplemented(context, "ObjReady")

    def WorkerReady(self, request: pb.WorkerReadyRequest, context: grpc.ServicerContext) -> pb.AckReply:
        return pb.AckReply()

    def SchedulerDebugInfo(self, request: pb.SchedulerDebugInfoRequest,
                           context: grpc.ServicerContext) -> pb.SchedulerDebugInfoReply:
        return _on_loop(self.head, self.head.events.debug_info, context)


class _ObjStore:
    def __init__(self, head: Head) -> None:
        self.head = head

    def DeliverObj(self, request: pb.DeliverObjRequest, context: grpc.ServicerContext) -> pb.AckReply:
        import grpc
        context.abort(grpc.StatusCode.UNIMPLEMENTED, "DeliverObj: this cluster has one node")
        raise AssertionError("context.abort() raises")

    def StreamObj(self, request_iterator: Iterator[pb.ObjChunk],
                  context: grpc.ServicerContext) -> pb.AckReply:
        import grpc
        context.abort(grpc.StatusCode.UNIMPLEMENTED, "StreamObj: this cluster has one node")
        raise AssertionError("context.abort() raises")

    def ObjStoreDebugInfo(self, request: pb.ObjStoreDebugInfoRequest,
                          context: grpc.ServicerContext) -> pb.ObjStoreDebugInfoReply:
        def info() -> pb.ObjStoreDebugInfoReply:
            node = self.head.local   # the node of the head's own machine
            reply = node.store_info()
            for oid, o in self.head.state.objects.items():
                seg = o.data.segment if o.data is not None else None
                if seg is not None and not seg.path and seg.node_id == node.node_id:
                    if not request.objref or oid in request.objref:
                        reply.objref.append(oid)
                        reply.segment.append(segment_out(seg))
            return reply
        return _on_loop(self.head, info, context)
