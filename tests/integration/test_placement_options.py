"""scheduling_strategy= on a real single-node cluster: options are checked at once,
SPREAD and affinity to the (only) node run as usual, affinity to a node that is not in
the cluster fails with an error naming it. (Placement over several nodes is specified
by tests/unit/test_placement.py.)"""
from __future__ import annotations

import pytest

import _helpers as h
import orchestra
from orchestra._ids import node_hex
from orchestra.exceptions import InfeasibleResourcesError
from orchestra.util.scheduling_strategies import NodeAffinitySchedulingStrategy

pytestmark = pytest.mark.timeout(60)

T = 30
HEAD = node_hex(0)           # the head's own node: the only one of a local cluster
BOGUS = "00000000000000ff"   # no node has this id


@orchestra.remote(scheduling_strategy="SPREAD")
def spread_square(x: int) -> int:
    return x * x


@orchestra.remote
class Counter:
    def __init__(self) -> None:
        self.n = 0

    def inc(self) -> int:
        self.n += 1
        return self.n


def test_spread_tasks_run_and_return_their_values(cluster):
    assert orchestra.get([spread_square.remote(i) for i in range(50)], timeout=T) == \
        [i * i for i in range(50)]


def test_spread_set_in_options_runs(cluster):
    refs = [h.add.options(scheduling_strategy="SPREAD").remote(i, 1) for i in range(20)]
    assert orchestra.get(refs, timeout=T) == list(range(1, 21))


@pytest.mark.parametrize("soft", [False, True])
def test_affinity_to_the_only_node_runs(cluster, soft):
    strategy = NodeAffinitySchedulingStrategy(HEAD, soft=soft)
    assert orchestra.get(h.add.options(scheduling_strategy=strategy).remote(2, 3), timeout=T) == 5


def test_default_named_explicitly_runs(cluster):
    assert orchestra.get(h.add.options(scheduling_strategy="DEFAULT").remote(1, 1), timeout=T) == 2


def test_a_strategy_task_can_take_an_object_in_shared_memory(cluster):
    import numpy as np
    big = orchestra.put(np.arange(1 << 20))
    ref = h.describe_arg.options(scheduling_strategy="SPREAD").remote(big)
    assert orchestra.get(ref, timeout=T)["type"] == "ndarray"


def test_affinity_to_a_node_not_in_the_cluster_fails_naming_it(cluster):
    ref = h.add.options(scheduling_strategy=NodeAffinitySchedulingStrategy(BOGUS)).remote(1, 2)
    with pytest.raises(InfeasibleResourcesError, match=BOGUS) as info:
        orchestra.get(ref, timeout=T)
    assert "no such node" in str(info.value) and "soft=True" in str(info.value)
    # The cluster carries on.
    assert orchestra.get(h.add.remote(1, 2), timeout=T) == 3


def test_soft_affinity_to_a_node_not_in_the_cluster_runs_here(cluster):
    strategy = NodeAffinitySchedulingStrategy(BOGUS, soft=True)
    assert orchestra.get(h.add.options(scheduling_strategy=strategy).remote(1, 2), timeout=T) == 3


@pytest.mark.parametrize("strategy", ["SPREAD", NodeAffinitySchedulingStrategy(HEAD)])
def test_an_actor_with_a_strategy_runs(cluster, strategy):
    c = Counter.options(scheduling_strategy=strategy).remote()
    assert orchestra.get([c.inc.remote() for _ in range(3)], timeout=T) == [1, 2, 3]
    orchestra.kill(c)


def test_an_actor_with_affinity_to_a_node_not_in_the_cluster_fails_its_calls(cluster):
    c = Counter.options(scheduling_strategy=NodeAffinitySchedulingStrategy(BOGUS)).remote()
    with pytest.raises(InfeasibleResourcesError, match=BOGUS):
        orchestra.get(c.inc.remote(), timeout=T)


@pytest.mark.parametrize("value, error", [("spread", ValueError), ("PACK", ValueError),
                                          (42, TypeError), ({"node": HEAD}, TypeError)])
def test_an_unknown_strategy_is_refused_before_anything_is_sent(cluster, value, error):
    with pytest.raises(error, match="accepted"):
        h.add.options(scheduling_strategy=value)
    with pytest.raises(error, match="accepted"):
        Counter.options(scheduling_strategy=value)


def test_a_malformed_node_id_is_refused_at_once(cluster):
    with pytest.raises(ValueError, match="16 hex digits"):
        NodeAffinitySchedulingStrategy("node-1")
