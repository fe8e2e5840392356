"""A segment's pages made present before a put copies into it (orchestra/_objects/pages.py):
a large segment through MADV_POPULATE_WRITE over disjoint ranges on threads, which must
cover the whole map and leave the file's bytes as they were; a small one, or a kernel
without it, through MAP_POPULATE. Real files in /dev/shm, the map's resident size read
from /proc/self/smaps."""
from __future__ import annotations

import mmap
import os
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
        assert _resident_kib(mm) == size >> 10   # the whole map, every range
        assert mm[size - 1:size] == b"z" and mm[:4] == b"\0\0\0\0"   # the bytes kept
        mm.close()
    finally:
        os.close(fd)


def test_map_for_writing_gives_a_present_writable_map_large_or_small(shm_file):
    for size, fresh in ((pages._POPULATE_WRITE_MIN, True), (1 << 20, True),
                        (pages._POPULATE_WRITE_MIN, False)):   # madvise, MAP_POPULATE twice
        fd = _file(shm_file, size)
        try:
            mm = pages.map_for_writing(fd, size, fresh)
            assert len(mm) == size and _resident_kib(mm) == size >> 10
            mm[:5] = b"hello"
            mm.close()
            with open(shm_file, "rb") as f:
                assert f.read(5) == b"hello"
        finally:
            os.close(fd)
            shm_file.unlink()
