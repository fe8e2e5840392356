"""The scheduler core under random interleavings (Hypothesis state machine).

Rules are the events the head feeds SchedulerState from several clients at once:
submits from two drivers (with ref arguments; chains whose driver keeps only the last
ref), results registered pending before their
task comes through the head (a driver's direct call that escaped), puts, drops,
task ends (a value, a user error, or a large result in its node's store), workers that
block in get() and resume, workers that die and connect, and a second node that dies
(its results made again by their tasks, freed arguments revived from their lineage) and
joins again. After every step the invariants are the promises:

- every task the scheduler holds either runs, is queued for a worker, or waits for an
  object that something will still make (its task is held, or a driver registered it);
- no object is freed while a driver's ref, or a task that is not done, holds it;
- each driver's count of an object at the head is the number of refs it holds;
- a task the scheduler ended has its result sealed (a value, or an error);
- the kept lineages count what they name, and a tomb lives while one names it.

``drain`` (also run at the end) connects every worker, resumes every blocked one and
finishes whatever runs until nothing is left: every task must end. A failure prints the
shrunk sequence of events; each one found became a plain test in
tests/unit/test_scheduler_state.py (the first: a Submit that orphaned a pending
object, test_a_result_registered_pending_before_its_task_comes_through_the_head_...).
"""
from __future__ import annotations

import collections
from typing import Any

import pytest
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from _sched_helpers import (
    DRIVER,
    Cluster,
    inline_data,
    make_call,
    new_id,
    ref,
    rid,
    segment_data,
    worker_conn,
)
from orchestra._scheduler import data as values
from orchestra._scheduler.events import Hello, TaskDone
from orchestra._scheduler.instructions import Push, StartWorker
from orchestra._scheduler.model import TaskState, WorkerState

pytestmark = pytest.mark.timeout(120)

DRIVER2 = 2
DRIVERS = (DRIVER, DRIVER2)
OTHER = 7   # the second node's id


class SchedulerInterleavings(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.c = Cluster(cpus=2, max_workers=4)
        self.s = self.c.s
        self.s.client_connected(DRIVER2, Hello(kind="driver", pid=2))
        # A second node, which may die and join again: large results live in the store
        # of the node that made them, and are made again (lineage) when it dies.
        self.s.add_node(OTHER, {"CPU": 2.0}, num_workers=2, max_workers=3)
        # The model: refs each driver holds (object id -> count), results sealed, tasks
        # submitted (task id -> call), and results registered pending whose task has
        # not come yet (a driver's direct call, escaped).
        self.held: dict[int, collections.Counter[bytes]] = {d: collections.Counter() for d in DRIVERS}
        self.sealed: dict[bytes, Any] = {}
        self.calls: dict[bytes, Any] = {}
        self.future: list[tuple[int, Any]] = []
        self.to_connect: list[int] = []
        self.blocked: set[int] = set()
        self.segments = 0
        self._take()

    # ------------------------------------------------------------ plumbing
    def _take(self) -> None:
        for ins in self.c.take():
            if type(ins) is StartWorker:
                self.to_connect.append(ins.worker_id)
            elif type(ins) is Push:
                self.sealed[ins.data.object_id] = ins.data

    def _held_ids(self, driver: int) -> list[bytes]:
        return sorted(oid for oid, n in self.held[driver].items() if n > 0)

    def _live_workers(self) -> list[Any]:
        return [w for w in self.s.workers.values() if w.conn >= 0 and w.state is not WorkerState.DEAD]

    # ------------------------------------------------------------ events
    @rule(driver=st.sampled_from(DRIVERS), picks=st.lists(st.integers(0, 50), max_size=2),
          retries=st.sampled_from([0, 1]))
    def submit(self, driver: int, picks: list[int], retries: int) -> None:
        ids = self._held_ids(driver)
        args = tuple(ref(ids[i % len(ids)]) for i in picks) if ids else ()
        call = make_call("task", args, max_retries=retries)
        self.calls[call.task_id] = call
        self.held[driver][rid(call)] += 1
        self.s.submit(driver, call)
        self._take()

    @rule(driver=st.sampled_from(DRIVERS), i=st.integers(0, 50))
    def chain(self, driver: int, i: int) -> None:
        """``ref = step.remote(ref)``: the next step of a chain (retries on), the driver
        keeping only its result; the argument is held by the step alone."""
        ids = self._held_ids(driver)
        if not ids:
            return
        oid = ids[i % len(ids)]
        self.submit(driver, [i], 1)
        self.held[driver][oid] -= 1
        self.s.directory.ref_delta(driver, [], [oid])
        self._take()

    @rule(driver=st.sampled_from(DRIVERS))
    def register_pending(self, driver: int) -> None:
        """A direct call's result escapes before the call went anywhere (then it comes
        through the head, submit_registered)."""
        call = make_call("direct")
        self.s.directory.register_pending(driver, [rid(call)])
        self.held[driver][rid(call)] += 1
        self.future.append((driver, call))
        self._take()

    @precondition(lambda self: self.future)
    @rule(i=st.integers(0, 50))
    def submit_registered(self, i: int) -> None:
        driver, call = self.future.pop(i % len(self.future))
        self.calls[call.task_id] = call
        self.s.submit(driver, call)   # its hold stands for the Submit's: the model adds none
        self._take()

    @rule(driver=st.sampled_from(DRIVERS))
    def put(self, driver: int) -> None:
        oid = new_id() + bytes(4)
        self.s.directory.put(driver, inline_data(oid, "put"))
        self.held[driver][oid] += 1
        self.sealed[oid] = True
        self._take()

    @rule(driver=st.sampled_from(DRIVERS), i=st.integers(0, 50))
    def drop(self, driver: int, i: int) -> None:
        ids = self._held_ids(driver)
        if not ids:
            return
        oid = ids[i % len(ids)]
        self.held[driver][oid] -= 1
        self.s.directory.ref_delta(driver, [], [oid])
        self._take()

    @precondition(lambda self: self.to_connect)
    @rule()
    def connect(self) -> None:
        wid = self.to_connect.pop(0)
        if wid in self.s.workers:
            self.c.connect(wid)
        self._take()

    def _running(self, w: Any) -> Any:
        """The task ``w`` runs now (the innermost one), if it can end: a blocked
        worker runs only what was sent into its get()."""
        if not w.queue:
            return None
        t = w.queue[0]
        if w.worker_id in self.blocked and t not in w.nested:
            return None
        return t

    @rule(i=st.integers(0, 50), error=st.booleans(), large=st.booleans())
    def finish(self, i: int, error: bool, large: bool = False) -> None:
        workers = [w for w in self._live_workers() if self._running(w) is not None]
        if not workers:
            return
        w = workers[i % len(workers)]
        t = self._running(w)
        call = t.call
        if error:
            returns = [values.error_value(rid(call), b"user error")]
            self.s.task_done(w.conn, TaskDone(task_id=call.task_id, returns=returns,
                                                 user_error=True))
        elif large:   # in the store of the worker's node
            self.segments += 1
            data = segment_data(rid(call), f"seg-{self.segments}", node_id=w.node_id)
            self.s.task_done(w.conn, TaskDone(task_id=call.task_id, returns=[data]))
        else:
            self.s.task_done(w.conn, TaskDone(task_id=call.task_id,
                                                 returns=[inline_data(rid(call), "v")]))
        self._take()

    @precondition(lambda self: OTHER in self.s.nodes)
    @rule()
    def node_dies(self) -> None:
        """The second node dies: its workers' connections close after it."""
        conns = [w.conn for w in self.s.workers.values() if w.node_id == OTHER and w.conn >= 0]
        for w in self.s.workers.values():
            if w.node_id == OTHER:
                self.blocked.discard(w.worker_id)
        self.s.remove_node(OTHER, "killed")
        for conn in conns:
            self.s.client_disconnected(conn, "its node died")
        self.to_connect = [wid for wid in self.to_connect if wid in self.s.workers]
        self._take()

    @precondition(lambda self: OTHER not in self.s.nodes)
    @rule()
    def node_joins(self) -> None:
        self.s.add_node(OTHER, {"CPU": 2.0}, num_workers=2, max_workers=3)
        self._take()

    @rule(i=st.integers(0, 50), j=st.integers(0, 50))
    def block(self, i: int, j: int) -> None:
        """The running task calls get() on an object: the worker hands back what is
        queued behind it, then says it blocked."""
        workers = [w for w in self._live_workers()
                   if w.queue and w.worker_id not in self.blocked and w.actor is None]
        ids = sorted(set(self.s.objects))
        if not workers or not ids:
            return
        w = workers[i % len(workers)]
        running = w.queue[0]
        behind = [t.call.task_id for t in list(w.queue)[1:]]
        if behind:
            self.s.return_tasks(w.conn, behind)
        self.blocked.add(w.worker_id)
        self.s.blocked(w.conn, True, [ids[j % len(ids)]], running.call.task_id, running.call.name)
        self._take()

    @rule(i=st.integers(0, 50))
    def bounce(self, i: int) -> None:
        """A blocked worker hands back what reached it that it will not run."""
        workers = [w for w in self._live_workers() if w.worker_id in self.blocked]
        if not workers:
            return
        w = workers[i % len(workers)]
        back = [t.call.task_id for t in list(w.queue)[1:] if t not in w.nested]
        if back:
            self.s.return_tasks(w.conn, back)
            self._take()

    @rule(i=st.integers(0, 50))
    def resume(self, i: int) -> None:
        workers = [w for w in self._live_workers()
                   if w.worker_id in self.blocked and not w.nested]
        if not workers:
            return
        w = workers[i % len(workers)]
        self.blocked.discard(w.worker_id)
        self.s.blocked(w.conn, False)
        self._take()

    @rule(i=st.integers(0, 50))
    def worker_dies(self, i: int) -> None:
        workers = self._live_workers()
        if not workers:
            return
        w = workers[i % len(workers)]
        self.blocked.discard(w.worker_id)
        self.s.client_disconnected(w.conn, "killed")
        self._take()

    # ------------------------------------------------------------ promises
    @invariant()
    def a_ready_task_has_the_data_of_every_argument(self) -> None:
        # Dispatched, it is sent each argument's data; one made again since (its node
        # died) has none, and the head's loop died on it (test_object_directory.py).
        objects = self.s.objects
        for q in self.s.ready.values():
            for t in q:
                for oid in t.call.refs:
                    assert objects[oid].data is not None, t.call.name

    @invariant()
    def every_task_runs_is_queued_or_waits_for_something_that_will_come(self) -> None:
        s = self.s
        queued = {id(t) for q in s.ready.values() for t in q}
        coming = {rid(call) for _, call in self.future}
        for tid, t in s.tasks.items():
            if t.state is TaskState.WAITING:
                assert t.deps, f"task {tid.hex()} waits for nothing"
                for oid in t.deps:
                    o = s.objects.get(oid)
                    assert o is not None and o.data is None, \
                        f"task {tid.hex()} waits on {oid.hex()}, which is gone or sealed"
                    assert t in o.waiting_tasks, \
                        f"task {tid.hex()} waits on {oid.hex()}, which does not know it"
                    producer = s.tasks.get(oid[:-4])
                    assert (producer is not None and producer.state is not TaskState.DONE) \
                        or oid in coming, f"task {tid.hex()} waits on {oid.hex()}, which nothing makes"
            elif t.state is TaskState.READY:
                assert id(t) in queued, f"ready task {tid.hex()} is in no queue"
            elif t.state is TaskState.DISPATCHED:
                assert t.worker is not None and t in t.worker.queue
                assert t.worker.worker_id in s.workers, f"task {tid.hex()} is on a dead worker"

    @invariant()
    def nothing_is_freed_while_held(self) -> None:
        s = self.s
        for driver in DRIVERS:
            for oid in self._held_ids(driver):
                assert oid in s.objects, f"{oid.hex()} freed while driver {driver} holds it"
        for tid, t in s.tasks.items():
            if t.state is not TaskState.DONE:
                for oid in t.arg_ids:
                    assert oid in s.objects, f"{oid.hex()} freed while task {tid.hex()} holds it"

    @invariant()
    def each_drivers_count_is_the_refs_it_holds(self) -> None:
        for driver in DRIVERS:
            holds = self.s.clients[driver].holds
            for oid, n in self.held[driver].items():
                assert holds.get(oid, 0) == n, \
                    f"driver {driver} holds {n} ref(s) to {oid.hex()}, the head counts {holds.get(oid, 0)}"

    @invariant()
    def the_lineages_kept_count_what_they_name_and_each_tomb_is_named(self) -> None:
        # A freed argument leaves a tomb while a kept lineage (a live object's or a
        # tomb's) names it, and goes with the last one (_scheduler/objects.py).
        d = self.s.directory
        named: collections.Counter[bytes] = collections.Counter()
        kept = [o.lineage for o in self.s.objects.values() if o.lineage is not None]
        kept += [tomb.lineage for tomb in d.tombs.values() if tomb.lineage is not None]
        for lineage in kept:
            for oid in lineage.call.refs:
                named[oid] += 1
        assert dict(d.lineage_refs) == dict(named)
        for oid, tomb in d.tombs.items():
            assert named[oid] > 0, f"tomb {oid.hex()} is named by no kept lineage"
            assert oid not in self.s.objects, f"{oid.hex()} is both alive and a tomb"
            assert (tomb.data is None) != (tomb.lineage is None)

    @invariant()
    def the_worker_tables_indexes_are_what_a_scan_finds(self) -> None:
        # Placement asks the indexes instead of scanning (model.WorkerTable).
        table = self.s.workers
        by_node: dict[int, set[int]] = collections.defaultdict(set)
        idle: dict[int, set[int]] = collections.defaultdict(set)
        for wid, w in table.items():
            assert w.table is table and w.worker_id == wid
            by_node[w.node_id].add(wid)
            if w.state is WorkerState.IDLE:
                idle[w.node_id].add(wid)
        assert {n: set(ws) for n, ws in table.by_node.items()} == by_node
        assert {n: set(ws) for n, ws in table.idle_by_node.items()} == idle
        # The pipelining index may hold more, never less: each task worker that can
        # take a task behind its own is in it, under its grant's shape and a length no
        # larger than its queue's. Its reader first goes through every entry (on no
        # node: it takes none), moving and dropping what no longer holds, so that a
        # worker that can take one again later is seen to come back.
        depth = self.s.pipeline_depth
        for shape in list(table.open):
            assert table.pipeline_pick(shape, depth, only=-1) is None
        for wid, w in table.items():
            if w.actor is None and w.state is WorkerState.BUSY and w.lent_to is None \
                    and not w.nested and len(w.queue) < depth:
                filed = [k for k, entries in table.open.get(w.grant_shape, {}).items()
                         if wid in entries]
                assert any(k <= len(w.queue) for k in filed), \
                    f"worker {wid} can take a pipelined task, the index misses it ({filed})"

    @invariant()
    def an_ended_task_has_its_result_sealed(self) -> None:
        s = self.s
        for tid, call in self.calls.items():
            if tid not in s.tasks:
                o = s.objects.get(rid(call))
                assert o is None or o.data is not None, f"task {tid.hex()} ended, its result pending"

    @rule()
    def drain(self) -> None:
        """Let everything run to its end: every task must end."""
        for _ in range(400):
            if self.future:
                self.submit_registered(0)
                continue
            if self.to_connect:
                self.connect()
                continue
            blocked = [w for w in self._live_workers() if w.worker_id in self.blocked and not w.nested]
            if blocked:
                self.resume(0)
                continue
            if OTHER not in self.s.nodes:
                self.node_joins()
                continue
            before = len(self.s.tasks)
            self.finish(0, False)
            if not self.s.tasks:
                break
            if len(self.s.tasks) == before and not any(self._running(w) for w in self._live_workers()):
                break
        left = {tid.hex(): t.state.value for tid, t in self.s.tasks.items()}
        assert not left, f"tasks that never ended: {left}"

    def teardown(self) -> None:
        self.drain()


SchedulerInterleavings.TestCase.settings = settings(
    max_examples=150, stateful_step_count=40, deadline=None,
    suppress_health_check=[HealthCheck.too_slow])
test_scheduler_interleavings = SchedulerInterleavings.TestCase


def test_worker_conn_numbering_matches_the_helpers() -> None:
    # The machine finds a worker's connection by its id the way the helpers do.
    c = Cluster(cpus=1)
    [wid] = c.pool
    assert c.s.workers[wid].conn == worker_conn(wid)
