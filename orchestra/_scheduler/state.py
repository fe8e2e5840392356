"""Scheduler state: tasks, workers, clients and nodes, and the event methods of the
whole core. No I/O.

Events come in as method calls (``submit``, ``task_done``, ``worker_died``, ...); the
decisions go out as typed instructions (instructions.py: Send, Push, StartWorker, ...)
appended to ``self.out``, which the head process (_head/head.py) carries out: send a
frame, start or kill a worker on a node, free a segment on a node. Unit tests drive
this class directly.

    client --Submit--> [WAITING deps] --deps sealed--> [READY queue per resource shape]
        --grant/pipeline--> worker queue [DISPATCHED] --TaskDone--> returns sealed
                                                    \\-- worker died --> retry or fail

Helpers, each owning its part and reaching this class only through the SchedulerCore
interface (model.py): ObjectDirectory (objects.py: every object's counts, data, copies
and waiters), WorkerPool (workers.py: which worker takes a task), ActorTable (actors.py),
Blocking (blocking.py: workers blocked in get()), Loans (loans.py: workers lent to
drivers), Placer (placement.py: which node), PlacementGroups (groups.py), Streams
(streams.py: generators' items), Adoption (adoption.py: direct calls handed over).
"""
from __future__ import annotations

import collections
from collections.abc import Callable, Hashable, Iterable
from typing import Any

from .. import _ids
from .actors import ActorTable
from .adoption import Adoption
from .blocking import Blocking
from .call import ActorSpec, Call, FunctionDef
from .data import ERROR, Segment, error_of, error_value
from .events import Hello, TaskDone
from .groups import PlacementGroups
from .instructions import CANCEL_KILL, CancelTask, Execute, Function, Instruction, KillWorker
from .kept import NODE_WAIT_S, KeptObjects
from .lineage import Rebuilds, wait_for_made_again
from .loans import Loans
from .memory import MEMORY_KILL, RetryLater
from .model import (
    TASK_TRANSITIONS,
    Client,
    DeadWorker,
    IllegalTransition,
    Lineage,
    Node,
    Obj,
    Shape,
    Task,
    TaskState,
    Worker,
    WorkerState,
    WorkerTable,
    default_error,
)
from .objects import ObjectDirectory
from .placement import Placer
from .streams import Streams
from .workers import RETIRING, WorkerPool

__all__ = ["TASK_TRANSITIONS", "Client", "IllegalTransition", "Node", "Obj", "SchedulerState",
           "Task", "TaskState", "Worker", "WorkerState"]

_MAX_START_FAILURES = 3


class SchedulerState:
    """All scheduling decisions of the cluster."""

    def __init__(self, *, pipeline_depth: int = 2,
                 error_factory: Callable[..., bytes] | None = None, joinable: bool = False,
                 infeasible_waits: bool = False) -> None:
        self.out: list[Instruction] = []
        self.nodes: dict[int, Node] = {}
        self.workers = WorkerTable()
        self.clients: dict[int, Client] = {}
        self.tasks: dict[bytes, Task] = {}
        # The objects (ObjectDirectory owns the table; _scheduler/objects.py).
        self.directory = ObjectDirectory(self)
        self.objects: dict[bytes, Obj] = self.directory.objects
        self.functions: dict[bytes, FunctionDef] = {}
        # Ready tasks by (-depth, resource shape): deeper tasks first, so the subtasks of
        # tasks blocked in get() run before more of their parents start (which would
        # block too, until no worker is left for anyone: a deadlock).
        self.ready: dict[tuple[Hashable, ...], collections.deque[Task]] = {}
        # No task was made ready since the last schedule() began (deps_met's shortcut):
        # schedule() sets it, enqueue_ready() clears it, nothing else writes it.
        self.settled = False
        self.pipeline_depth = pipeline_depth
        # Builds an object's pickled error, (kind, **details) -> bytes: _objects/errors.py.
        self.error: Callable[..., bytes] = error_factory or default_error
        self.actor_table = ActorTable(self, self.directory)
        self.blocking = Blocking(self)
        self.start_failures = 0   # consecutive worker processes that died before connecting
        self._feasible: dict[Shape, bool] = {}
        # Why recent workers died (worker id -> (pid, reason, whether a task the head sent
        # was running)): direct calls to a dead process may be handed over (adopt_calls).
        self.dead_workers: dict[int, DeadWorker] = {}
        # Where a worker takes direct calls: (node id, worker id) -> its socket; None:
        # callers always go through the head.
        self.worker_socket: Callable[[int, int], str] | None = None
        self.lending = False   # lend idle workers to drivers for their tasks (loans.py)
        self.loans = Loans(self)
        # Which node a task goes to (_scheduler/placement.py); a request no node holds
        # waits if nodes may join, or under the Ray runner (infeasible_waits).
        self.placer = Placer(self, joinable, infeasible_waits)
        self.groups = PlacementGroups(self, self.directory, self.actor_table, joinable,
                                      infeasible_waits)
        self.retry_later = RetryLater(self.requeue,
                                      lambda t: self.fail_task(t, self.groups.cancelled_error(t)))
        self.streams = Streams(self, self.directory)
        self.rebuilds = Rebuilds(self, self.directory)   # results lost, made again (lineage.py)
        self.kept = KeptObjects(self, self.directory, self.rebuilds)   # outlived a head (kept.py)
        self.placer.nodes_of_before, self.placer.node_wait_s = self.kept.nodes, NODE_WAIT_S
        # Direct calls handed over (adoption.py).
        self.adoption = Adoption(self, self.actor_table, self.directory)
        # Which worker runs what, when one starts or goes (_scheduler/workers.py).
        self.worker_pool = WorkerPool(self, self.loans, self.placer, self.blocking)

    # ------------------------------------------------------------------ nodes, workers
    def add_node(self, node_id: int, resources: dict[str, float], *, num_workers: int,
                 max_workers: int, works: bool = True) -> None:
        self.nodes[node_id] = node = Node(node_id, resources, max_workers, num_workers, works)
        self.placer.index.added(node)
        self._feasible.clear()   # a request no node could hold may fit this one
        if self.actor_table.awaiting:   # before anything is placed there
            self.actor_table.reserve(node_id)
        for _ in range(num_workers):
            self.worker_pool.start(node_id)

    def client_connected(self, conn: int, hello: Hello, node_id: int = 0) -> Client:
        c = Client(conn, hello.kind, hello.pid, node_id)
        c.namespace, c.key = hello.namespace, hello.driver_key
        self.clients[conn] = c
        if hello.kind == "worker":
            if hello.resume_actor:   # it outlived a restart of the head (or resume_task)
                self.actor_table.adopt(hello.resume_actor, hello.worker_id, node_id)
            elif hello.resume_task and self.worker_pool.of_before(hello.worker_id):
                self.adopt_worker(hello.worker_id, node_id)   # (its task's: kept.py)
            w = self.workers.get(hello.worker_id)
            if w is None or w.state is not WorkerState.STARTING:
                raise ValueError(f"unknown or duplicate worker id {hello.worker_id}")
            w.conn, w.pid, w.state = conn, hello.pid, WorkerState.IDLE
            c.worker = w
            self.start_failures = 0
            if w.actor is not None:
                self.actor_table.worker_connected(w)
            if hello.resume_task or self.kept.awaited:   # (_scheduler/kept.py)
                self.kept.connected(w, hello.resume_task)
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
            self.directory.decr(oid, n)
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
                w.grant_shape = RETIRING

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
        self.dead_workers[worker_id] = DeadWorker(w.pid, reason, bool(w.queue) and not w.actor, w.node_id)
        self.loans.worker_died(worker_id)
        if len(self.dead_workers) > 1024:
            del self.dead_workers[next(iter(self.dead_workers))]
        self.worker_pool.release_grant(w)
        w.state = WorkerState.DEAD
        self.adoption.worker_gone(worker_id)   # answers it owed the head are lost
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
                    self.fail_task(t, self.groups.cancelled_error(t))
                elif t.retries_left != 0:   # (one the memory monitor killed: later)
                    t.spend_retry()
                    (self.retry_later.hold if reason.startswith(MEMORY_KILL) else self.requeue)(t)
                else:
                    self.fail_task(t, self.error("crashed", name=t.call.name, pid=w.pid,
                                                   reason=reason, attempts=t.attempt))
            elif t.cancelled:   # cancelled while queued there: see return_tasks
                self.fail_task(t, self.groups.cancelled_error(t))
            else:  # never started there: schedule again, no retry spent
                self.requeue(t)
        node = self.nodes.get(w.node_id)
        if node is not None and not was_starting and \
                len(self.worker_pool.pool(w.node_id)) < max(node.num_cpus, 1):
            self.worker_pool.start(w.node_id)   # the pool keeps its size
        self.schedule()

    def remove_node(self, node_id: int, reason: str) -> None:
        """Node ``node_id`` is gone with its store. Its workers' deaths come as their
        connections close (client_disconnected); here: workers that never connected, and
        the objects whose only copy was there (made again from their lineage, or
        ObjectLostError naming the node: _scheduler/lineage.py)."""
        node = self.nodes.pop(node_id, None)
        if node is None:
            return
        self.placer.index.removed(node)
        self._feasible.clear()
        self.groups.node_removed(node_id)
        for w in list(self.workers.on_node(node_id)):
            if w.state is WorkerState.STARTING:
                self.worker_failed_to_start(w.worker_id, f"its node died: {reason}", broken=False)
            else:   # its tasks are retried elsewhere, its actor restarted or dead
                self.worker_died(w.worker_id, f"its node's death ({reason})")
        self.rebuilds.node_lost(node_id, reason)
        self.kept.node_gone(node_id)
        self.schedule()

    # ------------------------------------------------------------------ functions
    def register_function(self, fn: FunctionDef) -> None:
        self.functions.setdefault(fn.function_id, fn)

    # ------------------------------------------------------------------ tasks
    def submit(self, conn: int, call: Call) -> None:
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
                self.directory.new_object(conn, rid)
        if self.kept.active and self.kept.claim(t):   # made again after a head's restart
            return
        if self.hold_args(t):
            if call.actor_id:
                self.actor_table.submit_call(t)
            elif not t.deps:
                self.deps_met(t)

    def create_actor(self, conn: int, call: Call) -> ActorSpec | None:
        """Raises ValueError when the actor's name is taken in its namespace; with
        get_if_exists, returns the live actor's spec instead (nothing is created).
        None: created, or made already: the same request again, made on a restarted
        head that kept the actor (a driver that did not hear the first answer,
        _runtime/verbs.py); the caller then holds its handle, as a creator does."""
        assert call.actor is not None, "a constructor's call names its actor"
        if call.actor.actor_id in self.actor_table.actors:
            self.directory.hold_once(conn, call.actor.actor_id)
            return None
        t = Task(call, conn)
        c = self.clients.get(conn)
        if c is not None and c.worker is not None and t.placement is None and self.groups.groups:
            t = self.groups.capture(t, c.worker) or t
        existing = self.actor_table.create(conn, t.call, t)
        if existing is not None:
            return existing
        self.tasks[call.task_id] = t
        if self.hold_args(t) and not t.deps:
            self.actor_table.creation_deps_met(t)
        return None

    def hold_args(self, t: Task, rebuilds: list[Lineage] | None = None) -> bool:
        """The task holds its arguments; False when it already failed (lost or failed
        argument, infeasible request). ``rebuilds``: the task runs again (Rebuilds.rebuild),
        and an argument freed since is revived; the lineages to run for them are added
        (_scheduler/lineage.py)."""
        call = t.call
        objects = self.objects
        for oid in call.refs:
            t.arg_ids.append(oid)
            arg = objects.get(oid)
            if arg is None and rebuilds is not None:
                arg = self.directory.revive(oid)
                if arg is not None and arg.data is None:
                    assert arg.lineage is not None, "a tomb without a value has a lineage"
                    rebuilds.append(arg.lineage)
            if arg is None:
                lost = self.error("lost", object_id=oid, name=call.name)
                self.fail_task(t, lost)
                if call.actor is not None:
                    self.actor_table.creation_failed(
                        t, lost, f"its constructor's argument {oid.hex()} is lost")
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
                if call.actor is not None:
                    self.actor_table.creation_failed(t, err)
                return False
        if t.deps:
            # An argument that already failed fails the task without running it.
            for oid in t.arg_ids:
                dep = objects.get(oid)
                if dep is not None and dep.data is not None and dep.data.kind == ERROR:
                    self.fail_task(t, dep.data.payload)
                    return False
        return True

    def deps_met(self, t: Task) -> None:
        for oid in t.arg_ids:
            o = self.objects.get(oid)
            if o is not None and o.data is not None and o.data.kind == ERROR:
                self.fail_task(t, o.data.payload)
                return
        if t.call.actor_id:
            self.actor_table.call_deps_met(t)
            return
        if t.call.actor is not None:
            self.actor_table.creation_deps_met(t)
            return
        t.move(TaskState.READY)
        # Behind tasks the last schedule() could not place, it waits for the event that
        # frees a worker (which schedules) instead of a scan of every worker per task.
        behind = self.settled and bool(self.ready.get(t.qkey)) and not (self.loans.loaned
            or self.groups.pending or self.actor_table.pending or self.blocking.waiting_for)
        self.enqueue_ready(t, behind=behind)
        if not behind:
            self.schedule()

    def enqueue_ready(self, t: Task, front: bool = False, behind: bool = False) -> None:
        """Into its ready queue. ``behind``: the caller knows the queue's first could not
        be placed, so the last schedule() still holds (else it must run again)."""
        if not behind:
            self.settled = False
        if self.kept.parking:   # a restarted head waits for the processes of before
            self.kept.park(t)
            return
        q = self.ready.get(t.qkey)
        if q is None:
            q = self.ready[t.qkey] = collections.deque()
            self.ready = dict(sorted(self.ready.items()))   # deepest first
        if front:
            q.appendleft(t)
        else:
            q.append(t)

    def requeue(self, t: Task) -> None:
        """A task sent to a worker runs again (retried, handed back): first in its
        ready queue, or waiting once more for an argument made again since it was sent
        (_scheduler/lineage.py)."""
        t.move(TaskState.READY)
        if wait_for_made_again(t, self.objects):
            t.move(TaskState.WAITING)
        else:
            self.enqueue_ready(t, front=True)

    def schedule(self) -> None:
        """Give ready tasks to workers: idle workers first, then pipelining on the
        workers granted that shape."""
        self.settled = True   # until a task is made ready, each queue's first was looked at
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
                w = self.worker_pool.pick(t)
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

    def dispatch(self, t: Task, w: Worker) -> None:
        t.move(TaskState.DISPATCHED)
        t.worker = w
        t.sent()
        w.queue.append(t)
        call = t.call
        fid = call.function_id
        if fid not in w.functions:
            fn = self.functions.get(fid)
            if fn is not None:
                self.out.append(Function(w.conn, fn))
                w.functions.add(fid)
        objects = self.objects
        # (ready: a task is dispatched only once its ref arguments have data)
        resolved: list[Any] = [objects[oid].data for oid in call.refs]
        if len(self.nodes) > 1:
            self.directory.args_to(w.node_id, resolved)
        self.out.append(Execute(w.conn, call, resolved, w.gpu_ids, t.attempt))

    def task_done(self, conn: int, msg: TaskDone) -> None:
        c = self.clients.get(conn)
        w = c.worker if c is not None else None
        t = self.tasks.get(msg.task_id)
        if w is not None and w.worker_id in self.kept.resumed and self.kept.answered(w, t, msg):
            self.after_worker_step(w)   # a worker of before, its task not attached to it
            return
        if msg.owner and (t is None or w is None or t not in w.queue):
            # A direct call answered through the head (or run again since): adoption.py.
            late = self.adoption.answer_read(w.worker_id if w else 0, msg.task_id)
            for data in msg.returns:   # (late: into its run again's objects, if they live)
                self.directory.seal(data.object_id, data) if late else self.directory.put_for(msg.owner, data)
            if t is None and msg.lineage is not None and len(self.nodes) > 1:
                self.rebuilds.keep(msg.lineage, msg.lineage.max_retries, msg.owner, msg.returns)
            self.after_worker_step(w)
            return
        if w is not None and t is not None and t in w.queue:
            w.queue.remove(t)
            self.workers.may_pipeline(w)
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
        if t is None or t.state is TaskState.DONE:
            self.after_worker_step(w)
            return
        if msg.user_error and t.call.retry_exceptions and not msg.not_retryable \
                and t.retries_left != 0 and not t.cancelled:
            t.spend_retry()
            self.requeue(t)
            self.after_worker_step(w)
            return
        if msg.cancelled:   # the worker's own error when it gave one (see DirectCalls)
            given = error_of(msg.returns[0]) if msg.returns else b""
            self.fail_task(t, given or self.error("cancelled", name=t.call.name))
        else:
            t.move(TaskState.DONE)
            several = len(self.nodes) > 1
            if not t.call.actor_id and (several or t.retries_left != t.call.max_retries):
                # Before its arguments are released: a kept lineage names them, and
                # their freed values leave tombs (_scheduler/objects.py). On one node
                # there is none to keep, and a rebuild's old one goes.
                self.rebuilds.keep(t.call, t.retries_left if several else 0, t.owner,
                                   msg.returns)
            self.finish_task(t)
            for data in msg.returns:
                self.directory.seal(data.object_id, data)
        if t.call.max_calls and w is not None and w.actor is None:
            self.worker_pool.count_call(w, t.call.function_id, t.call.max_calls)
        self.after_worker_step(w, t)

    def after_worker_step(self, w: Worker | None, done: Task | None = None) -> None:
        """``w`` ended a task (``done``, when it ran to its end)."""
        if w is not None:
            self.workers.may_pipeline(w)   # its queue is shorter, or it is back from a loan
        if w is not None and w.actor is not None:
            self.actor_table.call_done(w)
            return
        if w is not None and w.retiring:
            self.worker_pool.retire(w)
            self.schedule()
            return
        if w is not None and not w.queue and w.state is WorkerState.BUSY and w.lent_to is None:
            if done is not None and self.lending and self.loans.lend_after_task(w, done):
                return   # the driver whose task it ran sends it its next ones as direct calls
            self.worker_pool.release_grant(w)
            w.state = WorkerState.IDLE
            if w.waits:   # a resume lost to a cancel: its task has ended all the same
                self.blocking.clear(w)
            node = self.nodes.get(w.node_id)
            size = max(node.num_cpus, 1) if node is not None else 0
            # len(self.workers) first: no list is built per task while the pool is at its
            # size (the common case, on the hot path).
            if len(self.workers) > size and len(self.worker_pool.pool(w.node_id)) > size \
                    and self.worker_pool.idle_on(w.node_id) > 1 and not self.has_ready():
                # Surplus from lending CPUs to blocked tasks: shrink back to the pool size.
                w.state = WorkerState.DEAD
                del self.workers[w.worker_id]
                self.worker_pool.stop(w)
        self.schedule()
        if w is not None and w.state is WorkerState.IDLE and not self.has_ready():
            self.worker_pool.steal_for(w)

    def has_ready(self) -> bool:
        return any(self.ready.values())

    def work_waits(self) -> bool:
        """A task or an actor waits for a worker or resources."""
        return self.has_ready() or bool(self.actor_table.pending)

    def finish_task(self, t: Task) -> None:
        """Release what the task held; it will not run again."""
        self.tasks.pop(t.call.task_id, None)
        for oid in t.arg_ids:
            self.directory.decr(oid)
        t.arg_ids = []

    def fail_task(self, t: Task, error: bytes) -> None:
        if t.call.actor_id:
            self.actor_table.remove_call(t)
        self.unqueue(t)
        self.finish_task(t)
        for rid in t.return_ids:
            self.directory.seal(rid, error_value(rid, error))

    def unqueue(self, t: Task) -> None:
        """Take a task out of the ready queue and its arguments' waits: DONE."""
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
                self.workers.may_pipeline(w)
                if t in w.nested:
                    self.blocking.nested_done(w, t)
            t.worker = None
            t.attempt -= 1
            if t.cancelled:
                # The worker handed it back before our CancelTask reached it, and then
                # ignored the cancel for a task it no longer had: re-queued, it ran.
                self.fail_task(t, self.groups.cancelled_error(t))
                continue
            self.requeue(t)
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
            self.out.append(KillWorker(w.node_id, w.worker_id, CANCEL_KILL))
        else:
            self.out.append(CancelTask(w.conn, t.call.task_id, recursive))

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
            if t.state is TaskState.DONE or t.call.actor is not None:
                continue
            if t.owner == conn:
                n += 1
            elif not own_only:
                c = clients.get(t.owner)
                if c is None or c.kind != "driver":
                    n += 1
        return n

    # ------------------------------------------------------------------ workers (_scheduler/workers.py)
    def start_worker(self, node_id: int) -> Worker:
        """A new worker on the node (StartWorker emitted), STARTING."""
        return self.worker_pool.start(node_id)

    def adopt_worker(self, worker_id: int, node_id: int) -> Worker:
        """A worker this head did not start (it outlived the head before), STARTING."""
        return self.worker_pool.adopt(worker_id, node_id)

    def pool(self, node_id: int) -> list[Worker]:
        """The node's task workers (dedicated actor workers do not count)."""
        return self.worker_pool.pool(node_id)

    def release_grant(self, w: Worker) -> None:
        """Give ``w``'s grant back to its node."""
        self.worker_pool.release_grant(w)

    def direct_path(self, w: Worker, c: Client) -> str:
        """Where client ``c`` reaches worker ``w`` for direct calls ("" when it cannot)."""
        return self.worker_pool.direct_path(w, c)

    # ------------------------------------------------------------------ objects (_scheduler/objects.py)
    def relocate(self, oid: bytes, segment: Segment) -> bool:
        """The store spilled the object's segment to a file (False: not that object's)."""
        return (self.kept if oid in self.kept.held else self.directory).relocate(oid, segment)

    def handles_gone(self, oid: bytes) -> bool:
        """The last count of ``oid`` is gone: True for an actor's handle (the actor ends)."""
        found = oid in self.actor_table.actors
        if found:
            self.actor_table.handles_gone(oid)
        return found

    # ------------------------------------------------------------------ placement groups
    def group_unplaceable(self, t: Task) -> bytes | None:
        """The error of a task whose placement group is gone or cannot hold it."""
        return self.groups.unplaceable(t)

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
