"""Head process: the cluster scheduler's I/O (connections, frames, instructions, gRPC,
lifetime) and the nodes it schedules on, on uvloop.

    driver/worker --frames--> Conn.data_received -> Head.handle -> SchedulerState, and
    the connection's Node for objects (seal, pin, unpin: direct calls) -> instructions
    in state.out -> Head.carry_out: frames queued per connection, and each node
    instruction carried out on the node it names (start/kill/stop a worker, free a
    segment) -> one write per connection.
    Node --NodeHost events--> Head: send a frame, a worker failed to start or exited,
    an object was spilled to a file (relocate), flush.

``self.nodes`` maps node ids to Node (orchestra/_node.py); today it holds this
machine's node only: by default LOCAL_NODE_ID, which runs in this process on this loop;
with cfg node_process a RemoteNode (NODE_PROCESS_ID, orchestra/_remote_node.py) whose
node runs in a process of its own, started before the clients' socket exists and
closed (bounded wait) at shutdown; its death ends the session. The gRPC control
plane (Scheduler and ObjStore services, _grpc_service.py) runs on a thread pool and
hands each RPC to the loop thread; nothing else touches the state.

Owns: its nodes (each owns its worker processes and shared-memory segments), the
session's socket files. Fate-shares with the driver that started it: when that
driver's connection closes (exit, crash, SIGKILL), the head closes its nodes (kills
their workers, unlinks their segments) and exits. A watch on the driver process (a
pidfd, see _procutil.watch_parent) covers a driver that dies before it connects.
"""
from __future__ import annotations

import asyncio
import json
import os
import signal
import sys
import threading
import time
from typing import Any

from . import _grpc_service, _wire
from . import _pb as pb
from ._errors import make_error
from ._grpc_service import GRPC_CONN
from ._instructions import FreeSegment, KillWorker, LateSend, Push, Send, StartWorker, StopWorker
from ._node import Node, node_from_cfg, worker_socket
from ._procutil import watch_parent
from ._remote_node import RemoteNode
from ._scheduler import SchedulerState, WorkerState

# The node that runs in this process. Nodes of other machines will get ids of their own
# when they join; nothing else names this one.
LOCAL_NODE_ID = 0
# The node of this machine when it runs in a process of its own (cfg node_process).
NODE_PROCESS_ID = 1
# Deadlocked clusters are noticed (and the drivers told) this often.
_TICK_S = 0.5


class Conn(asyncio.Protocol):
    __slots__ = ("head", "conn_id", "node", "transport", "decoder", "wbuf", "hello")

    def __init__(self, head: Head, conn_id: int, node: Node | RemoteNode) -> None:
        self.head = head
        self.conn_id = conn_id
        self.node = node            # the node of the process at the other end
        self.transport: Any = None
        self.decoder = _wire.FrameDecoder()
        self.wbuf: list[bytes] = []
        self.hello: Any = None

    def connection_made(self, transport: Any) -> None:
        self.transport = transport
        self.head.conns[self.conn_id] = self

    def data_received(self, data: bytes) -> None:
        try:
            frames = self.decoder.feed(data)
        except _wire.ProtocolError as exc:
            print(f"orchestra head: dropping a connection that sent a bad frame: {exc}",
                  file=sys.stderr)
            self.transport.close()
            return
        self.head.handle(self, frames)

    def connection_lost(self, exc: BaseException | None) -> None:
        self.head.conn_lost(self)


class Head:
    def __init__(self, cfg: dict[str, Any], loop: asyncio.AbstractEventLoop,
                 zygote: tuple[Any, int, int] | None = None) -> None:
        self.cfg = cfg
        self.loop = loop
        self.session_dir = cfg["session_dir"]
        self.sock_path = os.path.join(self.session_dir, "head.sock")
        # Up to 8 tasks queued per busy worker: 5.3k -> 7k no-op tasks/s on 2 cores (8 -> 16
        # adds ~10% more). An idle worker takes queued tasks back (STEAL), so a long
        # task never holds up the ones pipelined behind it for long.
        # joinable: nodes may join, so a request no node holds waits for one (warned).
        self.state = SchedulerState(pipeline_depth=cfg.get("pipeline_depth", 8),
                                    error_factory=make_error,
                                    joinable=bool(cfg.get("joinable", False)))
        # Internal switches (init(_system_config=...)): direct calls at all, and loans
        # (tasks as direct calls to lent workers) among them.
        if cfg.get("direct_calls", True):
            self.state.worker_socket = self.worker_socket
            self.state.lending = bool(cfg.get("loans", True))
        # The node of this machine: in this process (the default: seal, pin and unpin are
        # direct calls on the task path), or in a process of its own (cfg node_process:
        # every command a frame on its connection, see _remote_node.py).
        self.local: Node | RemoteNode
        if cfg.get("node_process"):
            self.local = RemoteNode(NODE_PROCESS_ID, self, loop, cfg)
        else:
            self.local = node_from_cfg(LOCAL_NODE_ID, self, loop, cfg, zygote)
        self.nodes: dict[int, Node | RemoteNode] = {self.local.node_id: self.local}
        # Workers whose connection closed, until their node reports the exit: -> conn id.
        self._reaping: dict[int, int] = {}
        self.conns: dict[int, Conn] = {}
        # HelloReplies to drivers held until the first worker connects (_hello).
        self._parked_replies: list[tuple[Conn, bytes]] = []
        self.dirty: set[Conn] = set()
        self._next_conn = 1
        self.primary: int | None = None
        self.stopping = False
        self.server: Any = None
        self.last_activity = time.monotonic()
        self.grpc_server: Any = None
        self.watchers: dict[bytes, list[Any]] = {}   # RequestObj futures (gRPC threads wait)

    async def start(self) -> None:
        if isinstance(self.local, RemoteNode):
            # Before the clients' socket exists: a HelloReply describes the node.
            await self.local.launch(os.path.join(self.session_dir, "node.sock"))
        self.server = await self.loop.create_unix_server(self._new_conn, self.sock_path)
        os.chmod(self.sock_path, 0o600)
        self.local.start()
        res = (self.local.resources if isinstance(self.local, RemoteNode)   # as registered
               else {k: float(v) for k, v in self.cfg["resources"].items()})
        self.state.add_node(self.local.node_id, res, num_workers=int(self.cfg["num_workers"]),
                            max_workers=int(self.cfg.get("max_workers", 0)) or
                            4 * max(int(res.get("CPU", 1)), 1) + 32)
        self.state.client_connected(GRPC_CONN, pb.Hello(kind="grpc"))
        self.carry_out()
        self.loop.call_later(self.cfg.get("driver_connect_timeout_s", 60), self._check_driver)
        if self.cfg.get("grpc", True):
            # Control plane: importing grpc costs ~0.1 s, so it starts after init() returns.
            self.loop.call_later(self.cfg.get("grpc_delay_s", 0.5), self._start_grpc)
        self.loop.call_later(_TICK_S, self._tick)

    def _start_grpc(self) -> None:
        def run() -> None:
            try:
                server = _grpc_service.start(self, os.path.join(self.session_dir, "grpc.sock"))
            except Exception as exc:  # noqa: BLE001 - the frame path works without it
                print(f"orchestra head: gRPC control plane not started: {exc}", file=sys.stderr)
                return
            if self.stopping:
                server.stop(0)
            else:
                self.grpc_server = server
        if not self.stopping:
            threading.Thread(target=run, name="orchestra-grpc-start", daemon=True).start()

    def watch_object(self, oid: bytes, fut: Any) -> None:
        """Resolve ``fut`` with the object's data once sealed (for RequestObj)."""
        self.watchers.setdefault(oid, []).append(fut)
        self.state.subscribe(GRPC_CONN, [oid])

    # ------------------------------------------------------------------ NodeHost
    def send(self, conn_id: int, kind: int, msg: Any) -> None:
        c = self.conns.get(conn_id)
        if c is not None:
            c.wbuf.append(_wire.encode(kind, msg))
            self.dirty.add(c)

    def flush(self) -> None:
        self.carry_out()

    def is_idle(self) -> bool:
        """No task queued or running, and no frame for a while (read from another thread)."""
        return not self.state.tasks and time.monotonic() - self.last_activity > 0.3

    def relocate(self, object_id: bytes, segment: Any) -> bool:
        return self.state.relocate(object_id, segment)

    def worker_failed_to_start(self, worker_id: int, reason: str) -> None:
        print(f"orchestra head: could not start a worker: {reason}", file=sys.stderr)
        self.state.worker_failed_to_start(worker_id, reason)
        self._release_driver_replies()
        self.carry_out()

    def worker_exited(self, worker_id: int, reason: str, *, connected: bool) -> None:
        if connected:
            conn_id = self._reaping.pop(worker_id, None)
            if conn_id is not None:
                self.state.client_disconnected(conn_id, reason)
        else:
            w = self.state.workers.get(worker_id)
            if w is None or w.state is not WorkerState.STARTING:
                return   # the scheduler let it go already
            print(f"orchestra head: worker {worker_id} exited with {reason} "
                  "before it connected", file=sys.stderr)
            self.state.worker_failed_to_start(worker_id, reason)
        self.carry_out()

    # ------------------------------------------------------------------ connections
    def worker_socket(self, worker_id: int) -> str:
        """Where a worker listens for direct calls (_worker.py)."""
        return worker_socket(self.session_dir, worker_id)

    def _new_conn(self) -> Conn:
        c = Conn(self, self._next_conn, self.local)
        self._next_conn += 1
        return c

    # ------------------------------------------------------------------ frames
    def handle(self, conn: Conn, frames: list[tuple[int, Any]]) -> None:
        self.last_activity = time.monotonic()
        state = self.state
        cid = conn.conn_id
        node = conn.node
        for kind, msg in frames:
            if kind == _wire.SUBMIT:
                for call in msg.calls:
                    state.submit(cid, call)
            elif kind == _wire.TASK_DONE:
                for d in msg.returns:
                    if d.WhichOneof("data") == "segment":
                        node.seal(d.segment.name)
                state.task_done(cid, msg)
            elif kind == _wire.REF_DELTA:
                if msg.pin:
                    node.pin(cid, msg.pin)
                if msg.pending:
                    state.register_pending(cid, msg.pending)
                state.ref_delta(cid, msg.incr, msg.decr)
                if msg.unpin:
                    node.unpin(cid, msg.unpin)
            elif kind == _wire.OBJECTS:
                for d in msg.objects:
                    if d.WhichOneof("data") == "segment":
                        node.seal(d.segment.name)
                    state.put(cid, d)
            elif kind == _wire.SUBSCRIBE:
                state.subscribe(cid, msg.ids)
            elif kind == _wire.FUNCTION:
                state.register_function(msg)
            elif kind == _wire.BLOCKED:
                state.blocked(cid, msg.blocked, msg.object_ids, msg.task_id, msg.task_name)
            elif kind == _wire.RETURN_TASKS:
                state.return_tasks(cid, msg.task_ids)
            elif kind == _wire.CANCEL:
                state.cancel(msg.object_id, msg.force)
            elif kind == _wire.ADOPT:
                state.adopt_calls(cid, msg)
            elif kind == _wire.LOAN_RETURN:
                state.return_loan(cid, msg.worker_id)
            elif kind == _wire.LOAN_REQUEST:   # a driver asks for one more lent worker
                state.lend_idle(cid, dict(msg.resources))
            elif kind == _wire.RELEASE_CALL:   # ordered after the actor's own ref changes
                caller = self.conns.get(msg.owner)
                if caller is not None:
                    self._queue(caller, _wire.encode(_wire.RELEASE_CALL, pb.TaskDone(task_id=msg.task_id)))
            elif kind == _wire.REQUEST:
                self._request(conn, msg)
            elif kind == _wire.HELLO:
                self._hello(conn, msg)
            elif kind == _wire.SHUTDOWN:
                self.loop.call_soon(self.shutdown, "the driver called shutdown()")
        self.carry_out()

    def _hello(self, conn: Conn, hello: Any) -> None:
        conn.hello = hello
        node = conn.node
        if hello.kind == "driver" and self.primary is None:
            self.primary = conn.conn_id
            node.set_driver(conn.conn_id)
        try:
            self.state.client_connected(conn.conn_id, hello)
        except ValueError as exc:
            print(f"orchestra head: refusing a connection: {exc}", file=sys.stderr)
            conn.transport.close()
            return
        if hello.kind == "worker":
            node.worker_connected(hello.workerid)
            self._release_driver_replies()
        reply = pb.HelloReply(
            session_id=self.cfg["session_id"].encode(), node_id=node.node_id,
            node_resources=self.state.nodes[node.node_id].resources.total,
            store_capacity=node.capacity, session_dir=self.session_dir,
            shm_dir=node.shm_dir,
            cwd=self.cfg.get("cwd", ""), sys_path=self.cfg.get("sys_path", []),
            inline_threshold=int(self.cfg.get("inline_threshold", 100 * 1024)),
            conn_id=conn.conn_id)
        frame = _wire.encode(_wire.HELLO_REPLY, reply)
        if hello.kind == "driver" and self._no_worker_yet():
            # init() returns once a task can start at once: the head is ready before
            # its first worker (the fork server imports more), and a first task sent
            # meanwhile would wait for it anyway. Bounded: a worker that fails to start,
            # or ready_wait_s, releases the reply too.
            self._parked_replies.append((conn, frame))
            if len(self._parked_replies) == 1:
                self.loop.call_later(float(self.cfg.get("ready_wait_s", 1.0)),
                                     self._release_driver_replies)
            return
        self._queue(conn, frame)

    def _no_worker_yet(self) -> bool:
        workers = self.state.workers.values()
        return bool(workers) and all(w.state is WorkerState.STARTING for w in workers)

    def _release_driver_replies(self) -> None:
        if not self._parked_replies:
            return
        parked, self._parked_replies = self._parked_replies, []
        for conn, frame in parked:
            if conn.conn_id in self.conns:
                self._queue(conn, frame)
        self.carry_out()

    def _request(self, conn: Conn, req: Any) -> None:
        reply = pb.Reply(req_id=req.req_id)
        body = req.WhichOneof("body")
        if body == "create_segment":
            # Frees decided earlier in this batch of frames must happen before the store
            # judges the room (they wait in state.out until carry_out otherwise).
            self.carry_out()
            conn.node.create_segment(conn.conn_id, req)
            return
        elif body == "abort_segment":
            conn.node.abort_segment(conn.conn_id, req.abort_segment)
            if type(conn.node) is RemoteNode:   # answered once the node did it
                data = _wire.encode(_wire.REPLY, reply)
                conn.node.after_node(lambda: self._queue_if_open(conn, data))
                return
        elif body == "locate":
            if type(conn.node) is RemoteNode:
                # The reader found the segment gone: the node spilled it, and its
                # relocation may still be on its way here. Answered after it.
                conn.node.after_node(lambda: self._locate(conn, req.req_id, req.locate))
            else:
                self._locate(conn, req.req_id, req.locate)
            return
        elif body == "create_actor":
            try:
                self.state.create_actor(conn.conn_id, req.create_actor)
            except ValueError as exc:
                reply.error, reply.error_kind = str(exc), "ValueError"
        elif body == "kill_actor":
            self.state.actor_table.kill(req.kill_actor.actor_id, req.kill_actor.no_restart)
        elif body == "get_actor":
            try:
                reply.actor.CopyFrom(self.state.actor_table.get(req.get_actor))
            except ValueError as exc:
                reply.error, reply.error_kind = str(exc), "ValueError"
        elif body == "query":
            q = req.query
            if q == "cluster_resources":
                reply.resources.update(self.state.total_resources())
            elif q == "available_resources":
                reply.resources.update(self.state.available_resources())
            elif q == "debug":
                reply.debug.CopyFrom(self.debug_info())
            elif q == "sync":
                pass   # the reply says every frame sent before the request was handled
            else:
                reply.error = f"unknown query {q!r}"
        self._queue(conn, _wire.encode(_wire.REPLY, reply))

    def _locate(self, conn: Conn, req_id: int, object_id: bytes) -> None:
        """Answer where an object's data is now (a reader found its segment gone)."""
        reply = pb.Reply(req_id=req_id)
        o = self.state.objects.get(object_id)
        if o is None or o.data is None:
            reply.error = f"object {object_id.hex()} was freed while it was being read"
            reply.error_kind = "ObjectLostError"
        else:
            reply.object.CopyFrom(o.data)
        self._queue_if_open(conn, _wire.encode(_wire.REPLY, reply))

    def _queue_if_open(self, conn: Conn, data: bytes) -> None:
        """For an answer that waited for the node: the connection may have closed."""
        if self.conns.get(conn.conn_id) is conn:
            self._queue(conn, data)

    def debug_info(self) -> Any:
        st = self.state
        info = pb.SchedulerDebugInfoReply(
            total_resources=st.total_resources(), available_resources=st.available_resources())
        for t in st.tasks.values():
            info.task.append(t.call)
        for w in st.workers.values():
            info.workers.append(pb.WorkerInfo(
                workerid=w.worker_id, pid=w.pid, node_id=w.node_id, state=w.state.value,
                running=[t.call.task_id for t in w.queue]))
            if w.state is WorkerState.IDLE:
                info.avail_worker.append(w.worker_id)
        for oid, o in st.objects.items():
            large = o.data is not None and o.data.WhichOneof("data") == "segment"
            info.objects.append(pb.ObjectInfo(
                objref=oid, state="ready" if o.data is not None else "pending",
                refcount=o.count, size=o.size,
                in_shared_memory=large and not o.data.segment.path,
                spilled=large and bool(o.data.segment.path)))
        for f in st.functions.values():
            info.function_table[f.fnname].num_return_vals = f.num_return_vals
        return info

    # ------------------------------------------------------------------ instructions
    def _queue(self, conn: Conn, data: bytes) -> None:
        conn.wbuf.append(data)
        self.dirty.add(conn)

    def carry_out(self) -> None:
        out = self.state.out
        pushes: dict[int, Any] = {}
        late: list[tuple[Conn, bytes]] = []
        if out:
            self.state.out = []
            conns = self.conns
            for ins in out:
                if type(ins) is Push:
                    msg = pushes.get(ins.conn)
                    if msg is None:
                        msg = pushes[ins.conn] = pb.Objects()
                    msg.objects.append(ins.data)
                elif type(ins) is Send:
                    c = conns.get(ins.conn)
                    if c is not None:
                        c.wbuf.append(_wire.encode(ins.kind, ins.msg))
                        self.dirty.add(c)
                elif type(ins) is LateSend:
                    c = conns.get(ins.conn)
                    if c is not None:
                        late.append((c, _wire.encode(ins.kind, ins.msg)))
                elif type(ins) is FreeSegment:
                    self.nodes[ins.node_id].free_segment(ins.key)
                elif type(ins) is StartWorker:
                    self.nodes[ins.node_id].start_worker(ins.worker_id)
                elif type(ins) is KillWorker:
                    self.nodes[ins.node_id].kill_worker(ins.worker_id, ins.reason)
                elif type(ins) is StopWorker:
                    self.nodes[ins.node_id].stop_worker(ins.worker_id)
            for cid, msg in pushes.items():
                if cid == GRPC_CONN:
                    for d in msg.objects:
                        for fut in self.watchers.pop(d.object_id, []):
                            if not fut.done():
                                fut.set_result(d)
                    continue
                c = conns.get(cid)
                if c is not None:
                    c.wbuf.append(_wire.encode(_wire.OBJECTS, msg))
                    self.dirty.add(c)
        if self.dirty:
            for c in self.dirty:
                if c.wbuf:
                    c.transport.write(b"".join(c.wbuf) if len(c.wbuf) > 1 else c.wbuf[0])
                    c.wbuf = []
            self.dirty.clear()
        for c, data in late:
            c.transport.write(data)

    # ------------------------------------------------------------------ failures
    def conn_lost(self, conn: Conn) -> None:
        self.conns.pop(conn.conn_id, None)
        self.dirty.discard(conn)
        if self.stopping:
            return
        conn.node.drop_conn(conn.conn_id)
        if conn.conn_id == self.primary:
            self.shutdown("the driver disconnected")
            return
        client = self.state.clients.get(conn.conn_id)
        if client is not None and client.worker is not None:
            # The scheduler hears of it once its node has the exit status (worker_exited):
            # a crash then reads "died of SIGSEGV", not "its connection closed".
            wid = client.worker.worker_id
            self._reaping[wid] = conn.conn_id
            self.nodes[client.worker.node_id].worker_disconnected(wid)
        else:
            self.state.client_disconnected(conn.conn_id)
            self.carry_out()

    def _tick(self) -> None:
        """Notice a cluster where no task can progress (the drivers are told)."""
        if self.stopping:
            return
        self.state.blocking.tick(time.monotonic())
        self.carry_out()
        self.loop.call_later(_TICK_S, self._tick)

    def _check_driver(self) -> None:
        if self.primary is None:
            self.shutdown("no driver connected in time")

    def shutdown(self, reason: str) -> None:
        if self.stopping:
            return
        self.stopping = True
        if self.server is not None:
            self.server.close()
        if self.grpc_server is not None:
            self.grpc_server.stop(0)
        for node in self.nodes.values():
            node.close()
        # The clients learn why (a driver's later calls name it), then lose the connection.
        closing = _wire.encode(_wire.CLOSING, pb.Closing(reason=reason))
        for c in list(self.conns.values()):
            try:
                c.transport.write(b"".join(c.wbuf) + closing)
            except (OSError, RuntimeError):   # already closed
                pass
            c.transport.abort()
        for name in ("head.sock", "grpc.sock"):
            try:
                os.unlink(os.path.join(self.session_dir, name))
            except FileNotFoundError:
                pass
        self.loop.stop()


def main(argv: list[str] | None = None, zygote: tuple[Any, int, int] | None = None) -> None:
    argv = sys.argv[1:] if argv is None else argv
    with open(argv[0]) as f:
        cfg = json.load(f)
    cfg["_cfg_path"] = argv[0]   # a node process reads the same file
    # Everything the head creates (sockets, segments) is for this user only; set before
    # any socket exists, so none is ever reachable by others, not even for a moment.
    os.umask(0o077)
    signal.signal(signal.SIGINT, signal.SIG_IGN)   # Ctrl-C belongs to the driver
    import uvloop
    loop = uvloop.new_event_loop()
    asyncio.set_event_loop(loop)
    head = Head(cfg, loop, zygote)
    for sig in (signal.SIGTERM, signal.SIGHUP):
        loop.add_signal_handler(sig, head.shutdown, f"signal {sig.name}")
    # The driver's connection closing is the usual sign it is gone; this covers a driver
    # that dies before it connects.
    watch_parent(loop, lambda: head.shutdown("the driver process exited"))
    try:
        loop.run_until_complete(head.start())
    except Exception as exc:
        print(f"orchestra head: failed to start: {exc}", file=sys.stderr)
        head.shutdown("start failed")
        raise SystemExit(1) from exc
    try:
        loop.run_forever()
    finally:
        if not head.stopping:
            head.shutdown("loop ended")
        loop.close()


if __name__ == "__main__":
    main()
