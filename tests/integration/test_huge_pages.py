"""Large objects on huge pages (ORCHESTRA_HUGE_PAGES) on a real cluster, over a real
hugetlbfs mount of this test's own: values round-trip exactly and tasks read them, the
pages are the session's files while objects live and given back after, objects beyond
the free pages go to /dev/shm, a huge-page object spills and comes back, and one moves
between two nodes. Needs root (the mount and the pages reserved): skipped otherwise,
with the reason. The machine's pool of huge pages is shared: the pages are added for
the test and taken back after, under a file lock, and the mount's size= bounds what
the cluster sees to this test's pages."""
from __future__ import annotations

import contextlib
import fcntl
import os
import stat
import subprocess
import tempfile
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

import orchestra
from _cli import SMALL, cli, records, start_head
from _helpers import array_sum, joined_cluster
from test_shm_security import _PROBE, other_user  # noqa: F401 (the fixture, a second local user)

pytestmark = pytest.mark.timeout(120)

MiB = 1 << 20
PAGE = 2 * MiB
PAGES = 40                           # 80 MiB of 2 MiB pages for the test
POOL = "/sys/kernel/mm/hugepages/hugepages-2048kB"
SESSION_DIRS = "orchestra-"


def _pages(name: str) -> int:
    return int(Path(POOL, name).read_text())


@contextlib.contextmanager
def _more_pages(n: int) -> Iterator[None]:
    """``n`` more 2 MiB pages in the machine's pool while the block runs."""
    with open("/tmp/orchestra-test-hugepages.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        before = _pages("nr_hugepages")
        try:
            Path(POOL, "nr_hugepages").write_text(str(before + n))
        except OSError as exc:   # a container's read-only /sys, say
            pytest.skip(f"cannot reserve huge pages here ({exc.strerror})")
        try:
            if _pages("nr_hugepages") < before + n:
                pytest.skip(f"the kernel could not reserve {n} huge pages (memory too fragmented)")
            yield
        finally:
            Path(POOL, "nr_hugepages").write_text(str(max(_pages("nr_hugepages") - n, 0)))


@pytest.fixture
def mount(monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """A hugetlbfs mount of PAGES pages, named by ORCHESTRA_HUGE_PAGES: every user may
    reach and write it (mode 1777, as a machine's shared /mnt/huge)."""
    if os.geteuid() != 0:
        pytest.skip("needs root: reserving huge pages and mounting hugetlbfs (CI runs as root)")
    if not os.path.isdir(POOL):
        pytest.skip(f"this kernel has no 2 MiB huge pages ({POOL} is missing)")
    path = Path(tempfile.mkdtemp(prefix="orchestra-test-huge-", dir="/tmp"))
    path.chmod(0o755)
    with contextlib.ExitStack() as cleanup:
        cleanup.callback(_remove_mount_point, path)
        cleanup.enter_context(_more_pages(PAGES))
        done = subprocess.run(["mount", "-t", "hugetlbfs", "-o",
                               f"pagesize=2M,size={PAGES * PAGE},mode=1777", "none",
                               str(path)], capture_output=True, text=True)
        if done.returncode != 0:   # no mount allowed here (a container without the right)
            pytest.skip(f"cannot mount hugetlbfs here: {done.stderr.strip()}")
        try:
            monkeypatch.setenv("ORCHESTRA_HUGE_PAGES", str(path))
            yield path
        finally:
            if orchestra.is_initialized():
                orchestra.shutdown()
            subprocess.run(["umount", str(path)], check=False)


def _remove_mount_point(path: Path) -> None:
    with contextlib.suppress(OSError):   # still mounted: the umount's error says why
        path.rmdir()


def _free(path: Path) -> int:
    return os.statvfs(path).f_bavail


def _files(path: Path) -> list[str]:
    return sorted(f for d in os.listdir(path) for f in os.listdir(path / d))


def test_large_objects_live_on_the_huge_pages_and_give_them_back(mount: Path) -> None:
    orchestra.init(num_cpus=1, object_store_memory=160 * MiB)
    rng = np.random.default_rng(7)
    small = rng.integers(0, 255, 100_000, dtype=np.uint8)
    a3, a12 = rng.random(3 * MiB // 8), rng.random(12 * MiB // 8)
    refs = [orchestra.put(v) for v in (small, a3, a12)]
    assert len(_files(mount)) == 2                   # the small one stays in /dev/shm
    assert _free(mount) == PAGES - 2 - 7             # the pages each object fills
    for ref, v in zip(refs, (small, a3, a12), strict=True):
        assert np.array_equal(orchestra.get(ref), v)
    assert orchestra.get(array_sum.remote(refs[2])) == pytest.approx(a12.sum())

    # 31 pages left: a 40 MiB object (48 MiB class: 24 pages, it fills 21) goes there,
    # a second one no longer fits and goes to /dev/shm, a 10 MiB one (12 MiB, 6) does.
    a40 = [rng.random(40 * MiB // 8) for _ in range(2)]
    a10 = rng.random(10 * MiB // 8)
    more = [orchestra.put(v) for v in (*a40, a10)]
    assert _free(mount) == 31 - 21 - 6 and len(_files(mount)) == 4
    for ref, v in zip(more, (*a40, a10), strict=True):
        assert np.array_equal(orchestra.get(ref), v)

    del refs, more
    orchestra.shutdown()
    assert os.listdir(mount) == [] and _free(mount) == PAGES


def test_a_huge_page_object_spills_and_comes_back(mount: Path) -> None:
    orchestra.init(num_cpus=1, object_store_memory=48 * MiB)
    rng = np.random.default_rng(8)
    values = [rng.random(12 * MiB // 8) for _ in range(6)]   # 14 MiB each: 84 MiB in all
    refs = [orchestra.put(values[0])]
    [first] = _files(mount)
    refs += [orchestra.put(v) for v in values[1:]]
    assert first not in _files(mount), "the least recently used object did not spill"
    for ref, v in zip(refs, values, strict=True):
        assert np.array_equal(orchestra.get(ref), v)
    orchestra.shutdown()
    assert os.listdir(mount) == []


def test_a_huge_page_object_moves_to_another_node(mount: Path) -> None:
    with joined_cluster({"num_cpus": 1}, {"num_cpus": 1, "resources": {"far": 1}}):
        a = np.random.default_rng(9).random(6 * MiB // 8)
        ref = orchestra.put(a)
        assert len(_files(mount)) == 1
        assert orchestra.get(array_sum.options(resources={"far": 1}).remote(ref)) == \
            pytest.approx(a.sum())
    assert _free(mount) == PAGES


def test_another_user_cannot_list_open_or_create_in_the_sessions_huge_pages(
        mount: Path, other_user) -> None:  # noqa: F811 (the fixture)
    # The mount is every user's (mode 1777); the session's directory there is its own.
    orchestra.init(num_cpus=1, object_store_memory=64 * MiB)
    ref = orchestra.put(np.ones(3 * MiB // 8))
    [folder] = os.listdir(mount)
    [name] = os.listdir(mount / folder)
    st = os.lstat(mount / folder)
    assert stat.S_ISDIR(st.st_mode) and st.st_uid == os.geteuid()
    assert stat.S_IMODE(st.st_mode) == 0o700
    seen = other_user.run(_PROBE, str(mount / folder / name))
    assert seen == {"listed": False, "opened": False, "created": False}
    assert orchestra.get(ref).sum() == 3 * MiB // 8


def test_orchestra_start_with_huge_pages_puts_large_objects_there(
        mount: Path, state: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("ORCHESTRA_HUGE_PAGES")   # the flag alone
    head = start_head(state, "--huge-pages", str(mount))
    orchestra.init(address=head["address"], token=head["token"])
    a = np.random.default_rng(10).random(3 * MiB // 8)
    ref = orchestra.put(a)
    assert len(_files(mount)) == 1
    assert np.array_equal(orchestra.get(ref), a)
    del ref
    orchestra.shutdown()
    assert cli("stop", "--timeout", "10").returncode == 0
    assert os.listdir(mount) == [] and _free(mount) == PAGES


def test_orchestra_start_refuses_a_huge_pages_path_that_is_no_mount(state: str,
                                                                   tmp_path: Path) -> None:
    r = cli("start", "--head", "--port", "0", *SMALL, "--huge-pages", str(tmp_path))
    assert r.returncode == 1
    assert "--huge-pages=" in r.stderr and "not hugetlbfs" in r.stderr, r.stderr
    assert records(state) == []


def test_a_setting_that_names_no_hugetlbfs_mount_is_refused(tmp_path: Path,
                                                            monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("ORCHESTRA_HUGE_PAGES", str(tmp_path))
    with pytest.raises(ValueError, match="ORCHESTRA_HUGE_PAGES=.*not hugetlbfs"):
        orchestra.init(num_cpus=1)
    assert not orchestra.is_initialized()
