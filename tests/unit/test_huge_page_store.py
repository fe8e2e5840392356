"""Huge pages for large objects (ORCHESTRA_HUGE_PAGES), the store's and the files' part:
which segments go there, in whole pages, within the pages free at start; names and paths
through the session directory's ``huge`` link; the setting refused with the cause. No
processes: a private directory under /dev/shm stands for the hugetlbfs mount (the
cluster on a real one: tests/integration/test_huge_pages.py)."""
from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Iterator

import pytest

from orchestra._objects.segments import (
    DIR_PREFIX,
    huge_page_mount,
    map_segment,
    open_segment,
    segment_path,
    sweep_stale_segments,
)
from orchestra._objects.store import HUGE_MIN, ObjectStore, huge_pages_dir
from orchestra.exceptions import ObjectStoreError

pytestmark = pytest.mark.timeout(30)

MiB = 1 << 20
PAGE = 2 * MiB
DEAD_PID = 4194304 + 17   # above pid_max's ceiling (2**22): no process has it


@pytest.fixture
def mount() -> Iterator[str]:
    path = tempfile.mkdtemp(prefix="orchestra-test-huge-", dir="/dev/shm")
    yield path
    shutil.rmtree(path, ignore_errors=True)


def huge_store(mount: str, budget: int) -> ObjectStore:
    store = ObjectStore(1, "unit", 64 * MiB, huge_pages=mount)
    # A mount of 2 MiB pages, ``budget`` bytes of them free less what the store holds.
    store.huge_page = PAGE
    store.huge_free = lambda: budget - store.huge_used + sum(store.huge_writing.values())
    return store


def test_large_objects_go_to_huge_pages_in_whole_pages_and_small_ones_stay(mount: str) -> None:
    store = huge_store(mount, 16 * MiB)
    try:
        small = store.create(1, b"s" * 16, HUGE_MIN - 4096)
        large = store.create(1, b"l" * 16, 5 * MiB)
        assert "/" not in small.name and large.name.startswith("huge/")
        assert large.capacity % PAGE == 0 and large.capacity >= 5 * MiB
        assert store.huge_used == large.capacity and store.used == small.capacity + large.capacity
        for seg, byte in ((small, b"a"), (large, b"b")):   # written and read as any segment
            mm = open_segment(store.dir, seg)
            mm[: seg.size] = byte * seg.size
            mm.close()
            store.seal(seg.name, b"o" * 16, seg.size)
            _, view = map_segment(store.dir, seg)
            assert bytes(view[:3]) == byte * 3
            view.release()
        assert os.listdir(store.huge) == [large.name[len("huge/"):]]
        assert os.path.realpath(os.path.join(store.dir, "huge")) == store.huge
        assert store.huge.startswith(mount + "/" + os.path.basename(store.dir) + "-")
    finally:
        store.close()
    assert os.listdir(mount) == [] and not os.path.exists(store.dir)


def test_once_the_pages_are_spent_objects_go_to_dev_shm_and_freed_ones_give_them_back(mount: str) -> None:
    store = huge_store(mount, 2 * PAGE)
    try:
        first = store.create(1, b"1" * 16, 3 * MiB)      # 2 pages: all of them
        second = store.create(1, b"2" * 16, 3 * MiB)
        assert first.name.startswith("huge/") and not second.name.startswith("huge/")
        assert store.huge_used == 2 * PAGE
        store.abort(1, first.name)                       # kept for reuse: still held
        store.pool_idle_s = 0
        store.trim_pool()                                # given back: the pages too
        assert store.huge_used == 0 and os.listdir(store.huge) == []
        third = store.create(1, b"3" * 16, 3 * MiB)
        assert third.name.startswith("huge/")
    finally:
        store.close()


def test_an_object_whose_class_the_pages_cannot_hold_takes_its_own_size_in_pages(
        mount: str) -> None:
    """17 MiB: its size class is 20 MiB (10 pages), the mount has 9 free: it goes there
    in 9 pages all the same (an 8 GiB array's class is 10 GiB), not to /dev/shm."""
    store = huge_store(mount, 9 * PAGE)
    try:
        seg = store.create(1, b"g" * 16, 17 * MiB)
        assert seg.name.startswith("huge/") and seg.capacity == 9 * PAGE
        mm = open_segment(store.dir, seg)
        mm[: seg.size] = b"g" * seg.size
        mm.close()
        other = store.create(1, b"h" * 16, 3 * MiB)   # no page left: /dev/shm
        assert not other.name.startswith("huge/")
    finally:
        store.close()


def test_a_huge_segment_name_is_a_file_of_the_huge_directory_and_nothing_else() -> None:
    assert segment_path("/dev/shm/s", "huge/seg-3") == "/dev/shm/s/huge/seg-3"
    for bad in ("huge/", "huge/../x", "huge/a/b", "huge/.x", "../x", "a/b", ".x"):
        with pytest.raises(ObjectStoreError, match="bad segment name"):
            segment_path("/dev/shm/s", bad)


def test_a_dead_sessions_directory_on_the_mount_is_swept(mount: str) -> None:
    dead = os.path.join(mount, f"{DIR_PREFIX}{os.geteuid()}-{DEAD_PID}-unit-x")
    alive = os.path.join(mount, f"{DIR_PREFIX}{os.geteuid()}-{os.getpid()}-unit-y")
    for path in (dead, alive):
        os.mkdir(path, 0o700)
    assert sweep_stale_segments(mount) == 1
    assert os.listdir(mount) == [os.path.basename(alive)]
    os.rmdir(alive)


def test_the_setting_names_what_is_wrong_with_it(tmp_path) -> None:
    assert huge_pages_dir({}) is None
    assert "not hugetlbfs" in huge_page_mount(str(tmp_path))
    assert "not a directory" in huge_page_mount(str(tmp_path / "nope"))
    with pytest.raises(ValueError, match=r"ORCHESTRA_HUGE_PAGES=.*not hugetlbfs.*mount -t hugetlbfs"):
        huge_pages_dir({"ORCHESTRA_HUGE_PAGES": str(tmp_path)})
