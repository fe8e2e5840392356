"""The object store under random interleavings (Hypothesis), over a real private
directory of segment files and a real spill directory, no processes: objects of mixed
sizes created, written, sealed, aborted, read (pinned) and freed in random order,
spilled when the store is full, readers letting go of their maps when asked, and
connections dropping (a writer too, before it opened its segment), and time passing
(pooled segments nobody took for the idle time given back, a floor kept). A final large
put must find its room.

Invariants after every step: the store's counts are exact (``used`` is the capacity of
every segment holding a live object, ``pooled`` that of the pool); live and pooled
segments never exceed the capacity; the directory holds exactly the segments the store
names; every live object's bytes are still its own (no segment reused or removed under
a live object or a reader's pin); spilled bytes are the spilled objects'; a full store
is refused only when even spilling every sealed object would not make the room; after
a trim no segment pooled for the idle time is left, unless giving it back would leave
less than the floor pooled. Medium objects are slots of slab files (_objects/slabs.py):
a slab's counts match its slots' states, a cold slot holds no page, the directory holds
exactly the slabs and other segments the store names."""
from __future__ import annotations

import os
import shutil
import tempfile
from dataclasses import dataclass, field

import pytest
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    Bundle,
    RuleBasedStateMachine,
    consumes,
    initialize,
    invariant,
    precondition,
    rule,
)

from orchestra._objects.segments import open_segment, segment_file, spill_file
from orchestra._objects.slabs import is_slot, split_slot
from orchestra._objects.store import ObjectStore, ReleaseNeeded, SpillNeeded, size_class
from orchestra.exceptions import ObjectStoreFullError

pytestmark = pytest.mark.timeout(120)

KiB, MiB = 1 << 10, 1 << 20
CAPACITY = 24 * MiB
# Mixed sizes across many classes: small (the 64 KiB class), middling, large.
SIZES = [1 * KiB, 70 * KiB, 200 * KiB, 700 * KiB, 1 * MiB + 3, 2500 * KiB, 5 * MiB, 9 * MiB]
WRITERS = [1, 2]
IDLE_S = 10.0          # a pooled segment nobody takes for this long is given back
FLOOR = 3 * MiB        # ... unless the pool would then hold less than this
READERS = [7, 8]
HUGE_BUDGET = 10 * MiB   # HugeStoreMachine's free huge pages


@dataclass
class Obj:
    oid: bytes
    name: str
    size: int
    state: str = "writing"              # writing / sealed / spilled
    path: str = ""                      # its spill file, once spilled
    pins: dict[int, int] = field(default_factory=dict)


def pattern(oid: bytes, size: int) -> bytes:
    return (oid * (size // len(oid) + 1))[:size]


class StoreMachine(RuleBasedStateMachine):
    objs = Bundle("objs")

    @initialize()
    def start(self) -> None:
        self.spill_root = tempfile.mkdtemp(prefix="orchestra-test-spill-")
        self.store = ObjectStore(0, "unit", CAPACITY, warm_bytes=FLOOR, pool_idle_s=IDLE_S,
                                 spill_dir=os.path.join(self.spill_root, "spill"))
        self.clock = 1000.0
        self.store.now = lambda: self.clock
        self.live: dict[bytes, Obj] = {}
        self.retired: list[Obj] = []        # freed while readers pinned them
        self.n = 0
        self.spares: dict[int, list[str]] = {}   # writer -> spare segments it holds

    def teardown(self) -> None:
        if hasattr(self, "store"):
            self.store.close()
            assert not os.path.exists(self.store.dir)
            shutil.rmtree(self.spill_root, ignore_errors=True)

    # ------------------------------------------------------------ the node's part
    def _create(self, conn: int, oid: bytes, size: int) -> object:
        """As the node answers CreateSegment: spill, ask readers to let go, try again."""
        store = self.store
        for _ in range(64):
            try:
                return store.create(conn, oid, size)
            except SpillNeeded as need:
                for job in store.begin_spill(need.names):
                    error = spill_file(job.source, job.dest, job.size, job.offset)
                    assert error == ""
                    seg = store.end_spill(job.name, job.dest, error)
                    obj = self.live[job.object_id]
                    if seg is not None:
                        obj.state, obj.path = "spilled", seg.path
            except ReleaseNeeded as rel:
                for conn_id, names in rel.held.items():   # RELEASE_MAPS: readers let go
                    for obj in self.live.values():
                        if obj.name in names and obj.pins.get(conn_id):
                            store.unpin(conn_id, [obj.name] * obj.pins.pop(conn_id))
                    # ... and writers give back the spares they hold (RefDelta.give_back)
                    held = self.spares.get(conn_id, [])
                    for name in [n for n in held if n in names]:
                        held.remove(name)
                        store.abort(conn_id, name)
                        assert name not in store.segs or store.segs[name].state in ("pooled", "cold")
            except ObjectStoreFullError:
                # Only when even spilling every sealed object would not make the room.
                # A segment being written counts its capacity, which may be up to twice
                # its object's class (a larger pooled segment is reused).
                # A slab is spilled whole: one with an object being written or freed
                # while mapped holds all its bytes (its other objects' and dead slots').
                stuck = sum(store.segs[o.name].capacity for o in self.live.values()
                            if o.state == "writing" and not is_slot(o.name))
                retired = sum(s.capacity for s in store.segs.values()
                              if s.state == "retired" and s.slab is None)
                slabs = sum(sum(store.segs[n].capacity for n in slab.slots
                                if store.segs[n].state not in ("pooled", "cold"))
                            for slab in store.slabs.values()
                            if any(store.segs[n].state in ("writing", "retired")
                                   for n in slab.slots))
                assert stuck + retired + slabs + size_class(max(size, 1)) > CAPACITY, \
                    "refused a put that spilling would have made room for"
                return None
        raise AssertionError("the store kept asking to spill or release")

    # ------------------------------------------------------------ rules
    @rule(target=objs, size=st.sampled_from(SIZES), writer=st.sampled_from(WRITERS))
    def create(self, size: int, writer: int) -> object:
        self.n += 1
        oid = self.n.to_bytes(4, "big") + b"obj."
        seg = self._create(writer, oid, size)
        if seg is None:
            return None
        mm = open_segment(self.store.dir, seg)
        try:
            mm[:size] = pattern(oid, size)
        finally:
            mm.close()
        self.live[oid] = Obj(oid, seg.name, size)
        return oid

    @rule(oid=objs)
    def seal(self, oid: bytes | None) -> None:
        obj = self.live.get(oid) if oid else None
        if obj is not None and obj.state == "writing":
            assert self.store.seal(obj.name)
            obj.state = "sealed"

    @rule(oid=consumes(objs), writer=st.sampled_from(WRITERS))
    def abort(self, oid: bytes | None, writer: int) -> None:
        obj = self.live.get(oid) if oid else None
        if obj is None:
            return
        writing = obj.state == "writing" and self.store.segs[obj.name].writer == writer
        self.store.abort(writer, obj.name)
        if writing:
            del self.live[obj.oid]
            assert obj.name not in self.store.segs or \
                self.store.segs[obj.name].state not in ("writing", "sealed")

    @rule(oid=objs, reader=st.sampled_from(READERS))
    def pin(self, oid: bytes | None, reader: int) -> None:
        obj = self.live.get(oid) if oid else None
        if obj is not None and obj.state == "sealed":
            self.store.pin(reader, [obj.name])
            obj.pins[reader] = obj.pins.get(reader, 0) + 1

    @rule(oid=objs, reader=st.sampled_from(READERS))
    def unpin(self, oid: bytes | None, reader: int) -> None:
        obj = self.live.get(oid) if oid else None
        if obj is not None and obj.pins.get(reader):
            self.store.unpin(reader, [obj.name])
            obj.pins[reader] -= 1

    @rule(oid=consumes(objs))
    def free(self, oid: bytes | None) -> None:
        obj = self.live.get(oid) if oid else None
        if obj is None or obj.state == "writing":
            return
        del self.live[obj.oid]
        self.store.free(obj.path if obj.state == "spilled" else obj.name)
        if obj.state == "sealed" and any(obj.pins.values()):   # readers still map it
            self.retired.append(obj)

    @rule(oid=consumes(objs), reader=st.sampled_from(READERS))
    def free_while_read(self, oid: bytes | None, reader: int) -> None:
        """A reader still holds a view of the value when its last ref goes."""
        self.pin(oid, reader)
        self.free(oid)

    @rule(reader=st.sampled_from(READERS))
    def reader_leaves(self, reader: int) -> None:
        self.store.drop_conn(reader)
        for obj in list(self.live.values()) + self.retired:
            obj.pins.pop(reader, None)

    @rule(writer=st.sampled_from(WRITERS))
    def writer_leaves(self, writer: int) -> None:
        unsealed = [o for o in self.live.values()
                    if o.state == "writing" and self.store.segs[o.name].writer == writer]
        self.store.drop_conn(writer)   # its unsealed objects are garbage, and its spares
        for obj in unsealed:
            del self.live[obj.oid]
        for name in self.spares.pop(writer, []):
            assert name not in self.store.segs or \
                self.store.segs[name].state in ("pooled", "cold"), \
                "a spare outlived its writer's connection"

    @rule(target=objs, size=st.sampled_from(SIZES[:5]), writer=st.sampled_from(WRITERS),
          n=st.integers(1, 4), used=st.integers(0, 2))
    def puts_into_spares(self, size: int, writer: int, n: int, used: int) -> object:
        """A writer takes spares (CreateSegment.spares), makes their files as it fills
        them, and puts up to ``used`` objects into them without asking; the rest stay
        its own until it seals them, gives them back (abort) or leaves."""
        store = self.store
        before = store.used
        spares = store.create_spares(writer, size, n)
        assert len(spares) <= n and store.used == before + sum(s.capacity for s in spares)
        assert store.used <= CAPACITY - CAPACITY // 4 or not spares
        oid = None
        for i, spare in enumerate(spares):
            if i < used:
                spare.size = size   # as the writer does before it opens it (ObjectIO._spare)
            mm = open_segment(store.dir, spare)
            if i >= used:
                mm.close()
                self.spares.setdefault(writer, []).append(spare.name)
                continue
            self.n += 1
            oid = self.n.to_bytes(4, "big") + b"spr."
            mm[:size] = pattern(oid, size)
            mm.close()
            assert store.seal(spare.name, oid, size)
            assert store.segs[spare.name].object_id == oid and store.segs[spare.name].size == size
            self.live[oid] = Obj(oid, spare.name, size, state="sealed")
        for name in self.spares.get(writer, [])[:1]:   # a refused seal changes nothing
            assert not store.seal(name, b"", size) and not store.seal(name, b"x", CAPACITY)
            assert store.segs[name].state == "writing"
        return oid

    @rule(size=st.sampled_from(SIZES), writer=st.sampled_from(WRITERS))
    def writer_dies_before_it_opens(self, size: int, writer: int) -> None:
        """The writer is killed between the store's reply and its open: no file was
        made (a new segment) or filled."""
        self.n += 1
        oid = self.n.to_bytes(4, "big") + b"obj."
        if self._create(writer, oid, size) is not None:
            self.writer_leaves(writer)

    @rule(seconds=st.sampled_from([1.0, 4.0, 11.0]))
    def time_passes(self, seconds: float) -> None:
        """As the node's watch does every half second: give back what sat idle."""
        store = self.store
        self.clock += seconds
        pooled = {n: s.capacity for n, s in store.segs.items() if s.state == "pooled"}
        freed = store.trim_pool()
        gone = {n: c for n, c in pooled.items()
                if n not in store.segs or store.segs[n].state != "pooled"}
        assert freed == sum(gone.values()), "the bytes given back are the segments removed"
        assert all(n not in os.listdir(store.dir) for n in gone if not is_slot(n))
        assert not freed or store.pooled >= FLOOR, "trimmed below the floor"
        old = [s for s in store.segs.values()
               if s.state == "pooled" and s.pooled_at <= self.clock - IDLE_S]
        if old:
            assert store.pooled - min(s.capacity for s in old) < FLOOR, \
                "a segment idle past its time was kept above the floor"

    # ------------------------------------------------------------ invariants
    @invariant()
    def counts_are_exact(self) -> None:
        if not hasattr(self, "store"):
            return
        store = self.store
        holding = sum(s.capacity for s in store.segs.values()
                      if s.state in ("writing", "sealed", "retired", "spilling",
                                     "spill-cancelled", "dead"))
        pooled = sum(s.capacity for s in store.segs.values() if s.state == "pooled")
        assert store.used == holding
        assert store.pooled == pooled == sum(
            c * len(q) for c, q in store.pool.items())
        assert store.used + store.pooled <= CAPACITY
        live_in_shm = {o.name for o in self.live.values() if o.state != "spilled"}
        assert live_in_shm <= set(store.segs), "a live object's segment is gone"
        assert store.spilled_bytes == sum(o.size for o in self.live.values()
                                          if o.state == "spilled")

    @invariant()
    def the_directory_holds_what_the_store_names(self) -> None:
        if not hasattr(self, "store"):
            return
        store = self.store
        assert set(os.listdir(store.dir)) == \
            {split_slot(n)[0] for n in store.segs if not n.startswith("huge/")} \
            | ({"huge"} if store.huge else set())
        assert set(store.slabs) == {split_slot(n)[0] for n in store.segs if is_slot(n)}

    @invariant()
    def slabs_count_their_slots_and_cold_slots_hold_no_page(self) -> None:
        if not hasattr(self, "store"):
            return
        store = self.store
        for slab in store.slabs.values():
            states = [store.segs[n].state for n in slab.slots]
            assert all(store.segs[n].slab is slab and store.segs[n].capacity == slab.cap
                       for n in slab.slots)
            assert slab.live == sum(st not in ("pooled", "cold", "dead") for st in states)
            assert slab.dead == states.count("dead")
            assert sorted(slab.cold) == sorted(n for n in slab.slots
                                               if store.segs[n].state == "cold")
            assert (slab.name in store._empty) == (slab.empty() and "pooled" in states)
            # A slab with no object goes once a slot of it is dead or all are cold.
            assert slab.live or (not slab.dead and len(slab.cold) < len(slab.slots)), \
                "a slab outlived its objects"
            path = os.path.join(store.dir, slab.name)
            fd = os.open(path, os.O_RDONLY)
            try:
                for name in slab.cold:
                    offset = split_slot(name)[1]
                    try:
                        data = os.lseek(fd, offset, os.SEEK_DATA)
                    except OSError:   # ENXIO: no data from there on
                        continue
                    assert data >= offset + slab.cap, f"cold slot {name} holds pages"
            finally:
                os.close(fd)

    @invariant()
    def every_live_objects_bytes_are_its_own(self) -> None:
        if not hasattr(self, "store"):
            return
        self.retired = [o for o in self.retired
                        if any(o.pins.values()) and o.name in self.store.segs]
        for obj in list(self.live.values()) + self.retired:
            path, start = (obj.path, 0) if obj.state == "spilled" else \
                segment_file(self.store.dir, obj.name)
            with open(path, "rb") as f:
                f.seek(start)
                assert f.read(obj.size) == pattern(obj.oid, obj.size), \
                    f"object {obj.oid!r} ({obj.state}) lost its bytes"

    # ------------------------------------------------------------ the end
    @precondition(lambda self: hasattr(self, "store"))
    @rule()
    def everything_freed_then_a_large_put_fits(self) -> None:
        store = self.store
        for obj in list(self.live.values()):
            if obj.state == "writing":
                store.abort(store.segs[obj.name].writer, obj.name)
            else:
                store.free(obj.path if obj.state == "spilled" else obj.name)
            del self.live[obj.oid]
        for reader in READERS:
            store.drop_conn(reader)
        for writer, names in self.spares.items():   # spares given back unused
            for name in names:
                store.abort(writer, name)
        self.spares = {}
        self.retired = []
        assert store.used == 0 and store.spilled_bytes == 0
        big = CAPACITY * 7 // 8   # a class of its own, larger than any object before
        seg = store.create(WRITERS[0], b"big.", big)   # no SpillNeeded: the pool makes way
        assert store.used == seg.capacity and store.used + store.pooled <= CAPACITY
        store.abort(WRITERS[0], seg.name)
        assert store.used == 0


class HugeStoreMachine(StoreMachine):
    """The same with huge pages (ORCHESTRA_HUGE_PAGES): objects from 1 MiB go to the
    session's directory on the "mount" (here a private directory under /dev/shm, with
    2 MiB pages and 10 MiB of them free) in whole pages while the budget lasts, the rest
    to /dev/shm. Also: the huge-page bytes counted are those of the huge segments and
    stay within the budget, and the directory there holds exactly those."""

    @initialize()
    def start(self) -> None:
        super().start()
        self.store.close()   # made again with huge pages
        self.mount = tempfile.mkdtemp(prefix="orchestra-test-huge-", dir="/dev/shm")
        self.store = ObjectStore(0, "unit", CAPACITY, warm_bytes=FLOOR, pool_idle_s=IDLE_S,
                                 spill_dir=os.path.join(self.spill_root, "spill"),
                                 huge_pages=self.mount)
        # A mount of 2 MiB pages, 10 MiB of them free less what the store holds (pages of
        # segments handed out and not written yet: free still, the store counts them).
        store = self.store
        store.huge_page = 2 * MiB
        store.huge_free = lambda: HUGE_BUDGET - store.huge_used + sum(store.huge_writing.values())
        self.store.now = lambda: self.clock

    def teardown(self) -> None:
        if hasattr(self, "store"):
            huge = self.store.huge
            try:
                super().teardown()
                assert not os.path.exists(huge) and os.listdir(self.mount) == []
            finally:
                shutil.rmtree(self.mount, ignore_errors=True)

    @invariant()
    def huge_pages_are_counted_and_within_the_budget(self) -> None:
        if not hasattr(self, "store"):
            return
        store = self.store
        huge = {n: s.capacity for n, s in store.segs.items() if n.startswith("huge/")}
        assert store.huge_used == sum(huge.values()) <= HUGE_BUDGET
        assert set(store.huge_writing) <= {n for n in huge if store.segs[n].state == "writing"}
        assert all(c % store.huge_page == 0 and c >= MiB for c in huge.values())
        assert set(os.listdir(store.huge)) == {n[len("huge/"):] for n in huge}


StoreMachine.TestCase.settings = settings(
    max_examples=int(os.environ.get("ORCHESTRA_HYPOTHESIS_EXAMPLES", "60")),
    stateful_step_count=40, deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much])
test_the_store_under_random_interleavings = StoreMachine.TestCase
HugeStoreMachine.TestCase.settings = StoreMachine.TestCase.settings
test_the_store_with_huge_pages_under_random_interleavings = HugeStoreMachine.TestCase
