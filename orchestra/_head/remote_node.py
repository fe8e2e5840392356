"""The head's side of a node that runs in a process of its own: the Node interface,
carried out over the node's connection (orchestra/_node/process.py is the other side).

    Head (Conn.node, carry_out, conn_lost) --Node method--> RemoteNode
        -> NodeCommand frame in the node connection's buffer -> written with the head's
        other frames (Head.carry_out), or at the latest on the loop's next turn
    node process --NodeEvent frames--> NodeConn.data_received -> RemoteNode.handle
        register -> node id, capacity, shm dir (HelloReply), then the head starts
        send -> the frame appended to that connection's buffer (a create_segment Reply,
            RELEASE_MAPS, DROP_MAPS, MAP_AHEAD: node -> head -> client)
        worker_failed_to_start / worker_exited -> the head's NodeHost calls
        relocate -> Head.relocate; an object gone meanwhile -> free_segment(its file)
        store_info -> kept for store_info() (the gRPC ObjStoreDebugInfo)
        -> Head.carry_out once per read

Commands keep their order: every one goes through the one connection, in the order the
head calls them, so a pin reaches the store before the free that follows it and the
frees of a batch before the create_segment that needs their room. Only the node
decides what its store does; the head relays, and waits only where a client's request
must see what the node did first (after_node: a sync command, answered once the events
of the commands before it are sent): a locate (a reader found a segment gone: its
relocation may still be on its way) and an abort_segment (answered with the store's
room back).

is_idle() is the head's question: the node asks it from its threads (warming) and
cannot wait a round trip, so the head tells the node when the answer changes
(cluster_idle), checked every _IDLE_CHECK_S.

Owns: the node process (launched by launch(), killed by close() if it does not exit
within _EXIT_TIMEOUT_S) and the node's connection. When the connection closes while
the session runs, the node is gone with its workers and objects: the head shuts the
session down, naming the node's death, and removes what the node left behind.
"""
from __future__ import annotations

import asyncio
import os
import pickle
import shutil
import subprocess
import sys
import time
from collections.abc import Callable, Iterable
from typing import Any

from .._objects.errors import describe_exit
from .._objects.segments import remove_private_dir
from .._platform.bootstrap import NODE_BOOTSTRAP
from .._protocol import pb
from .._protocol import wire as _wire
from ..exceptions import ClusterLostError
from . import rejoin
from .inbound import data_in

# The node process imports orchestra and creates its store in ~0.3 s; 30 s covers a
# machine under heavy load.
_REGISTER_TIMEOUT_S = 30.0
# close() waits this long for the node to kill its workers (it waits up to 2 s for
# them) and remove its segments, then kills it.
_EXIT_TIMEOUT_S = 4.0
# How often the head looks whether the cluster went idle or busy (a few µs each): the
# node warms shared memory in idle moments (a 0.5 s pause between workloads is enough
# for 512 MiB), so a late word costs the next large put its speed.
_IDLE_CHECK_S = 0.1


class NodeConn(asyncio.Protocol):
    """The head's end of a node process's connection (same shape as _head.Conn for the
    head's write loop: wbuf, transport)."""

    __slots__ = ("remote", "transport", "decoder", "wbuf")

    def __init__(self, remote: RemoteNode) -> None:
        self.remote = remote
        self.transport: Any = None
        self.decoder = _wire.FrameDecoder()
        self.wbuf: list[bytes] = []

    def connection_made(self, transport: Any) -> None:
        if self.remote.conn is not None:   # only the node it launched may connect
            transport.close()
            return
        self.transport = transport
        self.remote.conn = self

    def data_received(self, data: bytes) -> None:
        try:
            frames = self.decoder.feed(data)
        except _wire.ProtocolError as exc:
            print(f"orchestra head: node {self.remote.node_id} sent a bad frame: {exc}",
                  file=sys.stderr)
            self.transport.close()
            return
        self.remote.handle(frames)

    def connection_lost(self, exc: BaseException | None) -> None:
        if self.remote.conn is self:
            self.remote.lost()


class RemoteNode:
    """A node in a process of its own, with the Node's command interface (see the
    module docstring). ``head``: the Head (conns, dirty, carry_out, shutdown and the
    NodeHost calls)."""

    def __init__(self, node_id: int, head: Any, loop: asyncio.AbstractEventLoop, cfg: dict[str, Any],
                 joined: bool = False) -> None:
        self.node_id = node_id
        # A node of another machine that joined over TCP (not launched by this head):
        # its death ends only it, and it heartbeats.
        self.joined = joined
        self.ip = ""              # the address it binds (joined nodes)
        self.num_workers = 0
        self.data_address = ""
        self.node_dir = ""
        self.last_heard = time.monotonic()
        self._lost_reason = ""    # why the head declared it dead (silent()), if it did
        self.head = head
        self.loop = loop
        self.cfg = cfg
        self.capacity = 0
        self.shm_dir = ""
        self.resources: dict[str, float] = {}
        self.pid = 0
        self.proc: subprocess.Popen[bytes] | None = None
        self.conn: NodeConn | None = None
        self.registered: asyncio.Future[None] = loop.create_future()
        self.closed = False
        self._store_info = pb.ObjStoreDebugInfoReply()
        self._flush_due = False
        self._idle: bool | None = None
        self._syncs: dict[int, Callable[[], None]] = {}
        self._next_sync = 1

    # ------------------------------------------------------------------ launch
    async def launch(self, listen_path: str) -> None:
        """Start the node process and wait until it registered. It connects to
        ``listen_path``, a socket only it is told about, closed once it connected."""
        server = await self.loop.create_unix_server(lambda: NodeConn(self), listen_path)
        os.chmod(listen_path, 0o600)
        session_dir = self.cfg["session_dir"]
        head_sock = os.path.join(session_dir, "head.sock")
        cfg_path = self.cfg.get("_cfg_path") or os.path.join(session_dir, "config.json")
        args = [cfg_path, head_sock, listen_path, str(self.node_id)]
        # With a fork server (the default) the node starts it first, as the head does
        # when the node runs inside it (_platform/bootstrap.py).
        cmd = ([sys.executable, "-c", NODE_BOOTSTRAP, *args] if self.cfg.get("zygote", True)
               else [sys.executable, "-m", "orchestra._node", *args])
        self.proc = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, close_fds=True,
                                     cwd=session_dir)
        try:
            deadline = time.monotonic() + _REGISTER_TIMEOUT_S
            while not self.registered.done():
                await asyncio.wait([self.registered], timeout=0.05)
                if self.proc.poll() is not None:
                    raise RuntimeError(f"the node process exited with "
                                       f"{describe_exit(self.proc.returncode)} while starting; "
                                       "its error is printed above")
                if time.monotonic() > deadline:
                    raise RuntimeError(f"the node process did not register within "
                                       f"{_REGISTER_TIMEOUT_S:g} s")
            self.registered.result()
        finally:
            server.close()
            try:
                os.unlink(listen_path)
            except FileNotFoundError:
                pass

    def adopt(self, transport: Any) -> None:
        """Take over a connection the head accepted (a node that joined over TCP)."""
        nc = NodeConn(self)
        transport.set_protocol(nc)
        nc.transport = transport
        self.conn = nc

    def welcome(self, msg: pb.NodeWelcome) -> None:
        self._command(pb.NodeCommand(welcome=msg))

    def heartbeat(self) -> None:
        self._command(pb.NodeCommand(heartbeat=True))

    def silent(self, why: str) -> None:
        """The node said nothing for too long: dead, whatever its connection says."""
        c = self.conn
        self._lost_reason = why
        if c is not None and c.transport is not None:
            c.transport.abort()   # -> lost()
        else:
            self.lost()

    def pull(self, object_id: bytes, address: str, key: str, size: int, token: str) -> None:
        """As Node.pull; the node process uses the cluster token of its own cfg."""
        self._command(pb.NodeCommand(pull=pb.NodePull(
            object_id=object_id, address=address, key=key, size=size)))

    def start(self) -> None:
        """The node started itself; from now on it hears when the cluster goes idle."""
        self.loop.call_later(_IDLE_CHECK_S, self._check_idle)

    def _check_idle(self) -> None:
        if self.closed:
            return
        idle = self.head.is_idle()
        if idle != self._idle:
            self._idle = idle
            self._command(pb.NodeCommand(cluster_idle=idle))
        self.loop.call_later(_IDLE_CHECK_S, self._check_idle)

    # ------------------------------------------------------------------ commands
    def _command(self, cmd: pb.NodeCommand) -> None:
        c = self.conn
        if c is None or self.closed:
            return
        c.wbuf.append(_wire.encode(_wire.NODE_COMMAND, cmd))
        self.head.dirty.add(c)
        # Most commands are written by the head's carry_out that follows them; some
        # (a connection that closed) have none after them.
        if not self._flush_due:
            self._flush_due = True
            self.loop.call_soon(self._flush)

    def _flush(self) -> None:
        self._flush_due = False
        c = self.conn
        if c is not None and c.wbuf and not self.closed:
            c.transport.write(b"".join(c.wbuf))
            c.wbuf = []

    def seal(self, name: str, object_id: bytes = b"", size: int = 0) -> bool:
        self._command(pb.NodeCommand(seal_object=pb.NodeRelocate(
            object_id=object_id, segment=pb.Segment(name=name, size=size))))
        return True

    def pin(self, conn_id: int, names: Iterable[str]) -> None:
        self._command(pb.NodeCommand(pin=pb.NodeSegments(conn_id=conn_id, names=names)))

    def unpin(self, conn_id: int, names: Iterable[str]) -> None:
        self._command(pb.NodeCommand(unpin=pb.NodeSegments(conn_id=conn_id, names=names)))

    def free_segment(self, key: str) -> None:
        self._command(pb.NodeCommand(free_segment=key))

    def abort_segment(self, conn_id: int, name: str) -> None:
        self._command(pb.NodeCommand(
            abort_segment=pb.NodeSegments(conn_id=conn_id, names=[name])))

    def drop_conn(self, conn_id: int) -> None:
        self._command(pb.NodeCommand(drop_conn=conn_id))

    def create_segment(self, conn_id: int, req: pb.Request) -> None:
        self._command(pb.NodeCommand(
            create_segment=pb.NodeCreateSegment(conn_id=conn_id, request=req)))

    def start_worker(self, worker_id: int) -> None:
        self._command(pb.NodeCommand(start_worker=worker_id))

    def kill_worker(self, worker_id: int, reason: str) -> None:
        self._command(pb.NodeCommand(
            kill_worker=pb.NodeKillWorker(worker_id=worker_id, reason=reason)))

    def stop_worker(self, worker_id: int) -> None:
        self._command(pb.NodeCommand(stop_worker=worker_id))

    def worker_connected(self, worker_id: int) -> None:
        self._command(pb.NodeCommand(worker_connected=worker_id))

    def worker_disconnected(self, worker_id: int) -> None:
        self._command(pb.NodeCommand(worker_disconnected=worker_id))

    def set_driver(self, conn_id: int) -> None:
        self._command(pb.NodeCommand(set_driver=conn_id))

    def after_node(self, fn: Callable[[], None]) -> None:
        """Call ``fn`` once the node carried out every command sent so far and its
        events have come back (a spill's relocation among them)."""
        n = self._next_sync
        self._next_sync += 1
        self._syncs[n] = fn
        self._command(pb.NodeCommand(sync=n))

    def store_info(self) -> pb.ObjStoreDebugInfoReply:
        """The store's figures as the node last reported them (within ~0.1 s)."""
        info = pb.ObjStoreDebugInfoReply()
        info.CopyFrom(self._store_info)
        return info

    # ------------------------------------------------------------------ events
    def handle(self, frames: list[tuple[int, Any]]) -> None:
        head = self.head
        self.last_heard = time.monotonic()
        for kind, ev in frames:
            if kind != _wire.NODE_EVENT:
                continue
            which = ev.WhichOneof("event")
            if which == "send":
                s = ev.send
                c = head.conns.get(s.conn_id)
                if c is not None:
                    c.wbuf.append(_wire.frame(s.kind, s.body))
                    head.dirty.add(c)
            elif which == "worker_exited":
                e = ev.worker_exited
                head.worker_exited(e.worker_id, e.reason, connected=e.connected)
            elif which == "memory_pressure":
                head.memory_pressure(self.node_id, ev.memory_pressure)
            elif which == "worker_failed_to_start":
                e = ev.worker_failed_to_start
                head.worker_failed_to_start(e.worker_id, e.reason)
            elif which == "relocate":
                r = ev.relocate
                if not head.relocate(r.object_id, r.segment):
                    self.free_segment(r.segment.path)   # the object is gone: its file too
            elif which == "store_info":
                self._store_info = ev.store_info
            elif which == "synced":
                fn = self._syncs.pop(ev.synced, None)
                if fn is not None:
                    fn()
            elif which == "pulled":
                p = ev.pulled
                head.node_pulled(self.node_id, p.object_id,
                                 p.segment if p.HasField("segment") else None, p.error)
            elif which == "heartbeat":
                pass
            elif which == "register":
                r = ev.register
                if r.node_id != self.node_id:
                    print(f"orchestra head: a node registered as {r.node_id}, expected "
                          f"{self.node_id}", file=sys.stderr)
                    continue
                self.capacity, self.shm_dir, self.pid = r.capacity, r.shm_dir, r.pid
                self.resources = dict(r.resources)
                self.data_address, self.node_dir = r.data_address, r.node_dir
                if not self.registered.done():
                    self.registered.set_result(None)
                    if self.joined:
                        if r.kept:   # before it takes work: a task made again may wait
                            self._offer_kept(list(r.kept))
                        head.node_joined(self)
                        rejoin.node_back(head, self.node_id, list(r.kept_workers))
        head.carry_out()

    def _offer_kept(self, kept: list[pb.ObjectData]) -> None:
        """Objects this node's store kept from before the head was restarted: the tasks
        made again that return them are done with them (_scheduler/kept.py)."""
        head = self.head
        ended = head.state.kept.offer(self.node_id, [data_in(d) for d in kept], time.monotonic())
        print(f"orchestra head: node {self.node_id} kept {len(kept)} object(s) from before "
              f"the restart ({ended} task(s) made again ended with them at once)",
              file=sys.stderr, flush=True)

    def lost(self) -> None:
        """The node's connection closed: the node process died (or was killed), and its
        workers and objects with it."""
        self.conn = None
        if self.closed or self.head.stopping:
            return
        if self.joined:
            self.closed = True
            rejoin.node_left(self.head, self.node_id)
            self.head.node_gone(self, self._lost_reason
                                or "its connection to the head closed")
            return
        rc = None
        if self.proc is not None:
            try:
                rc = self.proc.wait(1.0)
            except subprocess.TimeoutExpired:
                pass
        how = f"died ({describe_exit(rc)})" if rc is not None else "closed its connection"
        reason = (f"the node process (node {self.node_id}, pid {self.pid}) {how}; its "
                  "workers and objects are gone with it")
        print(f"orchestra head: {reason}: the session ends", file=sys.stderr)
        self._fail_pending(reason)
        self.head.shutdown(reason)

    def _fail_pending(self, reason: str) -> None:
        """Every object not computed yet fails with ClusterLostError naming the node's
        death, pushed to every client before the head closes their connections: a get()
        waiting for one raises that instead of "the head process exited"."""
        head = self.head
        error = pickle.dumps(ClusterLostError(
            f"lost the cluster: {reason}. This session is over: orchestra.init() starts a "
            "new cluster"))
        msg = pb.Objects(objects=[pb.ObjectData(object_id=oid, error=error)
                                  for oid, o in head.state.objects.items() if o.data is None])
        if msg.objects:
            frame = _wire.encode(_wire.OBJECTS, msg)
            for c in head.conns.values():
                c.wbuf.append(frame)
                head.dirty.add(c)
        head.carry_out()

    # ------------------------------------------------------------------ teardown
    def close(self) -> None:
        """Have the node kill its workers and remove its segments, wait (bounded) for it
        to exit; a node that died or hangs: kill it, remove what it left."""
        if self.closed:
            return
        self.closed = True
        c = self.conn
        if c is not None and c.transport is not None:
            c.wbuf.append(_wire.encode(_wire.NODE_COMMAND, pb.NodeCommand(close=True)))
            c.transport.write(b"".join(c.wbuf))
            c.wbuf = []
        if self.joined:   # it removes what it made itself, on its machine
            if c is not None and c.transport is not None:
                c.transport.close()
            return
        p = self.proc
        if p is not None:
            try:
                p.wait(_EXIT_TIMEOUT_S)
            except subprocess.TimeoutExpired:
                print(f"orchestra head: the node process (pid {p.pid}) did not exit within "
                      f"{_EXIT_TIMEOUT_S:g} s: killed", file=sys.stderr)
                p.kill()
                p.wait()
        if c is not None and c.transport is not None:
            c.transport.abort()
        # What a node that was killed left: its segments and spill files.
        if self.shm_dir:
            remove_private_dir(self.shm_dir)
        spill_dir = self.cfg.get("spill_dir")
        if spill_dir:
            shutil.rmtree(spill_dir, ignore_errors=True)
