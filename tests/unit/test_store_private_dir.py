"""The object store's private directory, segment opens and abort (no processes, no
sockets; files under /dev/shm, removed by each test)."""
from __future__ import annotations

import os
import stat
from collections.abc import Iterator
from typing import Any

import pytest

from orchestra._objects.segments import (
    DIR_PREFIX,
    SHM_DIR,
    check_private_dir,
    make_session_dir,
    map_segment,
    open_segment,
    remove_private_dir,
    segment_path,
    sweep_stale_segments,
)
from orchestra._objects.slabs import split_slot
from orchestra._objects.store import ObjectStore
from orchestra._proto import types_pb2
from orchestra.exceptions import ObjectStoreError

pytestmark = pytest.mark.timeout(30)

MiB = 1 << 20
DEAD_PID = 4194304 + 17   # above pid_max's ceiling (2**22): no process has it


@pytest.fixture
def store() -> Iterator[ObjectStore]:
    s = ObjectStore(1, "unit", 64 * MiB)
    yield s
    s.close()


@pytest.fixture
def private_dir() -> Iterator[str]:
    path = make_session_dir("unit")
    yield path
    remove_private_dir(path)


def test_the_session_directory_is_this_users_mode_0700_and_unguessable() -> None:
    a, b = make_session_dir("same"), make_session_dir("same")
    try:
        assert a != b
        for path in (a, b):
            st = os.lstat(path)
            assert stat.S_ISDIR(st.st_mode) and st.st_uid == os.geteuid()
            assert stat.S_IMODE(st.st_mode) == 0o700
            assert os.path.basename(path).startswith(f"{DIR_PREFIX}{os.geteuid()}-{os.getpid()}-same-")
    finally:
        remove_private_dir(a)
        remove_private_dir(b)


@pytest.mark.parametrize("make", ["symlink", "mode-0755", "file"])
def test_a_directory_that_is_not_private_is_refused(private_dir: str, make: str) -> None:
    path = private_dir + "-" + make
    if make == "symlink":
        os.symlink(private_dir, path)
    elif make == "mode-0755":
        os.mkdir(path, 0o700)
        os.chmod(path, 0o755)
    else:
        open(path, "w").close()
    try:
        with pytest.raises(ObjectStoreError, match=path):
            check_private_dir(path)
    finally:
        if os.path.isdir(path) and not os.path.islink(path):
            os.rmdir(path)
        else:
            os.unlink(path)


@pytest.mark.parametrize("name", ["../escape", "a/b", ".hidden", ".."])
def test_a_segment_name_never_leaves_the_directory(private_dir: str, name: str) -> None:
    with pytest.raises(ObjectStoreError):
        segment_path(private_dir, name)


def test_a_segment_is_created_exclusively_and_never_through_a_symlink(private_dir: str,
                                                                      tmp_path: Any) -> None:
    target = tmp_path / "target"
    target.write_bytes(b"")
    os.symlink(target, segment_path(private_dir, "seg-1"))
    seg = types_pb2.Segment(name="seg-1", size=MiB, capacity=MiB)
    with pytest.raises(ObjectStoreError, match="seg-1"):
        open_segment(private_dir, seg)
    assert target.read_bytes() == b""


def test_a_gone_segment_reads_as_file_not_found_so_the_reader_asks_where_it_went(
        private_dir: str) -> None:
    with pytest.raises(FileNotFoundError):
        map_segment(private_dir, types_pb2.Segment(name="seg-9", size=MiB))


def test_abort_gives_back_every_byte_counted_and_removes_the_file(store: ObjectStore) -> None:
    seg = store.create(7, b"oid", 3 * MiB)
    mm = open_segment(store.dir, seg)
    mm.close()
    assert store.used == seg.capacity
    store.abort(8, seg.name)   # another connection's abort changes nothing
    assert store.used == seg.capacity
    store.abort(7, seg.name)
    assert (store.used, store.pooled, store.segs) == (0, 0, {})
    assert not os.path.exists(segment_path(store.dir, seg.name))


def test_abort_of_a_sealed_segment_changes_nothing(store: ObjectStore) -> None:
    seg = store.create(7, b"oid", MiB)
    open_segment(store.dir, seg).close()
    store.seal(seg.name)
    store.abort(7, seg.name)
    assert store.used == seg.capacity


def test_close_removes_the_directory_with_every_segment(store: ObjectStore) -> None:
    open_segment(store.dir, store.create(1, b"a", MiB)).close()
    folder = store.dir
    store.close()
    assert not os.path.exists(folder)


def test_the_sweep_removes_this_users_directories_of_dead_heads_only(tmp_path: Any) -> None:
    mine = f"{DIR_PREFIX}{os.geteuid()}-"
    dead = os.path.join(SHM_DIR, f"{mine}{DEAD_PID}-s-x")
    alive = os.path.join(SHM_DIR, f"{mine}{os.getpid()}-s-x")
    link = os.path.join(SHM_DIR, f"{mine}{DEAD_PID}-s-link")
    target = tmp_path / "kept"
    target.mkdir()
    (target / "file").write_text("kept")
    for path in (dead, alive):
        os.mkdir(path, 0o700)
        open(os.path.join(path, "seg-1"), "w").close()
    os.symlink(target, link)
    try:
        sweep_stale_segments()
        assert not os.path.exists(dead)
        assert os.path.exists(alive)
        assert (target / "file").read_text() == "kept"   # a link is never followed
    finally:
        remove_private_dir(alive)
        remove_private_dir(dead)
        if os.path.lexists(link):
            os.unlink(link)


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root to make a directory another uid owns")
def test_the_sweep_leaves_a_directory_of_another_owner_even_under_this_users_name() -> None:
    other = os.path.join(SHM_DIR, f"{DIR_PREFIX}{os.geteuid()}-{DEAD_PID}-s-other")
    os.mkdir(other, 0o700)
    os.chown(other, 12345, 12345)
    try:
        sweep_stale_segments()
        assert os.path.isdir(other)
    finally:
        os.rmdir(other)


def test_a_kept_segment_a_reader_mapped_when_the_head_was_lost_is_never_reused(
        store: ObjectStore) -> None:
    """carry_over keeps sealed objects; one a process mapped then (a task's argument, run
    on across the head's restart) is removed once freed, never pooled for another writer
    (it would write into the bytes that task still reads); one nobody mapped is pooled."""
    read = store.create(7, b"read", 3 * MiB, holds_refs=False)   # files of their own
    idle = store.create(7, b"idle", 3 * MiB, holds_refs=False)
    for seg in (read, idle):
        open_segment(store.dir, seg).close()
        store.seal(seg.name)
    store.drop_conn(7)          # the writer let go of its maps
    store.pin(9, [read.name])   # a reader's map
    kept = {d.object_id for d in store.carry_over()}
    assert kept == {b"read", b"idle"}
    store.free(read.name)
    store.free(idle.name)
    assert not os.path.exists(segment_path(store.dir, read.name))
    assert os.path.exists(segment_path(store.dir, idle.name)) and store.pooled == idle.capacity


def test_a_kept_slot_a_reader_mapped_when_the_head_was_lost_is_never_reused(
        store: ObjectStore) -> None:
    """The same for slots of one slab: the slot read then is dead once freed (never
    handed out while its slab lives), the other pooled and reused; the slab's file goes
    with its last object, and the dead slot's bytes are counted until then."""
    read = store.create(7, b"read", MiB, holds_refs=False)
    idle = store.create(7, b"idle", MiB, holds_refs=False)
    other = store.create(7, b"othr", MiB, holds_refs=False)
    assert len({split_slot(s.name)[0] for s in (read, idle, other)}) == 1   # one slab
    for seg in (read, idle, other):
        open_segment(store.dir, seg).close()
        store.seal(seg.name)
    store.drop_conn(7)
    store.pin(9, [read.name])
    assert {d.object_id for d in store.carry_over()} == {b"read", b"idle", b"othr"}
    store.free(read.name)
    store.free(idle.name)
    assert store.segs[read.name].state == "dead" and store.used == 2 * read.capacity
    names = set()
    for i in range(8):   # the slab's slots, but the dead one, and a new slab's after
        names.add(store.create(8, b"new%d" % i, MiB).name)
    assert idle.name in names and read.name not in names
    for name in names | {other.name}:
        store.abort(8, name)
        store.free(name)
    assert not os.path.exists(segment_path(store.dir, read.name))   # the slab went
    assert store.used == 0
