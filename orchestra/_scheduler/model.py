"""The scheduler core's shared data: tasks, workers, objects, clients, nodes, their states
and transitions, and the interface its helpers use. No I/O, no decisions.

    _sched_types  <--  _actor_state (ActorTable), _blocking (Blocking), _loans (Loans),
                       _placement (Placer)
         ^                      |  they reach the core only through SchedulerCore
         +------  _scheduler (SchedulerState implements SchedulerCore, owns the helpers)

So none of the helpers imports _scheduler, not even for type checking: the import graph
of the package has no cycle (tests/unit/test_import_graph.py).

Who owns what: SchedulerState owns every Task, Worker, Obj, Client and Node; a helper
keeps only its own tables (actors, waits, loans) and changes the shared records through
the fields below and the SchedulerCore methods.
"""
from __future__ import annotations

import collections
import enum
import itertools
from collections.abc import Callable, Collection, Hashable, Iterable, Mapping
from typing import Any, NamedTuple, Protocol

from .. import _ids
from .._resources import NodeResources, shape_key
from .call import NODE_AFFINITY, PLACEMENT_GROUP, SPREAD, Call, FunctionDef
from .data import Data, Segment
from .instructions import Instruction

_sends = itertools.count(1)   # Task.seq (the memory monitor's victim is the newest task)

Shape = tuple[tuple[str, float], ...]   # a resource request as a hashable key (shape_key)

# (strategy, node id, soft), as Task.placement holds it; for PLACEMENT_GROUP: (strategy,
# bundle index or -1, capture_child_tasks), the group's id in call.placement.group_id.
Placement = tuple[str, int, bool]


def bundle_request(req: dict[str, float], group_hex: str, index: int) -> dict[str, float]:
    """A request in bundle ``index`` of a placement group (-1: any of its bundles), in
    the names its bundles reserve on their nodes (_scheduler/groups.py): {"CPU": 1} in bundle 0
    -> {"CPU_group_0_<G>": 1, "CPU_group_<G>": 1}. A request of nothing takes a sliver
    of the bundle's "bundle" resource, so that it still runs where the bundle is."""
    out: dict[str, float] = {}
    for k, v in (req or {"bundle": 0.001}).items():
        if index >= 0:
            out[f"{k}_group_{index}_{group_hex}"] = v
        out[f"{k}_group_{group_hex}"] = v
    return out


def placement_of(call: Call) -> Placement | None:
    """The Call's placement as a hashable key (part of the task's ready-queue key)."""
    p = call.placement
    if p is None:
        return None
    if p.strategy == SPREAD:
        return (SPREAD, 0, False)
    if p.strategy == NODE_AFFINITY:
        return (NODE_AFFINITY, p.node_id, p.soft)
    if p.strategy == PLACEMENT_GROUP:
        return (PLACEMENT_GROUP, p.bundle_index, p.capture_child_tasks)
    return None   # "" (DEFAULT), or a strategy this head does not know: the default



def default_error(kind: str, **details: Any) -> bytes:
    """An error's bytes when the head gives no factory (the core's tests): its kind and
    details, readable."""
    return repr((kind, sorted(details.items()))).encode()


class Lineage(NamedTuple):
    """How to make a finished task's results in shared memory again, should their node
    die: its call, the retries it has left, and the client that owns its returns."""

    call: Call
    retries_left: int
    owner: int


class DeadWorker(NamedTuple):
    """A worker process that died, remembered for direct calls handed over after it."""

    pid: int
    reason: str
    ran_head_task: bool   # a task the head sent was running (not a direct call)
    node_id: int = -1     # where it ran (-1: not known)


class TaskState(enum.Enum):
    # Members are singletons: identity hashing is exact, and C-fast (Enum.__hash__ is
    # Python code, and transitions are looked up per task).
    __hash__ = object.__hash__

    WAITING = "waiting"        # some argument not sealed yet
    READY = "ready"            # queued for a worker
    DISPATCHED = "dispatched"  # in a worker's queue (first in queue = running)
    DONE = "done"


class WorkerState(enum.Enum):
    __hash__ = object.__hash__

    STARTING = "starting"
    IDLE = "idle"
    BUSY = "busy"              # holds a grant: runs tasks of its shape (or is on loan)
    BLOCKED = "blocked"        # running task waits in get(); its CPU is lent back
    DEAD = "dead"


TASK_TRANSITIONS = {
    TaskState.WAITING: {TaskState.READY, TaskState.DONE},
    # READY -> WAITING: an argument was lost with its node and is made again.
    TaskState.READY: {TaskState.DISPATCHED, TaskState.DONE, TaskState.WAITING},
    TaskState.DISPATCHED: {TaskState.READY, TaskState.DONE},
    TaskState.DONE: set(),
}


class IllegalTransition(RuntimeError):
    pass


class Task:
    __slots__ = ("call", "owner", "state", "deps", "worker", "retries_left", "cancelled",
                 "shape", "resources", "attempt", "arg_ids", "return_ids",
                 "depth", "qkey", "placement", "streamed", "acked", "seq")

    def __init__(self, call: Call, owner: int) -> None:
        self.call = call
        self.owner = owner
        self.state = TaskState.WAITING
        self.deps: set[bytes] = set()
        self.worker: Worker | None = None
        self.retries_left = call.max_retries
        self.cancelled = False
        self.resources = call.resources   # (never changed in place: replaced)
        self.shape = shape_key(self.resources)
        self.depth = 0          # 0: submitted by a driver; n+1: by a task of depth n
        # Its scheduling strategy (_scheduler/placement.py), None for the default; part of its
        # ready-queue key, so a task its strategy holds back never blocks others.
        self.placement: Placement | None = None
        self.qkey: tuple[Hashable, ...] = (0, self.shape)
        if call.placement is not None:
            self.placement = placement_of(call)
            if self.placement is not None:
                if self.placement[0] == PLACEMENT_GROUP:   # held from its bundle
                    self.resources = bundle_request(self.resources, call.group_id.hex(),
                                                    self.placement[1])
                    self.shape = shape_key(self.resources)
                self.qkey = (0, self.shape, self.placement)
        self.attempt = 0
        self.seq = 0   # its place in the order of sends to workers (the newest: the highest)
        self.arg_ids: list[bytes] = []
        tid = call.task_id
        self.return_ids = _ids.return_ids(tid, call.num_returns)
        # A streaming generator: items taken so far (a retry yields them again, and
        # they are dropped), and read by its consumer (told again to a retry).
        self.streamed = 0
        self.acked = 0

    def sent(self) -> None:
        """Sent to a worker: one attempt more, and the newest sent so far."""
        self.attempt += 1
        self.seq = next(_sends)

    def spend_retry(self) -> None:
        """One retry is used up (``retries_left`` -1: retries without limit)."""
        if self.retries_left > 0:
            self.retries_left -= 1

    def move(self, new: TaskState) -> None:
        if new not in TASK_TRANSITIONS[self.state]:
            raise IllegalTransition(f"task {self.call.name} {self.state.value} -> {new.value}")
        self.state = new


class Wait:
    """One get()/wait() a worker is blocked in (_scheduler/blocking.py)."""

    __slots__ = ("ids", "task_id", "name")

    def __init__(self, ids: list[bytes], task_id: bytes, name: str) -> None:
        self.ids = ids
        self.task_id = task_id
        self.name = name


class Worker:
    __slots__ = ("worker_id", "node_id", "pid", "conn", "_state", "queue", "grant",
                 "gpu_ids", "functions", "grant_shape", "actor", "lent_to", "recalling",
                 "waits", "nested", "address", "calls", "retiring", "table")

    def __init__(self, worker_id: int, node_id: int) -> None:
        self.worker_id = worker_id
        self.node_id = node_id
        # On a cluster: where it takes direct calls over TCP (HOST:PORT), for callers on
        # other nodes; "" until it said (WORKER_ADDRESS), or on a private cluster.
        self.address = ""
        self.pid = 0
        self.conn = -1
        self._state = WorkerState.STARTING
        self.table: WorkerTable | None = None   # the table it is in, told of its state
        self.queue: collections.deque[Task] = collections.deque()
        # The resources it holds for the tasks it runs (taken from its node when it
        # leaves IDLE, given back when it returns there), and their shape.
        self.grant: dict[str, float] = {}
        self.grant_shape: Shape = ()
        self.gpu_ids: list[int] = []
        self.functions: set[bytes] = set()
        self.actor: Any = None   # _actor_state.Actor of a dedicated worker
        self.lent_to: int | None = None   # the driver connection it is on loan to (_scheduler/loans.py)
        self.recalling = False            # that driver was asked to return it
        # The get()s its main thread is blocked in, innermost last, and the tasks it runs
        # inside them (_scheduler/blocking.py); the innermost running task is queue[0].
        self.waits: list[Wait] = []
        self.nested: list[Task] = []
        # Calls run per function id, counted for functions with max_calls= only; at the
        # limit it is retiring: no more work, replaced once its queue is empty.
        self.calls: dict[bytes, int] | None = None
        self.retiring = False

    @property
    def state(self) -> WorkerState:
        """STARTING, IDLE, BUSY, BLOCKED or DEAD; set, it tells the table it is in
        (WorkerTable's indexes)."""
        return self._state

    @state.setter
    def state(self, new: WorkerState) -> None:
        old, self._state = self._state, new
        table = self.table
        if table is not None:
            if (old is WorkerState.IDLE) is not (new is WorkerState.IDLE):
                table.idle_changed(self)
            if new is WorkerState.BUSY:
                table.may_pipeline(self)


class WorkerTable(dict[int, Worker]):
    """The cluster's workers by id, and the indexes the table keeps as they change:
    each node's workers; each node's idle ones, in the order they became idle; and by
    grant shape, the busy workers that may take a task pipelined behind their own.

    The table owns the indexes: a worker put in it (``table[id] = w``) is indexed under
    its node (a worker never changes node) and tells the table when it becomes idle or
    stops being idle (Worker.state's setter); deleting or popping it takes it out of
    the node indexes (the pipelining index lets it go when its reader meets it: the
    worker no longer names this table). So a placement asks a node for an idle worker
    at the cost of a dict lookup, not of a scan of every worker of the cluster
    (WorkerPool.pick_placed, pool).

    The pipelining index (``open``: shape -> tasks queued -> workers) may hold more
    than it should, never less: every worker that can take a pipelined task (busy, not
    lent, not running tasks inside a get(), fewer tasks queued than the pipeline depth)
    is in ``open[its grant shape][k]`` for some k no larger than its queue's length. A
    worker enters, under its queue's length, when it becomes busy (the state's setter)
    and after each step that can shorten its queue, give it back from a loan or end a
    task it ran inside a get() (SchedulerState.after_worker_step, task_done,
    Blocking.nested_done: may_pipeline); a task queued on it needs no notice, its entry
    is then under a shorter length than its own, which the rule allows. The one reader,
    pipeline_pick, goes through the lengths from 0 up, moves an entry it finds under a
    length its queue no longer has to the one it has, and drops the entries that no
    longer hold: so it finds the worker with the shortest queue (the least-queued
    choice) without looking at every busy worker. Tested: the scheduler's Hypothesis
    machine checks the rule after every step, and a test of the table the choice.

    Decisions and changes come from the scheduler's one thread (the head's loop)."""

    def __init__(self) -> None:
        super().__init__()
        self.by_node: dict[int, dict[int, Worker]] = {}
        self.idle_by_node: dict[int, dict[int, Worker]] = {}
        self.open: dict[Shape, dict[int, dict[int, Worker]]] = {}

    def can_pipeline(self, w: Worker, shape: Shape, depth: int) -> bool:
        """Whether ``w`` may take a task of ``shape`` behind its own now (the rule of
        the pipelining index; an entry it no longer holds for may leave)."""
        return w.table is self and w._state is WorkerState.BUSY and w.grant_shape == shape \
            and w.lent_to is None and not w.nested and len(w.queue) < depth

    def may_pipeline(self, w: Worker) -> None:
        """``w`` may now take a task pipelined behind its own: index it under its
        queue's length (the reader checks the rest)."""
        if w.table is self and w._state is WorkerState.BUSY:
            self.open.setdefault(w.grant_shape, {}).setdefault(
                len(w.queue), {})[w.worker_id] = w

    def pipeline_pick(self, shape: Shape, depth: int, only: int | None = None) -> Worker | None:
        """The busy worker of ``shape`` with the fewest tasks queued, below ``depth``
        (on node ``only`` when given), or None; ties go to the one indexed first."""
        lengths = self.open.get(shape)
        if not lengths:
            return None
        for k in range(depth):
            entries = lengths.get(k)
            if not entries:
                continue
            best = None
            moved: list[Worker] = []
            for w in entries.values():
                if not self.can_pipeline(w, shape, depth):
                    moved.append(w)          # (dropped: may_pipeline brings it back)
                elif len(w.queue) != k:
                    moved.append(w)          # filed under its length, met there
                elif only is None or w.node_id == only:
                    best = w
                    break
            for w in moved:
                del entries[w.worker_id]
                if len(w.queue) > k and self.can_pipeline(w, shape, depth):
                    lengths.setdefault(len(w.queue), {})[w.worker_id] = w
            if not entries:
                del lengths[k]
            if best is not None:
                return best
        return None

    def __setitem__(self, worker_id: int, w: Worker) -> None:
        old = self.get(worker_id)
        if old is not None:
            self._forget(old)
        super().__setitem__(worker_id, w)
        w.table = self
        self.by_node.setdefault(w.node_id, {})[worker_id] = w
        if w._state is WorkerState.IDLE:
            self.idle_by_node.setdefault(w.node_id, {})[worker_id] = w

    def __delitem__(self, worker_id: int) -> None:
        w = self[worker_id]
        super().__delitem__(worker_id)
        self._forget(w)

    def pop(self, worker_id: int, *default: Any) -> Any:
        w = super().pop(worker_id, *default)
        if isinstance(w, Worker) and w.table is self:
            self._forget(w)
        return w

    def on_node(self, node_id: int) -> Collection[Worker]:
        """The node's workers (actors' included)."""
        return self.by_node.get(node_id, {}).values()

    def idle_on(self, node_id: int) -> Worker | None:
        """The node's worker that became idle last, or None: work goes to the warmest
        worker, and the ones idle longest are left to the idle timeout."""
        idle = self.idle_by_node.get(node_id)
        return next(reversed(idle.values())) if idle else None

    def idle_changed(self, w: Worker) -> None:
        """``w`` (in this table) became idle, or stopped being idle."""
        if w._state is WorkerState.IDLE:
            self.idle_by_node.setdefault(w.node_id, {})[w.worker_id] = w
        else:
            _drop(self.idle_by_node, w)

    def _forget(self, w: Worker) -> None:
        w.table = None
        _drop(self.by_node, w)
        _drop(self.idle_by_node, w)

    def clear(self) -> None:
        for w in self.values():
            w.table = None
        super().clear()
        self.by_node.clear()
        self.idle_by_node.clear()
        self.open.clear()


def _drop(index: dict[int, dict[int, Worker]], w: Worker) -> None:
    mine = index.get(w.node_id)
    if mine is not None and mine.pop(w.worker_id, None) is not None and not mine:
        del index[w.node_id]


class Obj:
    __slots__ = ("data", "count", "subscribers", "waiting_tasks", "owner", "size", "copies",
                 "lineage")

    def __init__(self, owner: int) -> None:
        self.data: Data | None = None   # once sealed
        self.count = 0
        self.subscribers: list[int] = []
        self.waiting_tasks: list[Task] = []
        self.owner = owner
        self.size = 0   # a segment's bytes, set when sealed (an inline value's: the state API counts them)
        # Copies pulled by other nodes' stores (node id -> Segment there); the primary
        # copy is data.segment. None while there is none (every object on one node).
        self.copies: dict[int, Segment] | None = None
        # On a cluster of several nodes, a task's large result keeps how to make it
        # again (its Call, the retries it had left, its owner): lost with its node, it
        # is rebuilt by running the task again.
        self.lineage: Lineage | None = None


class Client:
    __slots__ = ("conn", "kind", "pid", "holds", "worker", "node_id", "namespace", "key")

    def __init__(self, conn: int, kind: str, pid: int, node_id: int = 0) -> None:
        self.conn = conn
        self.namespace = ""   # a driver's (Hello.namespace): where its actor names live
        self.key = b""        # a driver's (Hello.driver_key): the same across head restarts
        self.kind = kind
        self.pid = pid
        self.node_id = node_id         # the node whose store it maps
        self.holds: collections.Counter[bytes] = collections.Counter()
        self.worker: Worker | None = None


class Node:
    __slots__ = ("node_id", "resources", "max_workers", "num_cpus", "num_workers")

    def __init__(self, node_id: int, resources: dict[str, float], max_workers: int,
                 num_workers: int = 0, works: bool = True) -> None:
        self.node_id = node_id
        self.num_workers = num_workers
        self.resources = NodeResources(resources, works, node_id)
        self.num_cpus = int(resources.get("CPU", 0))
        self.max_workers = max_workers


class SchedulerCore(Protocol):
    """What ActorTable, Blocking, Loans and ObjectDirectory may use of the scheduler
    (SchedulerState): its tables, its instruction list, and the steps they share with it."""

    nodes: dict[int, Node]
    workers: WorkerTable
    clients: dict[int, Client]
    tasks: dict[bytes, Task]
    objects: dict[bytes, Obj]
    functions: dict[bytes, FunctionDef]   # registered functions and classes
    ready: dict[tuple[Hashable, ...], collections.deque[Task]]
    out: list[Instruction]
    # Builds the pickled error for an object: (kind, **details) -> bytes.
    error: Callable[..., bytes]
    # Where a worker listens for direct calls (worker id -> socket path); None: every
    # call goes through the head.
    worker_socket: Callable[[int, int], str] | None
    lending: bool   # whether idle workers are lent to drivers (_scheduler/loans.py)
    pipeline_depth: int   # tasks queued on a busy worker of their shape, at most
    # Why recent workers died: worker id -> (pid, reason, whether a task the head sent ran).
    dead_workers: dict[int, DeadWorker]

    def start_worker(self, node_id: int) -> Worker:
        """A new worker on the node (StartWorker emitted), STARTING."""
        ...

    def adopt_worker(self, worker_id: int, node_id: int) -> Worker:
        """A worker this head did not start (it outlived the head before), STARTING."""
        ...

    def dispatch(self, t: Task, w: Worker) -> None:
        """Queue ``t`` on ``w`` and send it there (Execute)."""
        ...

    def fail_task(self, t: Task, error: bytes) -> None:
        """End ``t`` with ``error`` as the value of each of its returns."""
        ...

    def finish_task(self, t: Task) -> None:
        """Release what ``t`` holds (its arguments); it will not run again."""
        ...

    def unqueue(self, t: Task) -> None:
        """Take ``t`` out of the ready queue and its arguments' waits: DONE."""
        ...

    def hold_args(self, t: Task, rebuilds: list[Lineage] | None = None) -> bool:
        """``t`` holds its arguments (and waits for those not made); False when it failed.
        ``rebuilds``: ``t`` runs again, and freed arguments are revived (their lineages
        to run are added)."""
        ...

    def enqueue_ready(self, t: Task, front: bool = False) -> None:
        """Queue ``t`` to run (``front``: before the others of its queue)."""
        ...

    def deps_met(self, t: Task) -> None:
        """The last argument ``t`` waited for is made: queue it to run."""
        ...

    def handles_gone(self, oid: bytes) -> bool:
        """The last count of ``oid`` is gone: True when it was an actor's handle object."""
        ...

    def schedule(self) -> None:
        """Give ready tasks to workers."""
        ...

    def has_ready(self) -> bool:
        """A task waits in a ready queue."""
        ...

    def work_waits(self) -> bool:
        """A task or an actor waits for a worker or resources."""
        ...

    def release_grant(self, w: Worker) -> None:
        """Give ``w``'s grant back to its node."""
        ...

    def direct_path(self, w: Worker, c: Client) -> str:
        """Where ``c`` reaches ``w`` for direct calls ("" when it cannot)."""
        ...

    def after_worker_step(self, w: Worker | None, done: Task | None = None) -> None:
        """``w`` ended a task, or changed hands: make it idle, or give it more work."""
        ...

    def pool(self, node_id: int) -> list[Worker]:
        """The node's task workers (dedicated actor workers do not count)."""
        ...

    def node_order(self, t: Task) -> list[Node]:
        """The nodes where ``t``'s request fits now and its strategy allows, best first."""
        ...

    def unplaceable(self, t: Task) -> bytes | None:
        """The error of a task whose strategy names a node that cannot take it, ever."""
        ...

    def placed_on(self, t: Task, node_id: int) -> None:
        """``t`` took resources on ``node_id`` (the next SPREAD turn starts after it)."""
        ...

    def group_unplaceable(self, t: Task) -> bytes | None:
        """The error of a task whose placement group is gone or cannot hold it."""
        ...


def summed(resources: Iterable[dict[str, float]]) -> dict[str, float]:
    """Resource amounts added up by name (a negative amount, lent past a node's total
    while a task blocks, counts as none)."""
    total: dict[str, float] = {}
    for r in resources:
        for k, v in r.items():
            total[k] = total.get(k, 0.0) + max(v, 0.0)
    return total


def cluster_total(nodes: Mapping[int, Node]) -> dict[str, float]:
    """The cluster's resources: every node's, summed."""
    return summed(n.resources.total for n in nodes.values())


def cluster_free(nodes: Mapping[int, Node]) -> dict[str, float]:
    """What running tasks do not hold now, summed over the nodes."""
    return summed(n.resources.free for n in nodes.values())
