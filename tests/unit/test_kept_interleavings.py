"""A restarted head taking back what outlived it on a joined node (orchestra/
_scheduler/kept.py): the objects its store kept, and its workers of before still running
a task. The driver sends its tasks again (in its order, some taking others' results as
arguments), the node joins (the head's store may have named it: then the head waits for
it and its workers of before), with some results kept, its workers of before come back
(or exit first), workers run what was sent to them and answer, time passes (the waits
run out, the kept objects expire), and the node may die again, in any order. Whatever
the order: a task ends once, either with its kept result (never sent to a worker) or
by running; a kept segment, or a result a worker of before answered, is either the value
of its object or freed, once, never both; a task whose result was kept and that had not
been sent to a worker before the node joined, nor expired, does not run; a task whose
worker of before came back before it was sent elsewhere runs nowhere else; in the end
every task is done and nothing is held. No processes."""
from __future__ import annotations

import os
from typing import Any

import pytest
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

from _sched_helpers import Nodes, executed, freed_segments, make_call, ref, rid, segment_data, worker_conn
from orchestra._scheduler.events import Hello, TaskDone
from orchestra._scheduler.instructions import KillWorker
from orchestra._scheduler.kept import KEEP_S
from orchestra._scheduler.model import TaskState

pytestmark = pytest.mark.timeout(120)

JOINED = 2   # the node that kept objects; node 0 is the head's own
TASKS = 6
BEFORE = 20   # worker ids of the head before (this one gives ids from FIRST up)
FIRST = 50


class Kept(RuleBasedStateMachine):
    @initialize(kept=st.sets(st.integers(0, TASKS - 1)),
                before=st.sets(st.integers(0, TASKS - 1)),
                far=st.lists(st.booleans(), min_size=TASKS, max_size=TASKS),
                deps=st.lists(st.integers(-1, TASKS - 1), min_size=TASKS, max_size=TASKS),
                expected=st.booleans())
    def restart(self, kept: set[int], before: set[int], far: list[bool], deps: list[int],
                expected: bool) -> None:
        # The head's node runs tasks that need only a CPU; "far" ones wait for the node.
        self.c = Nodes({0: {"CPU": 1}}, joinable=True)
        self.now = 0.0
        self.c.s.worker_pool.first_id(FIRST)
        self.c.s.kept.clock = lambda: self.now
        self.expected = expected
        self.waits_ran_out = False
        if expected:   # the head's store named the node: it waits for it
            self.c.s.kept.expect({JOINED}, 0.0)
        self.calls = []
        for i in range(TASKS):
            dep = deps[i] if 0 <= deps[i] < i else -1
            args = (ref(rid(self.calls[dep])),) if dep >= 0 else ()
            self.calls.append(make_call(f"t{i}", args, resources={"far": 1} if far[i] else None,
                                        max_retries=3))
        self.kept = {i: segment_data(rid(self.calls[i]), f"k-{i}", node_id=JOINED) for i in kept}
        # Tasks a worker of before (BEFORE + i) still runs on the node (none kept too).
        self.before = {BEFORE + i: self.calls[i].task_id for i in before - kept}
        self.away = set(self.before)    # not connected (nor exited) yet
        self.back_first: set[bytes] = set()   # came back before their task ran elsewhere
        self.killed: set[bytes] = set()       # their worker killed: nobody made them again
        self.sent = 0                 # tasks the driver sent again, in its order
        self.joined = False
        self.node_dead = False
        self.ran: list[bytes] = []    # task ids sent to a worker, in order
        self.running: dict[bytes, int] = {}   # task id -> its worker
        self.freed: list[str] = []
        self.sent_before_join: set[bytes] = set()
        self._take()

    def _waiting(self) -> bool:
        """The head waits for the node of before, or its workers of before."""
        return self.expected and not self.waits_ran_out and not self.node_dead and \
            (not self.joined or bool(self.away))

    def _take(self) -> None:
        out = self.c.take()
        assert not (executed(out) and self._waiting()), \
            "a task made again ran while the head waited for the processes of before"
        for wid, tid in executed(out):
            self.ran.append(tid)
            self.running[tid] = wid
        self.freed += freed_segments(out)
        for ins in out:
            if type(ins) is KillWorker and ins.worker_id in self.before:
                tid = self.before[ins.worker_id]
                self.killed.add(tid)
                if self.running.pop(tid + b"@before", None) is not None:
                    self.c.s.client_disconnected(worker_conn(ins.worker_id))
        for wid in self.c.started(out):
            self.c.connect(wid)
            self._take()

    # ------------------------------------------------------------ rules
    @precondition(lambda self: self.sent < TASKS)
    @rule()
    def the_driver_sends_a_task_again(self) -> None:
        self.c.submit(self.calls[self.sent])
        self.sent += 1
        self._take()

    @precondition(lambda self: not self.joined)
    @rule()
    def the_node_joins_with_what_it_kept(self) -> None:
        self.joined = True
        self.sent_before_join = set(self.ran)
        s = self.c.s
        s.kept.offer(JOINED, list(self.kept.values()), self.now)   # as the head: offer, then add
        s.add_node(JOINED, {"CPU": 1.0, "far": 1.0}, num_workers=1, max_workers=4)
        s.kept.node_joined(JOINED, sorted(self.away), self.now)
        s.schedule()
        self._take()

    @precondition(lambda self: self.joined and not self.node_dead and self.away)
    @rule(data=st.data(), exits=st.booleans())
    def a_worker_of_before_comes_back(self, data: st.DataObject, exits: bool) -> None:
        """It connects with the task it runs, or exits before it could."""
        wid = data.draw(st.sampled_from(sorted(self.away)))
        self.away.discard(wid)
        tid = self.before[wid]
        if exits:
            self.c.s.kept.worker_gone(wid)
        else:
            if tid not in self.ran:
                self.back_first.add(tid)
            self.c.s.client_connected(worker_conn(wid), Hello(
                kind="worker", pid=wid, worker_id=wid, resume_task=tid), JOINED)
            self.running[tid + b"@before"] = wid
        self._take()

    @rule(data=st.data())
    def a_worker_finishes(self, data: st.DataObject) -> None:
        if not self.running:
            return
        self._finish(data.draw(st.sampled_from(sorted(self.running))))

    def _finish(self, key: bytes) -> None:
        """The worker running ``key`` answers: its value in a segment on its node."""
        wid = self.running.pop(key)
        tid = key[:12]
        node = self.c.node_of(wid) if wid in self.c.s.workers else 0
        name = f"r-{tid.hex()}" if wid in self.before else f"w-{tid.hex()}"
        self.c.s.task_done(worker_conn(wid), TaskDone(task_id=tid, returns=[
            segment_data(tid + (0).to_bytes(4, "big"), name, node_id=node)]))
        self._take()

    @rule()
    def time_passes(self) -> None:
        self.now += KEEP_S
        self.waits_ran_out = True
        # What came back for a task not made again yet expires (its answer freed, or its
        # worker killed): made again later, it runs.
        made = {c.task_id for c in self.calls[:self.sent]}
        self.back_first &= made
        self.c.s.kept.tick(self.now)
        self._take()

    @precondition(lambda self: self.joined and not self.node_dead)
    @rule()
    def the_node_dies(self) -> None:
        self.node_dead = True
        for tid, wid in list(self.running.items()):
            if wid in self.before or self.c.node_of(wid) == JOINED:
                del self.running[tid]   # its worker died with it: the task is retried
        for wid in list(self.away):     # (their exits are not heard: their waits run out)
            self.away.discard(wid)
        self.c.s.remove_node(JOINED, "killed")
        self._take()

    # ------------------------------------------------------------ invariants
    def _claimed(self) -> set[int]:
        """Tasks whose object is the kept segment."""
        out = set()
        for i in self.kept:
            o = self.c.s.objects.get(rid(self.calls[i]))
            if o is not None and o.data is not None and o.data.segment.name == f"k-{i}":
                out.add(i)
        return out

    @invariant()
    def a_task_ends_once_and_a_kept_segment_is_used_or_freed_once(self) -> None:
        claimed = self._claimed()
        for i in claimed:
            assert self.calls[i].task_id not in self.ran or self.node_dead, \
                f"task {i} ended with its kept result and ran too"
        kept_freed = [n for n in self.freed if n.startswith(("k-", "r-"))]
        assert len(kept_freed) == len(set(kept_freed)), f"a kept segment freed twice: {kept_freed}"
        for i in claimed:
            assert f"k-{i}" not in kept_freed, f"the kept segment of task {i} freed while used"
        for call in self.calls:
            o = self.c.s.objects.get(rid(call))
            if o is not None and o.data is not None and o.data.segment.name.startswith("r-"):
                assert o.data.segment.name not in kept_freed, \
                    f"the answer of {call.name}'s worker of before freed while used"

    @invariant()
    def a_task_whose_worker_came_back_first_runs_nowhere_else(self) -> None:
        if self.node_dead:
            return
        for tid in self.back_first - self.killed:
            assert tid not in self.ran, "a task ran again though its worker of before came back"

    @invariant()
    def what_was_kept_and_not_yet_running_does_not_run(self) -> None:
        if not self.joined or self.node_dead:
            return
        for i in self.kept:
            tid = self.calls[i].task_id
            if i < self.sent and tid not in self.sent_before_join and f"k-{i}" not in self.freed:
                assert tid not in self.ran, f"task {i} ran though its result was kept"

    @precondition(lambda self: self.sent == TASKS and self.joined)
    @rule()
    def everything_settles(self) -> None:
        for wid in sorted(self.away):   # the rest exit before they could come back
            self.away.discard(wid)
            self.c.s.kept.worker_gone(wid)
        self._take()
        while True:
            while self.running:
                self._finish(next(iter(self.running)))
            self.time_passes()
            if not self.running:
                break
        s = self.c.s
        if not self.node_dead:
            for call in self.calls:
                t = s.tasks.get(call.task_id)
                assert t is None or t.state is TaskState.DONE, f"{call.name} never ended"
                o = s.objects[rid(call)]
                assert o.data is not None, f"{call.name}'s result never came"
        assert not s.kept.held and not s.kept.until and not s.kept.running
        assert not s.kept.parking and not s.kept.active
        claimed = self._claimed()
        kept_freed = {n for n in self.freed if n.startswith("k-")}
        if not self.node_dead:
            assert {f"k-{i}" for i in self.kept} == {f"k-{i}" for i in claimed} | kept_freed


Kept.TestCase.settings = settings(
    max_examples=int(os.environ.get("ORCHESTRA_HYPOTHESIS_EXAMPLES", "150")),
    stateful_step_count=30, deadline=None)
test_kept_objects_under_any_order = Kept.TestCase


def test_a_task_made_again_after_its_kept_result_came_ends_at_once() -> None:
    """The plain order: the node joins first; the driver's task sent again is done with
    the kept segment, nothing is sent to a worker, and the driver's get finds it there."""
    c = Nodes({0: {"CPU": 1}}, joinable=True)
    call = make_call("made", resources={"far": 1})
    c.s.kept.offer(JOINED, [segment_data(rid(call), "k", node_id=JOINED)], 0.0)
    c.s.add_node(JOINED, {"CPU": 1.0, "far": 1.0}, num_workers=1, max_workers=4)
    c.take()
    c.submit(call)
    out: Any = c.take()
    assert executed(out) == []
    o = c.s.objects[rid(call)]
    assert o.data.segment.name == "k" and o.data.segment.node_id == JOINED
    assert call.task_id not in c.s.tasks
