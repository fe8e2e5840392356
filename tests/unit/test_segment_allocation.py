"""A fresh segment's pages are allocated before its writer copies a byte: from
pages.ALLOCATE_MIN by populating them on threads (no fallocate), below it by fallocate
then one populate. Either way a tmpfs without room fails the open with
ObjectStoreFullError, never a SIGBUS in the copy. Runs on a small tmpfs of its own
(root, to mount it; skipped otherwise, saying why)."""
from __future__ import annotations

import os
import subprocess
import tempfile
from collections.abc import Iterator

import pytest

from orchestra._objects.pages import ALLOCATE_MIN
from orchestra._objects.segments import open_segment
from orchestra._protocol import pb
from orchestra.exceptions import ObjectStoreFullError

MiB = 1 << 20
SIZE_MIB = 24


@pytest.fixture
def tmpfs() -> Iterator[str]:
    """A private tmpfs of SIZE_MIB, mounted for the test and unmounted after."""
    if os.geteuid() != 0:
        pytest.skip("mounting a tmpfs of a bounded size needs root")
    path = tempfile.mkdtemp(prefix="orchestra-test-alloc-")
    got = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={SIZE_MIB}m,mode=0700", "tmpfs", path],
                         capture_output=True, text=True)
    if got.returncode:
        os.rmdir(path)
        pytest.skip(f"cannot mount a tmpfs here: {got.stderr.strip()}")
    try:
        yield path
    finally:
        subprocess.run(["umount", path], check=True)
        os.rmdir(path)


def _segment(name: str, size: int) -> pb.Segment:
    return pb.Segment(name=name, size=size, capacity=size + size // 4)


@pytest.mark.parametrize("size", [ALLOCATE_MIN, 16 * MiB, 1 * MiB], ids=["threshold", "large", "small"])
def test_a_fresh_segment_has_its_pages_before_the_copy(tmpfs, size):
    mm = open_segment(tmpfs, _segment("seg-1", size))
    try:
        st = os.stat(os.path.join(tmpfs, "seg-1"))
        assert st.st_blocks * 512 >= size, "the pages are allocated only as the copy writes them"
        assert st.st_size == size + size // 4 and len(mm) >= size
        mm[:size] = b"\x5a" * size
        assert mm[size - 1] == 0x5A
    finally:
        mm.close()


@pytest.mark.parametrize("size", [32 * MiB, 8 * MiB, 3 * MiB], ids=["over-all", "populated", "fallocated"])
def test_a_segment_the_tmpfs_has_no_room_for_fails_its_open_naming_why(tmpfs, size):
    # 20 MiB taken first: 8 MiB (populated on threads) and 3 MiB (fallocate) no longer fit.
    if size < SIZE_MIB * MiB:
        with open(os.path.join(tmpfs, "taken"), "wb") as f:
            f.write(b"\0" * (22 * MiB))
    with pytest.raises(ObjectStoreFullError, match="has no room for an object of"):
        open_segment(tmpfs, _segment("seg-2", size))
    os.unlink(os.path.join(tmpfs, "seg-2"))   # the caller aborts it: the store unlinks it
    free = os.statvfs(tmpfs)
    assert free.f_bavail * free.f_frsize >= (SIZE_MIB - 22 - 1) * MiB if size < SIZE_MIB * MiB \
        else free.f_bavail * free.f_frsize >= (SIZE_MIB - 1) * MiB
