"""Recursion of any depth, and no silent stall (issue 12, item 3).

``rec(n) = 0 if n == 0 else 1 + get(rec.remote(n - 1))`` used to hold one blocked worker
per level: on 2 CPUs it stalled for good at n = 40 (the worker cap, 4 x CPUs + 32, all
blocked in get()), and after that even a trivial task timed out. A worker blocked in
get() now runs the task it waits for itself when that task has not started; where no
task can progress at all, the driver logs a warning naming the blocked tasks.
"""
from __future__ import annotations

import logging
import threading
import time
from pathlib import Path

import pytest

import orchestra
from _helpers import wait_for_file
from orchestra._cli.microbenchmark import _children  # every process below a pid

DEADLINE_S = 90.0


@orchestra.remote
def rec(n: int) -> int:
    return 0 if n == 0 else 1 + orchestra.get(rec.remote(n - 1), timeout=DEADLINE_S)


@orchestra.remote
def rec_sum(n: int, width: int) -> int:
    """A tree: each level waits for ``width`` children at once."""
    if n == 0:
        return 1
    return sum(orchestra.get([rec_sum.remote(n - 1, width) for _ in range(width)], timeout=DEADLINE_S))


@orchestra.remote
def trivial() -> str:
    return "ok"


@pytest.mark.timeout(180)
def test_recursion_1000_deep_completes_on_two_cpus_within_the_worker_cap(start_cluster):
    cluster = start_cluster(num_cpus=2)
    cap = 4 * 2 + 32
    most = [0]
    stop = threading.Event()

    def sample() -> None:
        while not stop.is_set():
            most[0] = max(most[0], len(_children(cluster.head_pid)) - 1)   # less the fork server
            time.sleep(0.05)

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    try:
        assert orchestra.get(rec.remote(1000), timeout=120) == 1000
    finally:
        stop.set()
        sampler.join(timeout=5)
    assert orchestra.get(trivial.remote(), timeout=10) == "ok"   # the cluster is not wedged
    assert 0 < most[0] <= cap, f"{most[0]} worker processes (cap {cap})"
    assert len(cluster.worker_pids()) <= cap


@pytest.mark.timeout(120)
def test_recursion_deeper_than_the_worker_cap_leaves_the_cluster_usable(start_cluster):
    start_cluster(num_cpus=2)
    for n in (41, 200):   # 41: one level past the old stall
        assert orchestra.get(rec.remote(n), timeout=60) == n
    assert orchestra.get(trivial.remote(), timeout=10) == "ok"


@pytest.mark.timeout(120)
def test_a_tree_of_tasks_each_waiting_for_several_children_completes(start_cluster):
    # More blocked parents at once than the cap allows (2 + 4 + ... + 128 = 254):
    # each runs its children's tasks inline in turn.
    start_cluster(num_cpus=2)
    assert orchestra.get(rec_sum.remote(7, 2), timeout=90) == 2 ** 7


# ------------------------------------------------------------------ a genuine stall

@orchestra.remote(resources={"left": 1})
def hold_left_wait_right(directory: str) -> int:
    # Both holders start before either asks for the other's resource: a real deadlock.
    Path(directory, "left").touch()
    wait_for_file(Path(directory, "right"))
    return orchestra.get(needs_right.remote(), timeout=DEADLINE_S)


@orchestra.remote(resources={"right": 1})
def hold_right_wait_left(directory: str) -> int:
    Path(directory, "right").touch()
    wait_for_file(Path(directory, "left"))
    return orchestra.get(needs_left.remote(), timeout=DEADLINE_S)


@orchestra.remote(resources={"right": 1})
def needs_right() -> int:
    return 1


@orchestra.remote(resources={"left": 1})
def needs_left() -> int:
    return 1


@pytest.mark.timeout(60)
def test_a_stall_no_task_can_leave_is_logged_by_the_driver_naming_the_blocked_tasks(
        start_cluster, tmp_path, caplog):
    start_cluster(num_cpus=2, resources={"left": 1, "right": 1})
    caplog.set_level(logging.WARNING, logger="orchestra")
    a = hold_left_wait_right.remote(str(tmp_path))
    b = hold_right_wait_left.remote(str(tmp_path))
    started = time.monotonic()

    def warned() -> str:
        return "\n".join(r.getMessage() for r in caplog.records
                         if r.name == "orchestra" and "no task can make progress" in r.getMessage())

    while not warned() and time.monotonic() - started < 15:
        time.sleep(0.05)
    text = warned()
    assert text, "no warning within 15 s of a stall"
    assert time.monotonic() - started < 12
    for blocked in (a, b):
        assert blocked.binary()[:12].hex() in text   # the task id: the object id less its index
    assert "hold_left_wait_right()" in text and "hold_right_wait_left()" in text
    assert "needs_right()" in text and "needs_left()" in text
    assert text.count("no task can make progress") == 1   # once per stall, not every check
    for ref in (a, b):
        orchestra.cancel(ref, force=True)


@pytest.mark.timeout(60)
def test_a_long_blocked_get_that_can_progress_logs_no_stall(start_cluster, caplog):
    start_cluster(num_cpus=2)
    caplog.set_level(logging.WARNING, logger="orchestra")

    @orchestra.remote
    def slow() -> int:
        time.sleep(7)
        return 1

    @orchestra.remote
    def parent() -> int:
        return orchestra.get(slow.remote(), timeout=DEADLINE_S)

    assert orchestra.get(parent.remote(), timeout=30) == 1
    assert not [r for r in caplog.records if "no task can make progress" in r.getMessage()]


@orchestra.remote
def rec_fail(n: int) -> int:
    if n == 0:
        raise ValueError("the bottom of the recursion")
    return 1 + orchestra.get(rec_fail.remote(n - 1), timeout=DEADLINE_S)


@pytest.mark.timeout(90)
def test_an_error_at_the_bottom_of_a_recursion_reaches_the_driver_with_a_bounded_message(start_cluster):
    # Each level used to repeat the whole message of the level below twice: 30 levels
    # down, the error grew past a gigabyte and the callers seemed hung.
    start_cluster(num_cpus=2)
    with pytest.raises(ValueError, match="the bottom of the recursion") as info:
        orchestra.get(rec_fail.remote(30), timeout=60)
    assert len(str(info.value)) < 200_000
