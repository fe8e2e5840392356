"""Tasks on a real local cluster: arguments, returns, nesting, wait() and get(timeout=)."""
from __future__ import annotations

import os
import time

import pytest

import _helpers as h
import orchestra
from orchestra.exceptions import GetTimeoutError

pytestmark = pytest.mark.timeout(60)

T = 30  # seconds: every get in these tests has a deadline, so nothing hangs


# ------------------------------------------------------------------ arguments

def test_plain_arguments_and_keyword_arguments(cluster):
    assert orchestra.get(h.add.remote(2, 3), timeout=T) == 5
    assert orchestra.get(h.add.remote(a="x", b="y"), timeout=T) == "xy"
    assert orchestra.get(h.add.remote([1], b=[2]), timeout=T) == [1, 2]


def test_top_level_ref_argument_arrives_as_its_value(cluster):
    ref = orchestra.put([1, 2, 3])
    assert orchestra.get(h.describe_arg.remote(ref), timeout=T) == {"type": "list",
                                                                    "items": ["int"] * 3}
    # A task's result as well as a put.
    assert orchestra.get(h.add.remote(h.add.remote(1, 2), 4), timeout=T) == 7


def test_top_level_ref_argument_given_by_keyword_arrives_as_its_value(cluster):
    ref = orchestra.put(10)
    assert orchestra.get(h.add.remote(1, b=ref), timeout=T) == 11


@pytest.mark.parametrize("container", ["list", "dict", "object"])
def test_refs_nested_in_an_argument_arrive_as_refs(cluster, container):
    ref = orchestra.put(41)
    arg = {"list": [ref], "dict": {"k": ref}, "object": h.Box(ref)}[container]
    got = orchestra.get(h.describe_arg.remote(arg), timeout=T)
    items = list(got["items"].values()) if container == "dict" else got["items"]
    assert items == ["ObjectRef"]


def test_a_task_can_get_the_refs_nested_in_its_argument(cluster):
    refs = [orchestra.put(i) for i in range(3)] + [h.add.remote(1, 1)]
    assert orchestra.get(h.get_nested.remote(refs), timeout=T) == [0, 1, 2, 2]


def test_a_task_runs_only_after_its_arguments_exist(cluster, gates, tmp_path):
    gate = gates("producer")
    produced = h.gated.remote(gate, 5)
    marker = str(tmp_path / "consumer-ran")
    consumer = h.mark_then_return.remote(marker, produced)
    gate.wait_started()
    ready, _ = orchestra.wait([consumer], timeout=0.3)
    assert ready == [] and not os.path.exists(marker)
    gate.open()
    assert orchestra.get(consumer, timeout=T) == 5
    assert os.path.exists(marker)


# ------------------------------------------------------------------ returns

def test_num_returns_k_gives_k_refs(cluster):
    refs = h.three.remote(10)
    assert isinstance(refs, list) and len(refs) == 3
    assert all(isinstance(r, orchestra.ObjectRef) for r in refs)
    assert orchestra.get(refs, timeout=T) == [10, 11, 12]


def test_num_returns_set_by_options(cluster):
    refs = h.identity.options(num_returns=2).remote(("a", "b"))
    assert orchestra.get(refs, timeout=T) == ["a", "b"]


def test_num_returns_zero_gives_none(cluster, tmp_path):
    marker = str(tmp_path / "ran")
    assert h.touch_marker.options(num_returns=0).remote(marker) is None
    h.wait_for_file(marker, T)


def test_wrong_number_of_returned_values_raises_at_get(cluster):
    refs = h.identity.options(num_returns=2, max_retries=0).remote((1, 2, 3))
    with pytest.raises(ValueError, match="num_returns=2 but returned 3 values"):
        orchestra.get(refs[0], timeout=T)


def test_many_small_tasks_return_in_order(cluster):
    refs = [h.add.remote(i, i) for i in range(300)]
    assert orchestra.get(refs, timeout=T) == [2 * i for i in range(300)]


# ------------------------------------------------------------------ nested tasks

def test_a_task_can_submit_tasks_and_get_their_results(cluster):
    assert orchestra.get(h.submit_and_get.remote(4), timeout=T) == [100, 101, 102, 103]


def test_a_task_blocked_in_get_lends_its_cpu_to_its_subtask(cluster):
    # The outer task holds both CPUs of the node: its subtask can only run if the CPU
    # is lent back while the outer task waits in get().
    assert orchestra.get(h.whole_node_then_subtask.remote(1), timeout=T) == 2


@pytest.mark.timeout(90)
def test_many_parents_blocked_in_get_do_not_starve_their_subtasks(start_cluster):
    # More parents than the pool can ever grow to: subtasks must run before more
    # parents start, or every worker ends up blocked in get() (a deadlock).
    start_cluster(num_cpus=2)
    assert orchestra.get([h.fan_out.remote(5) for _ in range(150)], timeout=60) == [5] * 150


@pytest.mark.timeout(90)
def test_recursion_deeper_than_the_number_of_cpus_completes(start_cluster):
    start_cluster(num_cpus=2)
    assert orchestra.get(h.recurse.remote(6), timeout=60) == 6


def test_a_quick_task_does_not_wait_behind_a_long_one_while_a_worker_is_idle(cluster, gates):
    gate = gates()
    h.gated.remote(gate)
    quick = [h.identity.remote(i) for i in range(20)]
    assert orchestra.get(quick, timeout=1) == list(range(20))


def test_calling_a_remote_function_directly_raises_type_error(cluster):
    with pytest.raises(TypeError, match=r"\.remote\("):
        h.add(1, 2)


# ------------------------------------------------------------------ wait()

def test_wait_returns_ready_and_not_ready_in_input_order(cluster, gates):
    done = [h.identity.remote(i) for i in range(4)]
    orchestra.get(done, timeout=T)
    gate = gates()
    blocked = h.gated.remote(gate, "late")
    refs = [done[0], blocked, done[1], done[2], done[3]]
    ready, not_ready = orchestra.wait(refs, num_returns=3, timeout=T)
    assert ready == [done[0], done[1], done[2]]
    assert not_ready == [blocked, done[3]]


@pytest.mark.parametrize("num_returns", [1, 2, 5])
def test_wait_returns_exactly_num_returns_ready_refs(cluster, num_returns):
    refs = [h.identity.remote(i) for i in range(5)]
    orchestra.get(refs, timeout=T)
    ready, not_ready = orchestra.wait(refs, num_returns=num_returns, timeout=T)
    assert ready == refs[:num_returns]
    assert not_ready == refs[num_returns:]


def test_wait_blocks_until_num_returns_are_ready(cluster, gates):
    gate = gates()
    slow = h.gated.remote(gate, 1)
    fast = h.identity.remote(2)
    ready, not_ready = orchestra.wait([slow, fast], num_returns=1, timeout=T)
    assert (ready, not_ready) == ([fast], [slow])
    gate.open()
    ready, not_ready = orchestra.wait([slow, fast], num_returns=2, timeout=T)
    assert (ready, not_ready) == ([slow, fast], [])


def test_wait_timeout_ends_it_with_fewer_ready(cluster, gates):
    gate = gates()
    slow = h.gated.remote(gate)
    fast = h.identity.remote(1)
    orchestra.get(fast, timeout=T)
    start = time.monotonic()
    ready, not_ready = orchestra.wait([slow, fast], num_returns=2, timeout=0.3)
    elapsed = time.monotonic() - start
    assert (ready, not_ready) == ([fast], [slow])
    assert 0.25 <= elapsed < 3


def test_wait_timeout_zero_polls(cluster, gates):
    gate = gates()
    slow = h.gated.remote(gate)
    done = h.identity.remote(1)
    orchestra.get(done, timeout=T)
    start = time.monotonic()
    ready, not_ready = orchestra.wait([slow, done], num_returns=2, timeout=0)
    assert time.monotonic() - start < 0.5
    assert (ready, not_ready) == ([done], [slow])
    assert orchestra.wait([slow], timeout=0) == ([], [slow])


def test_wait_counts_a_failed_task_as_ready(cluster):
    err = h.raise_value_error.remote("boom")
    ready, not_ready = orchestra.wait([err], timeout=T)
    assert (ready, not_ready) == ([err], [])


def test_wait_on_an_empty_list_returns_two_empty_lists(cluster):
    assert orchestra.wait([]) == ([], [])


@pytest.mark.parametrize("call, error", [
    (lambda r: orchestra.wait(r[0]), TypeError),                       # a ref, not a list
    (lambda r: orchestra.wait([r[0], 1]), TypeError),                  # not a ref inside
    (lambda r: orchestra.wait(r, num_returns="1"), TypeError),
    (lambda r: orchestra.wait(r, num_returns=0), ValueError),
    (lambda r: orchestra.wait(r, num_returns=3), ValueError),          # more than len(refs)
    (lambda r: orchestra.wait([r[0], r[0]]), ValueError),              # the same ref twice
    (lambda r: orchestra.wait(r, timeout=-1), ValueError),
    (lambda r: orchestra.wait(r, timeout="1"), ValueError),
], ids=["ref-not-list", "non-ref-item", "num-returns-str", "num-returns-0",
        "num-returns-too-many", "duplicate", "negative-timeout", "timeout-str"])
def test_wait_rejects_bad_arguments(cluster, call, error):
    refs = [orchestra.put(1), orchestra.put(2)]
    with pytest.raises(error):
        call(refs)


# ------------------------------------------------------------------ get(timeout=)

def test_get_timeout_raises_get_timeout_error_and_the_task_keeps_running(cluster, gates):
    gate = gates()
    ref = h.gated.remote(gate, "finished later")
    gate.wait_started()
    start = time.monotonic()
    with pytest.raises(GetTimeoutError) as info:
        orchestra.get(ref, timeout=0.3)
    elapsed = time.monotonic() - start
    assert isinstance(info.value, TimeoutError)
    assert 0.25 <= elapsed < 3
    assert "timed out" in str(info.value)
    gate.open()
    assert orchestra.get(ref, timeout=T) == "finished later"


def test_get_timeout_on_a_list_raises_get_timeout_error(cluster, gates):
    gate = gates()
    refs = [h.identity.remote(1), h.gated.remote(gate)]
    with pytest.raises(GetTimeoutError):
        orchestra.get(refs, timeout=0.2)


def test_get_timeout_zero_returns_a_ready_value(cluster):
    ref = orchestra.put("here")
    assert orchestra.get(ref, timeout=0) == "here"


@pytest.mark.parametrize("timeout", [-1, "1", True])
def test_get_rejects_a_bad_timeout(cluster, timeout):
    with pytest.raises(ValueError, match="timeout"):
        orchestra.get(orchestra.put(1), timeout=timeout)


# ------------------------------------------------------------------ load

MiB = 1 << 20


def _peak_rss(pid: int) -> int:
    """The process's peak resident set (VmHWM), in bytes."""
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) * 1024
    raise AssertionError(f"no VmHWM in /proc/{pid}/status")


def _reset_peak_rss(pid: int) -> None:
    with open(f"/proc/{pid}/clear_refs", "w") as f:
        f.write("5")   # VmHWM starts over from the current RSS


@pytest.mark.load
@pytest.mark.timeout(240)
def test_a_hundred_thousand_queued_tasks_complete_in_bounded_memory(start_cluster):
    # A cluster of its own: a fresh head, and a small store, so that the head's peak is
    # that of the queue and not of the store's warm reserve (shared memory counts in RSS).
    c = start_cluster(num_cpus=2, object_store_memory=128 * MiB)
    n = 100_000
    for pid in (os.getpid(), c.head_pid):   # the driver is pytest: its peak so far is not ours
        _reset_peak_rss(pid)
    start = time.monotonic()
    refs = [h.identity.remote(i) for i in range(n)]   # all queued before any get
    submitted = time.monotonic() - start
    assert orchestra.get(refs, timeout=180) == list(range(n))
    elapsed = time.monotonic() - start
    driver, head = _peak_rss(os.getpid()), _peak_rss(c.head_pid)
    print(f"\n{n:,} queued tasks: submitted in {submitted:.1f} s, all done in {elapsed:.1f} s "
          f"({n / elapsed:,.0f} tasks/s); peak RSS: driver {driver / MiB:.0f} MiB, "
          f"head {head / MiB:.0f} MiB")
    assert driver < 1024 * MiB and head < 1024 * MiB
