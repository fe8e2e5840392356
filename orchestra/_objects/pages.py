"""Pages of a segment made present before a writer copies into it (the writer's side
of a put: _objects/segments.py open_segment, map_ahead).

    map_allocating(fd, length): a fresh segment's pages allocated by populating them,
        on threads (from ALLOCATE_MIN), no fallocate first
    map_for_writing(fd, length): a read-write map of the start of the segment's file,
        every page present and writable: MADV_POPULATE_WRITE (Linux 5.14) for a fresh
        one, on up to four threads over disjoint ranges from 512 MiB; MAP_POPULATE for a
        reused one or on an older kernel (said once by EINVAL, remembered)
    populate_write(map, threads): the same for a map made already

Measured on a 2-core machine, a fresh 4 GiB segment (after fallocate): MAP_POPULATE
2.6 s, MADV_POPULATE_WRITE 1.3 s, on two threads 1.2 s; a copy into it then runs at
memory speed. A fresh 1 MiB object (fallocate, map, populate, copy): 635 us with
MAP_POPULATE over its 1.25 MiB size class, 386 us with MADV_POPULATE_WRITE over its
own pages only; 100 KB: 53 -> 44 us.
"""
from __future__ import annotations

import errno
import mmap
import os
import threading
from typing import Any

from .serialization import _COPY_THREADS

_POPULATE = getattr(mmap, "MAP_POPULATE", 0)
_PAGE = mmap.PAGESIZE

_MADV_POPULATE_WRITE = 23   # Linux 5.14
# A fresh segment is mapped, then its pages made writable in place with
# MADV_POPULATE_WRITE (MAP_POPULATE maps them for reading, and the copy then faults
# each again to write), in ranges of at least _POPULATE_RANGE on as many threads as a
# put copies on (_COPY_THREADS; the call releases the GIL): 4 GiB in 1.2 s here, where
# MAP_POPULATE took 2.6 s. Segments reused from the pool (kept for reuse: the 512 MiB
# rows of the microbenchmark) keep MAP_POPULATE: over pages present already it is the
# faster (512 MiB: 75 ms against 90).
_POPULATE_RANGE = 256 << 20
# A fresh segment of ALLOCATE_MIN bytes or more is allocated by populating it on up to
# _COPY_THREADS threads, over ranges of at least _ALLOCATE_RANGE, without fallocate first
# (map_allocating): fallocate runs on one thread and holds the file's lock, and then
# populating pages it allocated gains nothing from a second thread. Measured on 2 cores,
# fresh /dev/shm (GB/s, median): 4 MiB 2.24 -> 2.98, 64 MiB 1.95 -> 3.07, 512 MiB (two
# threads before too) 2.74 -> 3.22, 2 GiB 2.80 -> 3.03. Below it fallocate then one
# populate stays (a thread costs more than it saves; alone, populating without
# fallocate is the slower: 1.8 against 2.2 GB/s).
ALLOCATE_MIN = 4 << 20
_ALLOCATE_RANGE = 2 << 20
_madvise: Any = None       # libc's, once looked up (False: none)
_write_populates = True    # False once the kernel said it has no MADV_POPULATE_WRITE


def _libc_madvise() -> Any:
    global _madvise
    if _madvise is None:
        import ctypes
        try:
            fn = ctypes.CDLL(None, use_errno=True).madvise
            fn.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
            _madvise = fn
        except (OSError, AttributeError):
            _madvise = False
    return _madvise


def _address(mm: mmap.mmap) -> int:
    """Where ``mm`` starts in this process's memory."""
    import ctypes
    anchor = ctypes.c_char.from_buffer(mm)
    addr = ctypes.addressof(anchor)
    del anchor   # the export must be gone before the map may close
    return addr


def populate_write(mm: mmap.mmap, threads: int = 1, min_range: int = _POPULATE_RANGE) -> int:
    """Make every page of ``mm`` present and writable (MADV_POPULATE_WRITE), on up to
    ``threads`` threads over disjoint ranges of at least ``min_range``: 0, or the errno
    of a range that failed (EINVAL: a kernel before 5.14; EFAULT or ENOMEM: a page that
    could not be had); the pages then fault as they are written."""
    import ctypes
    madvise = _libc_madvise()
    if not madvise:
        return errno.ENOSYS
    addr = _address(mm)
    size = len(mm)
    n = max(1, min(threads, size // min_range))
    step = (-(-size // n) + _PAGE - 1) & ~(_PAGE - 1)
    results = [0] * n

    def run(i: int) -> None:
        start = i * step
        if madvise(addr + start, max(0, min(step, size - start)), _MADV_POPULATE_WRITE):
            results[i] = ctypes.get_errno() or errno.EIO
    workers = [threading.Thread(target=run, args=(i,), name="orchestra-populate")
               for i in range(1, n)]
    for w in workers:
        w.start()
    run(0)
    for w in workers:
        w.join()
    return next((r for r in results if r), 0)


def populate_range(mm: mmap.mmap, start: int, length: int) -> int:
    """MADV_POPULATE_WRITE over ``length`` bytes of ``mm`` from ``start`` (page-aligned),
    the GIL released: 0, or the errno (ENOSYS/EINVAL: the kernel cannot; EFAULT/ENOMEM:
    a page could not be had). A slot's pages in a writer's map of its slab (io.py):
    those present already cost a page-table walk, the rest are allocated here, never
    by a fault in the copy (which, with /dev/shm full, would be SIGBUS)."""
    import ctypes
    madvise = _libc_madvise()
    if not madvise or not _write_populates:
        return errno.ENOSYS
    if madvise(_address(mm) + start, length, _MADV_POPULATE_WRITE):
        return ctypes.get_errno() or errno.EIO
    return 0


def map_allocating(fd: int, length: int) -> mmap.mmap | None:
    """A read-write map of the first ``length`` bytes of a fresh segment's file (sized,
    nothing allocated yet), its pages allocated and present by populating them on up to
    _COPY_THREADS threads (ALLOCATE_MIN and up: see the module docstring). None when the
    kernel cannot (no MADV_POPULATE_WRITE): the caller allocates with fallocate.
    OSError(ENOSPC) when a page cannot be had (/dev/shm full): the put fails there, as
    after a failed fallocate, instead of by SIGBUS in the middle of its copy."""
    global _write_populates
    if not _write_populates:
        return None
    mm = mmap.mmap(fd, length, mmap.MAP_SHARED, mmap.PROT_READ | mmap.PROT_WRITE)
    failed = populate_write(mm, _COPY_THREADS, _ALLOCATE_RANGE)
    if not failed:
        return mm
    mm.close()
    if failed in (errno.EINVAL, errno.ENOSYS):   # an older kernel: fallocate from now on
        _write_populates = False
        return None
    raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))


def map_length(fd: int, length: int) -> int:
    """``length`` rounded up to the file's pages: a hugetlbfs file (st_blksize its huge
    page) is mapped in whole huge pages, which munmap needs to end the map (a map
    ending inside one is never unmapped, and its pages stay taken)."""
    page = os.fstat(fd).st_blksize
    return -(-length // page) * page if page > mmap.PAGESIZE else length


def map_for_writing(fd: int, length: int, fresh: bool = True, offset: int = 0) -> mmap.mmap:
    """A read-write map of ``length`` bytes of a segment's file from ``offset`` (a slot's
    in its slab; allocated already) with its pages present; a segment reused from the
    store's pool (``fresh`` False: its pages were written before) keeps MAP_POPULATE."""
    global _write_populates
    prot = mmap.PROT_READ | mmap.PROT_WRITE
    if fresh and _write_populates:
        mm = mmap.mmap(fd, length, mmap.MAP_SHARED, prot, offset=offset)
        failed = populate_write(mm, _COPY_THREADS)
        if not failed:
            return mm
        mm.close()
        if failed in (errno.EINVAL, errno.ENOSYS):   # an older kernel: MAP_POPULATE from now on
            _write_populates = False
    # MAP_POPULATE: map every page in one call instead of one fault per page.
    return mmap.mmap(fd, length, mmap.MAP_SHARED | _POPULATE, prot, offset=offset)
