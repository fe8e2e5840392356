"""A segment's pages made present before a put copies into it (orchestra/_objects/pages.py):
a large segment through MADV_POPULATE_WRITE over disjoint ranges on threads, which must
cover the whole map and leave the file's bytes as they were; a reused one, or a kernel
without it, through MAP_POPULATE. A writer allocates and maps only the pages its object
needs, never a size class's slack. Real files in /dev/shm, the map's resident size read
from /proc/self/smaps, the file's allocation from its blocks."""
from __future__ import annotations

import mmap
import os
import time
from pathlib import Path

import pytest

from orchestra._objects import pages


def _file(tmp: Path, size: int) -> int:
    fd = os.open(tmp, os.O_CREAT | os.O_RDWR, 0o600)
    os.ftruncate(fd, size)
    os.posix_fallocate(fd, 0, size)
    return fd


def _resident_kib(mm: mmap.mmap) -> int:
    """The resident size of the map whose start address is ``mm``'s."""
    import ctypes
    anchor = ctypes.c_char.from_buffer(mm)
    start = ctypes.addressof(anchor)
    del anchor
    rss, inside = -1, False
    with open("/proc/self/smaps") as f:
        for line in f:
            first = line.split()[0]
            if "-" in first and not first.endswith(":"):
                lo = int(first.split("-")[0], 16)
                inside = lo == start
            elif inside and line.startswith("Rss:"):
                rss = int(line.split()[1])
    return rss


def _resident_settles_at(mm: mmap.mmap, kib: int) -> int:
    """The map's resident size once it is ``kib``, or its last reading after 2 s. A page
    the kernel is migrating meanwhile (compaction, under another process's memory
    pressure) is briefly out of the map's page table and of its Rss, then back."""
    deadline = time.monotonic() + 2.0
    while True:
        rss = _resident_kib(mm)
        if rss == kib or time.monotonic() > deadline:
            return rss
        time.sleep(0.01)


@pytest.fixture
def shm_file() -> Path:
    path = Path("/dev/shm") / f"orchestra-pages-test-{os.getpid()}"
    yield path
    path.unlink(missing_ok=True)


@pytest.mark.parametrize("threads", [1, 3])
def test_every_page_of_the_map_is_present_after_populate_write(shm_file, monkeypatch, threads):
    size = 48 << 20
    monkeypatch.setattr(pages, "_POPULATE_RANGE", 8 << 20)   # three ranges of 16 MiB
    fd = _file(shm_file, size)
    try:
        mm = mmap.mmap(fd, size, mmap.MAP_SHARED, mmap.PROT_READ | mmap.PROT_WRITE)
        mm[size - 1:size] = b"z"
        assert _resident_kib(mm) < 64   # one page written so far
        failed = pages.populate_write(mm, threads)
        if failed:
            pytest.skip(f"this kernel has no MADV_POPULATE_WRITE (errno {failed})")
        assert _resident_settles_at(mm, size >> 10) == size >> 10   # the whole map, every range
        assert mm[size - 1:size] == b"z" and mm[:4] == b"\0\0\0\0"   # the bytes kept
        mm.close()
    finally:
        os.close(fd)


def test_map_for_writing_gives_a_present_writable_map_large_or_small(shm_file):
    # madvise on two threads, on one; MAP_POPULATE (reused)
    for size, fresh in ((2 * pages._POPULATE_RANGE, True), (1 << 20, True),
                        (pages._POPULATE_RANGE, False)):
        fd = _file(shm_file, size)
        try:
            mm = pages.map_for_writing(fd, size, fresh)
            assert len(mm) == size and _resident_settles_at(mm, size >> 10) == size >> 10
            mm[:5] = b"hello"
            mm.close()
            with open(shm_file, "rb") as f:
                assert f.read(5) == b"hello"
        finally:
            os.close(fd)
            shm_file.unlink()


@pytest.mark.parametrize("size", [(1 << 20) + 100, (5 << 19) + 100])
def test_a_writer_allocates_and_maps_its_objects_pages_and_never_the_slack(tmp_path, size):
    """A 1.25 MiB class (a slot of a slab) and a 3 MiB one (a file of its own)."""
    from orchestra._objects.segments import open_segment, segment_path
    from orchestra._objects.slabs import SLAB, is_slot
    from orchestra._objects.store import ObjectStore, size_class
    store = ObjectStore(0, "pages-test", 64 << 20)
    try:
        assert size_class(size) in (1310720, 3 << 20)
        seg = store.create(1, b"a", size)
        assert not seg.reused and seg.allocated == 0
        assert is_slot(seg.name) == (seg.capacity < 2 << 20)
        mm = open_segment(store.dir, seg)
        page_aligned = (size + mmap.PAGESIZE - 1) & ~(mmap.PAGESIZE - 1)
        path = segment_path(store.dir, seg.name)
        # the file has its class (a slot: the slab's size)
        assert os.path.getsize(path) == (SLAB if is_slot(seg.name) else seg.capacity)
        assert os.stat(path).st_blocks * 512 == page_aligned      # its memory, the object's
        assert len(mm) == page_aligned and \
            _resident_settles_at(mm, page_aligned >> 10) == page_aligned >> 10
        mm[:size] = b"a" * size
        mm.close()
        store.seal(seg.name)
        store.free(seg.name)
        # Reused by a larger object of the class: what it needs beyond is allocated now.
        bigger = seg.capacity - 5000
        again = store.create(1, b"b", bigger)
        assert again.name == seg.name and again.reused and again.allocated == page_aligned
        mm = open_segment(store.dir, again)
        need = (bigger + mmap.PAGESIZE - 1) & ~(mmap.PAGESIZE - 1)
        assert os.stat(path).st_blocks * 512 == need and len(mm) == need
        assert mm[:4] == b"aaaa"                                  # reused: the bytes are there
        mm[:bigger] = b"b" * bigger
        mm.close()
        store.seal(again.name)
        store.free(again.name)
        # A smaller one after it maps all that was allocated (a later larger one needs no map).
        small = store.create(1, b"c", seg.capacity * 5 // 8)
        assert small.reused and small.allocated == need
        mm = open_segment(store.dir, small)
        assert len(mm) == need
        mm.close()
    finally:
        store.close()
