"""A restarted head taking back what outlived the head before it (orchestra/_scheduler/
durable.py restore, ActorTable.adopt / release_awaiting; _head/rejoin.py): detached
actors whose processes ran on joined nodes, those processes connecting again in any
order, some dying before they do, the wait for them ending at any moment, new instances'
workers connecting; and, for the actors a driver made (not detached), that driver
connecting again and claiming them, dropping a handle, exiting, or never coming back
before its time ends. Whatever the order: every actor is served by one process at a
time, a process taken back keeps its actor's restart count and one made again adds one,
each node's resources are what its workers hold, once the wait ended nothing waits, and
a driver's actor lives exactly while its driver claimed it and holds it (or may still
come). No processes."""
from __future__ import annotations

from typing import Any

import pytest
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

from _sched_helpers import Nodes, new_id, worker_conn
from orchestra._head import inbound
from orchestra._proto import types_pb2
from orchestra._protocol import pb
from orchestra._scheduler import durable
from orchestra._scheduler.actors import ActorState
from orchestra._scheduler.events import Hello, TaskDone
from orchestra._scheduler.instructions import StartWorker

pytestmark = pytest.mark.timeout(120)

HEAD = 0                      # the restored actors' owner: the head's pseudo-client
AGAIN = 99                    # the driver's connection to the restarted head
KEY = b"d" * 16               # its key (Hello.driver_key)
JOINED_FROM = 2               # nodes 2 and 3 joined; node 0 is the head's own
OLD_BASE = (1 << 32) + 1      # worker ids the head before gave
NEW_BASE = (2 << 32) + 1      # this head's


def ctor(n: int, detached: bool = True) -> Any:
    tid = new_id()
    call = types_pb2.Call(task_id=tid, function_id=b"cls-" + tid[:4], name="Keeper.__init__",
                          num_returns=0, resources={"CPU": 1.0})
    call.actor.CopyFrom(types_pb2.ActorSpec(
        actor_id=tid + b"\xff\xff\xff\xff", name=f"k{n}" if detached else "",
        max_restarts=0, class_name="Keeper", detached=detached))
    return call


class Rejoin(RuleBasedStateMachine):
    # Each actor holds 1 CPU of its node's 2: at most two were on one node.
    @initialize(where=st.lists(st.sampled_from([0, 2, 3]), min_size=1, max_size=4).filter(
                    lambda w: all(w.count(n) <= 2 for n in (0, 2, 3))),
                restarts=st.lists(st.integers(0, 3), min_size=4, max_size=4),
                own=st.lists(st.booleans(), min_size=4, max_size=4))
    def restore(self, where: list[int], restarts: list[int], own: list[bool]) -> None:
        self.c = Nodes({0: {"CPU": 2}, 2: {"CPU": 2}, 3: {"CPU": 2}}, workers={0: 0, 2: 0, 3: 0})
        self.c.s.worker_pool.first_id(NEW_BASE)
        self.c.s.client_connected(HEAD, Hello(kind="grpc"))
        records: dict[str, bytes] = {}
        self.calls: list[Any] = []
        self.before: dict[bytes, int] = {}          # actor id -> restarts in its record
        self.old: dict[bytes, tuple[int, int]] = {}  # actor id -> (old worker id, its node)
        self.own: set[bytes] = set()   # the driver's actors (not detached)
        for i, node in enumerate(where):
            call = ctor(i, detached=not own[i])
            aid = call.actor.actor_id
            self.calls.append(call)
            self.before[aid] = restarts[i]
            if own[i]:
                self.own.add(aid)
            records[aid.hex()] = durable.ActorRecord(
                creation=inbound.call_in(call), restarts=restarts[i], node_id=node,
                owner_key=KEY if own[i] else b"",
                cls=inbound.function_in(pb.RegisterFunctionRequest(function_id=call.function_id)))
            if node >= JOINED_FROM:   # its process outlived the head
                self.old[aid] = (OLD_BASE + i, node)
        assert durable.restore(self.c.s, HEAD, {durable.ACTORS: records}, JOINED_FROM) == []
        self.adopted: set[bytes] = set()
        self.refused: set[bytes] = set()
        self.released = False
        self.claimed = self.expired = self.exited = False
        self.dropped: set[bytes] = set()   # handles the driver let go
        self.starting: list[int] = []
        self._take()

    def _take(self) -> None:
        out, self.c.s.out = self.c.s.out, []
        self.starting += [ins.worker_id for ins in out if type(ins) is StartWorker]

    @rule(data=st.data())
    def an_old_process_connects_again(self, data: st.DataObject) -> None:
        left = sorted(self.old)
        if not left:
            return
        aid = data.draw(st.sampled_from(left))
        wid, node = self.old.pop(aid)
        kept = aid in self.c.s.actor_table.reserved   # its node had room for it
        try:
            self.c.s.client_connected(worker_conn(wid), Hello(
                kind="worker", pid=wid, worker_id=wid, resume_actor=aid), node)
            self.adopted.add(aid)
        except ValueError:   # the head closes it; the process exits
            self.c.s.client_disconnected(worker_conn(wid))
            self.refused.add(aid)
            assert not kept or self._stopped(aid), \
                "a process that came back in time, with room kept, was refused"
        self._take()

    @rule(data=st.data())
    def an_old_process_dies_first(self, data: st.DataObject) -> None:
        if self.old:
            self.old.pop(data.draw(st.sampled_from(sorted(self.old))))

    @precondition(lambda self: not self.released)
    @rule()
    def the_wait_ends(self) -> None:
        self.released = True
        self.c.s.actor_table.release_awaiting()
        self._take()

    @rule()
    def a_new_instance_starts(self) -> None:
        if not self.starting:
            return
        wid = self.starting.pop(0)
        if wid not in self.c.s.workers:
            return
        self.c.connect(wid)
        w = self.c.s.workers[wid]
        if w.actor is not None:   # its constructor runs, and returns
            self.c.s.task_done(worker_conn(wid), TaskDone(task_id=w.actor.creation.call.task_id))
        self._take()

    @precondition(lambda self: not self.claimed and not self.exited)
    @rule()
    def the_driver_connects_again(self) -> None:
        self.c.s.client_connected(AGAIN, Hello(kind="driver", pid=5, driver_key=KEY))
        got = self.c.s.actor_table.claim(AGAIN, KEY)
        assert set(got) == (set() if self.expired else self.own)
        self.claimed = not self.expired
        self._take()

    @precondition(lambda self: self.claimed and not self.exited)
    @rule(data=st.data())
    def the_driver_drops_a_handle(self, data: st.DataObject) -> None:
        held = sorted(self.own - self.dropped)
        if held:
            aid = data.draw(st.sampled_from(held))
            self.dropped.add(aid)
            self.c.s.directory.ref_delta(AGAIN, [], [aid])
            self._take()

    @precondition(lambda self: self.claimed and not self.exited)
    @rule()
    def the_driver_exits(self) -> None:
        self.exited = True
        self.c.s.client_disconnected(AGAIN)
        self._take()

    @precondition(lambda self: not self.expired)
    @rule()
    def the_drivers_time_ends(self) -> None:
        self.expired = True
        gone = self.c.s.actor_table.expire_unclaimed(60.0)
        assert set(gone) == (set() if self.claimed else self.own)
        self._take()

    def _stopped(self, aid: bytes) -> bool:
        """Whether this actor must be dead by now: a driver's that its driver let go."""
        if aid not in self.own:
            return False
        return (self.expired and not self.claimed) or self.exited or aid in self.dropped

    @invariant()
    def a_drivers_actor_lives_while_its_driver_may_hold_it(self) -> None:
        table = self.c.s.actor_table
        for aid in self.before:
            a = table.actors[aid]
            assert (a.state is ActorState.DEAD) == self._stopped(aid), (aid in self.own, a.cause)
            if aid in self.own and self.claimed and a.state is not ActorState.DEAD:
                assert a.owner == AGAIN and self.c.s.clients[AGAIN].holds[aid] == 1
                assert self.c.s.clients[HEAD].holds.get(aid, 0) == 0
            if a.state is ActorState.DEAD:
                assert aid not in table.awaiting and aid not in table.reserved
        assert set(table.unclaimed) == (self.own if not (self.claimed or self.expired) else set())

    @invariant()
    def one_process_per_actor(self) -> None:
        serving: dict[bytes, list[int]] = {}
        for w in self.c.s.workers.values():
            if w.actor is not None:
                serving.setdefault(w.actor.spec.actor_id, []).append(w.worker_id)
        for aid, wids in serving.items():
            assert len(wids) == 1, f"two processes serve one actor: {wids}"
            a = self.c.s.actor_table.actors[aid]
            assert a.worker is not None and a.worker.worker_id == wids[0]

    @invariant()
    def restarts_say_what_happened(self) -> None:
        for aid, before in self.before.items():
            a = self.c.s.actor_table.actors[aid]
            if aid in self.adopted:
                assert a.state is ActorState.ALIVE or self._stopped(aid)
                assert a.worker is not None
                assert a.worker.worker_id < NEW_BASE   # its process of before
                assert a.restarts == before and a.spec.restart_count == before
            else:
                assert a.restarts == before + 1   # made again (or waiting to be)
                assert a.worker is None or a.worker.worker_id >= NEW_BASE

    @invariant()
    def resources_are_what_workers_and_waiting_actors_hold(self) -> None:
        table = self.c.s.actor_table
        for nid, node in self.c.s.nodes.items():
            held = sum(w.grant.get("CPU", 0.0) for w in self.c.s.workers.values()
                       if w.node_id == nid)
            held += sum(1.0 for aid in table.reserved if table.awaiting.get(aid) == nid)
            assert node.resources.free.get("CPU", 0.0) == pytest.approx(2.0 - held)
        assert set(table.reserved) <= set(table.awaiting)

    @invariant()
    def a_process_that_comes_back_in_time_is_taken_back(self) -> None:
        # Its node had room when the head restored it: what it holds was kept for it.
        assert not (self.refused & set(self.c.s.actor_table.reserved))

    @invariant()
    def waiting_only_until_the_wait_ends(self) -> None:
        awaiting = self.c.s.actor_table.awaiting
        if self.released:
            assert awaiting == {}
            for aid in self.before:   # each taken back, or a new instance on its way
                assert self.c.s.actor_table.actors[aid].worker is not None or self._stopped(aid)
        for aid in awaiting:
            assert aid not in self.adopted and aid not in self.refused

    @invariant()
    def refused_only_when_not_waiting(self) -> None:
        for aid in self.refused:   # made again already (the wait had ended), or stopped
            assert aid not in self.c.s.actor_table.awaiting
            assert self.released or self._stopped(aid)


TestRejoin = Rejoin.TestCase
TestRejoin.settings = settings(max_examples=300, stateful_step_count=20, deadline=None)
