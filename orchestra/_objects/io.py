"""Object reads and writes of one process: values inline or in shared-memory segments,
and the maps of segments it keeps.

    put/result --serialize--> small: ObjectData.inline
                          \\-> large: create_segment (head) -> map -> write the Arrow
                               stream -> ObjectData.segment
    get --ObjectData--> inline: deserialize | segment: a read-only view (pinned) ->
        deserialize over it (Arrow data, DataFrame columns and numpy arrays come back
        as views of shared memory)

The view of a segment this process filled itself (a put read back) is made over its
read-write map in ``wmaps``, read-only, ~1 us; any other is a new read-only map.

Maps kept: ``maps`` (object id -> read view, while a ref lives here: a second get is
~15 us, a new map of 512 MiB ~80 us), given up when the store wants to spill
(RELEASE_MAPS); ``wmaps`` (segment name -> read-write map of a segment this process
filled, for when the store hands the segment back: a new map of 512 MiB costs ~100 ms,
the copy ~50 ms), closed when the store unlinks it (DROP_MAPS); ``rmaps`` (segment name ->
read-only map of all of it, kept across the objects the segment holds: a worker reading
each new large argument put in a pooled segment finds its pages mapped, and reads 512 MiB
strided in ~2 ms instead of ~25 ms of page faults; the newest _RMAPS_MAX, closed on
DROP_MAPS and RELEASE_MAPS; the store counts the reader among those it tells); and the
store's warm reserve where one is set (ORCHESTRA_OBJECT_WARM_RESERVE), mapped ahead while idle
(MAP_AHEAD). A medium object's segment is a slot of a slab (slabs.py): this process maps
each slab it writes into once (``slab_maps``, kept through the slab's carvings, closed
when the store removes it), and writes a slot through a view of that map (in ``wmaps``
as any other), its pages made present by populate_range: no map or unmap per put.
"""
from __future__ import annotations

import errno
import mmap
import os
import pickle
import threading
import time
import weakref
from collections.abc import Callable, Iterable, Sequence
from typing import Any, Protocol

from .._protocol import pb
from ..exceptions import ObjectLostError, ObjectStoreError, OrchestraError
from .pages import populate_range
from .premap import Premapper, close_map
from .refs import RefCounts
from .segments import (
    map_ahead,
    map_segment,
    map_slab,
    no_room,
    open_segment,
    page_align,
    write_into,
)
from .serialization import Parsed, Serialized, deserialize, parse
from .slabs import is_slot, slab_ident, split_slot
from .store import size_class

# Spare segments (CreateSegment.spares): for objects up to _SPARE_MAX bytes, _SPARES at a
# time, at most _SPARE_BYTES of capacity held per process, once puts of a size class
# come within _SPARE_AFTER_S of each other.
_SPARE_MAX = 4 << 20
_SPARES = 8
_SPARE_BYTES = 32 << 20
_SPARE_AFTER_S = 1.0
_SPARE_IDLE_S = 2.0   # spares of a class no put took for this long are given back
# A put that leaves _REFILL_AT or fewer spares of its class asks for _REFILL more
# without waiting (a create with no object: CreateSegment.spares alone), so that the
# puts after it find spares ready instead of waiting ~250 us for a create every _SPARES
# puts. Its answer takes ~0.3 ms (~0.6 ms with the node in a process of its own), while
# a put into a spare takes ~0.1 ms. One such request a class at a time (another after
# _REFILL_WAIT_S, should its answer never come: a head that died).
_REFILL_AT = 12
_REFILL = 16
_REFILL_WAIT_S = 5.0
# A put from this size parses what it wrote at once (keep_read): a get of a large value
# right after its copy otherwise parses it with the caches cold. Below it the parse
# costs ~10 us wherever it runs, and a put whose value is never read here skips it.
KEEP_READ_MIN = 1 << 20


class Client(Protocol):
    """What object reads and writes use of their process's CoreClient."""

    refs: RefCounts
    results: dict[bytes, pb.ObjectData]
    lost: str | None
    closing: bool

    def request(self, req: pb.Request, timeout_s: float = ...) -> pb.Reply: ...
    def request_later(self, req: pb.Request, on_reply: Callable[[pb.Reply], None]) -> None: ...
    def read_ready(self) -> None: ...
    def flush_refs(self, wait: bool = ...) -> None: ...
    def escape(self, ids: Iterable[bytes]) -> None: ...


class ObjectIO:
    def __init__(self, client: Client, shm_dir: str, inline_threshold: int,
                 node_id: int = 0) -> None:
        self.client = client
        self.node_id = node_id   # this process's node: segments of others are pulled here
        self.refs = client.refs
        self.shm_dir = shm_dir   # the session's private directory of segments
        self.inline_threshold = inline_threshold
        # object id -> (read view, segment, its stream parsed)
        self.maps: dict[bytes, tuple[memoryview, str, Parsed]] = {}
        # Objects kept in maps by their put (keep_read) that no get has read yet: the
        # first get tells the store of the use (its least recently used spill first).
        self.unread: set[bytes] = set()
        self.wmaps: dict[str, mmap.mmap | memoryview] = {}
        # slab-<n> -> read-write map of all of that slab (see the module docstring)
        self.slab_maps: dict[str, mmap.mmap] = {}
        # Segment name -> read-only map of all of it, kept across the objects it holds
        # (the store pools segments): a worker reading each new large argument in the
        # same memory finds its pages mapped already (no page faults). The newest
        # _RMAPS_MAX; closed when the store unlinks the segment (DROP_MAPS).
        self.rmaps: dict[str, mmap.mmap] = {}
        self.mapping_ahead: dict[str, bool] = {}   # name -> still wanted
        # Spare segments the store handed out (CreateSegment.spares), by the size class
        # of the put that asked: the next puts of that class go in without asking.
        # Asked for once puts of a class come within _SPARE_AFTER_S of each other.
        self.spares: dict[int, list[pb.Segment]] = {}
        self.spare_bytes = 0
        self._last_create: dict[int, float] = {}
        self._last_used: dict[int, float] = {}   # class -> when a put last took a spare
        self._refilling: dict[int, float] = {}   # class -> when its refill was asked for
        self.premap = Premapper(shm_dir)   # spares created and mapped ahead (premap.py)
        self.premap.prepare_slot = self._prepare_slot

    # ------------------------------------------------------------------ writes
    def make_object_data(self, oid: bytes, ser: Serialized,
                         out: pb.ObjectData | None = None) -> pb.ObjectData:
        """ObjectData for a sealed value: inline when small, else written to a segment.
        ``out``: an ObjectData to fill (one added to a message), else a new one."""
        client = self.client
        if ser.contained:
            client.escape(ser.contained)
        if out is None:
            out = pb.ObjectData()
        out.object_id = oid
        out.contained.extend(ser.contained)
        if ser.size <= self.inline_threshold:
            out.inline = ser.to_bytes()
            return out
        size = ser.stream_size()
        seg = self._spare(size) if not ser.contained else None
        spare = seg is not None
        if seg is None:
            seg = self._create(oid, size, ser)
        with self.refs.lock:
            mm = self.wmaps.pop(seg.name, None) if seg.reused else None
        try:
            need = min(page_align(size), seg.capacity)
            if is_slot(seg.name) and (mm is None or seg.allocated < need):
                # Through this process's map of its slab (a view it wrote through
                # before has the pages present already, as far as allocated; the premap
                # thread made a spare's present).
                close_map(mm)
                mm = self.slot_view(seg, not (spare and self.premap.take_slot(seg, need)))
            elif spare and mm is None:   # (a reused one's map is the one kept above)
                mm = self.premap.take(seg)
            if mm is None or len(mm) < size:
                try:
                    mm = open_segment(self.shm_dir, seg)
                except ObjectStoreError:
                    if not spare:
                        raise
                    # A spare of a store that is gone (its head was killed, and the
                    # put ran before this process heard): ask for a segment instead,
                    # which says ClusterLostError if the head is gone (put retries it).
                    self.abort_segment(seg.name)
                    seg = self._create(oid, size, ser)
                    mm = open_segment(self.shm_dir, seg)
            write_into(mm, ser)
        except BaseException:
            # The store counted the segment's bytes: give them back before the error
            # reaches the caller (a failed put used to keep them until disconnect).
            # (close_map: an exception raised into the copy, a cancel, can leave a view of
            # the map alive; closing it then raised BufferError in the cancel's place.)
            close_map(mm)
            self.abort_segment(seg.name)
            raise
        with self.refs.lock:
            if client.lost is None:
                self.wmaps[seg.name] = mm
        out.segment.CopyFrom(seg)
        return out

    def slot_view(self, seg: pb.Segment, populate: bool = True) -> memoryview | None:
        """A writable view of slot ``seg`` through this process's map of its slab, the
        pages of its object (``seg.size``) made present (unless ``populate`` is False:
        they are); None where the kernel cannot make them present (open_segment maps
        the slot then). ObjectStoreFullError when a page cannot be had."""
        key = f"{self.shm_dir}/{slab_ident(seg.name)}"
        with self.refs.lock:
            mm = self.slab_maps.get(key)
        if mm is None:
            made = map_slab(self.shm_dir, seg.name)
            with self.refs.lock:
                mm = self.slab_maps.get(key)
                if mm is None:
                    mm = made
                    if self.client.lost is None and not self.client.closing:
                        self.slab_maps[key] = made
            if mm is not made:
                close_map(made)
        offset = split_slot(seg.name)[1]
        failed = populate_range(mm, offset, min(page_align(max(seg.size, 1)), seg.capacity)) \
            if populate else 0
        if failed in (errno.ENOSYS, errno.EINVAL):
            return None
        if failed:
            raise no_room(seg.size, OSError(failed, os.strerror(failed)))
        return memoryview(mm)[offset: offset + seg.capacity]

    def _prepare_slot(self, seg: pb.Segment) -> int:
        """On the premap thread: a spare slot's pages made present ahead of its put;
        the bytes from its start that are (0: none, the put does it)."""
        view = self.slot_view(seg)
        if view is None:
            return 0
        view.release()
        return min(page_align(max(seg.size, 1)), seg.capacity)

    def _create(self, oid: bytes, size: int, ser: Serialized) -> pb.Segment:
        """A new segment for ``oid`` from the store (and spares of its class with it)."""
        # Drops that came before this put must reach the store before it judges the room
        # (the decrements otherwise travel after the frame, see CoreClient.send_raw); a
        # spare's room was judged when it was handed out.
        self.client.flush_refs()
        reply = self.client.request(pb.Request(create_segment=pb.CreateSegment(
            object_id=oid, size=size, holds_refs=bool(ser.contained),
            spares=0 if ser.contained else self._spares_wanted(size))))
        if reply.spares:
            self._keep_spares(size, reply.spares)
        return reply.segment

    def _spare(self, size: int) -> pb.Segment | None:
        """A spare segment for an object of ``size`` bytes (its size set), or None."""
        if size > _SPARE_MAX:
            return None
        cls = size_class(size)
        with self.refs.lock:
            spares = self.spares.get(cls)
            if not spares:
                return None
            spare = spares.pop()
            self.spare_bytes -= spare.capacity
            now = self._last_used[cls] = time.monotonic()
            refill, left = 0, len(spares)
            asked = self._refilling.get(cls)
            if left <= _REFILL_AT and (asked is None or now - asked > _REFILL_WAIT_S):
                refill = min(_REFILL, (_SPARE_BYTES - self.spare_bytes) // cls)
                if refill > 0:
                    self._refilling[cls] = now
        if refill > 0:
            self._refill(cls, size, refill)
        elif left < _REFILL_AT and cls in self._refilling:
            # Its answer may be here: no other thread reads for up to a background
            # round (20 ms), and the put after the last spare would ask and wait.
            self.client.read_ready()
        seg = pb.Segment()
        seg.CopyFrom(spare)
        seg.size = size
        return seg

    def _refill(self, cls: int, size: int, n: int) -> None:
        """Ask for ``n`` more spares of class ``cls`` without waiting: whichever thread
        reads the answer keeps its spares (``refilled``)."""
        def refilled(reply: pb.Reply) -> None:
            with self.refs.lock:
                self._refilling.pop(cls, None)
            if reply.spares and not self.client.closing:
                self._keep_spares(size, reply.spares)
        try:
            self.client.request_later(pb.Request(create_segment=pb.CreateSegment(
                size=size, spares=n)), refilled)
        except OrchestraError:   # ClusterLostError: the put's own write says so
            pass

    def _spares_wanted(self, size: int) -> int:
        """How many spares to ask for with a create of ``size`` bytes: none for a large
        object or a first put of its class, else as many as _SPARE_BYTES leaves room for."""
        if size > _SPARE_MAX:
            return 0
        cls = size_class(size)
        now = time.monotonic()
        with self.refs.lock:   # the spare fields: under the ref lock, as the maps
            last = self._last_create.get(cls, 0.0)
            self._last_create[cls] = now
            room = _SPARE_BYTES - self.spare_bytes
        if now - last > _SPARE_AFTER_S:
            return 0
        return max(0, min(_SPARES, room // cls))

    def idle_spares(self, idle_s: float = _SPARE_IDLE_S) -> list[str]:
        """The spares of the size classes no put used for ``idle_s``, taken out: the
        client's background thread gives them back (RefDelta.give_back), since the
        store counts them as used."""
        now = time.monotonic()
        with self.refs.lock:
            idle = [c for c in self.spares if now - self._last_used.get(c, 0.0) > idle_s]
            names = []
            for cls in idle:
                for spare in self.spares.pop(cls):
                    self.spare_bytes -= spare.capacity
                    names.append(spare.name)
        if names:
            self.premap.drop(names)
        return names

    def _keep_spares(self, size: int, spares: Sequence[pb.Segment]) -> None:
        cls = size_class(size)
        with self.refs.lock:
            self._last_used[cls] = time.monotonic()
            kept = self.spares.setdefault(cls, [])
            for spare in spares:
                kept.append(spare)
                self.spare_bytes += spare.capacity
            # Those this process holds no map of: fresh ones, and pooled ones another
            # process (or another carving of their slab) wrote before.
            unmapped = [s for s in spares if not (s.reused and s.name in self.wmaps)]
        self.premap.add(unmapped, size)

    def copy_object(self, oid: bytes, view: memoryview, contained: Sequence[bytes]) -> pb.ObjectData:
        """ObjectData of a new segment holding ``view``'s bytes (an object's Arrow stream
        as another segment held it): a driver's large put carried over to a restarted
        head (_runtime/reconnect.py). ObjectStoreError when it cannot be made."""
        size = len(view)
        seg = self.client.request(pb.Request(create_segment=pb.CreateSegment(
            object_id=oid, size=size, holds_refs=bool(contained)))).segment
        mm = None
        try:
            mm = open_segment(self.shm_dir, seg)
            mm[:size] = view
        except BaseException:
            if mm is not None:
                mm.close()
            self.abort_segment(seg.name)
            raise
        with self.refs.lock:
            self.wmaps[seg.name] = mm
        return pb.ObjectData(object_id=oid, contained=contained, segment=seg)

    def abort_segment(self, name: str) -> None:
        """Tell the store a segment it handed out was not filled (see make_object_data)."""
        if self.client.lost is None:
            try:
                self.client.request(pb.Request(abort_segment=name), timeout_s=30)
            except OrchestraError:   # ClusterLostError too
                pass   # the error being raised says more; a lost head frees it anyway

    # ------------------------------------------------------------------ maps
    def drop_maps(self, names: Iterable[str]) -> None:
        names = set(names)
        self.premap.drop(names)
        with self.refs.lock:
            maps: list[mmap.mmap | memoryview | None] = []
            for n in names:
                maps.append(self.wmaps.pop(n, None))
                maps.append(self.rmaps.pop(n, None))
                if n.startswith("slab-") and not is_slot(n):   # a slab the store removed
                    maps.append(self.slab_maps.pop(f"{self.shm_dir}/{slab_ident(n)}", None))
                if n in self.mapping_ahead:
                    self.mapping_ahead[n] = False   # unlinked before its map was made
            # Reads of them kept for a second get (a get that raced the removal read its
            # own write map): a later get maps the object where it is now.
            for oid in [o for o, (_, name, _) in self.maps.items() if name in names]:
                self.forget(oid)
        kept = [mm for mm in maps if mm is not None]
        if len(kept) > _CLOSE_HERE_MAX and self.premap.discard(kept):
            return   # (a slab carved again: a map of each of its old slots, ~14 us each)
        for mm in kept:
            close_map(mm)

    def drop_all_maps(self) -> None:
        """Close every map kept (they would keep the segments' memory)."""
        self.drop_maps(list(self.wmaps) + list(self.rmaps))
        with self.refs.lock:
            slabs, self.slab_maps = list(self.slab_maps.values()), {}
        for mm in slabs:
            close_map(mm)
        self.premap.close()

    def release_maps(self, names: Iterable[str]) -> list[str]:
        """The store wants to spill these segments: forget the maps kept for later gets
        (a map still viewed by a value stays, and so does its pin). Returns those of
        them that are spares of this process no put took yet: the caller gives them
        back (RefDelta.give_back)."""
        wanted = set(names)
        with self.refs.lock:
            for oid in [o for o, (_, name, _) in self.maps.items() if name in wanted]:
                self.forget(oid)
            kept = [self.rmaps.pop(n) for n in wanted if n in self.rmaps]
            back = []
            for cls, spares in list(self.spares.items()):
                keep = [sp for sp in spares if sp.name not in wanted]
                for sp in spares:
                    if sp.name in wanted:
                        back.append(sp.name)
                        self.spare_bytes -= sp.capacity
                self.spares[cls] = keep
        for mm in kept:
            close_map(mm)
        if back:
            self.premap.drop(back)
        return back

    def map_ahead(self, names: Sequence[str]) -> None:
        with self.refs.lock:
            for n in names:
                self.mapping_ahead[n] = True

        def work() -> None:
            client = self.client
            for n in names:
                mm = map_ahead(self.shm_dir, n)
                with self.refs.lock:
                    keep = self.mapping_ahead.pop(n, False) and client.lost is None \
                        and not client.closing and n not in self.wmaps
                    if keep and mm is not None:
                        self.wmaps[n] = mm
                        continue
                if mm is not None:
                    mm.close()
        threading.Thread(target=work, name="orchestra-map-ahead", daemon=True).start()

    # ------------------------------------------------------------------ reads
    def value(self, oid: bytes, data: pb.ObjectData) -> Any:
        """The value an ObjectData stands for (raises the error it holds)."""
        kind = data.WhichOneof("data")
        if kind == "inline":
            return deserialize(data.inline, f"object {oid.hex()}")
        if kind == "segment":
            cached = self.maps.get(oid)
            if cached is not None:
                if oid in self.unread:
                    self._first_read(oid, cached[1])
                return cached[2].value()
            own = self.own_view(data.segment)
            name = data.segment.name
            if own is not None:
                view = own
            else:
                view, seg = self.map_object(data)
                name = seg.name
            parsed = parse(view, f"object {oid.hex()}")
            with self.refs.lock:
                if oid in self.refs.local:
                    self.maps[oid] = (view, name, parsed)
            return parsed.value()
        raise pickle.loads(data.error)

    def keep_read(self, oid: bytes, segment: pb.Segment) -> None:
        """After a put: parse the object just written, as its first get would, and keep
        it as a get keeps it. The put has just copied the value through the caches, so
        the get that often follows it runs cold: it then only makes the value (~70 us
        for 512 MiB instead of ~240). A DataFrame of a schema new to this process is
        converted once here, so that the next are made by hand (``frames``)."""
        view = self.own_view(segment)
        if view is None:
            return
        try:
            parsed = parse(view, f"object {oid.hex()}")
            if parsed.kind == b"pandas" and parsed.ready is None:
                parsed.value()
        except OrchestraError:
            return   # a get says it, where it is asked for
        with self.refs.lock:
            if oid in self.refs.local:
                self.maps[oid] = (view, segment.name, parsed)
                self.unread.add(oid)

    def _first_read(self, oid: bytes, name: str) -> None:
        """A get of an object its put kept: a pin and an unpin tell the store of the use,
        as a get that maps it does (the put's own pin holds meanwhile)."""
        with self.refs.lock:
            if oid in self.unread:
                self.unread.discard(oid)
                self.refs.pin.append(name)
                self.refs.unpin.append(name)

    def forget(self, oid: bytes) -> None:
        """Under the ref lock: the read kept for ``oid`` goes (its view's pin with it)."""
        self.maps.pop(oid, None)
        self.unread.discard(oid)

    def own_view(self, segment: pb.Segment) -> memoryview | None:
        """A read-only view of a segment this process filled and still maps (a fresh
        put read back: no new map, ~1 us instead of ~100 us for 512 MiB), pinned like a
        reader's map; None when it is not at hand."""
        if segment.path or segment.node_id != self.node_id:
            return None
        mm = self.wmaps.get(segment.name)
        # None when DROP_MAPS closed it meanwhile: mapped anew (the map stays in wmaps
        # for the next put either way).
        view = _export(mm, segment.size) if mm is not None else None
        return self._pinned(view, segment.name) if view is not None else None

    def map_object(self, data: pb.ObjectData) -> tuple[memoryview, Any]:
        """Map a large object read-only, wherever it is now: a reader may have learnt
        its segment just before the store spilled it to disk; then ask the head.
        Returns the view and the Segment it maps."""
        for _ in range(8):
            if data.segment.node_id != self.node_id:
                # On another node: this node's store pulls a copy (the head answers
                # with it once it is here; one pull for every reader on this node).
                data = self._locate(data.object_id)
            try:
                return self.map_segment(data.segment), data.segment
            except FileNotFoundError:
                data = self._locate(data.object_id)
        raise ObjectLostError(f"object {data.object_id.hex()} kept moving while being read")

    def _locate(self, oid: bytes) -> pb.ObjectData:
        """Where the object's data is now, for this node (ObjectLostError if nowhere)."""
        client = self.client
        data = client.request(pb.Request(locate=oid)).object
        if data.WhichOneof("data") == "error":
            raise pickle.loads(data.error)
        with self.refs.lock:
            if oid in client.results:
                client.results[oid] = data
        return data

    def map_segment(self, segment: pb.Segment) -> memoryview:
        """Map a sealed segment read-only and pin it until the last view of it is gone
        (a spill file needs no pin: removing it does not disturb a map). A segment's map
        is kept for the next object in it (``rmaps``)."""
        if segment.path:
            return map_segment(self.shm_dir, segment)[1]
        name = segment.name
        with self.refs.lock:
            mm = self.rmaps.get(name)
        view = _export(mm, segment.size) if mm is not None else None
        if view is None:
            mm = map_segment(self.shm_dir, segment, whole=True)[0]
            view = _export(mm, segment.size)
            if view is None:
                mm.close()
                raise ObjectLostError(f"segment {name} of object store is shorter than the "
                                      f"object it holds ({segment.size} bytes)")
            with self.refs.lock:
                stale = [self.rmaps.pop(name, None)]
                if self.client.lost is None and not self.client.closing:
                    self.rmaps[name] = mm
                    while len(self.rmaps) > _RMAPS_MAX:   # the oldest go
                        stale.append(self.rmaps.pop(next(iter(self.rmaps))))
            for old in stale:
                close_map(old)
        return self._pinned(view, name)

    def _pinned(self, view: memoryview, name: str) -> memoryview:
        """Pin segment ``name`` until the last view of ``view``'s buffer is gone."""
        with self.refs.lock:
            self.refs.pin.append(name)
        weakref.finalize(view.obj, self._unmapped, name)
        return view

    def _unmapped(self, name: str) -> None:
        with self.refs.lock:
            if self.client.lost is None:
                self.refs.unpin.append(name)


# Read maps kept across objects (ObjectIO.rmaps): address space only (the segments' pages
# are the store's), each closed when the store unlinks its segment.
_RMAPS_MAX = 64
# More maps than this to close at once are closed on the premap thread (premap.discard).
_CLOSE_HERE_MAX = 8


def _export(mm: mmap.mmap | memoryview, size: int) -> memoryview | None:
    """A read-only view of the first ``size`` bytes of ``mm`` over a buffer of its own,
    whose finalizer tells when the last view of the value is gone (the map stays for
    the next object); None when the map is closed or too short."""
    import numpy as np
    try:
        export = np.frombuffer(mm, dtype=np.uint8)
    except (ValueError, TypeError, BufferError):
        return None
    if export.nbytes < size:
        return None
    export.flags.writeable = False
    return memoryview(export)[:size]  # type: ignore[arg-type]
