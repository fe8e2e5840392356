"""``orchestra microbenchmark --nodes N``: a cluster of N nodes on this machine, measured.

    driver (this process, on the head's node)
      |-- start: head + N-1 nodes ............ cluster_start_s, then connect_s
      |-- no-op task forced onto node 1 ...... remote_noop_latency_*
      |-- node 1 makes a 200 MiB array, a task there reads it ....... local_read_ms
      |   then a task on node 2 reads it ............................. node_to_node_gb_per_s
      |-- node 1 makes one, the driver gets it ...................... to_driver_gb_per_s
      '-- no-op tasks, round-robin over nodes 1..N-1 ................. spread_tasks_per_s

Placement is forced with ``NodeAffinitySchedulingStrategy(node_id, soft=False)``, which
orchestra and Ray share; a check before the figures asserts that the driver is on the
head's node and that each task ran on the node it was sent to (as its runtime context
names it). Ray runs the same on ``ray.cluster_utils.Cluster`` (a head raylet and N-1
more, each with its own object store); Dask on ``distributed.LocalCluster`` with N-1
worker processes (its scheduler runs in the driver's process, its workers are the
nodes), placing tasks with ``workers=[address]``. The transfer arrays are random floats,
so that no compression on the way flatters a figure.

Each framework runs in a process of its own (microbenchmark.py starts it), Ray and Dask under a Python
that has them: this file runs standalone by path there and imports orchestra only by
name, in the orchestra half.
"""
from __future__ import annotations

import importlib
import inspect
import os
import statistics
import sys
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from types import ModuleType

    import numpy as np

try:
    from .microbenchmark import MiB, Results, _lat, _rate, cluster_memory
except ImportError:   # run by path under a Python without orchestra: microbenchmark.py beside it
    import importlib.util
    _spec = importlib.util.spec_from_file_location(
        "microbenchmark", os.path.join(os.path.dirname(os.path.abspath(__file__)), "microbenchmark.py"))
    assert _spec is not None and _spec.loader is not None
    _bench = importlib.util.module_from_spec(_spec)
    sys.modules["microbenchmark"] = _bench
    _spec.loader.exec_module(_bench)
    MiB, Results, _lat, _rate, cluster_memory = (
        _bench.MiB, _bench.Results, _bench._lat, _bench._rate, _bench.cluster_memory)

# Each node offers the machine's cores, as the single-node benchmark's init(num_cpus=cpu_count)
# does (a node stands for a machine). With 1 CPU per node Ray's spread tasks/s halved here
# (665 vs 1,204 on 2 cores): it runs one task per leased worker at a time.
CPUS_PER_NODE = os.cpu_count() or 1
TRANSFER_BYTES = 200 * MiB
STORE_BYTES = 1024 * MiB    # per node: two transfer arrays alive at once, with room to spare


def _scale(quick: bool) -> dict[str, int]:
    """Counts for a full run, or a smoke test's."""
    if quick:
        return {"lat_n": 50, "spread_n": 100, "rounds": 1, "transfer_bytes": 8 * MiB}
    return {"lat_n": 2000, "spread_n": 5000, "rounds": 5, "transfer_bytes": TRANSFER_BYTES}


# ---------------------------------------------------------------- orchestra and Ray

def _start_orchestra(nodes: int) -> tuple[Any, Any, list[str], dict[str, float]]:
    """Head (the driver's node) + nodes-1 joined nodes, then the driver joins:
    (orchestra, cluster, node ids with the head's first, times)."""
    fw = importlib.import_module("orchestra")
    cluster_utils = importlib.import_module("orchestra.cluster_utils")
    t = time.perf_counter()
    # --tls: the nodes speak TLS to each other as between machines (on loopback here).
    cluster = cluster_utils.Cluster(initialize_head=True, head_node_args={
        "num_cpus": CPUS_PER_NODE, "object_store_memory": STORE_BYTES},
        tls=os.environ.get("ORCHESTRA_BENCH_TLS") == "1" or None)
    # Side by side, as add_nodes() does: their imports overlap (Ray's Cluster has no such call).
    joined = cluster.add_nodes(nodes - 1, num_cpus=CPUS_PER_NODE, object_store_memory=STORE_BYTES)
    times = {"cluster_start_s": time.perf_counter() - t}
    t = time.perf_counter()
    fw.init(address=cluster.address, token=cluster.token)
    times["connect_s"] = time.perf_counter() - t
    return fw, cluster, [n.node_id for n in cluster.list_all_nodes()[:1] + joined], times


def _start_ray(nodes: int) -> tuple[Any, Any, list[str], dict[str, float]]:
    """Ray's head raylet + nodes-1 more raylets, then the driver connects:
    (ray, cluster, node ids with the head's first, times)."""
    ray = importlib.import_module("ray")
    cluster_utils = importlib.import_module("ray.cluster_utils")
    t = time.perf_counter()
    cluster = cluster_utils.Cluster(initialize_head=True, head_node_args={
        "num_cpus": CPUS_PER_NODE, "object_store_memory": STORE_BYTES, "include_dashboard": False})
    joined = [cluster.add_node(num_cpus=CPUS_PER_NODE, object_store_memory=STORE_BYTES)
              for _ in range(1, nodes)]
    cluster.wait_for_nodes()
    times = {"cluster_start_s": time.perf_counter() - t}
    t = time.perf_counter()
    ray.init(address=cluster.address, log_to_driver=False)
    times["connect_s"] = time.perf_counter() - t
    return ray, cluster, [n.node_id for n in [cluster.head_node] + joined], times


def _wait_ready(fw: ModuleType, ref: object) -> None:
    """Wait until ``ref`` is made where it was made, without pulling it here (Ray's wait
    fetches to the driver's node unless told not to)."""
    kwargs = {"fetch_local": False} if "fetch_local" in inspect.signature(fw.wait).parameters else {}
    fw.wait([ref], num_returns=1, timeout=120, **kwargs)


def run_tasks_framework(name: str, nodes: int, quick: bool) -> Results:
    """orchestra or Ray: the cluster started from this process, its workloads, its shutdown."""
    import numpy as np
    sc = _scale(quick)
    fw, cluster, node_ids, times = (_start_orchestra if name == "orchestra" else _start_ray)(nodes)
    affinity = importlib.import_module(f"{name}.util.scheduling_strategies").NodeAffinitySchedulingStrategy
    res: Results = {"framework": name, "version": getattr(fw, "__version__", "?"),
                           "nodes": nodes, **times}

    @fw.remote
    def noop() -> None:
        return None

    @fw.remote
    def node_id() -> str:
        return str(fw.get_runtime_context().get_node_id())

    @fw.remote
    def make(nbytes: int, seed: int) -> np.ndarray:
        return np.random.default_rng(seed).random(nbytes // 8)

    @fw.remote
    def read(a: np.ndarray) -> float:
        return float(a[:: 4096].sum())

    on = {i: {"scheduling_strategy": affinity(node_ids[i], soft=False)} for i in range(1, nodes)}
    t = time.perf_counter()
    where = fw.get([node_id.options(**on[i]).remote() for i in range(1, nodes)])
    res["first_remote_tasks_s"] = time.perf_counter() - t
    _check_placement(str(fw.get_runtime_context().get_node_id()), node_ids, where)

    noop_1 = noop.options(**on[1])
    lat = _lat(lambda: fw.get(noop_1.remote()), sc["lat_n"], 10)
    res["remote_noop_latency_median_us"] = lat["median_us"]
    res["remote_noop_latency_p99_us"] = lat["p99_us"]

    spread = [noop.options(**on[i]) for i in range(1, nodes)]
    res["spread_tasks_per_s"] = _rate(
        lambda k: fw.get([spread[j % len(spread)].remote() for j in range(k)]), sc["spread_n"])

    make_1, read_1, read_2 = make.options(**on[1]), read.options(**on[1]), read.options(**on[2])

    def node_to_node(seed: int) -> tuple[float, float]:
        ref = make_1.remote(sc["transfer_bytes"], seed)
        _wait_ready(fw, ref)
        return _timed(lambda: fw.get(read_1.remote(ref))), _timed(lambda: fw.get(read_2.remote(ref)))

    def to_driver(seed: int) -> float:
        ref = make_1.remote(sc["transfer_bytes"], seed)
        _wait_ready(fw, ref)
        t = time.perf_counter()
        a = fw.get(ref)
        took = time.perf_counter() - t
        assert a.nbytes == sc["transfer_bytes"] // 8 * 8
        return took

    res.update(_transfers(node_to_node, to_driver, sc))
    time.sleep(0.5)
    res.update({f"idle_{k}": v for k, v in cluster_memory().items()})

    t = time.perf_counter()
    fw.shutdown()
    cluster.shutdown()
    res["shutdown_s"] = time.perf_counter() - t
    return res


def _check_placement(driver_node: str, node_ids: list[str], where: list[str]) -> None:
    """The driver is on the head's node, and the tasks sent to nodes 1..N-1 ran there."""
    if driver_node != node_ids[0] or where != node_ids[1:]:
        raise RuntimeError(f"placement not as asked: the driver is on {driver_node} (the head's "
                           f"node is {node_ids[0]}), tasks sent to {node_ids[1:]} ran on {where}; "
                           "the node figures would mean nothing")


def _timed(fn: Callable[[], object]) -> float:
    t = time.perf_counter()
    fn()
    return time.perf_counter() - t


def _transfers(node_to_node: Callable[[int], tuple[float, float]], to_driver: Callable[[int], float],
               sc: dict[str, int]) -> dict[str, float]:
    """Medians over the rounds; a fresh array each round (a copy already pulled would
    make the next read local). node_to_node gives (the read on the array's own node, the
    read on the other node): the first is what the second costs without the move."""
    n2n = [node_to_node(100 + r) for r in range(sc["rounds"])]
    drv = [to_driver(200 + r) for r in range(sc["rounds"])]
    nbytes = sc["transfer_bytes"]
    return {"local_read_ms": statistics.median(local for local, _ in n2n) * 1e3,
            "node_to_node_gb_per_s": nbytes / statistics.median(remote for _, remote in n2n) / 1e9,
            "to_driver_gb_per_s": nbytes / statistics.median(drv) / 1e9,
            "transfer_mib": nbytes / MiB}


# ---------------------------------------------------------------- Dask

def _dask_noop() -> None:
    return None


def _dask_make(nbytes: int, seed: int) -> np.ndarray:
    import numpy as np
    return np.random.default_rng(seed).random(nbytes // 8)


def _dask_read(a: np.ndarray) -> float:
    return float(a[:: 4096].sum())


def run_dask(nodes: int, quick: bool) -> Results:
    """Dask: a LocalCluster of nodes-1 worker processes (the scheduler in this process)."""
    import logging
    distributed = importlib.import_module("distributed")
    sc = _scale(quick)
    t = time.perf_counter()
    cluster = distributed.LocalCluster(
        n_workers=nodes - 1, threads_per_worker=CPUS_PER_NODE, processes=True,
        dashboard_address=None, silence_logs=logging.ERROR)
    res: Results = {"framework": "dask", "version": distributed.__version__,
                           "nodes": nodes, "cluster_start_s": time.perf_counter() - t}
    t = time.perf_counter()
    client = distributed.Client(cluster)
    client.wait_for_workers(nodes - 1)
    res["connect_s"] = time.perf_counter() - t
    workers = sorted(client.scheduler_info()["workers"])

    def on(i: int, fn: Callable[..., Any], *args: Any) -> Any:
        return client.submit(fn, *args, pure=False, workers=[workers[i - 1]], allow_other_workers=False)

    t = time.perf_counter()
    client.gather([on(i, _dask_noop) for i in range(1, nodes)])
    res["first_remote_tasks_s"] = time.perf_counter() - t

    lat = _lat(lambda: on(1, _dask_noop).result(), sc["lat_n"], 10)
    res["remote_noop_latency_median_us"] = lat["median_us"]
    res["remote_noop_latency_p99_us"] = lat["p99_us"]
    res["spread_tasks_per_s"] = _rate(
        lambda k: client.gather([on(1 + j % (nodes - 1), _dask_noop) for j in range(k)]), sc["spread_n"])

    def node_to_node(seed: int) -> tuple[float, float]:
        fut = on(1, _dask_make, sc["transfer_bytes"], seed)
        distributed.wait([fut])
        return (_timed(lambda: on(1, _dask_read, fut).result()),
                _timed(lambda: on(2, _dask_read, fut).result()))

    def to_driver(seed: int) -> float:
        fut = on(1, _dask_make, sc["transfer_bytes"], seed)
        distributed.wait([fut])
        t = time.perf_counter()
        fut.result()
        return time.perf_counter() - t

    res.update(_transfers(node_to_node, to_driver, sc))
    time.sleep(0.5)
    res.update({f"idle_{k}": v for k, v in cluster_memory().items()})
    t = time.perf_counter()
    client.close()
    cluster.close()
    res["shutdown_s"] = time.perf_counter() - t
    return res


def run(framework: str, nodes: int, quick: bool) -> Results:
    """One framework's results, printed as JSON by main() for microbenchmark.py's table."""
    if nodes < 3:
        raise ValueError(f"--nodes {nodes}: the multi-node benchmark needs a head and two nodes "
                         "(a transfer goes between two nodes, neither the driver's); use --nodes 3")
    if framework == "dask":
        return run_dask(nodes, quick)
    return run_tasks_framework(framework, nodes, quick)


def main() -> int:
    """Child entry when run by path: ``python _cli/bench_nodes.py FRAMEWORK NODES [--quick]``."""
    import json
    framework, nodes = sys.argv[1], int(sys.argv[2])
    print(json.dumps(run(framework, nodes, "--quick" in sys.argv[3:])))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
