"""The first put of one large array into a fresh cluster, and a task summing it; or, with
--raw, how fast this machine makes fresh shared memory present at all (the floor of
such a put: no copy, no framework).

    python tools/bench_big_put.py [--mib 8192] [--store-gib 10] [--framework orchestra|ray]
    python tools/bench_big_put.py --raw [--mib 8192] [--threads 2]

With ORCHESTRA_HUGE_PAGES set (a hugetlbfs mount with pages reserved), orchestra's put
goes to huge pages. Run each several times, in turn with the other framework: a VM's
fresh memory is slower the first time the host backs it.
"""
from __future__ import annotations

import argparse
import mmap
import os
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def raw(size: int, threads: int) -> None:
    sys.path.insert(0, ROOT)
    from orchestra._objects.pages import populate_write
    path = f"/dev/shm/bench-big-put-{os.getpid()}"
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o600)
    try:
        os.unlink(path)
        os.ftruncate(fd, size)
        mm = mmap.mmap(fd, size)
        t = time.perf_counter()
        failed = populate_write(mm, threads, 2 << 20)   # MADV_POPULATE_WRITE, GIL released
        took = time.perf_counter() - t
        mm.close()
        if failed:
            sys.exit(f"MADV_POPULATE_WRITE failed: {os.strerror(failed)}")
    finally:
        os.close(fd)
    print(f"fresh /dev/shm pages made present: {size >> 20} MiB on {threads} thread(s) "
          f"in {took:.2f} s ({size / took / 1e9:.2f} GB/s)")


def put(size: int, store: int, framework: str) -> None:
    import numpy as np
    if framework == "ray":
        import ray as fw
        fw.init(num_cpus=1, include_dashboard=False, object_store_memory=store,
                log_to_driver=False)
    else:
        import orchestra as fw  # type: ignore[no-redef]
        fw.init(num_cpus=1, object_store_memory=store)
    data = np.random.default_rng(0).random(size // 8)
    time.sleep(0.5)
    t = time.perf_counter()
    ref = fw.put(data)
    took = time.perf_counter() - t

    @fw.remote
    def total(a: np.ndarray) -> float:
        return float(a.sum())
    t = time.perf_counter()
    fw.get(total.remote(ref))
    summed = time.perf_counter() - t
    huge = os.environ.get("ORCHESTRA_HUGE_PAGES", "") if framework == "orchestra" else ""
    print(f"{framework}{' (huge pages)' if huge else ''}: put {size >> 20} MiB in {took:.2f} s "
          f"({size / took / 1e9:.2f} GB/s); a task summing it {summed:.2f} s")
    fw.shutdown()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--mib", type=int, default=8192)
    parser.add_argument("--store-gib", type=int, default=10)
    parser.add_argument("--framework", choices=("orchestra", "ray"), default="orchestra")
    parser.add_argument("--raw", action="store_true")
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args()
    if args.raw:
        raw(args.mib << 20, args.threads)
    else:
        put(args.mib << 20, args.store_gib << 30, args.framework)


if __name__ == "__main__":
    main()
