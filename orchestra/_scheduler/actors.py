"""Actors in the scheduler: placement, call order, death, restarts, names. No I/O.

    create_actor -> PENDING (waiting for resources) -> STARTING (dedicated worker starts,
    constructor runs) -> ALIVE -> (process died, restarts left) RESTARTING -> ALIVE
                                -> (killed, crashed for good, constructor raised,
                                    last handle gone) DEAD

Calls queue per actor in the order the head receives them (one connection per caller,
so each caller's order holds) and go to the actor's worker as soon as their arguments
exist and the actor is alive; the worker runs them one at a time, or up to
max_concurrency at once. A call in flight when the process dies fails with
ActorDiedError; later calls reach the restarted instance.

The actor id is also a pseudo-object that every handle holds: when its count drops to
zero an unnamed actor finishes the calls it has and is stopped.
"""
from __future__ import annotations

import collections
import enum

from .call import PLACEMENT_GROUP, ActorSpec, Call
from .data import error_of, inline
from .durable import actor_gone, actor_kept
from .events import TaskDone
from .instructions import ActorAddress, KillWorker
from .lineage import wait_for_made_again
from .model import SchedulerCore, Task, TaskState, Worker, WorkerState
from .objects import ObjectDirectory

ACTOR_SHAPE = (("__actor__", 1.0),)   # a grant shape no task has: no task is pipelined there


class ActorState(enum.Enum):
    PENDING = "pending"
    STARTING = "starting"
    ALIVE = "alive"
    RESTARTING = "restarting"
    DEAD = "dead"


def _made_by(task: Task) -> bytes:
    """The id of the actor that constructor ``task`` makes."""
    spec = task.call.actor
    assert spec is not None, "a constructor's call names its actor"
    return spec.actor_id


class Actor:
    __slots__ = ("spec", "creation", "state", "worker", "restarts", "revived", "queue", "death",
                 "no_restart", "draining", "owner", "killing", "handled", "cause",
                 "owner_key")

    def __init__(self, spec: ActorSpec, creation: Task, owner: int) -> None:
        self.spec = spec
        self.creation = creation
        self.state = ActorState.PENDING
        self.worker: Worker | None = None
        self.restarts = 0
        self.revived = 0   # of the restarts, by a restarted head (not against max_restarts)
        self.queue: collections.deque[Task] = collections.deque()
        self.death: bytes | None = None       # pickled ActorDiedError once dead
        self.cause = ""                       # why it died, in words (the dashboard's)
        self.no_restart = False
        self.draining = False
        self.owner = owner
        # A non-detached actor kept by the head's state store: its driver's key
        # (Hello.driver_key), under which that driver claims it after a restart.
        self.owner_key = b""
        self.killing = False    # a kill was sent to its worker, whose death is not seen yet
        # Calls of each connection that left the queue (sent to the worker, or failed),
        # over the actor's life: told to callers with its address (ActorAddress).
        self.handled: dict[int, int] = {}


class ActorTable:
    def __init__(self, state: SchedulerCore, directory: ObjectDirectory) -> None:
        self.s = state
        self.directory = directory   # each actor's handle is a pseudo-object there
        self.actors: dict[bytes, Actor] = {}
        self.names: dict[tuple[str, str], bytes] = {}   # (namespace, name) -> actor id
        self.pending: list[Actor] = []
        # Detached actors a restarted head made again whose process ran on a joined node:
        # actor id -> that node's id. Not placed until released (release_awaiting), so
        # that their process, if it outlived the head, is taken back (adopt); what each
        # holds on its node is kept for it once the node is there (reserve: actor id ->
        # its GPU ids), so nothing placed meanwhile takes its place.
        self.awaiting: dict[bytes, int] = {}
        self.reserved: dict[bytes, list[int]] = {}
        # A head with a state store keeps the non-detached actors drivers make too
        # (keep_owned); a restarted head made those again held by itself until their
        # driver connects again (claim: actor id -> that driver's key), or stops them
        # once the drivers' reconnect time is over (expire_unclaimed).
        self.keep_owned = False
        self.unclaimed: dict[bytes, bytes] = {}

    # ------------------------------------------------------------------ creation
    def create(self, conn: int, call: Call, task: Task) -> ActorSpec | None:
        """Raises ValueError for a name taken in its namespace (the head answers the
        request with it); with get_if_exists, the live actor's spec (nothing made)."""
        spec = call.actor
        assert spec is not None, "a constructor's call names its actor"
        if not spec.namespace:
            spec.namespace = self.namespace_of(conn)
        key = (spec.namespace, spec.name)
        if spec.name and key in self.names:
            if spec.get_if_exists:
                return self.actors[self.names[key]].spec
            raise ValueError(f"the actor name {spec.name!r} is already taken in namespace "
                             f"{spec.namespace!r}: names are unique among live actors of a "
                             "namespace; pick another, get_actor() the existing one, or pass "
                             "get_if_exists=True")
        a = Actor(spec, task, conn)
        a.restarts = spec.restart_count   # > 0: a restarted head's restore (durable.py)
        if self.keep_owned and not spec.detached and call.placement is None:
            # (a group a driver made is not kept: nor are the actors placed in one)
            c = self.s.clients.get(conn)
            a.owner_key = c.key if c is not None and c.kind == "driver" else b""
        self.actors[spec.actor_id] = a
        if spec.name:
            self.names[key] = spec.actor_id
        self._keep(a)
        token = self.directory.new_object(conn, spec.actor_id)   # the handle's pseudo-object
        token.data = inline(spec.actor_id, b"")
        return None

    def restored(self, actor_id: bytes, revived: int, owner_key: bytes = b"") -> None:
        """A restarted head made the actor again (_scheduler/durable.py): ``revived``
        of its restarts so far were such, and do not count against max_restarts; a
        non-detached one (``owner_key``) waits for its driver (claim)."""
        a = self.actors.get(actor_id)
        if a is not None and a.state is not ActorState.DEAD:
            a.revived = revived
            if owner_key and not a.spec.detached:
                a.owner_key = owner_key
                self.unclaimed[actor_id] = owner_key
            self._keep(a)

    def _keep(self, a: Actor) -> None:
        """A detached actor's record, or a kept non-detached one's, as it is now, for the
        state store. Not while it waits for its process (awaiting): the store holds its
        record as the head before left it (its node, its restarts), which a head killed
        meanwhile must find again; the restore's own figures (a restart counted, no node
        yet) are written once the wait ends, by adopt or by a placement."""
        if a.spec.actor_id in self.awaiting:
            return
        if a.spec.detached or a.owner_key:
            call = a.creation.call
            self.s.out.append(actor_kept(call, a.restarts, a.revived,
                                         self.s.functions.get(call.function_id),
                                         a.worker.node_id if a.worker is not None else 0,
                                         a.owner_key))

    def claim(self, conn: int, key: bytes) -> list[bytes]:
        """A driver connected to a restarted head with ``key``: the non-detached actors
        it made before are its again (they die with it), and so is the hold of their
        handles the head kept for it meanwhile (its count unchanged). Their ids."""
        c = self.s.clients.get(conn)
        mine = [aid for aid, k in self.unclaimed.items() if k == key]
        for aid in mine:
            del self.unclaimed[aid]
            a = self.actors.get(aid)
            if a is None or a.state is ActorState.DEAD or c is None:
                continue
            before = self.s.clients.get(a.owner)
            if before is not None and before.holds.get(aid, 0) > 0:
                before.holds[aid] -= 1
                if not before.holds[aid]:
                    del before.holds[aid]
                c.holds[aid] += 1
            a.owner = conn
        return mine

    def expire_unclaimed(self, wait_s: float) -> list[bytes]:
        """The drivers' time to connect to the restarted head is over: the non-detached
        actors no driver claimed are stopped, as their driver's exit stops them."""
        gone, self.unclaimed = list(self.unclaimed), {}
        for aid in gone:
            a = self.actors.get(aid)
            if a is not None and a.state is not ActorState.DEAD:
                self._stop(a, f"the driver that created it did not connect again within "
                              f"{wait_s:g} s of the head's restart")
        return gone

    def adopt(self, actor_id: bytes, worker_id: int, node_id: int) -> Worker:
        """A worker that outlived a restart of the head still serves ``actor_id`` on
        node ``node_id``: it becomes the actor's process again, state kept (the restart
        the restore counted is taken back). ValueError when it cannot be: the actor was
        made again meanwhile (or is no detached actor this head knows), or its node
        cannot hold it; the worker then exits."""
        a = self.actors.get(actor_id)
        s = self.s
        node = s.nodes.get(node_id)
        if a is None or self.awaiting.get(actor_id) != node_id or a.state is not ActorState.PENDING:
            raise ValueError(f"actor {actor_id.hex()} is not waiting for its process on node "
                             f"{node_id}: made again, or not kept")
        req = a.creation.resources
        if node is None or worker_id in s.workers or a.creation.placement is not None \
                or (actor_id not in self.reserved and not node.resources.fits(req)):
            raise ValueError(f"node {node_id} cannot take actor {actor_id.hex()} back")
        del self.awaiting[actor_id]
        w = s.adopt_worker(worker_id, node_id)
        w.actor = a
        w.grant = dict(req)
        w.grant_shape = ACTOR_SHAPE
        gpus = self.reserved.pop(actor_id, None)
        w.gpu_ids = node.resources.acquire(req) if gpus is None else gpus
        a.worker = w
        a.state = ActorState.ALIVE
        a.restarts -= 1
        a.revived -= 1
        a.spec.restart_count = a.restarts
        s.tasks.pop(a.creation.call.task_id, None)   # it keeps its arguments for restarts
        a.creation.state = TaskState.DONE
        self._keep(a)
        return w

    def reserve(self, node_id: int) -> None:
        """Node ``node_id`` is there: keep what the actors waiting for their process on
        it hold (as far as it fits)."""
        node = self.s.nodes.get(node_id)
        for actor_id, nid in self.awaiting.items():
            a = self.actors.get(actor_id)
            if nid == node_id and node is not None and a is not None \
                    and actor_id not in self.reserved and node.resources.fits(a.creation.resources):
                self.reserved[actor_id] = node.resources.acquire(a.creation.resources)

    def release_awaiting(self) -> None:
        """The wait for processes that outlived the head is over: the actors still
        waiting are placed as new instances."""
        waiting, self.awaiting = self.awaiting, {}
        for actor_id, node_id in waiting.items():
            gpus = self.reserved.pop(actor_id, None)
            node = self.s.nodes.get(node_id)
            a = self.actors.get(actor_id)
            if gpus is not None and node is not None and a is not None:
                node.resources.release(a.creation.resources, gpus)
        for actor_id in waiting:
            a = self.actors.get(actor_id)
            if a is not None and a.state is ActorState.PENDING and a.worker is None \
                    and not a.creation.deps:
                self.creation_deps_met(a.creation)

    def namespace_of(self, conn: int) -> str:
        """The namespace a connection acts in: a driver's own; a worker's, that of the
        driver whose task it runs (through tasks of tasks); an actor's, its own."""
        s = self.s
        for _ in range(256):   # a chain of owners, never a cycle; bounded all the same
            c = s.clients.get(conn)
            if c is None:
                return ""
            w = c.worker
            if w is None:
                return c.namespace
            if w.actor is not None:
                return w.actor.spec.namespace
            if w.queue:
                conn = w.queue[0].owner
            elif w.lent_to is not None:
                conn = w.lent_to
            else:
                return ""
        return ""

    def creation_deps_met(self, task: Task) -> None:
        aid = _made_by(task)
        a = self.actors.get(aid)
        if a is None or a.state is ActorState.DEAD or aid in self.awaiting:
            return
        w = a.worker
        if w is not None and w.state is WorkerState.BUSY and not w.queue:
            # Its restarted process waited for an argument made again: it is back.
            task.state = TaskState.READY
            self.s.dispatch(task, w)
            return
        if not self._place(a):
            self.pending.append(a)

    def creation_failed(self, task: Task, blob: bytes,
                        cause: str = "it could not be placed: no node can hold it") -> None:
        """The creation task failed before placement (no node can ever hold it, an
        argument lost): the actor is dead with ``blob``, the error its calls raise."""
        a = self.actors.get(_made_by(task))
        if a is not None and a.state is not ActorState.DEAD:
            a.no_restart = True
            self._die(a, blob, cause)

    def _place(self, a: Actor) -> bool:
        """Start its dedicated worker on the best node that holds its request now; False:
        none does (it waits). True also when it died here: its strategy names a node
        that cannot take it, ever."""
        s = self.s
        task = a.creation
        req = task.resources
        if len(s.nodes) > 1 or task.placement is not None:
            err = s.unplaceable(task)
            if err is not None:
                self._die(a, err, "it could not be placed: its strategy names a node that "
                                  "cannot hold it")
                return True
            nodes = s.node_order(task)
        else:
            nodes = list(s.nodes.values())
        for node in nodes:
            if node.resources.fits(req):
                w = s.start_worker(node.node_id)
                w.actor = a
                w.grant = dict(req)
                w.grant_shape = ACTOR_SHAPE
                w.gpu_ids = node.resources.acquire(req)
                a.worker = w
                a.state = ActorState.STARTING if a.restarts == 0 else ActorState.RESTARTING
                if task.placement is not None:
                    s.placed_on(task, node.node_id)
                self._keep(a)   # where it runs now
                return True
        return False

    def place_pending(self) -> None:
        if self.pending:
            waiting, self.pending = self.pending, []
            for a in waiting:
                if a.state is not ActorState.DEAD and not self._place(a):
                    self.pending.append(a)

    def worker_connected(self, w: Worker) -> None:
        """The dedicated worker is up: run the constructor there (or, taken back after a
        restart of the head, its calls)."""
        a = w.actor
        assert a is not None
        w.state = WorkerState.BUSY
        if a.state is ActorState.ALIVE:   # adopt()ed
            self.pump(a)
            return
        t = a.creation
        if wait_for_made_again(t, self.s.objects):
            t.state = TaskState.WAITING   # an argument lost with its node: once it is back
            return
        t.state = TaskState.READY
        self.s.dispatch(t, w)

    # ------------------------------------------------------------------ calls
    def submit_call(self, t: Task) -> None:
        a = self.actors.get(t.call.actor_id)
        if a is None or a.state is ActorState.DEAD:
            self.s.fail_task(t, a.death if a is not None and a.death else self.s.error(
                "actor_dead", name=t.call.name, reason="no such actor in this cluster"))
            return
        a.queue.append(t)
        if not t.deps:
            self.pump(a)

    def call_deps_met(self, t: Task) -> None:
        a = self.actors.get(t.call.actor_id)
        if a is not None:
            self.pump(a)

    def pump(self, a: Actor) -> None:
        """Send the calls at the head of the queue whose arguments exist, in order."""
        if a.state is not ActorState.ALIVE or a.worker is None:
            return
        q = a.queue
        callers: set[int] = set()
        while q and not q[0].deps:
            t = q.popleft()
            a.handled[t.owner] = a.handled.get(t.owner, 0) + 1
            if t.state is TaskState.DONE:
                continue
            t.state = TaskState.READY
            self.s.dispatch(t, a.worker)
            callers.add(t.owner)
        if callers:
            self._tell_address(a, callers)

    def _tell_address(self, a: Actor, callers: set[int]) -> None:
        """Give callers the socket of the actor's process once their calls through the
        head are all sent there: their later calls are direct calls (written after the
        Executes, so a direct call never overtakes one sent through the head)."""
        s = self.s
        w = a.worker
        if s.worker_socket is None or w is None:
            return
        waiting = {t.owner for t in a.queue}
        for conn in callers - waiting:
            c = s.clients.get(conn)
            # A caller on another node calls over TCP, once the worker said where (else
            # through the head).
            path = s.direct_path(w, c) if c is not None else ""
            if c is not None and c.kind in ("driver", "worker") and path:
                s.out.append(ActorAddress(conn, a.spec.actor_id, w.worker_id, path,
                                          a.handled.get(conn, 0)))

    def remove_call(self, t: Task) -> None:
        a = self.actors.get(t.call.actor_id)
        if a is not None and t in a.queue:
            a.queue.remove(t)
            a.handled[t.owner] = a.handled.get(t.owner, 0) + 1

    def creation_done(self, w: Worker, msg: TaskDone) -> None:
        a = w.actor
        if a is None:
            return
        if msg.user_error:   # the constructor raised: dead for good, with its error
            blob = error_of(msg.returns[0]) if msg.returns else self.s.error(
                "actor_dead", name=a.spec.class_name, reason="its constructor failed")
            a.no_restart = True
            self._die(a, blob, "its constructor raised")
            self.s.out.append(KillWorker(w.node_id, w.worker_id, "the actor's constructor raised"))
            return
        if a.killing or a.state is ActorState.DEAD:
            # killed while its constructor ran (calls wait for the death), or stopped
            # then (its driver gone, its last handle dropped): it stays dead
            return
        a.state = ActorState.ALIVE
        self.pump(a)

    def call_done(self, w: Worker) -> None:
        a = w.actor
        if a is not None and a.draining and not a.queue and not w.queue:
            self._stop(a, "no handle to it is left")

    # ------------------------------------------------------------------ death
    def worker_died(self, w: Worker, reason: str) -> None:
        a = w.actor
        if a is None or a.worker is not w:
            return
        a.worker = None
        a.killing = False
        inflight = [t for t in w.queue if t is not a.creation]
        w.queue.clear()
        name = a.spec.class_name
        limit = a.spec.max_restarts
        restarts = a.state is not ActorState.DEAD and not a.no_restart and not a.draining \
            and (limit < 0 or a.restarts - a.revived < limit)
        retried = []
        for t in inflight:
            t.worker = None
            if restarts and t.retries_left != 0 and t.state is not TaskState.DONE:
                # max_task_retries=: run it again on the restarted instance, first
                # (once an argument made again since it was sent is back).
                t.spend_retry()
                if wait_for_made_again(t, self.s.objects):
                    t.state = TaskState.WAITING
                retried.append(t)
                continue
            # Named for the actor (not "actor Counter.inc is dead") and its process.
            self.s.fail_task(t, self.s.error(
                "actor_dead", name=name,
                reason=f"its process (pid={w.pid}) died while running {t.call.name}() ({reason})"))
        for t in reversed(retried):
            a.queue.appendleft(t)
            a.handled[t.owner] = a.handled.get(t.owner, 0) - 1   # sent again: counted again
        if a.state is ActorState.DEAD:
            return
        if restarts:
            a.restarts += 1
            # The new instance learns it is one (was_current_actor_reconstructed()).
            a.spec.restart_count = a.restarts   # (the spec of its constructor's call)
            a.creation.state = TaskState.READY
            self._keep(a)
            if not self._place(a):
                a.state = ActorState.RESTARTING
                self.pending.append(a)
            return
        if a.no_restart:
            self._die(a, self.s.error("actor_dead", name=name, reason=reason), reason)
        else:
            self._die(a, self.s.error("actor_dead", name=name, reason=reason,
                                       restarts=a.restarts - a.revived, max_restarts=limit),
                      f"{reason} (after {a.restarts - a.revived} restart(s) of {limit})")

    def _release_name(self, a: Actor) -> None:
        key = (a.spec.namespace, a.spec.name)
        if a.spec.name and self.names.get(key) == a.spec.actor_id:
            del self.names[key]

    def _die(self, a: Actor, blob: bytes, cause: str) -> None:
        a.state = ActorState.DEAD
        if a.spec.detached or a.owner_key:
            self.s.out.append(actor_gone(a.spec.actor_id))
        node_id = self.awaiting.pop(a.spec.actor_id, None)
        if node_id is not None:   # restored, waiting for its process: what was kept goes
            gpus = self.reserved.pop(a.spec.actor_id, None)
            node = self.s.nodes.get(node_id)
            if gpus is not None and node is not None:
                node.resources.release(a.creation.resources, gpus)
        a.death = blob
        a.cause = cause
        self._release_name(a)
        queued, a.queue = list(a.queue), collections.deque()
        for t in queued:
            self.s.fail_task(t, blob)
        if a in self.pending:
            self.pending.remove(a)
        self.s.finish_task(a.creation)   # release the constructor's arguments

    def _stop(self, a: Actor, reason: str) -> None:
        a.no_restart = True
        w = a.worker
        self._die(a, self.s.error("actor_dead", name=a.spec.class_name, reason=reason), reason)
        if w is not None:
            self.s.out.append(KillWorker(w.node_id, w.worker_id, reason))

    def kill(self, actor_id: bytes, no_restart: bool, reason: str = "") -> None:
        """orchestra.kill(), or (``reason`` given) the actor's own exit_actor()."""
        a = self.actors.get(actor_id)
        if a is None or a.state is ActorState.DEAD:
            return
        a.no_restart = no_restart
        if a.worker is not None:
            # Hold later calls in the queue (pump sends only to ALIVE actors) until the
            # death is seen: sent on to the doomed worker they failed as "in flight",
            # even with no_restart=False and the restarted instance moments away
            # (test_calls_made_right_after_kill_with_no_restart_false_reach_the_new_instance).
            # worker_died then restarts the actor, or _die fails the queue.
            if a.state is ActorState.ALIVE:
                a.state = ActorState.RESTARTING
            a.killing = True
            if no_restart:
                self._release_name(a)   # get_actor() fails as soon as kill() returns
                if a.spec.detached or a.owner_key:   # nor a restarted head again
                    self.s.out.append(actor_gone(a.spec.actor_id))
            self.s.out.append(KillWorker(a.worker.node_id, a.worker.worker_id,
                                         reason or "killed by orchestra.kill()"))
        elif no_restart or a.state is ActorState.PENDING:
            why = f"{reason or 'killed by orchestra.kill()'} before it started"
            self._die(a, self.s.error("actor_dead", name=a.spec.class_name, reason=why), why)

    def handles_gone(self, actor_id: bytes) -> None:
        a = self.actors.get(actor_id)
        if a is None or a.spec.name or a.state is ActorState.DEAD:
            return   # named actors live until kill() or shutdown
        a.draining = True
        if not a.queue and (a.worker is None or not [t for t in a.worker.queue
                                                      if t is not a.creation]):
            self._stop(a, "no handle to it is left")

    def get(self, name: str, namespace: str = "", conn: int | None = None) -> ActorSpec | None:
        """The spec of the live actor ``name`` in ``namespace`` ("": ``conn``'s own)."""
        if not namespace and conn is not None:
            namespace = self.namespace_of(conn)
        aid = self.names.get((namespace, name))
        if aid is None:
            elsewhere = sorted(ns for ns, n in self.names if n == name)
            hint = (f" (actors of that name live in namespace(s) {', '.join(map(repr, elsewhere))}: "
                    "pass namespace=)") if elsewhere else ""
            raise ValueError(f"no live actor is named {name!r} in namespace {namespace!r}{hint}; "
                             "named actors are created with Cls.options(name=...).remote()")
        return self.actors[aid].spec

    def driver_gone(self, conn: int) -> None:
        """A driver's connection closed: the actors it made die with it, unless detached
        (lifetime="detached"), as in Ray."""
        for a in list(self.actors.values()):
            if a.owner == conn and not a.spec.detached and a.state is not ActorState.DEAD:
                self._stop(a, "the driver that created it exited (pass lifetime=\"detached\" "
                              "to keep an actor past its driver)")

    def in_group(self, group_id: bytes) -> list[bytes]:
        """The ids of the live actors created in that placement group."""
        out = []
        for aid, a in self.actors.items():
            p = a.creation.placement
            if p is not None and p[0] == PLACEMENT_GROUP and a.state is not ActorState.DEAD \
                    and a.creation.call.group_id == group_id:
                out.append(aid)
        return out
