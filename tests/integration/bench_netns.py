"""Objects between hosts, measured (not a test: pytest collects only test_*.py; run it as
root: ``ORCHESTRA_NETNS_STORE_MIB=1024 pytest tests/integration/bench_netns.py -s``).
The namespaced hosts of the ``netns_cluster`` fixture (conftest.py: a head and two
nodes, each on a host of its own with a private /dev/shm, joined over a veth network),
and a driver on the first node's host. Prints the median of five rounds (GB/s: 200 MiB
over the time from the call to its answer, the pull included), each with a fresh 200 MiB
array a task made on the other node: a task on the driver's node summing every byte of
it, or reading one value in 4,096 (as `microbenchmark --nodes` does); the driver getting
it, and summing it; and the first round alone (its pull into memory the receiving
store never used).

Numbers only: nothing here asserts a speed."""
from __future__ import annotations

import json
import sys

_BENCH = """
import statistics, time
import numpy as np
from orchestra.util.scheduling_strategies import NodeAffinitySchedulingStrategy as A
me = orchestra.get_runtime_context().get_node_id()
other = [n["NodeID"] for n in orchestra.nodes() if n["NodeID"] not in (me, "0" * 16)][0]
n = 200 << 20

@orchestra.remote(num_cpus=0)
def make(seed):
    return np.random.default_rng(seed).random(n // 8)

@orchestra.remote(num_cpus=0)
def total(a):
    return float(a.sum())

@orchestra.remote(num_cpus=0)
def strided(a):
    return float(a[::4096].sum())

def fresh(seed):
    ref = make.options(scheduling_strategy=A(other)).remote(seed)
    orchestra.wait([ref], num_returns=1, timeout=120)
    return ref

def rate(fn):
    t = time.perf_counter()
    fn()
    return n / (time.perf_counter() - t) / 1e9

rows = {"task_sums_every_byte": [], "task_reads_strided": [], "driver_gets": [],
        "driver_gets_and_sums": []}
for seed in range(5):
    ref = fresh(seed)
    rows["task_sums_every_byte"].append(rate(lambda: orchestra.get(
        total.options(scheduling_strategy=A(me)).remote(ref))))
    ref = fresh(seed + 100)
    rows["task_reads_strided"].append(rate(lambda: orchestra.get(
        strided.options(scheduling_strategy=A(me)).remote(ref))))
    ref = fresh(seed + 200)
    rows["driver_gets"].append(rate(lambda: orchestra.get(ref)))
    ref = fresh(seed + 300)
    rows["driver_gets_and_sums"].append(rate(lambda: orchestra.get(ref).sum()))
    del ref
out = {k + "_gb_per_s": round(statistics.median(v), 2) for k, v in rows.items()}
# The first round's pull meets memory the receiving store never used (fresh pages).
out.update({"first_" + k + "_gb_per_s": round(v[0], 2) for k, v in rows.items()})
print(json.dumps(out))
"""


def test_bench_objects_between_namespaced_hosts(netns_cluster) -> None:
    from test_cluster_netns import _driver_on_node
    got = _driver_on_node(netns_cluster, 0, _BENCH)
    print("\n" + json.dumps(got, indent=1), file=sys.stderr)
