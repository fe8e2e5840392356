"""A node: this machine's object store, worker pool and fork server, known by a node id.

    cluster scheduler (the head) --commands--> Node
        seal / pin / unpin / abort_segment / free_segment / drop_conn  -> ObjectStore
        create_segment(conn, request) -> ObjectStore.create, or wait for a spill:
            SpillNeeded -> spill thread (spill_file) -> _spilled -> host.relocate(object
            id, segment in its file) -> answer the waiting requests in order
            ReleaseNeeded -> RELEASE_MAPS to the readers -> answer again 50 ms later (and
                every 50 ms while their maps stand, up to 1 s)
        start_worker / kill_worker / stop_worker / worker_connected / worker_disconnected
            -> WorkerPool (fork server or exec) -> reaping -> host.worker_exited
    pull(object id, address, key, size, token) -> ObjectStore.create (waiting for a spill
        like create_segment) -> a pull thread: open_segment + _transfer.Fetcher.fetch
        from the source node's data server straight into the map -> _pulled on the loop:
        seal (or abort: the bytes go back) -> host.pulled(object id, segment | None, error)
    serve_data(host, token) -> a _transfer.DataServer of this store's sealed segments and
        spill files (its threads read the store's tables, nothing else), for other nodes'
        pulls; closed by close()
    Node --events--> NodeHost (implemented by the head)
        send(conn, frame kind, message): a reply, RELEASE_MAPS, DROP_MAPS, MAP_AHEAD
        worker_failed_to_start / worker_exited(reason, connected) / relocate / pulled /
        flush
    and asks it one question: is_idle() (warming and preloading wait for an idle cluster).

The interface takes plain data (ids, names, sizes, protobuf messages), so that a
connection can stand between the node and the cluster scheduler. By default the node
lives in the head process and runs on the head's event loop: seal, pin and unpin are
direct calls (the first two are the store's own bound methods), so the task path pays
no extra hop. With cfg node_process it runs in a process of its own
(orchestra/_node/process.py), and the head holds a RemoteNode with this interface
(orchestra/_head/remote_node.py); node_from_cfg() builds it the same way in both.

Owns: this node's shared-memory segments and spill files (ObjectStore), its worker
processes and fork server (WorkerPool), its workers' sockets for direct calls
(unlinked when a worker is reaped), its data server and its connections to other
nodes' data servers (Fetcher). close() kills, closes and removes them all; a joined
node that lost the head closes keeping its workers and store (kill_workers=False,
keep_store=True), and the node made when it joins again under its id takes both over
(take_workers; the store= argument, after ObjectStore.carry_over; _node/process.py).
"""
from __future__ import annotations

import asyncio
import collections
import mmap
import os
import threading
import time
from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING, Any, Protocol

from .._objects.errors import MEMORY_KILL, describe_exit
from .._objects.segments import open_segment, segment_file, spill_file
from .._objects.store import (
    DEFAULT_POOL_IDLE_S,
    ObjectStore,
    ReleaseNeeded,
    SpillJob,
    SpillNeeded,
    StoredSegment,
    huge_pages_dir,
    pool_settings,
)
from .._objects.transfer import DataServer, Fetcher
from .._observe.log_capture import LOGS_DIR, last_words
from .._protocol import pb
from .._protocol import wire as _wire
from ..exceptions import ObjectStoreError, ObjectStoreFullError, OrchestraError
from .memory import MemoryMonitor
from .memory import settings as memory_settings
from .worker_pool import WorkerPool, Zygote, ZygoteStart

if TYPE_CHECKING:
    from concurrent.futures import ThreadPoolExecutor

_REAP_POLL_S = 0.01
_REAP_LIMIT_S = 2.0
_WATCH_S = 0.5
# The most spare segments one create_segment hands out (CreateSegment.spares).
_MAX_SPARES = 16
# Readers asked to let go of maps (RELEASE_MAPS) answer within a round trip; the create
# that asked tries again after this long, and again while the maps are still held, up to
# _RELEASE_TRIES times (a busy machine answers later than a round trip; a reader that
# keeps a value it read keeps its map, and the create fails once the tries are spent).
_RELEASE_RETRY_S = 0.05
_RELEASE_TRIES = 20
_PRELOAD_DELAY_S = 1.0
# The store's writer id for the segments pulls fill: no connection has it (the head's
# connection ids are positive, the warm reserve's is -1).
PULL_CONN = -2
# Pulls in flight at once; more wait for a thread. Each is bound by the network or a
# core's copy, so more than the cores would only share them.
_PULL_THREADS = 4
# Segments the data server may send: written and sealed (a spill reads the same bytes).
_SERVABLE = frozenset(("sealed", "spilling"))
# A worker asked to exit (stop_worker) sends its last task events and exits within a
# few ms; one still there after this long is killed.
_STOP_GRACE_S = 1.0
# A pull may come before the seal command of what it reads (_wait_sealed): wait this
# long for it, looking this often.
SEAL_WAIT_S = 5.0
_SEAL_POLL_S = 0.001


class NodeHost(Protocol):
    """What a node tells the cluster scheduler (the head implements it)."""

    def send(self, conn_id: int, kind: int, msg: Any) -> None:
        """Queue a frame for a connection; nothing happens if it closed."""

    def flush(self) -> None:
        """Carry out what the events so far decided and write the queued frames."""

    def worker_failed_to_start(self, worker_id: int, reason: str) -> None:
        """The worker's process could not be started (``reason``: the OS error)."""

    def worker_exited(self, worker_id: int, reason: str, *, connected: bool) -> None:
        """The worker's process is gone; ``reason`` says how (describe_exit, or why it
        was killed). connected=False: it exited before it connected."""

    def relocate(self, object_id: bytes, segment: pb.Segment) -> bool:
        """The object's segment was spilled to ``segment.path``: point the object there.
        False when the object is gone or lives elsewhere now (the file is removed)."""

    def pulled(self, object_id: bytes, segment: pb.Segment | None, error: str) -> None:
        """A pull (Node.pull) ended: ``segment`` is the sealed copy in this node's store,
        or None with ``error`` saying why there is none (its bytes were given back)."""

    def is_idle(self) -> bool:
        """No task queued or running, and no frame for a while; asked from threads."""

    def memory_pressure(self, node_id: int, pressure: pb.NodeMemoryPressure) -> None:
        """The node's memory is past its monitor's threshold (_node/memory.py): kill the
        worker the head picks (kill_worker with a MEMORY_KILL reason), or none."""


def worker_socket(session_dir: str, worker_id: int) -> str:
    """Where a worker listens for direct calls (_worker/worker.py)."""
    return os.path.join(session_dir, f"worker-{worker_id}.sock")


def node_from_cfg(node_id: int, host: NodeHost, loop: asyncio.AbstractEventLoop, cfg: dict[str, Any],
                  zygote: ZygoteStart | None = None, store: ObjectStore | None = None) -> Node:
    """The node a session's configuration (cfg JSON, _api/session.py) describes, whether it
    runs in the head process or in a process of its own."""
    capacity = int(cfg["object_store_memory"])
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in cfg.get("sys_path", []) if p)
    session_dir = cfg["session_dir"]
    pool_idle_s, warm_bytes = pool_settings(env)
    huge_pages = huge_pages_dir(env)
    return Node(
        node_id, host, loop, session_id=cfg["session_id"], session_dir=session_dir,
        # A node that joined over TCP: its workers connect to the head's address.
        sock_path=cfg.get("head_address") or os.path.join(session_dir, "head.sock"),
        capacity=capacity,
        pool_bytes=cfg.get("pool_bytes"),
        warm_bytes=int(cfg.get("warm_bytes", warm_bytes)),
        pool_idle_s=float(cfg.get("pool_idle_s", pool_idle_s)),
        spill_dir=cfg.get("spill_dir"), env=env, preload=list(cfg.get("preload") or []),
        warm_delay_s=cfg.get("warm_delay_s", 0.5), zygote=zygote, store=store,
        huge_pages=huge_pages)


class Node:
    """Object store + worker pool + fork server of one machine (see the module docstring)."""

    def __init__(self, node_id: int, host: NodeHost, loop: asyncio.AbstractEventLoop, *, session_id: str,
                 session_dir: str, sock_path: str, capacity: int,
                 pool_bytes: int | None = None, warm_bytes: int = 0,
                 pool_idle_s: float = DEFAULT_POOL_IDLE_S, spill_dir: str | None = None,
                 env: dict[str, str] | None = None,
                 preload: list[str] | None = None, warm_delay_s: float = 0.5,
                 zygote: ZygoteStart | None = None, store: ObjectStore | None = None,
                 huge_pages: str | None = None) -> None:
        self.node_id = node_id
        self.host = host
        self.loop = loop
        self.session_dir = session_dir
        # ``store``: this node's before the head was lost; the objects it keeps
        # (carry_over) are named in the node's register (NodeRegister.kept).
        self.store = store if store is not None else ObjectStore(
            node_id, session_id, capacity, pool_limit=pool_bytes, warm_bytes=warm_bytes,
            pool_idle_s=pool_idle_s, spill_dir=spill_dir, huge_pages=huge_pages)
        self.kept_objects: list[pb.ObjectData] = store.carry_over() if store is not None else []
        self.capacity = capacity
        self.shm_dir = self.store.dir
        # Workers start in the session directory, not the driver's cwd: `python -m` puts
        # the cwd first on sys.path, and an orchestra/ folder there (a checkout) would win
        # over the driver's orchestra. They chdir to the driver's cwd once connected.
        self.pool = WorkerPool(sock_path, session_dir, dict(os.environ) if env is None else env,
                               self._spawn_failed)
        self._zygote_started = zygote
        self._preload_modules = list(preload or [])
        self._warm_delay_s = warm_delay_s
        # The task path calls these straight: no method of ours in between.
        self.seal: Callable[[str, bytes, int], bool] = self.store.seal
        self.pin: Callable[[int, Iterable[str]], None] = self.store.pin
        # create_segment requests (connection id, Request) that wait for a spill to make
        # their room, in order; None while none waits.
        self._creates_waiting: collections.deque[tuple[int, pb.Request | _Pull]] | None = None
        self._release_tries = 0   # retries of the first waiting create since RELEASE_MAPS
        self.exit_reasons: dict[int, str] = {}   # worker id -> why we killed it
        self.connected: set[int] = set()         # workers whose connection the head accepted
        self.driver: int | None = None           # the connection that maps the warm reserve
        self.data_server: DataServer | None = None
        self._fetcher: Fetcher | None = None
        self._pull_threads: ThreadPoolExecutor | None = None
        # Read-write maps of the segments pulls filled, kept as a writer keeps its own
        # (the store lists PULL_CONN among the segment's maps, and names it in
        # store.dropped once the segment is removed): a pull into a pooled segment then
        # skips the map and page-table fill, ~70 ms per 200 MiB (2.3 -> 3.x GB/s). Pull
        # threads add and drop theirs while the loop reads it: one item at a time, never
        # an iteration.
        self._pull_maps: dict[str, mmap.mmap] = {}
        # Its memory monitor (_node/memory.py), from ORCHESTRA_MEMORY_USAGE_THRESHOLD and
        # ORCHESTRA_MEMORY_MONITOR_REFRESH_MS (0: none).
        threshold, self._memory_refresh_s = memory_settings(self.pool.env)
        self.memory = MemoryMonitor(threshold)
        self.closed = False

    def start(self) -> None:
        """Adopt the fork server, then watch workers, warm the store and preload, later."""
        if self._zygote_started is not None:
            self.pool.adopt_zygote(Zygote(*self._zygote_started))
            if self._preload_modules:   # before any spawn: the first workers have the list
                self.pool.zygote.preload(self._preload_modules, now=False)   # type: ignore[union-attr]
        self.loop.call_later(_WATCH_S, self._watch)
        if self._memory_refresh_s:
            self.loop.call_later(self._memory_refresh_s, self._check_memory)
        # Warm shared memory for the first large put, off init()'s path, while idle.
        self.loop.call_later(self._warm_delay_s, self.warm)
        if self._preload_modules:
            self.loop.call_later(_PRELOAD_DELAY_S, self._preload)

    # ------------------------------------------------------------------ objects
    def unpin(self, conn_id: int, names: Iterable[str]) -> None:
        self.store.unpin(conn_id, names)
        if self.store.dropped:
            self._send_dropped()

    def free_segment(self, key: str) -> None:
        """The object in ``key`` (a segment name or a spill file's path) is gone."""
        self.store.free(key)
        if self.store.dropped:
            self._send_dropped()

    def abort_segment(self, conn_id: int, name: str) -> None:
        self.store.abort(conn_id, name)
        if self.store.dropped:
            self._send_dropped()

    def drop_conn(self, conn_id: int) -> None:
        """A connection closed: its maps and unsealed segments are gone, and its create
        requests no longer wait."""
        self.store.drop_conn(conn_id)
        if self.store.dropped:
            self._send_dropped()
        if self._creates_waiting is not None:
            # A request first in line that waited for a spill: the next one inherits
            # its place (the spill's end answers it).
            kept = [(c, r) for c, r in self._creates_waiting if c != conn_id]
            self._creates_waiting.clear()
            self._creates_waiting.extend(kept)

    def _send_dropped(self) -> None:
        """Tell writers to close their maps of segments the store unlinked."""
        names: dict[int, list[str]] = {}
        for cid, name in self.store.dropped:
            names.setdefault(cid, []).append(name)
        self.store.dropped = []
        for name in names.pop(PULL_CONN, ()):   # our own maps, kept by pulls
            _close_map(self._pull_maps.pop(name, None))
        for cid, ns in names.items():
            self.host.send(cid, _wire.DROP_MAPS, pb.SegmentNames(names=ns))

    def create_segment(self, conn_id: int, req: pb.Request) -> None:
        """Answer a create_segment Request (a Reply with the Segment to fill, or the
        error), now or, when room must be made first, after the requests before it."""
        if self._creates_waiting is not None:
            self._creates_waiting.append((conn_id, req))
        elif not self._create_segment(conn_id, req, spill=True):
            self._creates_waiting = collections.deque([(conn_id, req)])

    def _create_segment(self, conn_id: int, req: pb.Request | _Pull, *, spill: bool,
                        release: bool = True) -> bool:
        """Answer one request (or start one pull); False when it waits for a spill, or
        for readers to let go of maps they keep."""
        cs = req if isinstance(req, _Pull) else req.create_segment
        store = self.store
        if not isinstance(req, _Pull) and not cs.object_id:
            self._spares_only(conn_id, req)
            return True
        segment, error = None, ""
        try:
            segment = store.create(conn_id, cs.object_id, cs.size, spill=spill, release=release,
                                   holds_refs=isinstance(cs, _Pull) or cs.holds_refs)
        except ReleaseNeeded as rel:
            for cid, names in rel.held.items():
                self.host.send(cid, _wire.RELEASE_MAPS, pb.SegmentNames(names=names))
            # Their unpins arrive within a round trip; then spill what they let go.
            self._release_tries = 0
            self.loop.call_later(_RELEASE_RETRY_S, self._drain_creates, True, False)
            return False
        except SpillNeeded as need:
            try:
                jobs = store.begin_spill(need.names)
            except OSError as exc:
                store.spill_error = f"{store.spill_dir}: {exc.strerror}"
                return self._create_segment(conn_id, req, spill=False)
            except ObjectStoreError as exc:   # the spill directory is not ours
                store.spill_error = str(exc)
                return self._create_segment(conn_id, req, spill=False)
            self._start_spill(jobs)
            return False
        except ObjectStoreFullError as exc:
            if not release and self._release_tries < _RELEASE_TRIES and store.readers_hold(cs.size):
                # The readers asked have not let go yet: wait for them a little longer.
                self._release_tries += 1
                self.loop.call_later(_RELEASE_RETRY_S, self._drain_creates, True, False)
                return False
            error = str(exc)
        finally:
            if store.dropped:   # pooled segments evicted to make room
                self._send_dropped()
        if isinstance(req, _Pull):
            self._start_pull(req, segment, error)
            return True
        reply = pb.Reply(req_id=req.req_id)
        if segment is not None:
            reply.segment.CopyFrom(segment)
            asked = req.create_segment
            if asked.spares and not asked.holds_refs:
                self._add_spares(conn_id, asked, reply)
        else:
            reply.error, reply.error_kind = error, "ObjectStoreFullError"
        self.host.send(conn_id, _wire.REPLY, reply)
        return True

    def _spares_only(self, conn_id: int, req: pb.Request) -> None:
        """A create with no object: a writer's refill of spares (only those that fit
        without a spill, create_spares; none is an answer too)."""
        reply = pb.Reply(req_id=req.req_id)
        if req.create_segment.size > 0:
            self._add_spares(conn_id, req.create_segment, reply)
        self.host.send(conn_id, _wire.REPLY, reply)

    def _add_spares(self, conn_id: int, asked: pb.CreateSegment, reply: pb.Reply) -> None:
        """The spares ``asked`` for, into ``reply``; pooled segments evicted to make
        room for them are told to their holders at once."""
        reply.spares.extend(self.store.create_spares(conn_id, asked.size,
                                                     min(asked.spares, _MAX_SPARES)))
        if self.store.dropped:
            self._send_dropped()

    def _start_spill(self, jobs: list[SpillJob]) -> None:
        """Copy segments to disk on a thread: a 100 MiB object takes ~50 ms to write, the
        event loop goes on serving tasks meanwhile."""
        def work() -> None:
            done = [(j, spill_file(j.source, j.dest, j.size, j.offset)) for j in jobs]
            try:
                self.loop.call_soon_threadsafe(self._spilled, done)
            except RuntimeError:   # the loop closed: close() removed the files
                pass
        threading.Thread(target=work, name="orchestra-spill", daemon=True).start()

    def _spilled(self, done: list[tuple[SpillJob, str]]) -> None:
        """Spills ended (each job with its error, "" when copied)."""
        if self.closed:
            return
        failed = False
        for job, error in done:
            seg = self.store.end_spill(job.name, job.dest, error)
            failed = failed or bool(error)
            if seg is not None and not self.host.relocate(job.object_id, seg):
                self.store.free(job.dest)
        if self.store.dropped:
            self._send_dropped()
        # A failed spill is not tried again for the requests that waited on it: they get
        # ObjectStoreFullError naming why, instead of a loop of failing spills.
        self._drain_creates(not failed, True)

    def _drain_creates(self, spill: bool, release: bool) -> None:
        """Answer the create requests that waited, in order, until one waits again.
        release=False: the first one already asked readers to let go of their maps."""
        if self.closed or self._creates_waiting is None:
            return
        waiting, self._creates_waiting = self._creates_waiting, None
        while waiting:
            conn_id, req = waiting[0]
            if not self._create_segment(conn_id, req, spill=spill, release=release):
                self._creates_waiting = waiting   # the request stays first in line
                break
            waiting.popleft()
            release = True
        self.host.flush()

    # ------------------------------------------------------------------ transfers
    def serve_data(self, host: str, token: str) -> str:
        """Start this node's data server on ``host`` (port chosen by the system) for
        other nodes' pulls; its address, HOST:PORT. Once: later calls return it."""
        if self.data_server is None:
            self.data_server = DataServer(host, token, self._resolve)
        return self.data_server.address

    def _resolve(self, key: str) -> tuple[str, int, int] | None:
        """On a data server thread: the file, size and place in it of a sealed segment
        (a slot: in its slab) or spill file of this store named ``key``; None for anything
        else (any other path)."""
        store = self.store
        size = store.files.get(key)
        if size is not None:
            return key, size, 0
        seg = store.segs.get(key)
        if seg is not None and seg.state == "writing":
            seg = self._wait_sealed(key, seg)
        if seg is None or seg.state not in _SERVABLE:
            return None
        path, start = segment_file(store.dir, key)
        return path, seg.size, start

    def _wait_sealed(self, key: str, seg: StoredSegment) -> StoredSegment | None:
        """On a data server thread: a segment the head already holds sealed may still be
        "writing" here. On a joined node the seal is a command on this node's connection
        to the head, while the puller's request comes on another, and can come first (a
        200 KiB result read at once on another node failed with ObjectLostError in ~1%
        of tries). Polled, so that the seal on the task path pays nothing; the race lasts
        a loop turn, SEAL_WAIT_S bounds a segment that is never sealed."""
        store = self.store
        deadline = time.monotonic() + SEAL_WAIT_S
        while seg.state == "writing" and time.monotonic() < deadline:
            time.sleep(_SEAL_POLL_S)
            if store.segs.get(key) is not seg:
                return store.segs.get(key)
        return seg

    def pull(self, object_id: bytes, address: str, key: str, size: int, token: str) -> None:
        """Copy an object of ``size`` bytes from the data server at ``address`` (its
        ``key`` there) into a segment of this store; host.pulled() tells how it went.
        Room is made as for a writer's create_segment (spilling, in line with the
        create requests waiting), or the pull fails with ObjectStoreFullError's text."""
        p = _Pull(object_id, size, address, key, token)
        if self._creates_waiting is not None:
            self._creates_waiting.append((PULL_CONN, p))
        elif not self._create_segment(PULL_CONN, p, spill=True):
            self._creates_waiting = collections.deque([(PULL_CONN, p)])

    def _start_pull(self, pull: _Pull, segment: pb.Segment | None, error: str) -> None:
        """Fetch into the new segment on a pull thread; the loop hears of it in _pulled."""
        if segment is None:   # no room: answered on the loop's next turn, as a fetch is
            self.loop.call_soon(self._pulled, pull, None, error)
            return
        if self._fetcher is None:
            from concurrent.futures import ThreadPoolExecutor  # ~5 ms: the first pull pays
            self._fetcher = Fetcher()
            self._pull_threads = ThreadPoolExecutor(_PULL_THREADS, "orchestra-pull")
        fetcher, folder, maps = self._fetcher, self.shm_dir, self._pull_maps
        assert self._pull_threads is not None

        def work() -> None:
            why = fetch_into(fetcher, folder, maps, segment, pull.address, pull.token,
                             pull.key)
            try:
                self.loop.call_soon_threadsafe(self._pulled, pull, segment, why)
            except RuntimeError:   # the loop closed: close() removed the segment
                pass
        try:
            self._pull_threads.submit(work)
        except RuntimeError:   # close() shut the threads down
            pass

    def _pulled(self, pull: _Pull, segment: pb.Segment | None, error: str) -> None:
        """On the loop: seal the filled segment, or give a failed one's bytes back."""
        if self.closed:
            return
        store = self.store
        if segment is not None:
            if error:
                store.abort(PULL_CONN, segment.name)
            else:
                store.seal(segment.name)
            if store.dropped:
                self._send_dropped()
        self.host.pulled(pull.object_id, None if error else segment, error)
        self.host.flush()

    # ------------------------------------------------------------------ warming
    def set_driver(self, conn_id: int) -> None:
        """The driver's connection: it maps the warm reserve ahead of its first put."""
        self.driver = conn_id

    def warm(self) -> None:
        """Allocate the warm reserve on a thread while the cluster is idle."""
        if not self.closed:
            self.store.warm(lambda done: self.loop.call_soon_threadsafe(self._map_ahead, done),
                            self.host.is_idle)

    def _map_ahead(self, warmed: Callable[[], None]) -> None:
        """Record the warm reserve, and have the driver map it while idle (SegmentNames)."""
        warmed()
        names, self.store.warmed = self.store.warmed, []
        if self.driver is None or not names or self.closed:
            return
        for name in names:
            seg = self.store.segs.get(name)
            if seg is not None:
                seg.rw.add(self.driver)
        self.host.send(self.driver, _wire.MAP_AHEAD, pb.SegmentNames(names=names))
        self.host.flush()

    def _preload(self) -> None:
        """Once the cluster is idle: the zygote imports the heavy modules the driver uses
        (numpy: ~0.15 s), so that a worker started later (replacing a dead one, or one an
        actor took) does not import them in its first task."""
        z = self.pool.zygote
        if z is None or not z.alive or self.closed:
            return
        if not self.host.is_idle():
            self.loop.call_later(0.5, self._preload)
            return
        z.preload(self._preload_modules)

    # ------------------------------------------------------------------ workers
    def start_worker(self, worker_id: int) -> None:
        if not self.closed:
            self.pool.start(worker_id)

    def kill_worker(self, worker_id: int, reason: str) -> None:
        """Kill it; its death is reported with ``reason`` instead of its exit status."""
        self.exit_reasons[worker_id] = reason
        if reason.startswith(MEMORY_KILL):   # the monitor waits for its death
            self.memory.victim(worker_id)
        self.pool.kill(worker_id)

    def _check_memory(self) -> None:
        """The memory monitor's turn: past the threshold, the head is asked for a victim."""
        if self.closed:
            return
        pressure = self.memory.check({wid: getattr(p, "pid", 0) for wid, p in self.pool.snapshot()})
        if pressure is not None:
            self.host.memory_pressure(self.node_id, pressure)
        self.loop.call_later(self.memory.wait_s(self._memory_refresh_s), self._check_memory)

    def stop_worker(self, worker_id: int) -> None:
        """An idle, surplus worker the head asked to exit (it reports its task events
        first): killed if it is still there after _STOP_GRACE_S."""
        self.loop.call_later(_STOP_GRACE_S, self._stop_late, worker_id)

    def _stop_late(self, worker_id: int) -> None:
        if worker_id in self.pool.procs:
            self.pool.kill(worker_id)

    def worker_connected(self, worker_id: int) -> None:
        """The head accepted its connection: its exit is reported once that closes."""
        self.connected.add(worker_id)

    def worker_disconnected(self, worker_id: int) -> None:
        """Its connection closed: report its exit status once it has one."""
        self._reap(worker_id, time.monotonic())

    def _spawn_failed(self, worker_id: int, reason: str) -> None:
        """On the spawning thread: hand the failure to the loop thread."""
        self.loop.call_soon_threadsafe(self.host.worker_failed_to_start, worker_id, reason)

    def _reap(self, worker_id: int, since: float) -> None:
        """Wait (without blocking the loop) for a worker's exit status, then report it."""
        p = self.pool.procs.get(worker_id)
        rc = p.poll() if p is not None else None
        if rc is None and p is not None and time.monotonic() - since < _REAP_LIMIT_S:
            self.loop.call_later(_REAP_POLL_S, self._reap, worker_id, since)
            return
        if rc is None and p is not None:
            self.pool.kill(worker_id)   # closed its socket but lives on: broken
        pid = getattr(p, "pid", 0) if p is not None else 0
        self.pool.procs.pop(worker_id, None)
        self.connected.discard(worker_id)
        try:   # its socket for direct calls
            os.unlink(worker_socket(self.session_dir, worker_id))
        except FileNotFoundError:
            pass
        reason = self.exit_reasons.pop(worker_id, None)
        self.memory.gone(worker_id)
        if reason is None:   # it died unasked: with what it last wrote to stderr
            reason = describe_exit(rc)
            words = last_words(os.path.join(self.session_dir, LOGS_DIR), worker_id, pid) \
                if rc and pid else ""
            if words:
                reason += f"; its last lines on stderr: {words}"
        self.host.worker_exited(worker_id, reason, connected=True)

    def _watch(self) -> None:
        """Notice workers that exited before they connected; give back the segments
        kept for reuse that nothing took for a while (ObjectStore.trim_pool)."""
        if self.closed:
            return
        for wid, p in self.pool.snapshot():
            if wid not in self.connected and p.poll() is not None:
                self.pool.procs.pop(wid, None)
                self.exit_reasons.pop(wid, None)
                self.host.worker_exited(wid, describe_exit(p.returncode), connected=False)
        if self.store.pooled > self.store.warm_bytes and self.store.trim_pool() \
                and self.store.dropped:
            self._send_dropped()
            self.host.flush()
        self.loop.call_later(_WATCH_S, self._watch)

    # ------------------------------------------------------------------ figures
    def store_info(self) -> pb.ObjStoreDebugInfoReply:
        """The store's figures (ObjStoreDebugInfoReply, objects not filled in)."""
        s = self.store
        return pb.ObjStoreDebugInfoReply(
            capacity=s.capacity, used=s.used, pooled=s.pooled,
            spilled_bytes=s.spilled_bytes, spilled_objects=len(s.files))

    # ------------------------------------------------------------------ teardown
    def take_workers(self, old: Node) -> None:
        """The workers and fork server of ``old`` (closed with kill_workers=False: a
        joined node that lost the head) become this node's: those serving detached
        actors outlived the head. They connect to the head on their own; until the head
        accepts one (worker_connected), its exit is reported as one before connecting."""
        self.pool = old.pool
        self.pool.on_failed = self._spawn_failed
        self.exit_reasons = old.exit_reasons

    def end_kept(self) -> None:
        """A node closed with its workers and store kept (a lost head) that is not
        joined again under its id: end them."""
        self.pool.kill_all()
        self.store.close()

    def close(self, kill_workers: bool = True, keep_store: bool = False) -> None:
        """Kill every worker and the fork server (unless not ``kill_workers``), remove
        every segment and spill file (unless ``keep_store``: the head was lost, the
        store's objects wait for the next one, see ObjectStore.carry_over)."""
        if self.closed:
            return
        self.closed = True
        if self.data_server is not None:
            self.data_server.close()
        if self._pull_threads is not None:
            self._pull_threads.shutdown(wait=False, cancel_futures=True)
        if self._fetcher is not None:
            self._fetcher.close()
        maps = self._pull_maps   # pull threads still add and remove theirs: one at a time
        while maps:
            try:
                _close_map(maps.popitem()[1])
            except KeyError:   # the last went meanwhile
                break
        if kill_workers:
            self.pool.kill_all()
        if not keep_store:
            self.store.close()


class _Pull:
    """A pull waiting for room, or in flight (the fields create_segment's request has)."""
    __slots__ = ("object_id", "size", "address", "key", "token")

    def __init__(self, object_id: bytes, size: int, address: str, key: str,
                 token: str) -> None:
        self.object_id, self.size = object_id, size
        self.address, self.key, self.token = address, key, token


def fetch_into(fetcher: Fetcher, folder: str, maps: dict[str, mmap.mmap], segment: pb.Segment,
               address: str, token: str, key: str) -> str:
    """Fill the new segment from the data server at ``address``, through the map kept
    in ``maps`` (made now if there is none); "" or why it failed (the caller aborts the
    segment then, and its map is closed here)."""
    mm = maps.get(segment.name)
    if mm is None or len(mm) < segment.size:   # a map of a smaller object before
        try:
            mm = maps[segment.name] = open_segment(folder, segment)
        except (ObjectStoreError, ObjectStoreFullError) as exc:
            return str(exc)
    view = memoryview(mm)
    try:
        fetcher.fetch(address, token, key, segment.size, view)
        return ""
    except (OrchestraError, OSError, ValueError) as exc:
        view.release()
        _close_map(maps.pop(segment.name, None))
        return str(exc) or type(exc).__name__
    finally:
        view.release()


def _close_map(mm: mmap.mmap | None) -> None:
    if mm is None:
        return
    try:
        mm.close()
    except BufferError:   # a pull still writes into it (close() while it runs): it goes
        pass              # with the process
