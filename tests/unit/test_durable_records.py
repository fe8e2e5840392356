"""The records a head keeps for its restart (orchestra/_scheduler/durable.py): the Durable
instructions the scheduler emits, replayed into a dict as the store's thread writes
them, hold exactly the live detached actors (their restarts counted), the live actors
the driver made (under its key) and the live detached placement groups, whatever
happens to them; a new scheduler restored from them holds the same actors (one restart
more) and groups, the driver's own given back to it when it connects again (claim), and
stopped when it leaves. No processes."""
from __future__ import annotations

import itertools
from typing import Any

import pytest
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, rule

from _sched_helpers import DRIVER, Cluster, Nodes, executed, make_call, new_id, worker_conn
from orchestra._head import inbound, records
from orchestra._proto import types_pb2
from orchestra._protocol import pb
from orchestra._scheduler import durable
from orchestra._scheduler.actors import ActorState
from orchestra._scheduler.events import Hello, TaskDone
from orchestra._scheduler.groups import GroupSpec, GroupState
from orchestra._scheduler.instructions import Durable, StartWorker

pytestmark = pytest.mark.timeout(60)

HEAD = 0   # the restored things' owner: the head's own pseudo-client
KEY = b"k" * 16   # the driver's key (Hello.driver_key)
AGAIN = 77        # the driver's connection to a restarted head
_gids = itertools.count(1)


def ctor_call(name: str, *, detached: bool, max_restarts: int, args: tuple[Any, ...] = ()) -> Any:
    tid = new_id()
    call = types_pb2.Call(task_id=tid, function_id=b"cls-" + tid[:4], name=f"{name}.__init__",
                          num_returns=0, resources={"CPU": 0.5}, args=list(args), job=DRIVER)
    call.actor.CopyFrom(types_pb2.ActorSpec(
        actor_id=tid + b"\xff\xff\xff\xff", name=name, max_restarts=max_restarts,
        class_name="Counter", detached=detached))
    return call


def apply(store: dict[str, dict[str, bytes]], out: list[Any]) -> None:
    """Write the Durable instructions of ``out`` as the head does (its edge makes each
    record bytes: _head/records.py)."""
    for ins in out:
        if type(ins) is Durable:
            kept = store.setdefault(ins.table, {})
            if ins.value is None:
                kept.pop(ins.key, None)
            else:
                kept[ins.key] = records.encode(ins.table, ins.value)


def restore(state: Any, owner: int, rows: dict[str, dict[str, bytes]], joined_from: int = 0) -> list[str]:
    """A restarted head's restore from the store's ``rows``: read by its edge, then made again."""
    kept, unreadable = records.read(rows)
    assert unreadable == []
    return durable.restore(state, owner, kept, joined_from)


class Records(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.c = Cluster(cpus=4, workers=0, max_workers=64)
        self.c.s.actor_table.keep_owned = True   # a head with a state store
        self.c.s.clients[DRIVER].key = KEY
        self.store: dict[str, dict[str, bytes]] = {}
        self.made: list[Any] = []      # constructor calls
        self.groups: list[bytes] = []
        self.n = 0

    def _take(self) -> list[Any]:
        out = self.c.take()
        apply(self.store, out)
        for wid in self.c.started(out):   # each actor's worker comes up at once
            self.c.connect(wid)
        if self.c.s.out:
            self._take()
        return out

    def _actor(self, i: int) -> Any:
        return self.c.s.actor_table.actors[self.made[i % len(self.made)].actor.actor_id]

    @rule(detached=st.booleans(), max_restarts=st.sampled_from([0, 1, -1]))
    def create(self, detached: bool, max_restarts: int) -> None:
        self.n += 1
        call = ctor_call(f"a{self.n}", detached=detached, max_restarts=max_restarts)
        self.c.s.register_function(inbound.function_in(pb.RegisterFunctionRequest(
            function_id=call.function_id, pickled=b"the class")))
        self.c.s.create_actor(DRIVER, inbound.call_in(call))
        self.made.append(call)
        self._take()

    @rule(i=st.integers(0, 50), raised=st.booleans())
    def constructor_ends(self, i: int, raised: bool) -> None:
        if not self.made:
            return
        a = self._actor(i)
        if a.state in (ActorState.STARTING, ActorState.RESTARTING) and a.worker is not None \
                and a.worker.queue:
            self.c.s.task_done(worker_conn(a.worker.worker_id), TaskDone(
                task_id=a.creation.call.task_id, user_error=raised))
            self._take()

    @rule(i=st.integers(0, 50))
    def process_dies(self, i: int) -> None:
        if not self.made:
            return
        a = self._actor(i)
        if a.worker is not None:
            self.c.s.worker_died(a.worker.worker_id, "killed by a signal")
            self._take()

    @rule(i=st.integers(0, 50), no_restart=st.booleans())
    def kill(self, i: int, no_restart: bool) -> None:
        if not self.made:
            return
        a = self._actor(i)
        self.c.s.actor_table.kill(a.spec.actor_id, no_restart)
        out = self._take()
        for ins in out:   # the kill seen: the worker's death follows
            if type(ins).__name__ == "KillWorker":
                self.c.s.worker_died(ins.worker_id, "killed")
        self._take()

    @rule(detached=st.booleans(), named=st.booleans())
    def make_group(self, detached: bool, named: bool) -> None:
        gid = next(_gids).to_bytes(12, "big")
        spec = GroupSpec(gid, ({"CPU": 0.5},), "PACK", f"g{gid[-1]}" if named else "", detached)
        self.c.s.groups.create(DRIVER, spec)
        self.groups.append(gid)
        self._take()

    @rule(i=st.integers(0, 50))
    def remove_group(self, i: int) -> None:
        if self.groups:
            self.c.s.groups.remove(self.groups[i % len(self.groups)])
            self._take()

    @invariant()
    def the_records_are_the_live_actors_and_detached_groups(self) -> None:
        live = {aid.hex(): a for aid, a in self.c.s.actor_table.actors.items()
                if a.state is not ActorState.DEAD}
        kept = self.store.get(durable.ACTORS, {})
        assert set(kept) == set(live)
        for key, value in kept.items():
            rec = pb.DurableActor.FromString(value)
            assert rec.owner_key == (b"" if live[key].spec.detached else KEY)
            assert rec.restarts == live[key].restarts and rec.revived == live[key].revived
            assert rec.cls.pickled == b"the class"
            assert rec.creation.actor.actor_id.hex() == key
        groups = {g.gid.hex() for g in self.c.s.groups.groups.values()
                  if g.spec.detached and g.state is not GroupState.REMOVED}
        assert set(self.store.get(durable.GROUPS, {})) == groups

    def teardown(self) -> None:
        """A new head restored from the records holds the same actors and detached
        groups; the driver's own are its again once it connects, and go with it."""
        before = {aid: a for aid, a in self.c.s.actor_table.actors.items()
                  if a.state is not ActorState.DEAD}
        groups = {gid: g.spec.name for gid, g in self.c.s.groups.groups.items()
                  if g.spec.detached and g.state is not GroupState.REMOVED}
        fresh = Cluster(cpus=4, workers=0, max_workers=64)
        fresh.s.client_connected(HEAD, Hello(kind="grpc"))
        assert restore(fresh.s, HEAD, self.store) == []
        out = fresh.take()
        after = fresh.s.actor_table.actors
        assert set(after) == set(before)
        for aid, a in before.items():
            assert after[aid].restarts == a.restarts + 1
            assert after[aid].revived == a.revived + 1
            assert after[aid].creation.call.actor.restart_count == a.restarts + 1
            assert after[aid].creation.call.job == 0   # its creator's connection is gone
            if a.spec.name:
                assert fresh.s.actor_table.names[(a.spec.namespace, a.spec.name)] == aid
        assert {gid: g.spec.name for gid, g in fresh.s.groups.groups.items()} == groups
        store: dict[str, dict[str, bytes]] = {}
        apply(store, out)   # the restored head keeps them again, one restart more
        assert set(store.get(durable.ACTORS, {})) == {aid.hex() for aid in before}
        assert set(store.get(durable.GROUPS, {})) == {gid.hex() for gid in groups}
        assert len([ins for ins in out if type(ins) is StartWorker]) <= len(before)
        own = {aid for aid, a in before.items() if not a.spec.detached}
        table = fresh.s.actor_table
        assert table.unclaimed == dict.fromkeys(own, KEY)
        fresh.s.client_connected(AGAIN, Hello(kind="driver", pid=1, driver_key=KEY))
        assert set(table.claim(AGAIN, KEY)) == own and not table.unclaimed
        for aid in own:   # its handle's hold is the driver's now, counted once
            assert fresh.s.clients[AGAIN].holds[aid] == 1
            assert fresh.s.clients[HEAD].holds.get(aid, 0) == 0
            assert fresh.s.directory.objects[aid].count == 1
        assert table.expire_unclaimed(60.0) == []
        fresh.s.client_disconnected(AGAIN)
        for aid, a in table.actors.items():
            assert (a.state is ActorState.DEAD) == (aid in own)


TestRecords = Records.TestCase
TestRecords.settings = settings(max_examples=60, stateful_step_count=30, deadline=None)


def test_a_restored_actor_whose_constructor_argument_is_gone_is_dead_naming_it() -> None:
    lost = new_id()
    call = ctor_call("keeper", detached=True, max_restarts=0,
                     args=(types_pb2.Value(ref=lost),))
    rec = pb.DurableActor(creation=call, restarts=0,
                          cls=pb.RegisterFunctionRequest(function_id=call.function_id))
    c = Cluster(cpus=1, workers=0)
    c.s.client_connected(HEAD, Hello(kind="grpc"))
    records = {durable.ACTORS: {call.actor.actor_id.hex(): rec.SerializeToString()}}
    assert restore(c.s, HEAD, records) == []
    a = c.s.actor_table.actors[call.actor.actor_id]
    assert a.state is ActorState.DEAD and lost.hex() in a.cause
    assert Durable(durable.ACTORS, call.actor.actor_id.hex(), None) in c.take()
    with pytest.raises(ValueError, match="no live actor is named 'keeper'"):
        c.s.actor_table.get("keeper", "")


def test_a_record_no_head_can_read_is_named_and_the_rest_read() -> None:
    call = ctor_call("keeper", detached=True, max_restarts=0)
    cls = pb.RegisterFunctionRequest(function_id=call.function_id)
    good = durable.ActorRecord(inbound.call_in(call), cls=inbound.function_in(cls))
    kept, unreadable = records.read({
        durable.ACTORS: {"ab": b"\x00not a record", "ef": records.encode(durable.ACTORS, good)},
        durable.GROUPS: {"cd": b"\xff\xff"}})
    assert sorted((t, k) for t, k, _ in unreadable) == [(durable.ACTORS, "ab"), (durable.GROUPS, "cd")]
    assert {why.split(":")[0] for _, _, why in unreadable} == {"actor ab", "placement group cd"}
    [(key, read)] = kept[durable.ACTORS].items()
    assert (key, read.creation.wire, read.cls.wire) == ("ef", call, cls) and kept[durable.GROUPS] == {}


def test_a_record_without_a_constructor_and_class_is_said_and_deleted() -> None:
    c = Cluster(cpus=1, workers=0)
    c.s.client_connected(HEAD, Hello(kind="grpc"))
    call = ctor_call("keeper", detached=True, max_restarts=0)
    problems = restore(c.s, HEAD, {durable.ACTORS: {"ab": records.encode(
        durable.ACTORS, durable.ActorRecord(inbound.call_in(call)))}})   # no class
    assert len(problems) == 1 and problems[0].startswith("actor ab")
    assert c.take() == [Durable(durable.ACTORS, "ab", None)]


def test_a_restart_by_a_restarted_head_is_not_counted_against_max_restarts() -> None:
    call = ctor_call("keeper", detached=True, max_restarts=1)
    rec = pb.DurableActor(creation=call, restarts=0,
                          cls=pb.RegisterFunctionRequest(function_id=call.function_id))
    c = Cluster(cpus=1, workers=0)
    c.s.client_connected(HEAD, Hello(kind="grpc"))
    restore(c.s, HEAD, {durable.ACTORS: {call.actor.actor_id.hex(): rec.SerializeToString()}})
    a = c.s.actor_table.actors[call.actor.actor_id]
    assert (a.restarts, a.revived) == (1, 1)
    for _ in range(2):   # its own max_restarts=1 still holds one restart
        (wid,) = c.started(c.take())
        c.connect(wid)
        c.s.task_done(worker_conn(wid), TaskDone(task_id=call.task_id))
        assert a.state is ActorState.ALIVE
        c.s.worker_died(wid, "killed by a signal")
    assert a.state is ActorState.DEAD and "after 1 restart(s) of 1" in a.cause
    assert a.restarts == 2


# ---------------------------------------------------------------- processes that outlived the head
JOINED = 2              # a joined node's id (the head's own: 0)
OLD_WORKER = (3 << 32) + 7   # a worker id given by an earlier head


def restored_on(node_id: int, *, revived: int = 0) -> tuple[Nodes, Any]:
    """A fresh head (node 0 and JOINED, no workers) restored from the record of a
    detached actor whose process ran on ``node_id``."""
    call = ctor_call("keeper", detached=True, max_restarts=0)
    rec = pb.DurableActor(creation=call, restarts=0, revived=revived, node_id=node_id,
                          cls=pb.RegisterFunctionRequest(function_id=call.function_id))
    c = Nodes({0: {"CPU": 1}, JOINED: {"CPU": 1}}, workers={0: 0, JOINED: 0})
    c.s.worker_pool.first_id((4 << 32) + 1)
    c.s.client_connected(HEAD, Hello(kind="grpc"))
    records = {durable.ACTORS: {call.actor.actor_id.hex(): rec.SerializeToString()}}
    assert restore(c.s, HEAD, records, joined_from=JOINED) == []
    return c, call


def resume(c: Nodes, call: Any, node_id: int = JOINED, worker_id: int = OLD_WORKER) -> None:
    c.s.client_connected(worker_conn(worker_id), Hello(
        kind="worker", pid=4242, worker_id=worker_id,
        resume_actor=call.actor.actor_id), node_id)


def test_a_restored_actor_of_a_joined_node_waits_for_its_process_and_takes_it_back() -> None:
    c, call = restored_on(JOINED, revived=2)
    a = c.s.actor_table.actors[call.actor.actor_id]
    out = c.take()
    assert c.started(out) == [] and a.state is ActorState.PENDING   # not made again yet
    assert c.s.actor_table.awaiting == {call.actor.actor_id: JOINED}
    resume(c, call)
    assert a.state is ActorState.ALIVE and a.worker is c.s.workers[OLD_WORKER]
    assert (a.restarts, a.revived, a.spec.restart_count) == (0, 2, 0)   # no restart counted
    assert c.available()["CPU"] == 1.5   # its half CPU is taken on JOINED again
    assert c.s.nodes[JOINED].resources.fits({"CPU": 1.0}) is False
    out = c.take()
    rec = [ins for ins in out if type(ins) is Durable][-1].value
    assert (rec.restarts, rec.revived, rec.node_id) == (0, 2, JOINED)
    method = make_call("keeper.inc", cpus=0)
    method.actor_id = call.actor.actor_id
    c.submit(method)
    assert executed(c.take()) == [(OLD_WORKER, method.task_id)]   # its calls reach it
    c.s.actor_table.release_awaiting()   # the wait ends: nothing is made twice
    assert c.started(c.take()) == []


def test_a_head_killed_while_a_restored_actor_waits_leaves_its_record_as_it_found_it() -> None:
    """The head dies again before the actor's process came back: the next head finds
    the record as the one before it left it (its node, no restart counted), waits for
    the same process and takes it back with its state (the restore's figures were the
    store's, a next head made it again at once on no node: a double head kill lost it)."""
    c, call = restored_on(JOINED, revived=1)
    key = call.actor.actor_id.hex()
    rows = {durable.ACTORS: {key: pb.DurableActor(
        creation=call, restarts=0, revived=1, node_id=JOINED,
        cls=pb.RegisterFunctionRequest(function_id=call.function_id)).SerializeToString()}}
    apply(rows, c.take())   # what the restored head wrote while the actor waits
    rec = records.decode(durable.ACTORS, rows[durable.ACTORS][key])
    assert (rec.restarts, rec.revived, rec.node_id) == (0, 1, JOINED)
    again = Nodes({0: {"CPU": 1}, JOINED: {"CPU": 1}}, workers={0: 0, JOINED: 0})
    again.s.worker_pool.first_id((5 << 32) + 1)
    again.s.client_connected(HEAD, Hello(kind="grpc"))
    assert restore(again.s, HEAD, rows, joined_from=JOINED) == []
    assert again.s.actor_table.awaiting == {call.actor.actor_id: JOINED}
    assert again.started(again.take()) == []
    resume(again, call)
    a = again.s.actor_table.actors[call.actor.actor_id]
    assert a.state is ActorState.ALIVE and (a.restarts, a.revived) == (0, 1)


def test_a_restored_actor_whose_process_does_not_come_back_is_made_again() -> None:
    c, call = restored_on(JOINED)
    a = c.s.actor_table.actors[call.actor.actor_id]
    c.take()
    c.s.actor_table.release_awaiting()
    (wid,) = c.started(c.take())
    assert wid > (4 << 32) and a.restarts == 1   # a new instance, ids above the old head's
    with pytest.raises(ValueError, match="not waiting for its process"):
        resume(c, call)   # too late: that process is refused (and exits)
    c.s.client_disconnected(worker_conn(OLD_WORKER))
    c.connect(wid)
    assert a.worker is c.s.workers[wid] and OLD_WORKER not in c.s.workers


def test_an_actor_of_the_heads_own_node_is_made_again_at_once() -> None:
    c, call = restored_on(0)   # its process died with the head
    assert c.s.actor_table.awaiting == {}
    assert len(c.started(c.take())) == 1


def test_a_process_that_names_another_node_or_actor_is_refused() -> None:
    c, call = restored_on(JOINED)
    with pytest.raises(ValueError, match="not waiting"):
        resume(c, call, node_id=0)   # not where its record says it ran
    other = ctor_call("other", detached=True, max_restarts=0)
    with pytest.raises(ValueError, match="not waiting"):
        resume(c, other)
    assert OLD_WORKER not in c.s.workers and call.actor.actor_id in c.s.actor_table.awaiting


def restored_own(node_id: int = 0) -> tuple[Nodes, Any]:
    """A fresh head restored from the record of an actor the driver of KEY made."""
    call = ctor_call("own", detached=False, max_restarts=0)
    call.actor.name = ""   # an unnamed one ends with its last handle
    rec = pb.DurableActor(creation=call, node_id=node_id, owner_key=KEY,
                          cls=pb.RegisterFunctionRequest(function_id=call.function_id))
    c = Nodes({0: {"CPU": 1}, JOINED: {"CPU": 1}}, workers={0: 0, JOINED: 0})
    c.s.client_connected(HEAD, Hello(kind="grpc"))
    records = {durable.ACTORS: {call.actor.actor_id.hex(): rec.SerializeToString()}}
    assert restore(c.s, HEAD, records, joined_from=JOINED) == []
    return c, call


def test_a_drivers_actor_no_driver_claims_is_stopped_when_the_wait_ends() -> None:
    c, call = restored_own()
    aid = call.actor.actor_id
    (wid,) = c.started(c.take())   # made again on the head's node meanwhile
    c.connect(wid)
    c.s.client_connected(AGAIN, Hello(kind="driver", pid=2, driver_key=b"another"))
    assert c.s.actor_table.claim(AGAIN, b"another") == []
    assert c.s.actor_table.expire_unclaimed(4.0) == [aid]
    a = c.s.actor_table.actors[aid]
    out = c.take()
    assert a.state is ActorState.DEAD and "did not connect again within 4 s" in a.cause
    assert any(type(ins).__name__ == "KillWorker" and ins.worker_id == wid for ins in out)
    assert [ins for ins in out if type(ins) is Durable] == [durable.actor_gone(aid)]


def test_a_claimed_actor_whose_handles_went_meanwhile_stops_at_the_drivers_release() -> None:
    c, call = restored_own()
    aid = call.actor.actor_id
    c.take()
    c.s.client_connected(AGAIN, Hello(kind="driver", pid=2, driver_key=KEY))
    assert c.s.actor_table.claim(AGAIN, KEY) == [aid]
    c.s.directory.ref_delta(AGAIN, [], [aid])   # the driver holds no handle of it any more
    assert c.s.actor_table.actors[aid].state is ActorState.DEAD
