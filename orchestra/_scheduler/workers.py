"""The cluster's worker processes, for the scheduler core: which worker takes a ready
task, when a node starts one more, and when one is let go. No I/O.

    schedule() --> pick(task): one node, no strategy (the hot path): the first idle
        worker that fits, else pipelining behind a busy one of the same shape (up to
        pipeline_depth), else a worker started (maybe_grow) | several nodes or a
        strategy: pick_placed, in Placer.order
    a worker at a function's max_calls --> count_call: retiring --> retire: stopped
        (SHUTDOWN, then StopWorker) and replaced
    idle with nothing ready --> steal_for: tasks pipelined elsewhere asked back (STEAL)

``WorkerPool`` decides; SchedulerState owns the tables (workers, nodes) and calls it.
"""
from __future__ import annotations

from collections.abc import Iterable

from .blocking import Blocking
from .instructions import ReturnTasks, Shutdown, StartWorker, StopWorker
from .loans import Loans
from .model import Client, Node, SchedulerCore, Task, Worker, WorkerState
from .placement import Placer, hard_node

RETIRING = (("@retiring", 1.0),)   # the grant shape of a worker at max_calls (no task's)


class WorkerPool:
    """Which worker runs what (see the module docstring)."""

    def __init__(self, core: SchedulerCore, loans: Loans, placer: Placer, blocking: Blocking) -> None:
        self.core = core
        self.loans = loans
        self.placer = placer
        self.blocking = blocking
        self._next_id = 1
        self.first = 1

    def start(self, node_id: int) -> Worker:
        w = Worker(self._next_id, node_id)
        self._next_id += 1
        self.core.workers[w.worker_id] = w
        self.core.out.append(StartWorker(node_id, w.worker_id))
        return w

    def first_id(self, worker_id: int) -> None:
        """Workers started from now on get ids from ``worker_id`` up: a restarted head
        starts above the ids of every head before it, so a worker that outlived one
        keeps its id (ActorTable.adopt)."""
        self._next_id = max(self._next_id, worker_id)
        self.first = worker_id   # ids below it are the heads' before (adopt)

    def of_before(self, worker_id: int) -> bool:
        """Whether ``worker_id`` is one a head before this one gave (with a state store:
        first_id), and no worker here has it."""
        return worker_id < self.first and worker_id not in self.core.workers

    def adopt(self, worker_id: int, node_id: int) -> Worker:
        """A worker this head did not start (it outlived the head before), STARTING:
        its connection is being accepted."""
        w = Worker(worker_id, node_id)
        self.core.workers[worker_id] = w
        return w

    def pool(self, node_id: int) -> list[Worker]:
        """The node's task workers (dedicated actor workers do not count)."""
        return [w for w in self.core.workers.on_node(node_id) if w.actor is None]

    def idle_on(self, node_id: int) -> int:
        return len(self.core.workers.idle_by_node.get(node_id, ()))

    def release_grant(self, w: Worker) -> None:
        if w.grant:
            node = self.core.nodes.get(w.node_id)
            if node is not None:
                grant = w.grant
                if w.state is WorkerState.BLOCKED:  # its CPU was already lent back
                    grant = {k: v for k, v in grant.items() if k != "CPU"}
                node.resources.release(grant, w.gpu_ids)
        w.grant = {}
        w.grant_shape = ()
        w.gpu_ids = []

    def pick(self, t: Task) -> Worker | None:
        if len(self.core.nodes) > 1 or t.placement is not None:
            return self.pick_placed(t)
        # One node, no strategy (the hot path): the first idle worker.
        req = t.resources
        candidates = []
        for w in self.core.workers.values():
            st = w.state
            if st is WorkerState.IDLE:
                # (None: a worker of a node being removed, not yet dead here: remove_node
                # ends its workers one by one, and each death schedules)
                node = self.core.nodes.get(w.node_id)
                if node is not None and node.resources.fits(req):
                    w.grant = req
                    w.grant_shape = t.shape
                    w.gpu_ids = node.resources.acquire(req)
                    w.state = WorkerState.BUSY
                    if self.core.lending and w.actor is None and not t.call.retry_exceptions \
                            and not t.call.max_calls:   # (its worker may retire: never lent)
                        self.loans.fresh.append((t.owner, w))
                    return w
            elif st is WorkerState.BUSY and w.grant_shape == t.shape and w.lent_to is None \
                    and not w.nested:   # tasks queued there would wait for its whole stack
                candidates.append(w)
        if req and any(n.resources.fits(req) for n in self.core.nodes.values()):
            # Resources are free, only a worker is missing (starting, or replacing a dead
            # one): wait for it. Pipelining now could queue the task behind a long-running
            # one for as long as that runs, with a CPU idle. (A task that holds nothing
            # always "fits": it pipelines, or it would start workers up to max_workers.)
            self.maybe_grow(t)
            return None
        best = self.least_queued(candidates)
        if best is None:
            self.maybe_grow(t)
        return best

    def least_queued(self, candidates: list[Worker]) -> Worker | None:
        """The busy worker with the fewest tasks queued, below the pipeline depth."""
        best = None
        for w in candidates:
            if len(w.queue) < self.core.pipeline_depth and (best is None or len(w.queue) < len(best.queue)):
                best = w
        return best

    def pick_placed(self, t: Task) -> Worker | None:
        """_pick_worker with several nodes, or a strategy: an idle worker on the first node
        of Placer.order that has one or can start one (then it waits for that one), else
        pipelining behind a busy worker of the same shape on a node the strategy allows.
        None: it waits, or it failed (hard affinity to a node gone from the cluster)."""
        err = self.placer.unplaceable(t)
        if err is not None:
            self.core.fail_task(t, err)
            return None
        req = t.resources
        only = hard_node(t)
        workers = self.core.workers
        for node in self.placer.ordered(t):
            took = workers.idle_on(node.node_id)   # (the table's index: no scan)
            if took is not None:
                took.grant = req
                took.grant_shape = t.shape
                took.gpu_ids = node.resources.acquire(req)
                took.state = WorkerState.BUSY
                self.placer.placed(t, node.node_id)
                if self.core.lending and took.actor is None and not t.call.retry_exceptions \
                        and not t.call.max_calls:
                    if t.placement is None:
                        self.loans.fresh.append((t.owner, took))
                    elif only == took.node_id:   # bound to this node: lent for those
                        self.loans.fresh_pinned.append((t.owner, took))
                return took
            if req and self.can_grow(node):
                # Resources are free there, only a worker is missing: wait for it (as on
                # one node, see _pick_worker), rather than pipeline behind a long task.
                self.maybe_grow(t, [node])
                return None
        # No node in order takes it now: the busy worker of its shape with the fewest
        # tasks queued below the pipeline depth (least_queued's choice), where allowed,
        # from the table's pipelining index.
        best = workers.pipeline_pick(t.shape, self.core.pipeline_depth, only)
        if best is None:
            self.maybe_grow(t, self.placer.order(t))
        return best

    def can_grow(self, node: Node) -> bool:
        """The node has a task worker starting, or room for one more."""
        mine = self.pool(node.node_id)
        return any(w.state is WorkerState.STARTING for w in mine) or len(mine) < node.max_workers

    def maybe_grow(self, t: Task, nodes: Iterable[Node] | None = None) -> None:
        """Start a worker when a ready task fits a node that has no idle or starting one:
        the first of ``nodes`` (the task's placement order) where it fits, or of all."""
        if t.depth and self.blocking.defer_growth(t):
            return
        for node in self.core.nodes.values() if nodes is None else nodes:
            if not node.resources.fits(t.resources):
                continue
            mine = self.pool(node.node_id)
            if any(w.state in (WorkerState.STARTING, WorkerState.IDLE) for w in mine):
                return
            if len(mine) < node.max_workers:
                self.start(node.node_id)
            return

    def count_call(self, w: Worker, function_id: bytes, max_calls: int) -> None:
        """``w`` ran a call of a function with max_calls=: at the limit it retires, and
        the tasks queued there that have not started are asked back (STEAL)."""
        calls = w.calls if w.calls is not None else {}
        w.calls = calls
        n = calls[function_id] = calls.get(function_id, 0) + 1
        if n >= max_calls and not w.retiring:
            w.retiring = True
            w.grant_shape = RETIRING   # no task has this shape: none is pipelined there
            if w.queue:
                ids = [t.call.task_id for t in w.queue]
                self.core.out.append(ReturnTasks(w.conn, ids))

    def retire(self, w: Worker) -> None:
        """A worker at a function's max_calls: once its queue is empty, stop it and
        start a fresh one in its place."""
        if w.queue or w.state is WorkerState.DEAD or w.lent_to is not None:
            return   # (a lent worker retires once given back: return_loan steps it here)
        self.release_grant(w)
        w.state = WorkerState.DEAD
        del self.core.workers[w.worker_id]
        self.stop(w)
        node = self.core.nodes.get(w.node_id)
        if node is not None and len(self.pool(w.node_id)) < max(node.num_cpus, 1):
            self.start(w.node_id)

    def stop(self, w: Worker) -> None:
        """End an idle worker the scheduler let go: it exits by itself once it has sent
        what it buffered (its task events: a worker killed outright took the last half
        second of them along, and its tasks showed as never run or as WORKER_DIED)."""
        self.core.out.append(Shutdown(w.conn))
        self.core.out.append(StopWorker(w.node_id, w.worker_id))

    def steal_for(self, idle: Worker) -> None:
        """A worker is idle and nothing is ready: take back tasks pipelined behind a
        running one elsewhere, so a quick task never waits for a long one ahead of it."""
        for v in self.core.workers.on_node(idle.node_id):
            if v.state is WorkerState.BUSY and v.actor is None \
                    and len(v.queue) > 1 and v.lent_to is None:
                ids = [t.call.task_id for t in list(v.queue)[1:]]
                self.core.out.append(ReturnTasks(v.conn, ids))

    def worker_address(self, conn: int, address: str) -> None:
        """The worker on ``conn`` takes direct calls over TCP at ``address``."""
        c = self.core.clients.get(conn)
        if c is not None and c.worker is not None:
            c.worker.address = address

    def direct_path(self, w: Worker, c: Client) -> str:
        """Where client ``c`` reaches worker ``w`` for direct calls: its unix socket on
        one node, its TCP address across nodes; "" when there is none (the head's path)."""
        if self.core.worker_socket is None:
            return ""
        if c.node_id == w.node_id:
            return self.core.worker_socket(w.node_id, w.worker_id)
        return w.address
