"""Scheduler state: tasks, objects, workers, resources and reference counts. No I/O.

Events come in as method calls (``submit``, ``task_done``, ``worker_died``, ...); the
decisions go out as typed instructions (_scheduler/instructions.py: Send, Push, StartWorker, ...)
appended to ``self.out``, which the head process (orchestra/_head/head.py) carries out: send
a frame, start or kill a worker on a node, free a segment on a node. Unit tests drive
this class directly.

    client --Submit--> [WAITING deps] --deps sealed--> [READY queue per resource shape]
        --grant/pipeline--> worker queue [DISPATCHED] --TaskDone--> returns sealed
                                                    \\-- worker died --> retry or fail

Helpers, each owning its own tables and reaching this class only through the
SchedulerCore interface (_scheduler/model.py): ActorTable (_scheduler/actors.py), Blocking
(_scheduler/blocking.py: workers blocked in get()), Loans (_scheduler/loans.py: workers lent to drivers),
Placer (_scheduler/placement.py: which node, with several nodes or a scheduling strategy; with
one node and none, _pick_worker takes the first idle worker, as fast as ever).

Objects: PENDING (a task will produce it) -> READY (data inline, in a segment, or an
error) -> freed when its count drops to zero. The count is the number of processes
holding a ref (each tells 0->1 / 1->0), plus queued tasks using it as an argument, plus
sealed objects that contain it.
"""
from __future__ import annotations

import collections
from collections.abc import Callable, Iterable
from typing import Any

from .. import _ids
from .._protocol import pb
from .._protocol.wire import CANCEL_TASK, EXECUTE, FUNCTION, GENERATOR_ACK, SHUTDOWN, STEAL
from .actors import ActorState, ActorTable
from .blocking import Blocking
from .groups import PlacementGroups
from .instructions import FreeSegment, Instruction, KillWorker, Pull, Push, Send, StartWorker, StopWorker
from .loans import Loans
from .model import (
    PLACEMENT_GROUP,
    TASK_TRANSITIONS,
    Client,
    IllegalTransition,
    Node,
    Obj,
    Shape,
    Task,
    TaskState,
    Worker,
    WorkerState,
)
from .placement import Placer, hard_node

__all__ = ["TASK_TRANSITIONS", "Client", "IllegalTransition", "Node", "Obj", "SchedulerState",
           "Task", "TaskState", "Worker", "WorkerState"]

_MAX_START_FAILURES = 3
_RETIRING = (("@retiring", 1.0),)   # the grant shape of a worker at max_calls (no task's)


class SchedulerState:
    """All scheduling decisions of the cluster."""

    def __init__(self, *, pipeline_depth: int = 2,
                 error_factory: Callable[..., bytes] | None = None, joinable: bool = False) -> None:
        self.out: list[Instruction] = []
        self.nodes: dict[int, Node] = {}
        self.workers: dict[int, Worker] = {}
        self.clients: dict[int, Client] = {}
        self.tasks: dict[bytes, Task] = {}
        self.objects: dict[bytes, Obj] = {}
        self.functions: dict[bytes, Any] = {}   # function id -> RegisterFunctionRequest
        # Ready tasks by (-depth, resource shape): deeper tasks first, so the subtasks of
        # tasks blocked in get() run before more of their parents start (which would
        # block too, until no worker is left for anyone: a deadlock).
        self.ready: dict[tuple[Any, ...], collections.deque[Task]] = {}
        self.pipeline_depth = pipeline_depth
        self._next_worker_id = 1
        # Builds the pickled error for an object: (kind, **details) -> bytes. The head
        # passes orchestra._errors.make_error; tests may pass their own.
        self.error: Callable[..., bytes] = error_factory or _default_error
        self.actor_table = ActorTable(self)
        self.blocking = Blocking(self)
        self.start_failures = 0   # consecutive worker processes that died before connecting
        self._feasible: dict[Shape, bool] = {}
        # Why recent workers died (worker id -> (pid, reason, whether a task the head
        # sent was running)): direct calls to a dead process may be handed over
        # (adopt_calls) after its death is seen.
        self.dead_workers: dict[int, tuple[int, str, bool]] = {}
        # Where a worker listens for direct calls (worker id -> socket path); None:
        # callers always go through the head.
        # Where a worker takes direct calls: (node id, worker id) -> its socket.
        self.worker_socket: Callable[[int, int], str] | None = None
        # Lend idle workers to drivers for their tasks (loans; _scheduler/loans.py).
        self.lending = False
        self.loans = Loans(self)
        # Which node a task or actor goes to, with several nodes or a strategy
        # (_scheduler/placement.py). joinable: nodes may join, so a request no node holds waits.
        self.placer = Placer(self, joinable)
        # Placement groups: bundles reserved on nodes (_scheduler/groups.py).
        self.groups = PlacementGroups(self, joinable)

    # ------------------------------------------------------------------ nodes, workers
    def add_node(self, node_id: int, resources: dict[str, float], *, num_workers: int,
                 max_workers: int) -> None:
        self.nodes[node_id] = Node(node_id, resources, max_workers, num_workers)
        self._feasible.clear()   # a request no node could hold may fit this one
        for _ in range(num_workers):
            self.start_worker(node_id)

    def start_worker(self, node_id: int) -> Worker:
        w = Worker(self._next_worker_id, node_id)
        self._next_worker_id += 1
        self.workers[w.worker_id] = w
        self.out.append(StartWorker(node_id, w.worker_id))
        return w

    def client_connected(self, conn: int, hello: Any, node_id: int = 0) -> Client:
        c = Client(conn, hello.kind, hello.pid, node_id)
        c.namespace = hello.namespace
        self.clients[conn] = c
        if hello.kind == "worker":
            w = self.workers.get(hello.workerid)
            if w is None or w.state is not WorkerState.STARTING:
                raise ValueError(f"unknown or duplicate worker id {hello.workerid}")
            w.conn, w.pid, w.state = conn, hello.pid, WorkerState.IDLE
            c.worker = w
            self.start_failures = 0
            if w.actor is not None:
                self.actor_table.worker_connected(w)
            self.schedule()
        return c

    def client_disconnected(self, conn: int, exit_reason: str = "") -> None:
        c = self.clients.pop(conn, None)
        if c is None:
            return
        if c.worker is not None:
            self.worker_died(c.worker.worker_id, exit_reason or "its connection closed")
        elif c.kind == "driver":
            self.actor_table.driver_gone(conn)
            self._job_gone(conn)
        self.loans.client_gone(conn)
        if self.groups.groups:
            self.groups.client_gone(conn)
        for oid, n in c.holds.items():
            self._decr(oid, n)
        c.holds.clear()

    def _job_gone(self, conn: int) -> None:
        """A driver's connection closed (it exited, or was killed): its job's tasks stop,
        as Ray stops a dead job's. Those its tasks submitted too (a call carries its
        job). Waiting or queued ones fail as cancelled, running ones are cancelled with
        force (their workers killed); workers on loan to it, which may run its direct
        calls, are retired (stopped once given back, and replaced). Calls to actors are
        left to the actors (its own actors die with it: ActorTable.driver_gone)."""
        doomed = [t for t in self.tasks.values()
                  if t.state is not TaskState.DONE and not t.cancelled and not t.call.actor_id
                  and (t.owner == conn or t.call.job == conn)]
        for t in doomed:
            self.cancel(t.call.task_id + bytes(4), force=True)
        for w in self.workers.values():
            if w.lent_to == conn and w.actor is None:
                w.retiring = True
                w.grant_shape = _RETIRING

    def worker_failed_to_start(self, worker_id: int, reason: str, *, broken: bool = True) -> None:
        """The worker's process never connected. ``broken``: it failed by itself (counted:
        a few in a row say the environment is broken); False when its node died."""
        w = self.workers.get(worker_id)
        if w is None or w.state is not WorkerState.STARTING:
            return
        w.state = WorkerState.DEAD
        del self.workers[worker_id]
        if w.actor is not None:
            self.actor_table.worker_died(w, f"its worker process failed to start ({reason})")
        if not broken:
            self.schedule()
            return
        self.start_failures += 1
        if self.start_failures >= _MAX_START_FAILURES:
            # A broken environment (the worker cannot even import): fail what waits for
            # a worker instead of retrying forever.
            err = self.error("crashed", name="", pid=0, attempts=0,
                              reason=f"worker processes fail to start: {reason}")
            for q in self.ready.values():
                while q:
                    self.fail_task(q[0], err)
            return
        self.schedule()

    def worker_died(self, worker_id: int, reason: str) -> None:
        """The worker's process is gone: retry or fail what it was running."""
        w = self.workers.pop(worker_id, None)
        if w is None or w.state is WorkerState.DEAD:
            return
        was_starting = w.state is WorkerState.STARTING
        self.dead_workers[worker_id] = (w.pid, reason, bool(w.queue) and w.actor is None)
        self.loans.worker_died(worker_id)
        if len(self.dead_workers) > 1024:
            del self.dead_workers[next(iter(self.dead_workers))]
        self.release_grant(w)
        w.state = WorkerState.DEAD
        if w.actor is not None:   # a dedicated worker: the actor restarts or dies
            self.actor_table.worker_died(w, reason)
            self.schedule()
            return
        queue = list(w.queue)
        w.queue.clear()
        running = 1 + len(w.nested)   # the tasks it ran inside its blocked get()s, and their caller
        self.blocking.clear(w)
        for i, t in enumerate(queue):
            t.worker = None
            if i < running:  # a running task
                if t.cancelled:
                    self.fail_task(t, self._cancelled_error(t))
                elif t.retries_left != 0:
                    t.retries_left -= 1 if t.retries_left > 0 else 0
                    t.move(TaskState.READY)
                    self._enqueue_ready(t, front=True)
                else:
                    self.fail_task(t, self.error("crashed", name=t.call.name, pid=w.pid,
                                                   reason=reason, attempts=t.attempt))
            elif t.cancelled:   # cancelled while queued there: see return_tasks
                self.fail_task(t, self._cancelled_error(t))
            else:  # never started there: schedule again, no retry spent
                t.move(TaskState.READY)
                self._enqueue_ready(t, front=True)
        node = self.nodes.get(w.node_id)
        if node is not None and not was_starting:
            # Keep the pool at its size: replace the dead worker.
            if len(self.pool(w.node_id)) < max(node.num_cpus, 1):
                self.start_worker(w.node_id)
        self.schedule()

    def worker_address(self, conn: int, address: str) -> None:
        """The worker on ``conn`` takes direct calls over TCP at ``address``."""
        c = self.clients.get(conn)
        if c is not None and c.worker is not None:
            c.worker.address = address

    def direct_path(self, w: Worker, c: Client) -> str:
        """Where client ``c`` reaches worker ``w`` for direct calls: its unix socket on
        one node, its TCP address across nodes; "" when there is none (the head's path)."""
        if self.worker_socket is None:
            return ""
        if c.node_id == w.node_id:
            return self.worker_socket(w.node_id, w.worker_id)
        return w.address

    def remove_node(self, node_id: int, reason: str) -> None:
        """Node ``node_id`` is gone with its store. Its workers' deaths come as their
        connections close (client_disconnected); here: workers that never connected,
        and the objects whose only copy was there (rebuilt by nothing yet: they hold
        ObjectLostError naming the node)."""
        if self.nodes.pop(node_id, None) is None:
            return
        self._feasible.clear()
        self.groups.node_removed(node_id)
        rebuild: dict[bytes, tuple[Any, int, int]] = {}
        for w in [w for w in self.workers.values() if w.node_id == node_id]:
            if w.state is WorkerState.STARTING:
                self.worker_failed_to_start(w.worker_id, f"its node died: {reason}", broken=False)
            else:   # its tasks are retried elsewhere, its actor restarted or dead
                self.worker_died(w.worker_id, f"its node died ({reason})")
        for oid, o in self.objects.items():
            if o.copies:
                o.copies.pop(node_id, None)
            data = o.data
            if data is None or data.WhichOneof("data") != "segment" \
                    or data.segment.node_id != node_id:
                continue
            if o.copies:   # another node pulled a copy: it becomes the primary one
                _, seg = o.copies.popitem()
                o.data = pb.ObjectData(object_id=oid, segment=seg, contained=data.contained)
            elif o.lineage is not None:
                rebuild.setdefault(o.lineage[0].task_id, o.lineage)
                o.data = None   # pending again: readers wait for the new run
                o.lineage = None
                for cid in data.contained:   # counted again when it is sealed anew
                    self._decr(cid)
            else:
                o.data = pb.ObjectData(object_id=oid, contained=data.contained, error=self.error(
                    "node_lost", object_id=oid, node=node_id, reason=reason))
        if rebuild:
            self._wait_again()
        for call, retries_left, owner in rebuild.values():
            self._rebuild(call, retries_left, owner)
        self.schedule()

    def _wait_again(self) -> None:
        """Objects are pending again (their node died; their tasks run again): a task
        not sent yet whose argument is one of them waits for it once more. Queued as
        ready (or ready once its other arguments came), it was dispatched with no data
        for that argument, and the head's loop died on it; an actor's queued call
        stops its actor's queue there (pump)."""
        objects = self.objects
        for t in self.tasks.values():
            if t.state is not TaskState.READY and t.state is not TaskState.WAITING:
                continue
            gone = [v.ref for v in t.call.args if v.WhichOneof("kind") == "ref"
                    and (o := objects.get(v.ref)) is not None and o.data is None
                    and v.ref not in t.deps]
            if not gone:
                continue
            if t.state is TaskState.READY:
                q = self.ready.get(t.qkey)
                if q is not None and t in q:
                    q.remove(t)
                t.move(TaskState.WAITING)
            for oid in gone:
                t.deps.add(oid)
                objects[oid].waiting_tasks.append(t)

    def _rebuild(self, call: Any, retries_left: int, owner: int) -> None:
        """Run a finished task again: a result of it was lost with its node. Its returns
        still alive elsewhere keep their data (the new copies are freed)."""
        t = Task(call, owner)
        t.retries_left = retries_left - 1 if retries_left > 0 else retries_left
        self.tasks[call.task_id] = t
        if self._hold_args(t) and not t.deps:
            self._deps_met(t)

    def pool(self, node_id: int) -> list[Worker]:
        """The node's task workers (dedicated actor workers do not count)."""
        return [w for w in self.workers.values() if w.node_id == node_id and w.actor is None]

    # ------------------------------------------------------------------ functions
    def register_function(self, req: Any) -> None:
        self.functions.setdefault(req.function_id, req)

    # ------------------------------------------------------------------ tasks
    def new_object(self, conn: int, oid: bytes) -> Obj:
        """A pending object held by ``conn`` (implied hold: no RefDelta for it)."""
        o = Obj(conn)
        o.count = 1
        self.objects[oid] = o
        client = self.clients.get(conn)
        if client is not None:
            client.holds[oid] += 1
        return o

    def submit(self, conn: int, call: Any) -> None:
        t = Task(call, conn)
        c = self.clients.get(conn)
        if c is not None and c.worker is not None and c.worker.queue:
            parent = c.worker.queue[0]
            if t.placement is None and self.groups.groups and not call.actor_id:
                t = self.groups.capture(t, c.worker) or t
            t.depth = parent.depth + 1
            t.qkey = (-t.depth, t.shape) if t.placement is None else (-t.depth, t.shape, t.placement)
        self.tasks[call.task_id] = t
        objects = self.objects
        for rid in t.return_ids:
            # Registered pending already (register_pending: a direct call's result that
            # escaped before the call came here instead): tasks may wait on that object,
            # and its hold stands for the Submit's.
            if rid not in objects:
                self.new_object(conn, rid)
        if self._hold_args(t):
            if call.actor_id:
                self.actor_table.submit_call(t)
            elif not t.deps:
                self._deps_met(t)

    def create_actor(self, conn: int, call: Any) -> Any:
        """Raises ValueError when the actor's name is taken in its namespace; with
        get_if_exists, returns the live actor's spec instead (nothing is created).
        None: created."""
        t = Task(call, conn)
        c = self.clients.get(conn)
        if c is not None and c.worker is not None and t.placement is None and self.groups.groups:
            t = self.groups.capture(t, c.worker) or t
        existing = self.actor_table.create(conn, t.call, t)
        if existing is not None:
            return existing
        self.tasks[call.task_id] = t
        if self._hold_args(t) and not t.deps:
            self.actor_table.creation_deps_met(t)
        return None

    def _hold_args(self, t: Task) -> bool:
        """The task holds its arguments; False when it already failed (lost or failed
        argument, infeasible request)."""
        call = t.call
        objects = self.objects
        for v in call.args:
            if v.WhichOneof("kind") == "ref":
                oid = v.ref
                t.arg_ids.append(oid)
                arg = objects.get(oid)
                if arg is None:
                    self.fail_task(t, self.error("lost", object_id=oid, name=call.name))
                    return False
                arg.count += 1
                if arg.data is None:
                    t.deps.add(oid)
                    arg.waiting_tasks.append(t)
        for oid in call.nested:
            inner = objects.get(oid)
            if inner is not None:
                inner.count += 1
                t.arg_ids.append(oid)
        feasible = self._feasible.get(t.shape)
        if feasible is None:   # once per resource shape: it only changes with the nodes
            feasible = self._feasible[t.shape] = any(
                n.resources.feasible(t.resources) for n in self.nodes.values())
        if not feasible or t.placement is not None:
            err = self.placer.admit(t, feasible)
            if err is not None:   # no node can ever hold it (or the one its strategy names)
                self.fail_task(t, err)
                if call.HasField("actor"):
                    self.actor_table.creation_failed(t, err)
                return False
        if t.deps:
            # An argument that already failed fails the task without running it.
            for oid in t.arg_ids:
                dep = objects.get(oid)
                if dep is not None and dep.data is not None and dep.data.WhichOneof("data") == "error":
                    self.fail_task(t, dep.data.error)
                    return False
        return True

    def _deps_met(self, t: Task) -> None:
        for oid in t.arg_ids:
            o = self.objects.get(oid)
            if o is not None and o.data is not None and o.data.WhichOneof("data") == "error":
                self.fail_task(t, o.data.error)
                return
        if t.call.actor_id:
            self.actor_table.call_deps_met(t)
            return
        if t.call.HasField("actor"):
            self.actor_table.creation_deps_met(t)
            return
        t.move(TaskState.READY)
        self._enqueue_ready(t)
        self.schedule()

    def _enqueue_ready(self, t: Task, front: bool = False) -> None:
        q = self.ready.get(t.qkey)
        if q is None:
            q = self.ready[t.qkey] = collections.deque()
            self.ready = dict(sorted(self.ready.items()))   # deepest first
        if front:
            q.appendleft(t)
        else:
            q.append(t)

    def schedule(self) -> None:
        """Give ready tasks to workers: idle workers first, then pipelining on the
        workers granted that shape."""
        if self.groups.pending:   # bundles first: they wait for resources tasks free
            self.groups.place_pending()
        self.actor_table.place_pending()
        waiting = False
        waiting_for = self.blocking.waiting_for
        for q in self.ready.values():
            while q:
                t = q[0]
                if waiting_for and t.call.task_id in waiting_for and self.blocking.inline_waiter(t):
                    q.popleft()   # runs inside a get() blocked on it (taken off first)
                    continue
                w = self._pick_worker(t)
                if w is None:
                    if not q or q[0] is not t:   # it failed (its node is gone): the next one
                        continue
                    waiting = True
                    break
                q.popleft()
                self.dispatch(t, w)
        waiting = waiting or bool(self.actor_table.pending)   # an actor waits for resources
        loans = self.loans
        if loans.fresh or loans.fresh_pinned or waiting and loans.loaned:
            loans.after_schedule(waiting)

    def _pick_worker(self, t: Task) -> Worker | None:
        if len(self.nodes) > 1 or t.placement is not None:
            return self._pick_placed(t)
        # One node, no strategy (the hot path): the first idle worker.
        req = t.resources
        candidates = []
        for w in self.workers.values():
            st = w.state
            if st is WorkerState.IDLE:
                # (None: a worker of a node being removed, not yet dead here: remove_node
                # ends its workers one by one, and each death schedules)
                node = self.nodes.get(w.node_id)
                if node is not None and node.resources.fits(req):
                    w.grant = req
                    w.grant_shape = t.shape
                    w.gpu_ids = node.resources.acquire(req)
                    w.state = WorkerState.BUSY
                    if self.lending and w.actor is None and not t.call.retry_exceptions \
                            and not t.call.max_calls:   # (its worker may retire: never lent)
                        self.loans.fresh.append((t.owner, w))
                    return w
            elif st is WorkerState.BUSY and w.grant_shape == t.shape and w.lent_to is None \
                    and not w.nested:   # tasks queued there would wait for its whole stack
                candidates.append(w)
        if req and any(n.resources.fits(req) for n in self.nodes.values()):
            # Resources are free, only a worker is missing (starting, or replacing a dead
            # one): wait for it. Pipelining now could queue the task behind a long-running
            # one for as long as that runs, with a CPU idle. (A task that holds nothing
            # always "fits": it pipelines, or it would start workers up to max_workers.)
            self._maybe_grow(t)
            return None
        best = self._least_queued(candidates)
        if best is None:
            self._maybe_grow(t)
        return best

    def _least_queued(self, candidates: list[Worker]) -> Worker | None:
        """The busy worker with the fewest tasks queued, below the pipeline depth."""
        best = None
        for w in candidates:
            if len(w.queue) < self.pipeline_depth and (best is None or len(w.queue) < len(best.queue)):
                best = w
        return best

    def _pick_placed(self, t: Task) -> Worker | None:
        """_pick_worker with several nodes, or a strategy: an idle worker on the first node
        of Placer.order that has one or can start one (then it waits for that one), else
        pipelining behind a busy worker of the same shape on a node the strategy allows.
        None: it waits, or it failed (hard affinity to a node gone from the cluster)."""
        err = self.placer.unplaceable(t)
        if err is not None:
            self.fail_task(t, err)
            return None
        req = t.resources
        order = self.placer.order(t)
        only = hard_node(t)
        idle: dict[int, Worker] = {}
        candidates = []
        for w in self.workers.values():
            st = w.state
            if st is WorkerState.IDLE:
                if w.node_id not in idle:
                    idle[w.node_id] = w
            elif st is WorkerState.BUSY and w.grant_shape == t.shape and w.lent_to is None \
                    and not w.nested and (only is None or w.node_id == only):
                candidates.append(w)
        for node in order:
            took = idle.get(node.node_id)
            if took is not None:
                took.grant = req
                took.grant_shape = t.shape
                took.gpu_ids = node.resources.acquire(req)
                took.state = WorkerState.BUSY
                self.placer.placed(t, node.node_id)
                if self.lending and took.actor is None and not t.call.retry_exceptions \
                        and not t.call.max_calls:
                    if t.placement is None:
                        self.loans.fresh.append((t.owner, took))
                    elif only == took.node_id:   # bound to this node: lent for those
                        self.loans.fresh_pinned.append((t.owner, took))
                return took
            if req and self._can_grow(node):
                # Resources are free there, only a worker is missing: wait for it (as on
                # one node, see _pick_worker), rather than pipeline behind a long task.
                self._maybe_grow(t, [node])
                return None
        best = self._least_queued(candidates)
        if best is None:
            self._maybe_grow(t, order)
        return best

    def _can_grow(self, node: Node) -> bool:
        """The node has a task worker starting, or room for one more."""
        mine = self.pool(node.node_id)
        return any(w.state is WorkerState.STARTING for w in mine) or len(mine) < node.max_workers

    def _maybe_grow(self, t: Task, nodes: Iterable[Node] | None = None) -> None:
        """Start a worker when a ready task fits a node that has no idle or starting one:
        the first of ``nodes`` (the task's placement order) where it fits, or of all."""
        if t.depth and self.blocking.defer_growth(t):
            return
        for node in self.nodes.values() if nodes is None else nodes:
            if not node.resources.fits(t.resources):
                continue
            mine = self.pool(node.node_id)
            if any(w.state in (WorkerState.STARTING, WorkerState.IDLE) for w in mine):
                return
            if len(mine) < node.max_workers:
                self.start_worker(node.node_id)
            return

    def dispatch(self, t: Task, w: Worker) -> None:
        t.move(TaskState.DISPATCHED)
        t.worker = w
        t.attempt += 1
        w.queue.append(t)
        call = t.call
        fid = call.function_id
        if fid not in w.functions:
            fn = self.functions.get(fid)
            if fn is not None:
                self.out.append(Send(w.conn, FUNCTION, fn))
                w.functions.add(fid)
        inv = pb.InvokeCallRequest(call=call, gpu_ids=w.gpu_ids, attempt=t.attempt)
        objects = self.objects
        resolved = inv.resolved
        for v in call.args:
            if v.WhichOneof("kind") == "ref":
                resolved.append(objects[v.ref].data)
        if len(self.nodes) > 1:
            self._args_to(w.node_id, resolved)
        self.out.append(Send(w.conn, EXECUTE, pb.Execute(invoke=inv)))

    def _args_to(self, node_id: int, resolved: Any) -> None:
        """Name the copies on the worker's node of its task's large arguments, and have
        the node pull those it lacks now (the worker asks for them once it runs)."""
        for i, data in enumerate(resolved):
            if data.WhichOneof("data") != "segment" or data.segment.node_id == node_id:
                continue
            local = self.copy_on(data.object_id, node_id)
            if local is not None:
                resolved[i].CopyFrom(local)
            else:
                self.out.append(Pull(node_id, data.object_id))

    def release_grant(self, w: Worker) -> None:
        if w.grant:
            node = self.nodes.get(w.node_id)
            if node is not None:
                grant = w.grant
                if w.state is WorkerState.BLOCKED:  # its CPU was already lent back
                    grant = {k: v for k, v in grant.items() if k != "CPU"}
                node.resources.release(grant, w.gpu_ids)
        w.grant = {}
        w.grant_shape = ()
        w.gpu_ids = []

    def task_done(self, conn: int, msg: Any) -> None:
        c = self.clients.get(conn)
        w = c.worker if c is not None else None
        t = self.tasks.get(msg.task_id)
        if w is not None and t is not None and t in w.queue:
            w.queue.remove(t)
            t.worker = None
            if w.nested and t in w.nested:   # run inside a get(): the worker is back in it
                self.blocking.nested_done(w, t)
        if w is not None and w.actor is not None and msg.task_id == w.actor.creation.call.task_id:
            creation = w.actor.creation
            if creation in w.queue:
                w.queue.remove(creation)
            self.tasks.pop(msg.task_id, None)   # it keeps its arguments for restarts
            self.actor_table.creation_done(w, msg)
            return
        if t is None and msg.owner:
            # A direct call of its caller (to an actor, or a task on a worker lent to
            # it), answered through the head (a result in shared memory or holding
            # refs): the caller owns the returns; a task's call comes along to be run
            # again should their node die.
            for data in msg.returns:
                self.put_for(msg.owner, data)
            if msg.HasField("lineage") and len(self.nodes) > 1:
                self._keep_lineage(msg.lineage, msg.lineage.max_retries, msg.owner, msg.returns)
        if t is None or t.state is TaskState.DONE:
            self.after_worker_step(w)
            return
        if msg.user_error and t.call.retry_exceptions and not msg.not_retryable \
                and t.retries_left != 0 and not t.cancelled:
            t.retries_left -= 1 if t.retries_left > 0 else 0
            t.move(TaskState.READY)
            self._enqueue_ready(t, front=True)
            self.after_worker_step(w)
            return
        if msg.cancelled:
            self.fail_task(t, self.error("cancelled", name=t.call.name))
        else:
            t.move(TaskState.DONE)
            self.finish_task(t)
            for data in msg.returns:
                self._seal(data.object_id, data)
            if len(self.nodes) > 1 and t.retries_left != 0 and not t.call.actor_id:
                self._keep_lineage(t.call, t.retries_left, t.owner, msg.returns)
        if t.call.max_calls and w is not None and w.actor is None:
            self._count_call(w, t.call)
        self.after_worker_step(w, t)

    def _keep_lineage(self, call: Any, retries_left: int, owner: int, returns: Any) -> None:
        """How to make a task's results in shared memory again (its node may die)."""
        for data in returns:
            if data.WhichOneof("data") == "segment":
                o = self.objects.get(data.object_id)
                if o is not None:
                    o.lineage = (call, retries_left, owner)

    def after_worker_step(self, w: Worker | None, done: Task | None = None) -> None:
        """``w`` ended a task (``done``, when it ran to its end)."""
        if w is not None and w.actor is not None:
            self.actor_table.call_done(w)
            return
        if w is not None and w.retiring:
            self._retire(w)
            self.schedule()
            return
        if w is not None and not w.queue and w.state is WorkerState.BUSY and w.lent_to is None:
            if done is not None and self.lending and self.loans.lend_after_task(w, done):
                return   # the driver whose task it ran sends it its next ones as direct calls
            self.release_grant(w)
            w.state = WorkerState.IDLE
            if w.waits:   # a resume lost to a cancel: its task has ended all the same
                self.blocking.clear(w)
            node = self.nodes.get(w.node_id)
            size = max(node.num_cpus, 1) if node is not None else 0
            # len(self.workers) first: no list is built per task while the pool is at its
            # size (the common case, on the hot path).
            if len(self.workers) > size and len(self.pool(w.node_id)) > size \
                    and self._idle_on(w.node_id) > 1 and not self.has_ready():
                # Surplus from lending CPUs to blocked tasks: shrink back to the pool size.
                w.state = WorkerState.DEAD
                del self.workers[w.worker_id]
                self._stop(w)
        self.schedule()
        if w is not None and w.state is WorkerState.IDLE and not self.has_ready():
            self._steal_for(w)

    def _count_call(self, w: Worker, call: Any) -> None:
        """``w`` ran a call of a function with max_calls=: at the limit it retires, and
        the tasks queued there that have not started are asked back (STEAL)."""
        calls = w.calls if w.calls is not None else {}
        w.calls = calls
        n = calls[call.function_id] = calls.get(call.function_id, 0) + 1
        if n >= call.max_calls and not w.retiring:
            w.retiring = True
            w.grant_shape = _RETIRING   # no task has this shape: none is pipelined there
            if w.queue:
                ids = [t.call.task_id for t in w.queue]
                self.out.append(Send(w.conn, STEAL, pb.ReturnTasks(task_ids=ids)))

    def _retire(self, w: Worker) -> None:
        """A worker at a function's max_calls: once its queue is empty, stop it and
        start a fresh one in its place."""
        if w.queue or w.state is WorkerState.DEAD or w.lent_to is not None:
            return   # (a lent worker retires once given back: return_loan steps it here)
        self.release_grant(w)
        w.state = WorkerState.DEAD
        del self.workers[w.worker_id]
        self._stop(w)
        node = self.nodes.get(w.node_id)
        if node is not None and len(self.pool(w.node_id)) < max(node.num_cpus, 1):
            self.start_worker(w.node_id)

    def _stop(self, w: Worker) -> None:
        """End an idle worker the scheduler let go: it exits by itself once it has sent
        what it buffered (its task events: a worker killed outright took the last half
        second of them along, and its tasks showed as never run or as WORKER_DIED)."""
        self.out.append(Send(w.conn, SHUTDOWN, pb.AckReply()))
        self.out.append(StopWorker(w.node_id, w.worker_id))

    def _idle_on(self, node_id: int) -> int:
        return sum(1 for x in self.workers.values()
                   if x.node_id == node_id and x.state is WorkerState.IDLE)

    def _steal_for(self, idle: Worker) -> None:
        """A worker is idle and nothing is ready: take back tasks pipelined behind a
        running one elsewhere, so a quick task never waits for a long one ahead of it."""
        for v in self.workers.values():
            if v.node_id == idle.node_id and v.state is WorkerState.BUSY and v.actor is None \
                    and len(v.queue) > 1 and v.lent_to is None:
                ids = [t.call.task_id for t in list(v.queue)[1:]]
                self.out.append(Send(v.conn, STEAL, pb.ReturnTasks(task_ids=ids)))

    def has_ready(self) -> bool:
        return any(self.ready.values())

    def work_waits(self) -> bool:
        """A task or an actor waits for a worker or resources."""
        return self.has_ready() or bool(self.actor_table.pending)

    def finish_task(self, t: Task) -> None:
        """Release what the task held; it will not run again."""
        self.tasks.pop(t.call.task_id, None)
        for oid in t.arg_ids:
            self._decr(oid)
        t.arg_ids = []

    def fail_task(self, t: Task, error: bytes) -> None:
        if t.call.actor_id:
            self.actor_table.remove_call(t)
        if t.state is TaskState.READY:
            q = self.ready.get(t.qkey)
            if q is not None and t in q:
                q.remove(t)
        for oid in t.deps:
            o = self.objects.get(oid)
            if o is not None and t in o.waiting_tasks:
                o.waiting_tasks.remove(t)
        t.deps.clear()
        t.state = TaskState.DONE
        self.finish_task(t)
        for rid in t.return_ids:
            self._seal(rid, pb.ObjectData(object_id=rid, error=error))

    def blocked(self, conn: int, is_blocked: bool, object_ids: Iterable[bytes] = (),
                task_id: bytes = b"", name: str = "") -> None:
        """A worker's running task blocks in get()/wait() on ``object_ids`` (or resumes):
        it runs one of their tasks itself, or lends its CPU (_scheduler/blocking.py)."""
        c = self.clients.get(conn)
        w = c.worker if c is not None else None
        if w is None or w.actor is not None or w.state not in (WorkerState.BUSY, WorkerState.BLOCKED):
            return
        self.blocking.blocked(w, is_blocked, object_ids, task_id, name)

    def return_tasks(self, conn: int, task_ids: Iterable[bytes]) -> None:
        """A worker hands back queued tasks it did not start (it blocked, or is exiting)."""
        c = self.clients.get(conn)
        w = c.worker if c is not None else None
        for tid in reversed(list(task_ids)):
            t = self.tasks.get(tid)
            if t is None or t.state is not TaskState.DISPATCHED:
                continue
            if w is not None and t in w.queue:
                w.queue.remove(t)
                if t in w.nested:
                    self.blocking.nested_done(w, t)
            t.worker = None
            t.attempt -= 1
            if t.cancelled:
                # The worker handed it back before our CancelTask reached it, and then
                # ignored the cancel for a task it no longer had: re-queued, it ran.
                self.fail_task(t, self._cancelled_error(t))
                continue
            t.move(TaskState.READY)
            self._enqueue_ready(t, front=True)
        self.after_worker_step(w)

    def cancel(self, object_id: bytes, force: bool, recursive: bool = False) -> None:
        """Cancel a task: failed at once while it waits, interrupted (or its worker
        killed, with ``force``) while it runs. ``recursive``: the tasks it submitted
        too, those known here (its worker's connection owns them) and, told by the
        CancelTask, those its worker sent elsewhere."""
        t = self.tasks.get(_ids.task_of(object_id))
        if t is None or t.state is TaskState.DONE:
            return  # finished (or a put): nothing to do
        t.cancelled = True
        if t.state in (TaskState.WAITING, TaskState.READY):
            self.fail_task(t, self.error("cancelled", name=t.call.name))
            return
        w = t.worker
        if w is None:
            return
        if recursive and w.actor is None and w.queue and w.queue[0] is t:
            self._cancel_children(w.conn, force)
        if force and w.queue and w.queue[0] is t:
            self.out.append(KillWorker(w.node_id, w.worker_id, "cancelled with force=True"))
        else:
            self.out.append(Send(w.conn, CANCEL_TASK, pb.CancelTask(task_id=t.call.task_id,
                                                                    recursive=recursive)))

    def _cancel_children(self, conn: int, force: bool) -> None:
        """The unfinished tasks a task worker's connection submitted (the task running
        there made them), each cancelled recursively."""
        children = [t for t in self.tasks.values()
                    if t.owner == conn and t.state is not TaskState.DONE and not t.cancelled]
        for child in children:
            self.cancel(child.call.task_id + b"\0\0\0\0", force, True)

    def pending_tasks(self, conn: int, own_only: bool = False) -> int:
        """Tasks and actor calls not finished that ``conn`` submitted, and (unless
        ``own_only``: a cluster shared with other drivers) those any worker submitted:
        what a driver's exit waits for."""
        clients = self.clients
        n = 0
        for t in self.tasks.values():
            if t.state is TaskState.DONE or t.call.HasField("actor"):
                continue
            if t.owner == conn:
                n += 1
            elif not own_only:
                c = clients.get(t.owner)
                if c is None or c.kind != "driver":
                    n += 1
        return n

    # ------------------------------------------------------------------ objects
    def put(self, conn: int, data: Any) -> None:
        oid = data.object_id
        o = self.objects.get(oid)
        if o is None:
            o = self.objects[oid] = Obj(conn)
            o.count = 1
            c = self.clients.get(conn)
            if c is not None:
                c.holds[oid] += 1
        self._seal(oid, data, push_owner=False)   # the writer has the data already

    def put_for(self, conn: int, data: Any) -> None:
        """An object of ``conn`` made elsewhere (an actor answering a direct call):
        held for ``conn`` and pushed to it."""
        oid = data.object_id
        if conn not in self.clients:
            if data.WhichOneof("data") == "segment":
                self._free_segment(data.segment)
            return
        if oid not in self.objects:
            self.new_object(conn, oid)
        self._seal(oid, data)

    # ------------------------------------------------------------------ generators
    def generator_item(self, conn: int, msg: Any) -> None:
        """An item a streaming generator yielded (GeneratorItem): an object of the
        task's owner, pushed to it now. Items come before their task's TaskDone, on the
        worker's connection, so the owner has them all when it learns the end."""
        data = msg.data
        if data.object_id != msg.task_id + msg.index.to_bytes(4, "big") or not msg.index:
            return   # not an item's id: never made by a worker of ours
        if msg.owner:   # a call its caller sent straight to the actor
            self.put_for(msg.owner, data)
            return
        t = self.tasks.get(msg.task_id)
        if t is None or t.state is not TaskState.DISPATCHED or msg.index <= t.streamed \
                or t.owner not in self.clients or data.object_id in self.objects:
            # Taken already (a retry yields its items again), or nobody waits for it.
            if data.WhichOneof("data") == "segment":
                self._free_segment(data.segment)
            if t is not None and t.acked and msg.index <= t.streamed:
                # A retry pauses for acks the consumer sent its first attempt.
                self.out.append(Send(conn, GENERATOR_ACK, pb.GeneratorAck(
                    task_id=msg.task_id, consumed=t.acked)))
            return
        t.streamed = msg.index
        self.new_object(t.owner, data.object_id)
        self._seal(data.object_id, data)

    def generator_ack(self, msg: Any) -> None:
        """The consumer read ``msg.consumed`` items: tell the worker producing them."""
        t = self.tasks.get(msg.task_id)
        if t is None:
            return
        t.acked = max(t.acked, msg.consumed)
        if t.worker is not None and t.state is TaskState.DISPATCHED:
            self.out.append(Send(t.worker.conn, GENERATOR_ACK, msg))

    def register_pending(self, conn: int, ids: Iterable[bytes]) -> None:
        """Results of direct calls ``conn`` made to an actor, not answered yet, whose
        refs leave that process: held for it until it forwards their data (put)."""
        for oid in ids:
            if oid not in self.objects:
                self.new_object(conn, oid)

    def adopt_calls(self, conn: int, msg: Any) -> None:
        """Direct calls ``conn`` made to an actor's process, unanswered when their
        connection closed: failed as calls in flight when that process died, or ended
        when the process still answers them (through the head)."""
        if not msg.actor_id:
            self._adopt_tasks(conn, msg)
            return
        w = self.workers.get(msg.worker_id)
        alive = w is not None and w.actor is not None and w.state is not WorkerState.DEAD
        a = self.actor_table.actors.get(msg.actor_id)
        name = a.spec.class_name if a is not None else "?"
        for call in msg.calls:
            t = self._adopted(conn, call)
            if t is None:
                continue
            if call.max_retries and a is not None and a.state is not ActorState.DEAD:
                # max_task_retries=: it may run again on the restarted instance, which
                # reads its arguments through the head.
                if not self._hold_args(t):
                    continue
                if not alive:
                    t.retries_left -= 1 if t.retries_left > 0 else 0
                    self.actor_table.submit_call(t)
                    continue
            if alive:
                assert w is not None
                self._queued_on(t, w)
                continue
            pid, reason, _ = self.dead_workers.get(msg.worker_id, (0, "its connection closed", False))
            self.fail_task(t, self.error(
                "actor_dead", name=name,
                reason=f"its process (pid={pid}) died while running {call.name}() ({reason})"))

    def _adopted(self, conn: int, call: Any) -> Task | None:
        """The task of a call handed over by ``conn``, its returns held for ``conn``;
        None when the worker answered it through the head already."""
        t = Task(call, conn)
        if call.num_returns and all(
                (o := self.objects.get(r)) is not None and o.data is not None for r in t.return_ids):
            return None
        self.tasks[call.task_id] = t
        for rid in t.return_ids:
            if rid not in self.objects:
                self.new_object(conn, rid)
        return t

    @staticmethod
    def _queued_on(t: Task, w: Worker) -> None:
        """A handed-over call, as sent to ``w`` (its death, or answer, ends it)."""
        t.state = TaskState.DISPATCHED
        t.worker = w
        t.attempt = 1
        w.queue.append(t)

    def _adopt_tasks(self, conn: int, msg: Any) -> None:
        """Tasks a driver sent as direct calls to a worker on loan to it, unanswered when their
        connection closed: as tasks queued there when it died (the first one running,
        unless a task the head sent was) when the head has seen the death, or queued
        there for the death to come."""
        w = self.workers.get(msg.worker_id)
        alive = w is not None and w.actor is None and w.state is not WorkerState.DEAD
        cancelled = set(msg.cancelled)
        pid, reason, head_running = self.dead_workers.get(msg.worker_id, (0, "its connection closed", False))
        running = not head_running
        for call in msg.calls:
            t = self._adopted(conn, call)
            if t is None or not self._hold_args(t):
                continue
            t.cancelled = call.task_id in cancelled
            if t.deps:
                continue   # waits for its arguments like any task
            if alive:
                assert w is not None
                self._queued_on(t, w)
                continue
            t.attempt = 1
            if running and t.cancelled:
                self.fail_task(t, self.error("cancelled", name=call.name))
            elif running and t.retries_left == 0:
                self.fail_task(t, self.error("crashed", name=call.name, pid=pid, reason=reason,
                                               attempts=t.attempt))
            else:
                if running and t.retries_left > 0:
                    t.retries_left -= 1
                t.move(TaskState.READY)
                self._enqueue_ready(t)
            running = False
        self.schedule()

    # ------------------------------------------------------------------ loans
    def lend_idle(self, conn: int, req: dict[str, float], pinned: int = 0) -> None:
        """A driver whose loaned workers are all busy asks for one more (_scheduler/loans.py)."""
        self.loans.lend_idle(conn, req, pinned)

    def return_loan(self, conn: int, worker_id: int) -> None:
        """A driver gives back a worker lent to it (_scheduler/loans.py)."""
        self.loans.return_loan(conn, worker_id)

    def _seal(self, oid: bytes, data: Any, push_owner: bool = True) -> None:
        o = self.objects.get(oid)
        if o is None or o.data is not None:
            # Nobody wants it any more (a second run's copy, or the object is gone);
            # the same segment told twice is the object's own, and stays.
            if data.WhichOneof("data") == "segment" and not _holds(o, data.segment):
                self._free_segment(data.segment)
            return
        o.data = data
        kind = data.WhichOneof("data")
        if kind == "segment":
            o.size = data.segment.size
        elif kind == "inline":
            o.size = len(data.inline)
        for cid in data.contained:
            co = self.objects.get(cid)
            if co is not None:
                co.count += 1
        if o.count <= 0:
            self._free(oid, o)
            return
        out = self.out
        if push_owner and o.owner in self.clients:
            out.append(Push(o.owner, data))
        for sub in o.subscribers:
            if sub != o.owner and sub in self.clients:
                out.append(Push(sub, data))
        o.subscribers = []
        if o.waiting_tasks:
            waiting, o.waiting_tasks = o.waiting_tasks, []
            for t in waiting:
                t.deps.discard(oid)
                if not t.deps and t.state is TaskState.WAITING:
                    self._deps_met(t)

    def _free_segment(self, segment: Any) -> None:
        # The store's key: the spill file's path, or the shared-memory segment's name.
        self.out.append(FreeSegment(segment.node_id, segment.path or segment.name))

    def relocate(self, oid: bytes, segment: Any) -> bool:
        """The store spilled the object's segment to a file: point the object at it.
        False when the object is gone or no longer in that segment."""
        o = self.objects.get(oid)
        if o is None:
            return False
        data = o.data
        if data is None or data.WhichOneof("data") != "segment":
            return False
        if segment.node_id != data.segment.node_id:   # a copy another node pulled
            copy = o.copies.get(segment.node_id) if o.copies else None
            if copy is None or copy.path or copy.name != segment.name:
                return False
            o.copies[segment.node_id] = segment  # type: ignore[index]
            return True
        if data.segment.path or data.segment.name != segment.name:
            return False
        o.data = pb.ObjectData(object_id=oid, segment=segment, contained=data.contained)
        return True

    # ------------------------------------------------------------------ object directory
    def copy_on(self, oid: bytes, node_id: int) -> Any:
        """The object's data as a reader on ``node_id`` maps it: the primary copy when it
        is there, else a copy pulled there; None when that node has none (pull it)."""
        o = self.objects.get(oid)
        if o is None or o.data is None:
            return None
        data = o.data
        if data.WhichOneof("data") != "segment" or data.segment.node_id == node_id:
            return data
        seg = o.copies.get(node_id) if o.copies else None
        if seg is None:
            return None
        return pb.ObjectData(object_id=oid, segment=seg, contained=data.contained)

    def add_copy(self, oid: bytes, segment: Any) -> bool:
        """A node pulled the object into its store; False when the object is gone (the
        caller frees the copy)."""
        o = self.objects.get(oid)
        if o is None or o.data is None or o.data.WhichOneof("data") != "segment":
            return False
        if o.copies is None:
            o.copies = {}
        old = o.copies.get(segment.node_id)
        if old is not None:
            self._free_segment(old)
        o.copies[segment.node_id] = segment
        return True

    def subscribe(self, conn: int, ids: Iterable[bytes]) -> None:
        for oid in ids:
            o = self.objects.get(oid)
            if o is None:
                self.out.append(Push(conn, pb.ObjectData(
                    object_id=oid, error=self.error("lost", object_id=oid, name=""))))
            elif o.data is not None:
                self.out.append(Push(conn, o.data))
            elif conn not in o.subscribers:
                o.subscribers.append(conn)

    def ref_delta(self, conn: int, incr: Iterable[bytes], decr: Iterable[bytes]) -> None:
        c = self.clients.get(conn)
        objects = self.objects
        for oid in incr:   # increments first: a batch never frees what it also takes
            o = objects.get(oid)
            if o is not None:
                o.count += 1
                if c is not None:
                    c.holds[oid] += 1
        for oid in decr:
            if c is not None:
                n = c.holds.get(oid, 0)
                if n <= 0:
                    continue
                if n == 1:
                    del c.holds[oid]
                else:
                    c.holds[oid] = n - 1
            self._decr(oid)

    def _decr(self, oid: bytes, n: int = 1) -> None:
        o = self.objects.get(oid)
        if o is None:
            return
        o.count -= n
        if o.count <= 0 and o.data is not None:
            self._free(oid, o)

    def _free(self, oid: bytes, o: Obj) -> None:
        del self.objects[oid]
        if oid in self.actor_table.actors:   # the last handle of an actor is gone
            self.actor_table.handles_gone(oid)
            return
        data = o.data
        if data.WhichOneof("data") == "segment":
            self._free_segment(data.segment)
            if o.copies:
                for seg in o.copies.values():
                    self._free_segment(seg)
        for cid in data.contained:
            self._decr(cid)

    # ------------------------------------------------------------------ placement groups
    def _cancelled_error(self, t: Task) -> bytes:
        """The error of a cancelled task: killed with its placement group, or cancel()."""
        doomed = self.groups.doomed.pop(t.call.task_id, None) if self.groups.doomed else None
        return doomed or self.error("cancelled", name=t.call.name)

    def kill_actor(self, actor_id: bytes, reason: str) -> None:
        """Stop the actor for good (no restart), saying why."""
        self.actor_table.kill(actor_id, True, reason=reason)

    def actors_in_group(self, group_id: bytes) -> list[bytes]:
        """The ids of the live actors created in that placement group."""
        out = []
        for aid, a in self.actor_table.actors.items():
            p = a.creation.placement
            if p is not None and p[0] == PLACEMENT_GROUP and a.state is not ActorState.DEAD \
                    and a.creation.call.placement.group_id == group_id:
                out.append(aid)
        return out

    def group_unplaceable(self, t: Task) -> bytes | None:
        """The error of a task whose placement group is gone or cannot hold it."""
        return self.groups.unplaceable(t)

    def seal(self, oid: bytes, data: Any) -> None:
        """The object ``oid`` is made: push it to its owner and subscribers."""
        self._seal(oid, data)

    def drop_hold(self, oid: bytes) -> None:
        """One count of ``oid`` is gone (freed at zero)."""
        self._decr(oid)

    # ------------------------------------------------------------------ placement
    def node_order(self, t: Task) -> list[Node]:
        """The nodes where ``t``'s request fits now and its strategy allows, best first."""
        return self.placer.order(t)

    def unplaceable(self, t: Task) -> bytes | None:
        """The error of a task whose strategy names a node that cannot take it, ever."""
        return self.placer.unplaceable(t)

    def placed_on(self, t: Task, node_id: int) -> None:
        """``t`` took resources on ``node_id`` (the next SPREAD turn starts after it)."""
        self.placer.placed(t, node_id)

    # ------------------------------------------------------------------ queries
    def total_resources(self) -> dict[str, float]:
        total: dict[str, float] = {}
        for n in self.nodes.values():
            for k, v in n.resources.total.items():
                total[k] = total.get(k, 0.0) + v
        return total

    def available_resources(self) -> dict[str, float]:
        avail: dict[str, float] = {}
        for n in self.nodes.values():
            for k, v in n.resources.free.items():
                avail[k] = avail.get(k, 0.0) + max(v, 0.0)
        return avail


def _holds(o: Obj | None, segment: Any) -> bool:
    """Whether ``segment`` is where object ``o`` lives now, or a copy of it."""
    if o is None or o.data is None:
        return False
    key = (segment.node_id, segment.path or segment.name)
    if o.data.WhichOneof("data") == "segment":
        own = o.data.segment
        if (own.node_id, own.path or own.name) == key:
            return True
    copies = o.copies or {}
    return any((c.node_id, c.path or c.name) == key for c in copies.values())


def _default_error(kind: str, **details: Any) -> bytes:
    return repr((kind, sorted(details.items()))).encode()
