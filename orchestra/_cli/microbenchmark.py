"""orchestra microbenchmark: the hot path measured the way users feel it.

    orchestra microbenchmark [--quick] [--json FILE] [--compare ray[,dask]] [--ray-python PATH]
                             [--nodes N] [--dask-python PATH]

Each workload runs for a bounded count and time and prints one row. ``--compare ray``
runs the same file under a Python that has Ray (this environment, or --ray-python /
$ORCHESTRA_RAY_PYTHON, e.g. a separate venv) in the same run and prints ratios; the
workloads that multiprocessing.Pool can do are measured too. ``--nodes N`` (N >= 3)
measures a cluster of a head and N-1 nodes on this machine instead (bench_nodes.py beside it),
with Ray and Dask (``--compare ray,dask``; Dask from --dask-python, else Ray's Python)
side by side. Numbers only: nothing here asserts a speed.

This file must run standalone under a Python without orchestra (for Ray), so it
imports the framework under test by name and nothing else from orchestra.
"""
from __future__ import annotations

import argparse
import gc
import importlib
import json
import os
import statistics
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from types import ModuleType
from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    import numpy as np
    import pandas as pd
    import pyarrow as pa


# One framework's numbers by row key (with its name and version), as the child process
# that measured them prints them in JSON.
Results = dict[str, float | str]


class RemoteFn(Protocol):
    """A remote function of the framework under test (orchestra's or Ray's)."""

    remote: Callable[..., Any]

MiB = 1 << 20


# ---------------------------------------------------------------- process memory

def _children(pid: int) -> list[int]:
    kids: dict[int, list[int]] = {}
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/stat") as f:
                ppid = int(f.read().rsplit(")", 1)[1].split()[1])
        except (OSError, IndexError, ValueError):
            continue
        kids.setdefault(ppid, []).append(int(name))
    out, todo = [], [pid]
    while todo:
        p = todo.pop()
        for c in kids.get(p, []):
            out.append(c)
            todo.append(c)
    return out


def _mem(pid: int) -> tuple[int, int]:
    rss = pss = 0
    try:
        with open(f"/proc/{pid}/smaps_rollup") as f:
            for line in f:
                if line.startswith("Rss:"):
                    rss = int(line.split()[1]) * 1024
                elif line.startswith("Pss:"):
                    pss = int(line.split()[1]) * 1024
    except OSError:
        pass
    return rss, pss


def cluster_memory() -> dict[str, float]:
    pids = [os.getpid()] + _children(os.getpid())
    rss = pss = 0
    for p in pids:
        r, s = _mem(p)
        rss += r
        pss += s
    return {"rss_mb": rss / MiB, "pss_mb": pss / MiB, "processes": len(pids)}


# ---------------------------------------------------------------- helpers

def _lat(fn: Callable[[], object], n: int, budget_s: float) -> dict[str, float]:
    fn()
    samples = []
    end = time.perf_counter() + budget_s
    for _ in range(n):
        t = time.perf_counter()
        fn()
        samples.append(time.perf_counter() - t)
        if time.perf_counter() > end:
            break
    samples.sort()
    return {"median_us": statistics.median(samples) * 1e6,
            "p99_us": samples[min(len(samples) - 1, int(len(samples) * 0.99))] * 1e6,
            "n": len(samples)}


def _rate(fn: Callable[[int], object], n: int) -> float:
    t = time.perf_counter()
    fn(n)
    return n / (time.perf_counter() - t)


# ---------------------------------------------------------------- the workloads

def run_framework(name: str, quick: bool) -> Results:
    import numpy as np
    fw = importlib.import_module(name)
    scale = 0.02 if quick else 1.0
    big = (8 if quick else 512) * MiB
    res: Results = {"framework": name, "version": getattr(fw, "__version__", "?")}

    # room for the 1 GiB table too; Ray refuses a store under 75 MiB (--quick)
    store = max(big * 3 + (32 if quick else 2048) * MiB, 80 * MiB)
    t = time.perf_counter()
    if name == "ray":
        fw.init(num_cpus=os.cpu_count(), object_store_memory=store,
                include_dashboard=False, log_to_driver=False)
    else:
        fw.init(num_cpus=os.cpu_count(), object_store_memory=store)
    res["init_s"] = time.perf_counter() - t

    @fw.remote
    def noop() -> None:
        return None

    @fw.remote
    def first() -> int:
        return 1

    t = time.perf_counter()
    fw.get(first.remote())
    res["first_task_s"] = time.perf_counter() - t

    @fw.remote
    def size_of(a: np.ndarray) -> int:
        return int(a.nbytes)

    @fw.remote
    def checksum(a: np.ndarray) -> float:
        return float(a[:: 4096].sum())

    @fw.remote
    def nested(k: int) -> int:
        return sum(fw.get([first.remote() for _ in range(k)]))

    lat = _lat(lambda: fw.get(noop.remote()), max(50, int(5000 * scale)), 10)
    res["noop_latency_median_us"] = lat["median_us"]
    res["noop_latency_p99_us"] = lat["p99_us"]
    n = max(100, int(10000 * scale))
    res["noop_tasks_per_s"] = _rate(lambda k: fw.get([noop.remote() for _ in range(k)]), n)

    arr = np.ones(MiB // 8)
    n = max(20, int(1000 * scale))
    res["arg_1mb_tasks_per_s"] = _rate(lambda k: fw.get([size_of.remote(arr) for _ in range(k)]), n)

    n = max(4, int(200 * scale))
    res["nested_10_tasks_per_s"] = _rate(lambda k: fw.get([nested.remote(10) for _ in range(k)]), n) * 10

    n = max(100, int(20000 * scale))
    res["put_small_per_s"] = _rate(lambda k: [fw.put(i) for i in range(k)], n)
    ref = fw.put(1)
    res["get_small_per_s"] = _rate(lambda k: [fw.get(ref) for _ in range(k)], n)

    res["wait_1000_refs_us"] = _wait_all(fw, [noop.remote() for _ in range(1000 if not quick else 100)])

    try:
        res.update(_actor_workloads(fw, scale))
    except NotImplementedError as exc:
        res["actors"] = f"not supported: {str(exc)[:60]}"
    res.update(_util_workloads(name, fw, scale))

    res.update(_stream_workloads(fw, scale))

    gc.collect()
    time.sleep(0.5)
    res.update({f"idle_{k}": v for k, v in cluster_memory().items()})

    res.update(_medium_objects(fw, scale))
    gc.collect()
    res.update(_large_object(fw, big, checksum))
    gc.collect()
    try:
        res.update(_columnar(fw, quick))
    except ImportError as exc:   # this Python has no pandas or pyarrow
        print(f"{name}: columnar workloads not run: {exc}", file=sys.stderr)

    t = time.perf_counter()
    fw.shutdown()
    res["shutdown_s"] = time.perf_counter() - t
    return res


def _wait_all(fw: ModuleType, refs: list[object]) -> float:
    fw.get(refs)
    return _lat(lambda: fw.wait(refs, num_returns=len(refs)), 50, 5)["median_us"]


def _medium_objects(fw: ModuleType, scale: float) -> dict[str, float]:
    """10,000 puts of a 100 KB array (the refs kept), a get of each; 1,000 puts of a
    1 MiB array."""
    import numpy as np
    out = {}
    n = max(100, int(10000 * scale))
    value = np.ones(100_000 // 8)
    t = time.perf_counter()
    refs = [fw.put(value) for _ in range(n)]
    out["put_100kb_per_s"] = n / (time.perf_counter() - t)
    t = time.perf_counter()
    for r in refs:
        fw.get(r)
    out["get_100kb_per_s"] = n / (time.perf_counter() - t)
    del refs
    m = max(20, int(1000 * scale))
    value = np.ones(MiB // 8)
    t = time.perf_counter()
    refs = [fw.put(value) for _ in range(m)]
    out["put_1mb_gb_per_s"] = m * MiB / (time.perf_counter() - t) / 1e9
    del refs
    return out


def _large_object(fw: ModuleType, big: int, checksum: RemoteFn) -> dict[str, float]:
    import numpy as np
    data = np.random.default_rng(0).random(big // 8)
    out = {}
    ref, puts, first_gets, _ = _fresh_puts(fw, data)
    out["put_large_gb_per_s"] = big / statistics.median(puts) / 1e9
    out["put_large_first_gb_per_s"] = big / puts[0] / 1e9
    out["get_large_first_us"] = statistics.median(first_gets) * 1e6
    out["get_large_us"] = _lat(lambda: fw.get(ref), 20, 5)["median_us"]
    t = time.perf_counter()
    fw.get(checksum.remote(ref))
    out["task_read_large_ms"] = (time.perf_counter() - t) * 1e3

    @fw.remote
    def total(a: np.ndarray) -> float:
        return float(a.sum())
    fw.get(total.remote(np.ones(8)))   # the function reaches the workers first
    # A task summing every byte of a fresh object: the best of three puts (each into the
    # memory the last one freed, as _fresh_puts does), and the same sum in the driver
    # over the view it holds, all its pages mapped already.
    times = []
    for _ in range(3):
        del ref
        ref = fw.put(data)
        t = time.perf_counter()
        fw.get(total.remote(ref))
        times.append(time.perf_counter() - t)
    out["task_sum_large_ms"] = min(times) * 1e3
    view = fw.get(ref)
    view.sum()
    t = time.perf_counter()
    view.sum()
    out["sum_large_mapped_ms"] = (time.perf_counter() - t) * 1e3
    return out


def _fresh_puts(fw: ModuleType, value: Any) -> tuple[Any, list[float], list[float], list[int]]:
    """Three fresh puts of value, each into the memory the last one freed and read at
    once: (the last ref, put times, first-get times, the driver's RSS growth per get)."""
    puts, gets, growth = [], [], []
    ref = None
    for _ in range(3):
        ref = None
        gc.collect()
        time.sleep(0.2)
        t = time.perf_counter()
        ref = fw.put(value)
        puts.append(time.perf_counter() - t)
        before = _rss()
        t = time.perf_counter()
        got = fw.get(ref)
        gets.append(time.perf_counter() - t)
        growth.append(_rss() - before)
        del got
    return ref, puts, gets, growth


def _rss() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def _columnar(fw: ModuleType, quick: bool) -> dict[str, float]:
    """A 1 GiB Arrow table (8 float64 columns) and a 10-million-row DataFrame (10 numeric
    columns): put, a first get of each fresh put with the driver's RSS growth over it,
    and a task summing one column."""
    import numpy as np
    import pandas as pd
    import pyarrow as pa

    @fw.remote
    def table_sum(t: pa.Table) -> float:
        import pyarrow.compute as pc
        return float(pc.sum(t.column("c0")).as_py())

    @fw.remote
    def frame_sum(df: pd.DataFrame) -> float:
        return float(df["c0"].sum())

    rows = (1 << 17) if quick else (1 << 24)
    table = pa.table({f"c{i}": np.full(rows, float(i)) for i in range(8)})
    frame_rows = 100_000 if quick else 10_000_000
    frame = pd.DataFrame({f"c{i}": np.arange(frame_rows, dtype=np.float64 if i % 2 else np.int64)
                          for i in range(10)})
    out: dict[str, float] = {}
    for label, value, nbytes, fn in (
            ("table", table, table.nbytes, table_sum),
            ("frame", frame, int(frame.memory_usage(index=False).sum()), frame_sum)):
        ref, puts, gets, growth = _fresh_puts(fw, value)
        out[f"put_{label}_gb_per_s"] = nbytes / statistics.median(puts) / 1e9
        out[f"get_{label}_us"] = statistics.median(gets) * 1e6
        out[f"get_{label}_rss_mb"] = max(growth) / MiB
        fw.get([fn.remote(ref) for _ in range(4)])   # every worker imports what it needs
        took = []
        for _ in range(3):
            t = time.perf_counter()
            fw.get(fn.remote(ref))
            took.append(time.perf_counter() - t)
        out[f"task_{label}_sum_ms"] = statistics.median(took) * 1e3
        del ref
    return out


def _actor_workloads(fw: ModuleType, scale: float) -> Results:
    out: Results = {}

    class Counter:
        def __init__(self) -> None:
            self.n = 0

        def inc(self) -> int:
            self.n += 1
            return self.n

    class AsyncCounter:
        def __init__(self) -> None:
            self.n = 0

        async def inc(self) -> int:
            self.n += 1
            return self.n

    for label, cls in (("actor", Counter), ("async_actor", AsyncCounter)):
        a = fw.remote(cls).remote()
        def call(a: Any = a) -> Any:
            return fw.get(a.inc.remote())

        def many(k: int, a: Any = a) -> Any:
            return fw.get([a.inc.remote() for _ in range(k)])

        lat = _lat(call, max(50, int(3000 * scale)), 10)
        out[f"{label}_call_latency_median_us"] = lat["median_us"]
        n = max(100, int(5000 * scale))
        out[f"{label}_calls_per_s"] = _rate(many, n)
    return out


def _stream_workloads(fw: ModuleType, scale: float) -> dict[str, float]:
    """A streaming generator task of small items, read as they come: items/s (each
    item's ref taken and its value read), and the time from .remote() to the first
    item's value in hand. The best of a few runs (one is ~0.5 s)."""

    @fw.remote
    def items(n: int) -> Iterator[int]:
        for i in range(n):  # noqa: UP028 - Ray's generator tasks fail on `yield from range()`
            yield i

    streaming = items.options(num_returns="streaming")
    n = max(200, int(10000 * scale))
    first_ms, rate = [], []
    for _ in range(3):
        t = time.perf_counter()
        gen = streaming.remote(n)
        fw.get(next(gen))
        first_ms.append((time.perf_counter() - t) * 1e3)
        for ref in gen:
            fw.get(ref)
        rate.append(n / (time.perf_counter() - t))
    return {"stream_items_per_s": max(rate), "stream_first_item_ms": min(first_ms)}


def _util_workloads(name: str, fw: ModuleType, scale: float) -> Results:
    """ActorPool.map over small items with 2 actors, and Queue put+get round trips
    (``<framework>.util.ActorPool``, ``<framework>.util.queue.Queue``: Ray's names)."""
    out: Results = {}
    util = importlib.import_module(f"{name}.util")
    queue_mod = importlib.import_module(f"{name}.util.queue")

    class Doubler:
        def double(self, v: int) -> int:
            return 2 * v

    actor_cls = fw.remote(Doubler)
    pool = util.ActorPool([actor_cls.remote(), actor_cls.remote()])
    n = max(200, int(10000 * scale))
    out["actor_pool_map_items_per_s"] = _rate(
        lambda k: list(pool.map(lambda a, v: a.double.remote(v), range(k))), n)
    q = queue_mod.Queue()
    n = max(100, int(2000 * scale))

    def round_trips(k: int) -> None:
        for i in range(k):
            q.put(i)
            q.get()
    q.put(0)
    q.get()   # the queue's actor is up
    out["queue_round_trips_per_s"] = _rate(round_trips, n)
    q.shutdown()
    mp_pool = importlib.import_module(f"{name}.util.multiprocessing").Pool(2)
    try:
        out.update(_pool_rows(mp_pool, scale))
    finally:
        mp_pool.terminate()
    return out


def _pool_rows(pool: Any, scale: float) -> Results:
    """A Pool(2)'s map of a trivial function over 100,000 items, and its imap_unordered
    with chunksize=100 over 20,000 (best of three each): the standard library's Pool,
    Ray's ``ray.util.multiprocessing.Pool`` and orchestra's, on the same interface."""
    n, m = max(2000, int(100_000 * scale)), max(400, int(20_000 * scale))
    pool.map(_pool_double, range(100))   # the processes are up
    maps, imaps = [], []
    for _ in range(3):
        t = time.perf_counter()
        pool.map(_pool_double, range(n))
        maps.append(time.perf_counter() - t)
        t = time.perf_counter()
        for _ in pool.imap_unordered(_pool_double, range(m), chunksize=100):
            pass
        imaps.append(time.perf_counter() - t)
    return {"pool_map_items_per_s": n / min(maps), "pool_imap_items_per_s": m / min(imaps)}


def run_pool(quick: bool) -> Results:
    import multiprocessing as mp

    import numpy as np
    scale = 0.02 if quick else 1.0
    res: Results = {"framework": "multiprocessing.Pool"}
    t = time.perf_counter()
    pool = mp.get_context("forkserver").Pool(os.cpu_count())
    pool.apply(_pool_noop)
    res["init_s"] = time.perf_counter() - t
    lat = _lat(lambda: pool.apply_async(_pool_noop).get(), max(50, int(5000 * scale)), 10)
    res["noop_latency_median_us"] = lat["median_us"]
    res["noop_latency_p99_us"] = lat["p99_us"]
    n = max(100, int(10000 * scale))
    res["noop_tasks_per_s"] = _rate(
        lambda k: [r.get() for r in [pool.apply_async(_pool_noop) for _ in range(k)]], n)
    arr = np.ones(MiB // 8)
    n = max(20, int(1000 * scale))
    res["arg_1mb_tasks_per_s"] = _rate(
        lambda k: [r.get() for r in [pool.apply_async(_pool_nbytes, (arr,)) for _ in range(k)]], n)
    t = time.perf_counter()
    pool.terminate()
    pool.join()
    res["shutdown_s"] = time.perf_counter() - t
    with mp.get_context("forkserver").Pool(2) as two:
        res.update(_pool_rows(two, scale))
    return res


def _pool_noop() -> None:
    return None


def _pool_nbytes(a: np.ndarray) -> int:
    return int(a.nbytes)


def _pool_double(x: int) -> int:
    return 2 * x


# ---------------------------------------------------------------- report

ROWS = [
    ("init_s", "init (s)", False), ("first_task_s", "first task (s)", False),
    ("shutdown_s", "shutdown (s)", False),
    ("noop_latency_median_us", "no-op task latency, median (us)", False),
    ("noop_latency_p99_us", "no-op task latency, p99 (us)", False),
    ("noop_tasks_per_s", "no-op tasks/s (10k submitted, then get)", True),
    ("arg_1mb_tasks_per_s", "tasks/s with a 1 MB numpy argument", True),
    ("nested_10_tasks_per_s", "nested: subtasks/s (tasks submitting 10 each)", True),
    ("actor_call_latency_median_us", "actor call latency, median (us)", False),
    ("actor_calls_per_s", "actor calls/s (5k, then get)", True),
    ("async_actor_call_latency_median_us", "async actor call latency, median (us)", False),
    ("async_actor_calls_per_s", "async actor calls/s", True),
    ("stream_items_per_s", "streaming generator: items/s (10k small items)", True),
    ("stream_first_item_ms", "streaming generator: time to first item (ms)", False),
    ("actor_pool_map_items_per_s", "ActorPool.map, 2 actors: small items/s (10k)", True),
    ("queue_round_trips_per_s", "Queue put+get round trips/s", True),
    ("pool_map_items_per_s", "Pool(2).map, 100k trivial items: items/s", True),
    ("pool_imap_items_per_s", "Pool(2).imap_unordered, chunksize=100: items/s", True),
    ("put_small_per_s", "put small values/s", True),
    ("get_small_per_s", "get small values/s", True),
    ("put_100kb_per_s", "put 100 KB arrays: puts/s (10k, refs kept)", True),
    ("get_100kb_per_s", "get each of those 100 KB objects: gets/s", True),
    ("put_1mb_gb_per_s", "put 1 MiB arrays (1k, refs kept) (GB/s)", True),
    ("put_large_gb_per_s", "put 512 MiB array (GB/s)", True),
    ("put_large_first_gb_per_s", "  the first of those puts (fresh memory) (GB/s)", True),
    ("get_large_first_us", "get 512 MiB array, first after its put (us)", False),
    ("get_large_us", "get 512 MiB array, again (us)", False),
    ("task_read_large_ms", "task reading the 512 MiB object (ms)", False),
    ("task_sum_large_ms", "task summing all of a fresh 512 MiB object (ms)", False),
    ("sum_large_mapped_ms", "  the same sum in the driver, already mapped (ms)", False),
    ("put_table_gb_per_s", "put 1 GiB Arrow table (GB/s)", True),
    ("get_table_us", "get 1 GiB Arrow table (us)", False),
    ("get_table_rss_mb", "  driver's RSS growth over that get (MB)", False),
    ("task_table_sum_ms", "task summing a column of the table (ms)", False),
    ("put_frame_gb_per_s", "put 10M-row DataFrame, 10 columns (GB/s)", True),
    ("get_frame_us", "get 10M-row DataFrame (us)", False),
    ("get_frame_rss_mb", "  driver's RSS growth over that get (MB)", False),
    ("task_frame_sum_ms", "task summing a column of the DataFrame (ms)", False),
    ("wait_1000_refs_us", "wait on 1000 ready refs (us)", False),
    ("idle_rss_mb", "idle memory, RSS of all processes (MB)", False),
    ("idle_pss_mb", "idle memory, PSS of all processes (MB)", False),
    ("idle_processes", "processes", False),
]


# --nodes N: the figures _cli/bench_nodes.py measures (labels filled in by node_rows)
NODE_ROWS = [
    ("cluster_start_s", "cluster start: head + {n1} nodes (s)", False),
    ("connect_s", "driver connects (s)", False),
    ("first_remote_tasks_s", "first task on each node (s)", False),
    ("remote_noop_latency_median_us", "remote no-op task latency, median (us)", False),
    ("remote_noop_latency_p99_us", "remote no-op task latency, p99 (us)", False),
    ("spread_tasks_per_s", "no-op tasks/s spread over {n1} nodes", True),
    ("local_read_ms", "a task reads the {mib} MiB array on its own node (ms)", False),
    ("node_to_node_gb_per_s", "{mib} MiB array node to node, a task reads it (GB/s)", True),
    ("to_driver_gb_per_s", "{mib} MiB array from a node to the driver (GB/s)", True),
    ("shutdown_s", "shutdown: driver and cluster (s)", False),
    ("idle_rss_mb", "idle memory, RSS of all processes (MB)", False),
    ("idle_pss_mb", "idle memory, PSS of all processes (MB)", False),
    ("idle_processes", "processes", False),
]


def node_rows(results: list[Results]) -> list[tuple[str, str, bool]]:
    """NODE_ROWS with this run's node count and transfer size in the labels."""
    ok = [r for r in results if "nodes" in r]
    n = int(ok[0]["nodes"]) if ok else 3
    mib = next((float(r["transfer_mib"]) for r in ok if "transfer_mib" in r), 200.0)
    return [(k, label.format(n1=n - 1, mib=f"{mib:g}"), hb) for k, label, hb in NODE_ROWS]


def _fmt(v: object) -> str:
    if isinstance(v, float):
        return f"{v:,.3f}" if v < 10 else f"{v:,.0f}"
    return str(v) if v is not None else "-"


def report(results: list[Results], rows: list[tuple[str, str, bool]] | None = None) -> str:
    """A table: one row per workload, one column per framework, then orchestra's ratios."""
    names = [str(r["framework"]) for r in results]
    header = ["workload"] + names
    base = results[0]
    if len(results) > 1:
        header += [f"orchestra vs {n}" for n in names[1:]]
    lines: list[list[str]] = [header]
    for key, label, higher_better in ROWS if rows is None else rows:
        vals = [r.get(key) for r in results]
        if all(v is None for v in vals):
            continue
        row = [label] + [_fmt(v) for v in vals]
        for other in results[1:]:
            a, b = base.get(key), other.get(key)
            if isinstance(a, (int, float)) and isinstance(b, (int, float)) and a and b:
                ratio = a / b if higher_better else b / a
                row.append(f"{ratio:.2f}x {'better' if ratio >= 1 else 'worse'}")
            else:
                row.append("-")
        lines.append(row)
    widths = [max(len(r[i]) for r in lines) for i in range(len(header))]
    out = []
    for j, r in enumerate(lines):
        out.append("  ".join(c.ljust(widths[i]) if i == 0 else c.rjust(widths[i]) for i, c in enumerate(r)))
        if j == 0:
            out.append("  ".join("-" * w for w in widths))
    return "\n".join(out)


def _run_child(python: str, framework: str, quick: bool) -> Results:
    if framework == "ray":  # a Python without orchestra: run this file by path
        cmd = [python, os.path.abspath(__file__)]
    else:
        cmd = [python, "-m", "orchestra._cli.microbenchmark"]
    cmd += ["--framework", framework, "--child"]
    if quick:
        cmd.append("--quick")
    return _child_json(cmd, framework)


def _run_nodes_child(python: str, framework: str, nodes: int, quick: bool) -> Results:
    """One framework's cluster figures from a process of its own; an error becomes a row of
    dashes (and a message) so that the others still print."""
    if framework == "orchestra":
        cmd = [python, "-m", "orchestra._cli.bench_nodes"]
    else:  # a Python without orchestra: run the file by path
        cmd = [python, os.path.join(os.path.dirname(os.path.abspath(__file__)), "bench_nodes.py")]
    cmd += [framework, str(nodes)] + (["--quick"] if quick else [])
    try:
        return _child_json(cmd, framework)
    except (RuntimeError, subprocess.TimeoutExpired) as exc:
        print(str(exc), file=sys.stderr)
        return {"framework": framework, "error": str(exc)[-500:]}


def _child_json(cmd: list[str], framework: str) -> Results:
    """Run a benchmark child; its last stdout line that is a JSON object is its result."""
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=900)
    for line in reversed(proc.stdout.splitlines()):
        if line.startswith("{"):
            return dict(json.loads(line))
    raise RuntimeError(f"{framework} benchmark failed (exit {proc.returncode}):\n{proc.stderr[-3000:]}")


def _find_python(module: str, candidates: list[str | None]) -> str | None:
    """The first interpreter of ``candidates`` that can import ``module``."""
    for cand in candidates:
        if cand and subprocess.run([cand, "-c", f"import {module}"], capture_output=True).returncode == 0:
            return cand
    return None


def _find_ray_python(explicit: str | None) -> str | None:
    return _find_python("ray", [explicit, os.environ.get("ORCHESTRA_RAY_PYTHON"), sys.executable])


def _compare_list(text: str) -> list[str]:
    """``--compare ray,dask`` -> ["ray", "dask"]; an unknown name is an argparse error."""
    names = [n.strip() for n in text.split(",") if n.strip()]
    bad = [n for n in names if n not in ("ray", "dask")]
    if bad:
        raise argparse.ArgumentTypeError(f"unknown framework {bad[0]!r}: choose from ray, dask")
    return names


def _comparisons(ns: argparse.Namespace) -> list[tuple[str, str]] | str:
    """(framework, python) for each --compare, or the error message naming the fix."""
    wanted = [n for group in ns.compare for n in group]
    if "dask" in wanted and ns.nodes < 3:
        return "--compare dask: Dask runs only in the multi-node benchmark; add --nodes 3"
    ray_py = _find_ray_python(ns.ray_python) if "ray" in wanted else None
    out: list[tuple[str, str]] = []
    for name in dict.fromkeys(wanted):
        if name == "ray":
            py = ray_py
        else:
            py = _find_python("distributed", [ns.dask_python, os.environ.get("ORCHESTRA_DASK_PYTHON"),
                                              ns.ray_python or _find_ray_python(None), sys.executable])
        if py is None:
            how = ("pass --ray-python or set ORCHESTRA_RAY_PYTHON (e.g. a venv with `pip install ray`)"
                   if name == "ray" else
                   "pass --dask-python or set ORCHESTRA_DASK_PYTHON (e.g. a venv with "
                   "`pip install 'dask[distributed]'`)")
            return f"--compare {name}: no Python with {name} found; {how}"
        out.append((name, py))
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="orchestra microbenchmark", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--quick", action="store_true", help="tiny counts (a smoke test)")
    p.add_argument("--json", metavar="FILE", help="also write the results as JSON")
    p.add_argument("--compare", type=_compare_list, action="append", default=[],
                   help="ray, dask or ray,dask: run them side by side (dask with --nodes only)")
    p.add_argument("--ray-python", help="a Python interpreter that can import ray")
    p.add_argument("--dask-python", help="a Python interpreter that can import distributed "
                   "(default: the Ray one)")
    p.add_argument("--nodes", type=int, default=1,
                   help="N >= 3: a cluster of a head and N-1 nodes on this machine")
    p.add_argument("--tls", action="store_true",
                   help="with --nodes: orchestra's nodes speak TLS to each other, as between "
                        "machines (a cluster on loopback is plain TCP otherwise)")
    p.add_argument("--no-pool", action="store_true", help="skip multiprocessing.Pool")
    p.add_argument("--framework", default="orchestra", help=argparse.SUPPRESS)
    p.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    ns = p.parse_args(argv)
    if ns.child:
        res = run_pool(ns.quick) if ns.framework == "pool" else run_framework(ns.framework, ns.quick)
        print(json.dumps(res))
        return 0
    if ns.tls:
        if ns.nodes < 3:
            p.error("--tls is for --nodes N (N >= 3): a single node has no connection to secure")
        os.environ["ORCHESTRA_BENCH_TLS"] = "1"   # for the orchestra child
    if ns.nodes != 1 and ns.nodes < 3:
        p.error(f"--nodes {ns.nodes}: a cluster here is a head and at least two nodes (--nodes 3)")
    others = _comparisons(ns)
    if isinstance(others, str):
        print(others, file=sys.stderr)
        return 2
    print(f"machine: {os.cpu_count()} CPUs, Python {sys.version.split()[0]}")
    if ns.nodes >= 3:
        # Each framework in its own process: nothing of one warms or slows the other.
        results = [_run_nodes_child(sys.executable, "orchestra", ns.nodes, ns.quick)]
        results += [_run_nodes_child(py, name, ns.nodes, ns.quick) for name, py in others]
        print(report(results, node_rows(results)))
    else:
        results = [_run_child(sys.executable, "orchestra", ns.quick)]
        results += [_run_child(py, name, ns.quick) for name, py in others]
        if not ns.no_pool:
            results.append(_run_child(sys.executable, "pool", ns.quick))
        print(report(results))
    if ns.json:
        with open(ns.json, "w") as f:
            json.dump(results, f, indent=2)
    return 0


if __name__ == "__main__":
    sys.exit(main())
