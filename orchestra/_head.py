"""Head process: scheduler state + this node's object store + its worker pool, on uvloop.

    driver/worker --frames--> Conn.data_received -> Head.handle -> SchedulerState (and
    ObjectStore) -> instructions in state.out -> Head.carry_out: frames queued per
    connection, workers started/killed, segments freed -> one write per connection.

The gRPC control plane (Scheduler and ObjStore services, _grpc_service.py) runs on a
thread pool and hands each RPC to the loop thread; nothing else touches the state.

Owns: every worker process of this node (WorkerPool), every shared-memory segment of
this node (ObjectStore), the session's socket files. Fate-shares with the driver that
started it: when that driver's connection closes (exit, crash, SIGKILL), the head kills
its workers, unlinks its segments and exits. A watch on the driver process (a pidfd,
see _procutil.watch_parent) covers a driver that dies before it connects.
"""
from __future__ import annotations

import asyncio
import collections
import concurrent.futures
import json
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from typing import Any

from . import _grpc_service, _wire
from . import _pb as pb
from ._errors import describe_exit, make_error
from ._grpc_service import GRPC_CONN
from ._instructions import FreeSegment, KillWorker, LateSend, Push, Send, StartWorker, StopWorker
from ._procutil import watch_parent
from ._scheduler import SchedulerState, WorkerState
from ._store import ObjectStore, ReleaseNeeded, SpillNeeded, spill_file
from .exceptions import ObjectStoreError, ObjectStoreFullError

NODE_ID = 0
_REAP_POLL_S = 0.01
_REAP_LIMIT_S = 2.0


class Conn(asyncio.Protocol):
    __slots__ = ("head", "conn_id", "transport", "decoder", "wbuf", "hello")

    def __init__(self, head: Head, conn_id: int) -> None:
        self.head = head
        self.conn_id = conn_id
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


class ForkedWorker:
    """A worker forked by the zygote, with the part of Popen's interface the pool uses."""

    def __init__(self) -> None:
        self.pid = 0                        # known once the zygote answers
        self.returncode: int | None = None
        self.exited = threading.Event()
        self.kill_on_pid = False            # killed before its pid was known

    def poll(self) -> int | None:
        return self.returncode

    def kill(self) -> None:
        if not self.pid:
            self.kill_on_pid = True
            return
        if self.returncode is None:
            try:
                os.kill(self.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass

    def wait(self, timeout: float | None = None) -> int | None:
        if not self.exited.wait(timeout):
            raise subprocess.TimeoutExpired("worker", timeout or 0)
        return self.returncode


class Zygote:
    """The fork server (orchestra/_zygote.py) and the thread reading its replies."""

    def __init__(self, proc: subprocess.Popen[bytes], req_w: int, rep_r: int) -> None:
        # Started by the head's bootstrap (orchestra/_bootstrap.py) before the head's
        # imports; req_w / rep_r: the head's ends of its request and reply pipes.
        self.proc, self.req_w, self.rep_r = proc, req_w, rep_r
        self.children: dict[int, ForkedWorker] = {}   # worker id -> child
        self.by_pid: dict[int, ForkedWorker] = {}
        self.lock = threading.Lock()
        self.alive = True
        threading.Thread(target=self._read, name="orchestra-zygote", daemon=True).start()

    def spawn(self, worker_id: int) -> ForkedWorker:
        child = ForkedWorker()
        with self.lock:
            self.children[worker_id] = child
        os.write(self.req_w, f"spawn {worker_id}\n".encode())
        return child

    def _read(self) -> None:
        buf = b""
        while True:
            try:
                data = os.read(self.rep_r, 4096)
            except OSError:
                data = b""
            if not data:
                break
            buf += data
            while b"\n" in buf:
                line, buf = buf.split(b"\n", 1)
                parts = line.split()
                with self.lock:
                    if parts[0] == b"pid":
                        child = self.children.pop(int(parts[1]), None)
                        if child is not None:
                            child.pid = int(parts[2])
                            self.by_pid[child.pid] = child
                            if child.kill_on_pid:
                                child.kill()
                    elif parts[0] == b"exit":
                        child = self.by_pid.pop(int(parts[1]), None)
                        if child is not None:
                            child.returncode = int(parts[2])
                            child.exited.set()
        # The zygote is gone, and its workers with it (parent-death signal).
        self.alive = False
        with self.lock:
            for child in list(self.children.values()) + list(self.by_pid.values()):
                if child.returncode is None:
                    child.returncode = -signal.SIGKILL
                child.exited.set()

    def preload(self, modules: list[str]) -> None:
        """Have the zygote import ``modules``: workers forked later start with them."""
        try:
            os.write(self.req_w, f"preload {' '.join(modules)}\n".encode())
        except OSError:
            pass

    def close(self) -> None:
        try:
            os.close(self.req_w)
        except OSError:
            pass
        self.proc.kill()
        try:
            self.proc.wait(2)
        except subprocess.TimeoutExpired:
            pass


class WorkerPool:
    """Starts, watches and kills the worker processes of one node.

    Processes start on a thread of their own: a fork+exec costs the caller ~10-50 ms
    (more with many starting at once), which would stall every connection of the head
    (200 actors created in a row held the loop for seconds).
    """

    def __init__(self, sock_path: str, cwd: str, env: dict[str, str],
                 on_failed: Callable[[int, str], None]) -> None:
        self.sock_path = sock_path
        self.cwd = cwd
        self.env = env
        self.on_failed = on_failed        # called on the spawning thread
        self.procs: dict[int, Any] = {}   # Popen, or ForkedWorker from the zygote
        self.lock = threading.Lock()
        self.kill_requested: set[int] = set()
        self.closed = False
        self.spawner = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="orchestra-spawn")
        self.zygote: Zygote | None = None

    def start(self, worker_id: int) -> None:
        self.spawner.submit(self._spawn, worker_id)

    def adopt_zygote(self, zygote: Zygote) -> None:
        """Fork workers from this pre-imported process from now on (see _zygote.py)."""
        self.zygote = zygote

    def _spawn(self, worker_id: int) -> None:
        proc: Any
        try:
            z = self.zygote
            if z is not None and z.alive and not self.closed:
                proc = z.spawn(worker_id)
            else:
                proc = subprocess.Popen(
                    [sys.executable, "-m", "orchestra._worker", self.sock_path, str(worker_id)],
                    stdin=subprocess.DEVNULL, cwd=self.cwd if os.path.isdir(self.cwd) else None,
                    env=self.env, close_fds=True)
        except OSError as exc:
            self.on_failed(worker_id, str(exc))
            return
        with self.lock:
            self.procs[worker_id] = proc
            doomed = self.closed or worker_id in self.kill_requested
        if doomed:
            proc.kill()

    def snapshot(self) -> list[tuple[int, Any]]:
        with self.lock:
            return list(self.procs.items())

    def kill(self, worker_id: int) -> None:
        with self.lock:
            p = self.procs.get(worker_id)
            if p is None:   # still starting: killed as soon as it exists
                self.kill_requested.add(worker_id)
                return
        if p.poll() is None:
            try:
                p.kill()
            except ProcessLookupError:
                pass

    def kill_all(self, timeout_s: float = 2.0) -> None:
        with self.lock:
            self.closed = True
        self.spawner.shutdown(wait=True, cancel_futures=True)
        for p in self.procs.values():
            if p.poll() is None:
                try:
                    p.kill()
                except ProcessLookupError:
                    pass
        deadline = time.monotonic() + timeout_s
        for p in self.procs.values():
            if not p.pid:
                continue   # not forked yet: dies with the zygote below
            try:
                p.wait(max(0.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                pass
        if self.zygote is not None:
            self.zygote.close()   # its remaining children die with it


class Head:
    def __init__(self, cfg: dict[str, Any], loop: asyncio.AbstractEventLoop,
                 zygote: tuple[Any, int, int] | None = None) -> None:
        self._zygote_started = zygote
        self.cfg = cfg
        self.loop = loop
        self.session_dir = cfg["session_dir"]
        self.sock_path = os.path.join(self.session_dir, "head.sock")
        # Up to 8 tasks queued per busy worker: 5.3k -> 7k no-op tasks/s on 2 cores (8 -> 16
        # adds ~10% more). An idle worker takes queued tasks back (STEAL), so a long
        # task never holds up the ones pipelined behind it for long.
        self.state = SchedulerState(pipeline_depth=cfg.get("pipeline_depth", 8),
                                    error_factory=make_error)
        if cfg.get("direct_calls", True):
            self.state.worker_socket = self.worker_socket
            self.state.lending = bool(cfg.get("lend_workers", True))
        capacity = int(cfg["object_store_memory"])
        self.store = ObjectStore(NODE_ID, cfg["session_id"], capacity,
                                 pool_limit=cfg.get("pool_bytes"),
                                 warm_bytes=int(cfg.get("warm_bytes", min(capacity // 2, 1 << 30))),
                                 spill_dir=cfg.get("spill_dir"))
        # create_segment requests that wait for a spill to make their room, in order;
        # None while no spill runs.
        self._creates_waiting: collections.deque[tuple[Conn, Any]] | None = None
        env = dict(os.environ)
        env["PYTHONPATH"] = os.pathsep.join(p for p in cfg.get("sys_path", []) if p)
        # Workers start in the session directory, not the driver's cwd: `python -m` puts
        # the cwd first on sys.path, and an orchestra/ folder there (a checkout) would win
        # over the driver's orchestra. They chdir to the driver's cwd once connected.
        self.pool = WorkerPool(self.sock_path, self.session_dir, env, self._spawn_failed)
        self.conns: dict[int, Conn] = {}
        self.dirty: set[Conn] = set()
        self._next_conn = 1
        self.primary: int | None = None
        self.stopping = False
        self.server: Any = None
        self.exit_reasons: dict[int, str] = {}
        self.last_activity = time.monotonic()
        self.grpc_server: Any = None
        self.watchers: dict[bytes, list[Any]] = {}   # RequestObj futures (gRPC threads wait)

    async def start(self) -> None:
        self.server = await self.loop.create_unix_server(self._new_conn, self.sock_path)
        os.chmod(self.sock_path, 0o600)
        if self._zygote_started is not None:
            self.pool.adopt_zygote(Zygote(*self._zygote_started))
        res = {k: float(v) for k, v in self.cfg["resources"].items()}
        self.state.add_node(NODE_ID, res, num_workers=int(self.cfg["num_workers"]),
                            max_workers=int(self.cfg.get("max_workers", 0)) or
                            4 * max(int(res.get("CPU", 1)), 1) + 32)
        self.state.client_connected(GRPC_CONN, pb.Hello(kind="grpc"))
        self.carry_out()
        self.loop.call_later(self.cfg.get("driver_connect_timeout_s", 60), self._check_driver)
        if self.cfg.get("grpc", True):
            # Control plane: importing grpc costs ~0.1 s, so it starts after init() returns.
            self.loop.call_later(self.cfg.get("grpc_delay_s", 0.5), self._start_grpc)
        self.loop.call_later(0.5, self._watch_pool)
        # Warm shared memory for the first large put, off init()'s path, while idle.
        self.loop.call_later(self.cfg.get("warm_delay_s", 0.5), self._warm)
        if self.cfg.get("preload"):
            self.loop.call_later(1.0, self._preload)

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

    def _warm(self) -> None:
        self.store.warm(lambda done: self.loop.call_soon_threadsafe(self._map_ahead, done),
                        self._idle)

    def _preload(self) -> None:
        """Once the cluster is idle: the zygote imports the heavy modules the driver uses
        (numpy: ~0.15 s), so that a worker started later (replacing a dead one, or one an
        actor took) does not import them in its first task."""
        z = self.pool.zygote
        if z is None or not z.alive or self.stopping:
            return
        if not self._idle():
            self.loop.call_later(0.5, self._preload)
            return
        z.preload(list(self.cfg["preload"]))

    def _map_ahead(self, warmed: Callable[[], None]) -> None:
        """Record the warm reserve, and have the driver map it while idle (SegmentNames)."""
        warmed()
        names, self.store.warmed = self.store.warmed, []
        conn = self.conns.get(self.primary) if self.primary is not None else None
        if conn is None or not names or self.stopping:
            return
        for name in names:
            seg = self.store.segs.get(name)
            if seg is not None:
                seg.rw.add(conn.conn_id)
        self._queue(conn, _wire.encode(_wire.MAP_AHEAD, pb.SegmentNames(names=names)))
        self.carry_out()

    def _idle(self) -> bool:
        """No task queued or running, and no frame for a while (read from another thread)."""
        return not self.state.tasks and time.monotonic() - self.last_activity > 0.3

    def worker_socket(self, worker_id: int) -> str:
        """Where a worker listens for calls sent straight to it (_worker.py)."""
        return os.path.join(self.session_dir, f"worker-{worker_id}.sock")

    def _new_conn(self) -> Conn:
        c = Conn(self, self._next_conn)
        self._next_conn += 1
        return c

    # ------------------------------------------------------------------ frames
    def handle(self, conn: Conn, frames: list[tuple[int, Any]]) -> None:
        self.last_activity = time.monotonic()
        state = self.state
        cid = conn.conn_id
        for kind, msg in frames:
            if kind == _wire.SUBMIT:
                for call in msg.calls:
                    state.submit(cid, call)
            elif kind == _wire.TASK_DONE:
                for d in msg.returns:
                    if d.WhichOneof("data") == "segment":
                        self.store.seal(d.segment.name)
                state.task_done(cid, msg)
            elif kind == _wire.REF_DELTA:
                if msg.pin:
                    self.store.pin(cid, msg.pin)
                if msg.pending:
                    state.register_pending(cid, msg.pending)
                state.ref_delta(cid, msg.incr, msg.decr)
                if msg.unpin:
                    self.store.unpin(cid, msg.unpin)
            elif kind == _wire.OBJECTS:
                for d in msg.objects:
                    if d.WhichOneof("data") == "segment":
                        self.store.seal(d.segment.name)
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
            elif kind == _wire.LEASE_RETURN:
                state.return_loan(cid, msg.worker_id)
            elif kind == _wire.LEASE:   # a driver asks for one more lent worker
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
        if hello.kind == "driver" and self.primary is None:
            self.primary = conn.conn_id
        try:
            self.state.client_connected(conn.conn_id, hello)
        except ValueError as exc:
            print(f"orchestra head: refusing a connection: {exc}", file=sys.stderr)
            conn.transport.close()
            return
        reply = pb.HelloReply(
            session_id=self.cfg["session_id"].encode(), node_id=NODE_ID,
            node_resources=self.state.nodes[NODE_ID].resources.total,
            store_capacity=self.store.capacity, session_dir=self.session_dir,
            shm_dir=self.store.dir,
            cwd=self.cfg.get("cwd", ""), sys_path=self.cfg.get("sys_path", []),
            inline_threshold=int(self.cfg.get("inline_threshold", 100 * 1024)),
            conn_id=conn.conn_id)
        self._queue(conn, _wire.encode(_wire.HELLO_REPLY, reply))

    def _request(self, conn: Conn, req: Any) -> None:
        reply = pb.Reply(req_id=req.req_id)
        body = req.WhichOneof("body")
        if body == "create_segment":
            # Frees decided earlier in this batch of frames must happen before the store
            # judges the room (they wait in state.out until carry_out otherwise).
            self.carry_out()
            if self._creates_waiting is not None:
                self._creates_waiting.append((conn, req))
            elif not self._create_segment(conn, req, spill=True):
                self._creates_waiting = collections.deque([(conn, req)])
            return
        elif body == "abort_segment":
            self.store.abort(conn.conn_id, req.abort_segment)
        elif body == "locate":
            o = self.state.objects.get(req.locate)
            if o is None or o.data is None:
                reply.error = f"object {req.locate.hex()} was freed while it was being read"
                reply.error_kind = "ObjectLostError"
            else:
                reply.object.CopyFrom(o.data)
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

    # ------------------------------------------------------------------ spilling
    def _create_segment(self, conn: Conn, req: Any, *, spill: bool, release: bool = True) -> bool:
        """Answer a create_segment request; False when it waits for a spill, or for
        readers to let go of maps they keep."""
        reply = pb.Reply(req_id=req.req_id)
        cs = req.create_segment
        try:
            reply.segment.CopyFrom(self.store.create(conn.conn_id, cs.object_id, cs.size,
                                                     spill=spill, release=release))
        except ReleaseNeeded as rel:
            for cid, names in rel.held.items():
                c = self.conns.get(cid)
                if c is not None:
                    self._queue(c, _wire.encode(_wire.RELEASE_MAPS, pb.SegmentNames(names=names)))
            # Their unpins arrive within a round trip; then spill what they let go.
            self.loop.call_later(0.05, self._drain_creates, True, False)
            return False
        except SpillNeeded as need:
            try:
                jobs = self.store.begin_spill(need.names)
            except OSError as exc:
                self.store.spill_error = f"{self.store.spill_dir}: {exc.strerror}"
                return self._create_segment(conn, req, spill=False)
            except ObjectStoreError as exc:   # the spill directory is not ours
                self.store.spill_error = str(exc)
                return self._create_segment(conn, req, spill=False)
            self._start_spill(jobs)
            return False
        except ObjectStoreFullError as exc:
            reply.error, reply.error_kind = str(exc), "ObjectStoreFullError"
        self._queue(conn, _wire.encode(_wire.REPLY, reply))
        return True

    def _start_spill(self, jobs: list[tuple[str, bytes, str, str, int]]) -> None:
        """Copy segments to disk on a thread: a 100 MiB object takes ~50 ms to write, the
        event loop goes on serving tasks meanwhile."""
        def work() -> None:
            done = [(name, oid, dst, spill_file(src, dst, size))
                    for name, oid, src, dst, size in jobs]
            try:
                self.loop.call_soon_threadsafe(self._spilled, done)
            except RuntimeError:   # the loop closed: shutdown removes the files
                pass
        threading.Thread(target=work, name="orchestra-spill", daemon=True).start()

    def _spilled(self, done: list[tuple[str, bytes, str, str]]) -> None:
        if self.stopping:
            return
        failed = False
        for name, oid, path, error in done:
            seg = self.store.end_spill(name, path, error)
            failed = failed or bool(error)
            if seg is not None and not self.state.relocate(oid, seg):
                self.store.free(path)
        # A failed spill is not tried again for the requests that waited on it: they get
        # ObjectStoreFullError naming why, instead of a loop of failing spills.
        self._drain_creates(not failed, True)

    def _drain_creates(self, spill: bool, release: bool) -> None:
        """Answer the create requests that waited, in order, until one waits again.
        release=False: the first one already asked readers to let go of their maps."""
        if self.stopping or self._creates_waiting is None:
            return
        waiting, self._creates_waiting = self._creates_waiting, None
        while waiting:
            conn, req = waiting[0]
            if conn.conn_id not in self.conns:
                waiting.popleft()
                continue
            if not self._create_segment(conn, req, spill=spill, release=release):
                self._creates_waiting = waiting   # the request stays first in line
                break
            waiting.popleft()
            release = True
        self.carry_out()

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
                    self.store.free(ins.key)
                elif type(ins) is StartWorker:
                    self._start_worker(ins.worker_id)
                elif type(ins) is KillWorker:
                    self.exit_reasons[ins.worker_id] = ins.reason
                    self.pool.kill(ins.worker_id)
                elif type(ins) is StopWorker:
                    self.pool.kill(ins.worker_id)
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
        if self.store.dropped:
            self._send_dropped()
        if self.dirty:
            for c in self.dirty:
                if c.wbuf:
                    c.transport.write(b"".join(c.wbuf) if len(c.wbuf) > 1 else c.wbuf[0])
                    c.wbuf = []
            self.dirty.clear()
        for c, data in late:
            c.transport.write(data)

    def _send_dropped(self) -> None:
        """Tell writers to close their maps of segments the store unlinked."""
        names: dict[int, list[str]] = {}
        for cid, name in self.store.dropped:
            names.setdefault(cid, []).append(name)
        self.store.dropped = []
        for cid, ns in names.items():
            c = self.conns.get(cid)
            if c is not None:
                self._queue(c, _wire.encode(_wire.DROP_MAPS, pb.SegmentNames(names=ns)))

    def _start_worker(self, worker_id: int) -> None:
        if not self.stopping:
            self.pool.start(worker_id)

    def _spawn_failed(self, worker_id: int, reason: str) -> None:
        """On the spawning thread: hand the failure to the loop thread."""
        def report() -> None:
            print(f"orchestra head: could not start a worker: {reason}", file=sys.stderr)
            self.state.worker_failed_to_start(worker_id, reason)
            self.carry_out()
        self.loop.call_soon_threadsafe(report)

    # ------------------------------------------------------------------ failures
    def conn_lost(self, conn: Conn) -> None:
        self.conns.pop(conn.conn_id, None)
        self.dirty.discard(conn)
        if self.stopping:
            return
        self.store.drop_conn(conn.conn_id)
        if conn.conn_id == self.primary:
            self.shutdown("the driver disconnected")
            return
        client = self.state.clients.get(conn.conn_id)
        if client is not None and client.worker is not None:
            self._reap(conn.conn_id, client.worker.worker_id, time.monotonic())
        else:
            self.state.client_disconnected(conn.conn_id)
            self.carry_out()

    def _reap(self, conn_id: int, worker_id: int, since: float) -> None:
        """Wait (without blocking the loop) for a worker's exit status, then report it."""
        p = self.pool.procs.get(worker_id)
        rc = p.poll() if p is not None else None
        if rc is None and p is not None and time.monotonic() - since < _REAP_LIMIT_S:
            self.loop.call_later(_REAP_POLL_S, self._reap, conn_id, worker_id, since)
            return
        if rc is None and p is not None:
            self.pool.kill(worker_id)   # closed its socket but lives on: broken
        self.pool.procs.pop(worker_id, None)
        try:   # its socket for calls sent straight to it
            os.unlink(self.worker_socket(worker_id))
        except FileNotFoundError:
            pass
        reason = self.exit_reasons.pop(worker_id, None) or describe_exit(rc)
        self.state.client_disconnected(conn_id, reason)
        self.carry_out()

    def _watch_pool(self) -> None:
        """Notice workers that exited before they connected, and a cluster where no task
        can progress (the drivers are told)."""
        if self.stopping:
            return
        for wid, p in self.pool.snapshot():
            w = self.state.workers.get(wid)
            if p.poll() is not None and (w is None or w.state is WorkerState.STARTING):
                self.pool.procs.pop(wid, None)
                if w is not None:
                    print(f"orchestra head: worker {wid} exited with {describe_exit(p.returncode)} "
                          "before it connected", file=sys.stderr)
                    self.state.worker_failed_to_start(wid, describe_exit(p.returncode))
        self.state.blocking.tick(time.monotonic())
        self.carry_out()
        self.loop.call_later(0.5, self._watch_pool)

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
        self.pool.kill_all()
        self.store.close()
        for c in list(self.conns.values()):
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
