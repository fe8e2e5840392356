"""Head process: the cluster scheduler's I/O (connections, frames, instructions, gRPC,
lifetime) and the nodes it schedules on, on uvloop.

    driver/worker --frames--> Conn.data_received -> Head.handle -> SchedulerState, and
    the connection's Node for objects (seal, pin, unpin: direct calls) -> instructions
    in state.out -> Head.carry_out: frames queued per connection, and each node
    instruction carried out on the node it names (start/kill/stop a worker, free a
    segment) -> one write per connection.
    Node --NodeHost events--> Head: send a frame, a worker failed to start or exited,
    an object was spilled to a file (relocate), flush.

``self.nodes`` maps node ids to Node (orchestra/_node/node.py); today it holds this
machine's node only: by default LOCAL_NODE_ID, which runs in this process on this loop;
with cfg node_process a RemoteNode (NODE_PROCESS_ID, orchestra/_head/remote_node.py) whose
node runs in a process of its own, started before the clients' socket exists and
closed (bounded wait) at shutdown; its death ends the session. The gRPC control
plane (Scheduler and ObjStore services, _head/grpc_service.py) runs on a thread pool and
hands each RPC to the loop thread; nothing else touches the state.

Owns: its nodes (each owns its worker processes and shared-memory segments), the
session's socket files. Fate-shares with the driver that started it: when that
driver's connection closes (exit, crash, SIGKILL), the head closes its nodes (kills
their workers, unlinks their segments) and exits. A watch on the driver process (a
pidfd, see _procutil.watch_parent; set up by process.py, which runs the head) covers a
driver that dies before it connects.
"""
from __future__ import annotations

import asyncio
import os
import shutil
import sys
import threading
import time
from typing import TYPE_CHECKING, Any, NamedTuple

from .._ids import machine_id, node_hex
from .._node.node import Node, node_from_cfg, worker_socket
from .._node.worker_pool import ZygoteStart
from .._objects.errors import make_error
from .._objects.segments import sweep_stale_segments
from .._objects.serialization import INLINE_MAX
from .._observe.log_router import LogRoutes
from .._observe.task_events import DRIVER
from .._protocol import pb
from .._protocol import wire as _wire
from .._protocol.auth import AuthGate, server_tls
from .._protocol.connection import parse_address, parse_host
from .._resources import format_resources
from .._scheduler.events import Hello
from .._scheduler.instructions import (
    Durable,
    FreeSegment,
    KillWorker,
    Pull,
    Push,
    StartWorker,
    StopWorker,
)
from .._scheduler.jobs import JobBook
from .._scheduler.memory import choose as memory_victim
from .._scheduler.state import SchedulerState, WorkerState
from . import grpc_service as _grpc_service
from . import inbound, jobs, records, rejoin
from .frames import FRAMES, REQUESTS, Waiter
from .grpc_service import GRPC_CONN
from .heartbeats import HEARTBEAT_S, Heartbeats
from .outbound import FRAME_OF, LATE, data_out
from .pulls import Pulls
from .remote_node import RemoteNode
from .state_query import StateQueries
from .state_store import HeadState

if TYPE_CHECKING:
    import grpc

    from .._observe.dashboard import Dashboard

# The node that runs in this process. Nodes of other machines will get ids of their own
# when they join; nothing else names this one.
LOCAL_NODE_ID = 0
# The node of this machine when it runs in a process of its own (cfg node_process).
NODE_PROCESS_ID = 1
# Deadlocked clusters are noticed (and the drivers told) this often.
_TICK_S = 0.5
# After a node's death: when its segment directory is swept (if it was on this machine).
_SWEEP_AFTER_S = 1.0


class NodeGone(NamedTuple):
    """A node that died: what orchestra.nodes() still says of it."""

    host: str
    resources: dict[str, float]
    reason: str
    pid: int


class Conn(asyncio.Protocol):
    __slots__ = ("head", "conn_id", "node", "transport", "decoder", "wbuf", "hello")

    def __init__(self, head: Head, conn_id: int, node: Node | RemoteNode) -> None:
        self.head = head
        self.conn_id = conn_id
        self.node = node            # the node of the process at the other end
        self.transport: Any = None
        self.decoder = _wire.FrameDecoder()
        self.wbuf: list[bytes] = []
        self.hello: pb.Hello | None = None

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
        if self.hello is None and frames and frames[0][0] == _wire.NODE_EVENT:
            self.head.join(self, frames)   # a node joining over TCP, not a client
            return
        self.head.handle(self, frames)

    def connection_lost(self, exc: BaseException | None) -> None:
        self.head.conn_lost(self)


class Head:
    def __init__(self, cfg: dict[str, Any], loop: asyncio.AbstractEventLoop,
                 zygote: ZygoteStart | None = None) -> None:
        self.cfg = cfg
        self.loop = loop
        self.session_dir = cfg["session_dir"]
        self.sock_path = os.path.join(self.session_dir, "head.sock")
        # Up to 8 tasks queued per busy worker: 5.3k -> 7k no-op tasks/s on 2 cores (8 -> 16
        # adds ~10% more). An idle worker takes queued tasks back (STEAL), so a long
        # task never holds up the ones pipelined behind it for long.
        # joinable: nodes may join, so a request no node holds waits for one (warned);
        # infeasible_waits: it waits on a private cluster too (the Ray runner's).
        self.state = SchedulerState(pipeline_depth=cfg.get("pipeline_depth", 8),
                                    error_factory=make_error,
                                    joinable=bool(cfg.get("joinable", False)),
                                    infeasible_waits=bool(cfg.get("infeasible_waits", False)))
        self.state.directory.tell_owner_freed = float(cfg.get("reconnect_timeout_s", 0)) > 0
        # Internal switches (init(_system_config=...)): direct calls, loans among them.
        if cfg.get("direct_calls", True):
            self.state.worker_socket = self.worker_socket
            self.state.lending = bool(cfg.get("loans", True))
        # The node of this machine: in this process (the default: seal, pin and unpin are
        # direct calls on the task path), or in a process of its own (cfg node_process:
        # every command a frame on its connection, see _head/remote_node.py).
        self.local: Node | RemoteNode
        if cfg.get("node_process"):
            self.local = RemoteNode(NODE_PROCESS_ID, self, loop, cfg)
        else:
            self.local = node_from_cfg(LOCAL_NODE_ID, self, loop, cfg, zygote)
        self.nodes: dict[int, Node | RemoteNode] = {self.local.node_id: self.local}
        # Workers whose connection closed, until their node reports the exit: -> conn id.
        self._reaping: dict[int, int] = {}
        self.conns: dict[int, Conn] = {}
        # HelloReplies to drivers held until the first worker connects (hello).
        self._parked_replies: list[tuple[Conn, bytes]] = []
        self.dirty: set[Conn] = set()
        self.next_conn = 1
        self.primary: int | None = None
        self.log_routes = LogRoutes()   # drivers' log connections (_observe/log_router.py)
        self.stopping = False
        self.server: asyncio.Server | None = None
        self.last_activity = time.monotonic()
        self.heartbeats = Heartbeats(self)
        self.grpc_server: grpc.Server | None = None
        self.watchers: dict[bytes, list[Waiter]] = {}   # gRPC readers, pulls
        # A cluster (cfg listen): the TCP listener, nodes that joined over it, and the
        # pulls of objects between their stores.
        self.token: str = cfg.get("token") or ""
        self.tcp_server: asyncio.Server | None = None
        self.data_address = ""                       # the local node's data server
        self.machine = machine_id()
        self.node_machine: dict[int, str] = {self.local.node_id: self.machine}
        self.gone: dict[int, NodeGone] = {}          # nodes that died, for nodes()
        self.next_node_id = NODE_PROCESS_ID + 1   # (_head/rejoin.py)
        # (object id, node id) -> what waits for that node's copy (None: a prefetch)
        self.pulls = Pulls(self)   # objects copied between nodes for their readers
        self.address = cfg.get("listen", "")
        self.dashboard: Dashboard | None = None      # once it serves
        self.dashboard_url = ""
        self.events = StateQueries(self)   # task events, state queries (_head/state_query.py)
        self.durable: HeadState | None = None   # its state store (process.main sets it)
        self.jobs = JobBook()   # a job per driver session (_head/jobs.py)

    async def start(self) -> None:
        if isinstance(self.local, RemoteNode):
            # Before the clients' socket exists: a HelloReply describes the node.
            await self.local.launch(os.path.join(self.session_dir, "node.sock"))
        if self.cfg.get("include_dashboard", True):   # bound before a HelloReply names it
            from .._observe.dashboard_bind import start_dashboard
            self.dashboard_url = start_dashboard(self)
        self.server = await self.loop.create_unix_server(self._new_conn, self.sock_path)
        os.chmod(self.sock_path, 0o600)
        self.local.start()
        res = (self.local.resources if isinstance(self.local, RemoteNode)   # as registered
               else {k: float(v) for k, v in self.cfg["resources"].items()})
        # runs_work False: this machine's work runs on a node beside the head, which
        # outlives it (orchestra start --head); the head's own node only stores.
        works = self.cfg.get("runs_work", True)
        res = {**(res if works else {}), **self._node_resources(self.local),
               "node:__internal_head__": 1.0}
        self.state.add_node(self.local.node_id, res,
                            num_workers=int(self.cfg["num_workers"]) if works else 0,
                            max_workers=int(self.cfg.get("max_workers", 0)) or
                            4 * max(int(res.get("CPU", 1)), 1) + 32, works=works)
        self.state.client_connected(GRPC_CONN, Hello("grpc"))
        rejoin.restore(self, NODE_PROCESS_ID + 1, GRPC_CONN)
        self.carry_out()
        if self.address:
            await self._listen_tcp()
        if not self.cfg.get("detached"):
            self.loop.call_later(self.cfg.get("driver_connect_timeout_s", 60), self._check_driver)
        if self.cfg.get("grpc", True):
            # Control plane: importing grpc costs ~0.1 s, so it starts after init() returns.
            self.loop.call_later(self.cfg.get("grpc_delay_s", 0.5), self._start_grpc)
        self.loop.call_later(_TICK_S, self._tick)

    async def _listen_tcp(self) -> None:
        """Listen on cfg listen (HOST:PORT) for drivers, workers and nodes of other
        machines; each authenticates with the cluster token before a frame is read."""
        if not self.token:
            raise RuntimeError("a cluster address needs a token (cfg token)")
        _, (host, port) = parse_address(self.address)
        handshaking: dict[AuthGate, None] = {}   # shared: at most MAX_UNAUTHENTICATED
        self.tcp_server = await self.loop.create_server(
            lambda: AuthGate(self.token, self.loop, lambda transport: self._new_conn(),
                             what="orchestra head", pending=handshaking),
            host, port, reuse_address=True, **server_tls(self.token, host))
        if port == 0:   # an ephemeral port: say which
            port = self.tcp_server.sockets[0].getsockname()[1]
            self.address = f"{host}:{port}"
        serve = getattr(self.local, "serve_data", None)
        if serve is not None:
            self.data_address = serve(host, self.token)
        # Whole or not at all (its supervisor, `orchestra start` and drivers poll for it):
        # a file seen between its creation and its write was empty, and a supervisor
        # that read it so restarted its head on a new port nobody knew.
        path = os.path.join(self.session_dir, "address")
        with open(path + ".tmp", "w") as f:
            f.write(self.address)
        os.replace(path + ".tmp", path)
        self.loop.call_later(HEARTBEAT_S, self.heartbeats.tick)

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

    def watch_object(self, oid: bytes, fut: Waiter) -> None:
        """Resolve ``fut`` with the object's data once sealed (for RequestObj)."""
        self.watchers.setdefault(oid, []).append(fut)
        self.state.directory.subscribe(GRPC_CONN, [oid])

    # ------------------------------------------------------------------ NodeHost
    def node_pulled(self, node_id: int, object_id: bytes, segment: pb.Segment | None,
                    error: str) -> None:
        """Node ``node_id`` has its copy (or failed): answer what waited for it."""
        self.pulls.pulled(node_id, object_id, segment, error)

    def pulled(self, object_id: bytes, segment: pb.Segment | None, error: str) -> None:
        """The local node pulled an object's copy into its store (or failed to)."""
        self.pulls.pulled(self.local.node_id, object_id, segment, error)

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

    def relocate(self, object_id: bytes, segment: pb.Segment) -> bool:
        return self.state.relocate(object_id, inbound.segment_in(segment))

    def worker_failed_to_start(self, worker_id: int, reason: str) -> None:
        print(f"orchestra head: could not start a worker: {reason}", file=sys.stderr)
        self.state.worker_failed_to_start(worker_id, reason)
        self._release_driver_replies()
        self.carry_out()

    def _worker_without_node(self, worker_id: int) -> None:
        """A worker was to start on a node that died meanwhile (not a broken worker)."""
        self.state.worker_failed_to_start(worker_id, "its node is gone", broken=False)
        self.carry_out()

    def worker_exited(self, worker_id: int, reason: str, *, connected: bool) -> None:
        if connected:
            conn_id = self._reaping.pop(worker_id, None)
            if conn_id is not None:
                self._client_gone(conn_id, reason)
        else:
            w = self.state.workers.get(worker_id)
            if w is not None and w.state is WorkerState.STARTING:   # (else let go already)
                print(f"orchestra head: worker {worker_id} exited with {reason} "
                      "before it connected", file=sys.stderr)
                self.state.worker_failed_to_start(worker_id, reason)
            self.state.kept.worker_gone(worker_id)   # one of before (_scheduler/kept.py)
        self.carry_out()

    def memory_pressure(self, node_id: int, pressure: pb.NodeMemoryPressure) -> None:
        """A node's memory is past its monitor's threshold: the worker chosen
        (_scheduler/memory.py) is killed, its task failing with OutOfMemoryError."""
        kill = memory_victim(self.state.workers.values(), inbound.memory_pressure(pressure),
                             node_id, node_hex(node_id))
        if kill is None:
            return   # nothing runs there to stop (the node asks again later)
        print(f"orchestra head: worker {kill.worker_id} {kill.reason}", file=sys.stderr,
              flush=True)
        self.state.out.append(kill)
        self.carry_out()

    # ------------------------------------------------------------------ connections
    def worker_socket(self, node_id: int, worker_id: int) -> str:
        """Where a worker listens for direct calls (_worker/worker.py): in its node's directory."""
        node = self.nodes.get(node_id)
        return worker_socket(getattr(node, "node_dir", "") or self.session_dir, worker_id)

    def _new_conn(self) -> Conn:
        c = Conn(self, self.next_conn, self.local)
        self.next_conn += 1
        return c

    # ------------------------------------------------------------------ frames
    def handle(self, conn: Conn, frames: list[tuple[int, Any]]) -> None:
        """A batch of frames from one connection: each to its handler (frames.FRAMES),
        then the instructions they made carried out."""
        self.last_activity = time.monotonic()
        node = conn.node
        if self.gone and node.node_id in self.gone and node is not self.local:
            # Its node died (node_gone aborts this connection): what a worker of it still
            # says is void, a result there among it (sealed, it named a store that is
            # gone for good); its tasks are retried as its death says.
            return
        handlers = FRAMES
        for i, (kind, msg) in enumerate(frames):
            handler = handlers.get(kind)
            if handler is not None:
                handler(self, conn, msg)
            if i & 255 == 255:   # a long batch: the joined nodes still hear the head lives
                self.heartbeats.beat_if_due()
        self.carry_out()

    def forward_logs(self, conn: Conn, msg: pb.LogLines) -> None:
        """A worker's lines to the log connections of their jobs' drivers."""
        ip = self.node_address(conn.node) if len(self.nodes) > 1 else ""
        for target, lines in self.log_routes.route(msg, self.primary, ip).items():
            c = self.conns.get(target)
            if c is not None:
                self.queue(c, _wire.encode(_wire.LOG_LINES, lines))

    def hello(self, conn: Conn, hello: pb.Hello) -> None:
        conn.hello = hello
        if hello.kind == "logs":   # a driver's second connection: its tasks' output
            self.log_routes.add(conn.conn_id, hello.log_job)
            self.queue(conn, _wire.encode(_wire.HELLO_REPLY, pb.HelloReply(conn_id=conn.conn_id)))
            return
        node = self._node_for(conn, hello)
        if node is None and (hello.resume_actor or hello.resume_task) or \
                hello.kind == "driver" and jobs.node_away(self, hello):   # its node has not
            conn.transport.close()                                         # joined again yet
            return
        if node is None:
            self._refuse(conn, "no node of this cluster runs on this machine (none shares "
                         "its /dev/shm): start one here with `orchestra start --address "
                         f"{self.address} --token ...`, then connect again")
            return
        conn.node = node
        refused = jobs.driver_hello(self, conn.conn_id, hello, node.node_id) \
            if hello.kind == "driver" and not hello.tool else None
        if refused:
            self._refuse(conn, refused)
            return
        if hello.kind == "driver" and self.primary is None and not self.cfg.get("detached"):
            self.primary = conn.conn_id
            node.set_driver(conn.conn_id)
        try:
            self.state.client_connected(conn.conn_id, inbound.hello(hello), node.node_id)
        except ValueError as exc:
            self._refuse(conn, str(exc))
            return
        if hello.kind == "worker":
            node.worker_connected(hello.workerid)
        claimed = rejoin.claim(self, conn.conn_id, hello)
        reply = pb.HelloReply(claimed_actors=claimed,
            session_id=self.cfg["session_id"].encode(), node_id=node.node_id,
            node_resources=self.state.nodes[node.node_id].resources.total,
            store_capacity=node.capacity, session_dir=self.session_dir,
            shm_dir=node.shm_dir, node_dir=getattr(node, "node_dir", "") or self.session_dir,
            cwd=self.cfg.get("cwd", ""), sys_path=self.cfg.get("sys_path", []),
            inline_threshold=int(self.cfg.get("inline_threshold", INLINE_MAX)),
            conn_id=conn.conn_id, joinable=bool(self.cfg.get("joinable")),
            infeasible_waits=bool(self.cfg.get("infeasible_waits")),
            node_address=self.node_address(node), dashboard_url=self.dashboard_url,
            reconnect_s=float(self.cfg.get("reconnect_timeout_s", 0.0)))
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
        self.queue(conn, frame)
        if hello.kind == "worker":   # after its reply: what it was sent at connect follows
            self._release_driver_replies()   # it (the client drops frames before it)

    def _node_for(self, conn: Conn, hello: pb.Hello) -> Node | RemoteNode | None:
        """The node whose store a connecting process maps: a worker's is the node that
        started it (one that outlived the head names it); a driver's the one it names, or
        the first on its machine (the one it connected to, when that shares it)."""
        if hello.kind == "worker" and not (hello.resume_actor or hello.resume_task):
            w = self.state.workers.get(hello.workerid)
            return self.nodes.get(w.node_id) if w is not None else self.local
        if hello.HasField("node_id"):
            return self.nodes.get(hello.node_id)
        if not hello.machine:
            return conn.node
        if self.node_machine.get(conn.node.node_id) == hello.machine and \
                not (conn.node is self.local and self._head_only()):
            return conn.node
        # A head that runs no work (--num-cpus 0 --num-gpus 0) beside a joined node of
        # its machine: drivers there use that node's store, which outlives the head.
        for nid in sorted(self.node_machine):
            if self.node_machine[nid] == hello.machine and nid in self.nodes and \
                    nid != self.local.node_id:
                return self.nodes[nid]
        return conn.node if self.node_machine.get(conn.node.node_id) == hello.machine \
            else None

    def _head_only(self) -> bool:
        """Whether the head's own node runs no work, or offers neither CPUs nor GPUs (its
        work runs on joined nodes)."""
        res = self.state.nodes[self.local.node_id].resources
        return not res.works or not res.total.get("CPU") and not res.total.get("GPU")

    def _refuse(self, conn: Conn, reason: str) -> None:
        print(f"orchestra head: refusing a connection: {reason}", file=sys.stderr)
        conn.transport.write(_wire.encode(_wire.CLOSING, pb.Closing(reason=reason)))
        conn.transport.close()

    def _node_resources(self, node: Node | RemoteNode) -> dict[str, float]:
        """``node:<its address>`` = 1, as Ray's nodes advertise: resources={"node:10.0.0.5":
        0.01} pins work to that machine."""
        return {f"node:{self.node_address(node) or '127.0.0.1'}": 1.0}

    def node_address(self, node: Node | RemoteNode) -> str:
        if type(node) is RemoteNode and node.ip:
            return node.ip
        return parse_host(self.address) if self.address else ""

    def _no_worker_yet(self) -> bool:
        workers = self.state.workers.values()
        return bool(workers) and all(w.state is WorkerState.STARTING for w in workers)

    def _release_driver_replies(self) -> None:
        if not self._parked_replies:
            return
        parked, self._parked_replies = self._parked_replies, []
        for conn, frame in parked:
            if conn.conn_id in self.conns:
                self.queue(conn, frame)
        self.carry_out()

    def request(self, conn: Conn, req: pb.Request) -> None:
        """A Request frame: answered by its handler (frames.REQUESTS) now, or later."""
        reply = pb.Reply(req_id=req.req_id)
        handler = REQUESTS.get(req.WhichOneof("body"))
        if handler is None or handler(self, conn, req, reply):
            self.queue(conn, _wire.encode(_wire.REPLY, reply))

    def queue_if_open(self, conn: Conn, data: bytes) -> None:
        """For an answer that waited for the node: the connection may have closed."""
        if self.conns.get(conn.conn_id) is conn:
            self.queue(conn, data)

    # ------------------------------------------------------------------ instructions
    def queue(self, conn: Conn, data: bytes) -> None:
        conn.wbuf.append(data)
        self.dirty.add(conn)

    def carry_out(self) -> None:
        out = self.state.out
        pushes: dict[int, pb.Objects] = {}
        late: list[tuple[Conn, bytes]] = []
        if out:
            self.state.out = []
            conns = self.conns
            for ins in out:
                encode = FRAME_OF.get(type(ins))
                if encode is not None:
                    c = conns.get(ins.conn)   # type: ignore[union-attr]
                    if c is not None:
                        if type(ins) in LATE:
                            late.append((c, encode(ins)))
                        else:
                            c.wbuf.append(encode(ins))
                            self.dirty.add(c)
                elif type(ins) is Push:
                    msg = pushes.get(ins.conn)
                    if msg is None:
                        msg = pushes[ins.conn] = pb.Objects()
                    msg.objects.append(data_out(ins.data))
                elif type(ins) is FreeSegment:
                    node = self.nodes.get(ins.node_id)   # None: the node died with it
                    if node is not None:
                        node.free_segment(ins.key)
                elif type(ins) is StartWorker:
                    node = self.nodes.get(ins.node_id)
                    if node is not None:
                        node.start_worker(ins.worker_id)
                    else:
                        self.loop.call_soon(self._worker_without_node, ins.worker_id)
                elif type(ins) is KillWorker:
                    node = self.nodes.get(ins.node_id)
                    if node is not None:
                        node.kill_worker(ins.worker_id, ins.reason)
                elif type(ins) is StopWorker:
                    node = self.nodes.get(ins.node_id)
                    if node is not None:
                        node.stop_worker(ins.worker_id)
                elif type(ins) is Pull:
                    self.pulls.pull(ins.node_id, ins.object_id)
                elif type(ins) is Durable and self.durable is not None:
                    self.durable.write(ins.table, ins.key, records.encode(ins.table, ins.value))
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
        if self.stopping or self.log_routes.remove(conn.conn_id):
            return
        conn.node.drop_conn(conn.conn_id)
        if conn.conn_id == self.primary:
            self.shutdown("the driver disconnected", driver_gone=True)
            return
        client = self.state.clients.get(conn.conn_id)
        node = self.nodes.get(client.worker.node_id) if client is not None \
            and client.worker is not None else None
        if node is not None:
            # The scheduler hears of it once its node has the exit status (worker_exited):
            # a crash then reads "died of SIGSEGV", not "its connection closed".
            wid = client.worker.worker_id   # type: ignore[union-attr]
            self._reaping[wid] = conn.conn_id
            node.worker_disconnected(wid)
        elif client is not None and client.worker is not None:   # its node died
            gone = self.gone.get(client.worker.node_id)
            self._client_gone(conn.conn_id, f"its node's death ({gone.reason})"
                              if gone is not None else "its node's death")
            self.carry_out()
        else:
            self._client_gone(conn.conn_id)
            self.carry_out()

    def _client_gone(self, conn_id: int, reason: str = "") -> None:
        """A client's connection is over: the task table keeps whose it was (the job of
        its tasks), the scheduler lets go of what it held."""
        c = self.state.clients.get(conn_id)
        if c is not None and c.worker is not None:
            self.events.table.client_gone(conn_id, c.worker.worker_id)
        elif c is not None and c.kind == "driver":
            self.events.table.client_gone(conn_id, DRIVER)
            jobs.client_gone(self, conn_id)
        self.state.client_disconnected(conn_id, reason)

    # ------------------------------------------------------------------ nodes joining and dying
    def join(self, conn: Conn, frames: list[tuple[int, Any]]) -> None:
        """A node of another machine connected (authenticated) and asks to join: it gets
        an id, and the connection becomes that node's (RemoteNode)."""
        kind, ev = frames[0]
        if ev.WhichOneof("event") != "join" or self.stopping:
            conn.transport.close()
            return
        j = ev.join
        node_id = rejoin.node_id_for(self, j.node_id, NODE_PROCESS_ID + 1)
        self.conns.pop(conn.conn_id, None)
        remote = RemoteNode(node_id, self, self.loop, self.cfg, joined=True)
        remote.adopt(conn.transport)
        remote.ip = j.host
        remote.num_workers = int(j.num_workers)
        self.node_machine[node_id] = j.machine
        remote.welcome(pb.NodeWelcome(
            node_id=node_id, session_id=self.cfg["session_id"],
            inline_threshold=int(self.cfg.get("inline_threshold", INLINE_MAX)),
            heartbeat_s=HEARTBEAT_S, timeout_s=float(self.cfg.get("node_timeout_s", 10.0))))
        if len(frames) > 1:
            remote.handle(frames[1:])

    def node_joined(self, remote: RemoteNode) -> None:
        """A joined node registered (its store and data server are up): schedule on it."""
        nid = remote.node_id
        self.nodes[nid] = remote
        res = {**remote.resources, **self._node_resources(remote)}
        cpus = max(int(res.get("CPU", 1)), 1)
        n = remote.num_workers or cpus
        self.state.add_node(nid, res, num_workers=n,
                            max_workers=int(self.cfg.get("max_workers", 0)) or 4 * cpus + 32)
        remote.start()
        print(f"orchestra head: node {nid} joined from {remote.ip} (pid {remote.pid}): "
              + format_resources(res), file=sys.stderr)
        self.carry_out()

    def node_gone(self, remote: RemoteNode, reason: str) -> None:
        """A joined node died, or fell silent: its workers' connections are closed (their
        tasks retried, their actors restarted elsewhere or dead), its objects live on
        where copies are, else are lost; pulls to or from it fail."""
        nid = remote.node_id
        if self.nodes.get(nid) is not remote or self.stopping:
            return
        del self.nodes[nid]
        self.gone[nid] = NodeGone(remote.ip, dict(remote.resources), reason, remote.pid)
        print(f"orchestra head: node {nid} ({remote.ip}) is gone: {reason}", file=sys.stderr)
        self.pulls.node_gone(nid, reason)
        self.state.remove_node(nid, reason)
        for c in list(self.conns.values()):
            if c.node is remote:
                c.transport.abort()   # conn_lost: its tasks retried, its actors restarted
        # A node on this machine killed outright left its segment directory: removed
        # once its process is gone (a moment after its connection closed).
        self.loop.call_later(_SWEEP_AFTER_S, sweep_stale_segments)
        self.carry_out()

    def _tick(self) -> None:
        """Notice a cluster where no task can progress (the drivers are told)."""
        if self.stopping:
            return
        self.state.blocking.tick(now := time.monotonic())
        if self.state.kept.active:   # what outlived a restart of the head (_scheduler/kept.py)
            self.state.kept.tick(now)
        if self.state.retry_later.tick(now):   # tasks the memory monitor killed, run again
            self.state.schedule()
        self.events.tick()
        self.carry_out()
        self.loop.call_later(_TICK_S, self._tick)

    def _check_driver(self) -> None:
        if self.primary is None:
            self.shutdown("no driver connected in time")

    def shutdown(self, reason: str, driver_gone: bool = False, keep_dir: bool = False) -> None:
        """Stop: listeners, nodes (their workers and segments), connections. The session
        directory goes too when no driver will remove it: a detached head's, or one
        whose driver is gone (``driver_gone``: killed, it left it behind until the next
        init() swept it; one that shuts down removes it as well, which is harmless), unless
        ``keep_dir`` (a supervised head that failed to start: it is started again there)."""
        if self.stopping:
            return
        self.stopping = True
        if self.server is not None:
            self.server.close()
        if self.grpc_server is not None:
            self.grpc_server.stop(0)
        if self.tcp_server is not None:
            self.tcp_server.close()
        if self.dashboard is not None:
            self.dashboard.close()
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
        for name in ("head.sock", "grpc.sock", "address", "dashboard"):
            try:
                os.unlink(os.path.join(self.session_dir, name))
            except FileNotFoundError:
                pass
        if (self.cfg.get("detached") or driver_gone) and not keep_dir:
            # No driver removes it (orchestra stop does, but not a SIGTERM sent straight
            # here, nor the end of a cluster_utils.Cluster's script, nor a driver killed).
            shutil.rmtree(self.session_dir, ignore_errors=True)
        self.loop.stop()

