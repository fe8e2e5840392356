"""orchestra.util.multiprocessing.Pool and orchestra.util.futures.OrchestraExecutor on a
real local cluster: the standard library's semantics (results, chunks, callbacks,
timeouts, errors raised as themselves, close/join/terminate, the initializer's globals,
maxtasksperchild), and the executor's Futures with concurrent.futures' own helpers."""
from __future__ import annotations

import concurrent.futures as cf
import multiprocessing
import os
import subprocess
import sys
import textwrap
import threading
import time

import pytest

import orchestra
from _probes import pid_gone, wait_until
from orchestra.util.futures import OrchestraExecutor
from orchestra.util.multiprocessing import Pool

pytestmark = pytest.mark.timeout(90)

T = 30
SETTING = None   # set by the initializer, in the pool's processes


def square(x: int) -> int:
    return x * x


def setting_and_pid(_: object = None) -> tuple[object, int]:
    return SETTING, os.getpid()


def init_setting(value: object) -> None:
    global SETTING
    SETTING = value


def fail_on(x: int) -> int:
    if x == 3:
        raise KeyError(f"bad item {x}")
    return x


def sleep_then(x: float) -> float:
    time.sleep(x)
    return x


def die(_: object) -> None:
    os._exit(3)


class Unpicklable(Exception):
    def __init__(self) -> None:
        super().__init__("no")
        self.lock = threading.Lock()


def raise_unpicklable() -> None:
    raise Unpicklable()


# ------------------------------------------------------------------ results

def test_every_way_of_mapping_gives_the_standard_librarys_results(start_cluster):
    start_cluster(num_cpus=2)
    items = list(range(103))
    with Pool(2) as pool:
        assert pool.map(square, items) == [x * x for x in items]
        assert pool.map(square, items, chunksize=7) == [x * x for x in items]
        assert pool.map(square, []) == []
        assert pool.starmap(pow, [(2, 5), (3, 2)]) == [32, 9]
        assert list(pool.imap(square, items, chunksize=5)) == [x * x for x in items]
        assert sorted(pool.imap_unordered(square, iter(items), chunksize=4)) == \
            sorted(x * x for x in items)
        assert pool.apply(pow, (2, 10)) == 1024
        assert pool.apply(int, ("ff",), {"base": 16}) == 255
        got: list[object] = []
        res = pool.map_async(square, items, callback=got.append)
        assert res.get(timeout=T) == [x * x for x in items] and res.successful()
        assert got == [[x * x for x in items]]
        assert pool.starmap_async(pow, [(2, 2)]).get(timeout=T) == [4]


def test_many_small_chunks_grouped_per_call_keep_order_and_their_own_errors(start_cluster):
    # Thousands of queued chunks go several to a call: each keeps its result, its
    # place in imap's order and its own exception.
    start_cluster(num_cpus=2)
    with Pool(2) as pool:
        assert sorted(pool.imap_unordered(square, range(3000))) == [x * x for x in range(3000)]
        results = [pool.apply_async(square, (i,)) for i in range(500)]
        assert [r.get(timeout=T) for r in results] == [i * i for i in range(500)]
        it = pool.imap(fail_on, [0, 1, 2] * 500 + [3] + [4] * 500)
        assert [next(it) for _ in range(1500)] == [0, 1, 2] * 500
        with pytest.raises(KeyError):
            next(it)
        assert list(it) == [4] * 500


def test_the_processes_are_the_clusters_not_the_driver(start_cluster):
    start_cluster(num_cpus=2)
    with Pool() as pool:   # as many as the cluster's CPUs
        assert pool._processes == 2
        pids = {pid for _, pid in pool.map(setting_and_pid, range(40), chunksize=1)}
    assert os.getpid() not in pids and 1 <= len(pids) <= 2


def test_more_processes_than_the_cluster_has_cpus_is_refused_naming_them(start_cluster):
    start_cluster(num_cpus=2)
    with pytest.raises(ValueError, match="the cluster has 2 CPUs"):
        Pool(3)
    with pytest.raises(ValueError, match="at least 1"):
        Pool(0)
    with pytest.raises(ValueError, match="maxtasksperchild"):
        Pool(1, maxtasksperchild=0)
    with pytest.raises(TypeError, match="initializer"):
        Pool(1, initializer=3)
    with Pool(4, orchestra_remote_args={"num_cpus": 0.5}) as pool:
        assert pool.map(square, [3]) == [9]


# ------------------------------------------------------------------ errors and timeouts

def test_a_tasks_exception_is_raised_as_itself_with_the_remote_traceback(start_cluster):
    start_cluster(num_cpus=2)
    with Pool(2) as pool:
        with pytest.raises(KeyError) as info:
            pool.map(fail_on, range(8), chunksize=2)
        assert type(info.value) is KeyError and info.value.args == ("bad item 3",)
        assert "fail_on" in str(info.value.__cause__)
        errors: list[BaseException] = []
        res = pool.apply_async(fail_on, (3,), error_callback=errors.append)
        with pytest.raises(KeyError):
            res.get(timeout=T)
        assert not res.successful() and type(errors[0]) is KeyError
        it = pool.imap(fail_on, range(5))
        assert [next(it), next(it), next(it)] == [0, 1, 2]
        with pytest.raises(KeyError):
            next(it)
        assert next(it) == 4
        with pytest.raises(RuntimeError, match="Unpicklable: no"):
            pool.apply(raise_unpicklable)
        assert pool.apply(square, (5,)) == 25   # the pool goes on


def test_get_and_next_time_out_with_the_standard_librarys_error(start_cluster):
    start_cluster(num_cpus=2)
    with Pool(2) as pool:
        res = pool.apply_async(sleep_then, (1.0,))
        with pytest.raises(multiprocessing.TimeoutError):
            res.get(timeout=0.05)
        assert not res.ready()
        with pytest.raises(ValueError, match="not ready"):
            res.successful()
        res.wait(T)
        assert res.ready() and res.get() == 1.0
        it = pool.imap(sleep_then, [1.0])
        with pytest.raises(multiprocessing.TimeoutError):
            it.next(timeout=0.05)
        assert it.next(timeout=T) == 1.0
        with pytest.raises(StopIteration):
            next(it)


def test_a_pool_process_that_dies_fails_its_task_and_is_replaced(start_cluster):
    start_cluster(num_cpus=1)
    with Pool(1) as pool:
        (_, before), = pool.map(setting_and_pid, [0])
        with pytest.raises(orchestra.exceptions.ActorDiedError):
            pool.apply(die, (0,))
        (_, after), = pool.map(setting_and_pid, [0])
        assert after != before


# ------------------------------------------------------------------ lifetime

def test_a_closed_or_terminated_pool_refuses_work_and_join_waits(start_cluster):
    start_cluster(num_cpus=2)
    pool = Pool(2)
    with pytest.raises(ValueError, match="still running"):
        pool.join()
    pending = pool.map_async(sleep_then, [0.3, 0.3])
    pool.close()
    with pytest.raises(ValueError, match="Pool not running"):
        pool.apply(square, (1,))
    pool.join()   # the work submitted before close() finishes first
    assert pending.ready() and pending.get() == [0.3, 0.3]
    pool2 = Pool(1)
    pids = [pid for _, pid in pool2.map(setting_and_pid, [0])]
    slow = pool2.apply_async(sleep_then, (30,))
    pool2.terminate()
    with pytest.raises(RuntimeError, match="terminated"):
        slow.get(timeout=T)
    with pytest.raises(ValueError):
        pool2.map(square, [1])
    wait_until(lambda: all(pid_gone(p) for p in pids), 10, "the pool's process gone")


def test_leaving_the_with_block_terminates_the_processes(start_cluster):
    start_cluster(num_cpus=2)
    with Pool(2) as pool:
        pids = {pid for _, pid in pool.map(setting_and_pid, range(8), chunksize=1)}
    wait_until(lambda: all(pid_gone(p) for p in pids), 10, "the pool's processes gone")


# ------------------------------------------------------------------ initializer

def test_the_initializer_runs_once_per_process_and_its_globals_are_seen(start_cluster):
    start_cluster(num_cpus=2)
    with Pool(2, initializer=init_setting, initargs=("ready",)) as pool:
        got = pool.map(setting_and_pid, range(20), chunksize=1)
    assert {s for s, _ in got} == {"ready"}


def test_maxtasksperchild_replaces_a_process_after_that_many_tasks(start_cluster):
    start_cluster(num_cpus=1)
    with Pool(1, initializer=init_setting, initargs=("again",), maxtasksperchild=2) as pool:
        got = [pool.apply(setting_and_pid) for _ in range(6)]
    pids = [pid for _, pid in got]
    assert {s for s, _ in got} == {"again"}   # the initializer ran in each new process
    assert len(set(pids)) == 3 and pids[0] == pids[1] != pids[2] == pids[3] != pids[4]


_MAIN_SCRIPT = textwrap.dedent('''
    import json, os
    from orchestra.util.multiprocessing import Pool

    connection = None
    calls = 0

    def init(dsn):
        global connection
        connection = f"connected to {dsn} in {os.getpid()}"

    def helper(x):
        global calls
        calls += 1
        return x + 1

    def work(x):
        return connection, helper(x), calls

    if __name__ == "__main__":
        with Pool(1, initializer=init, initargs=("db",)) as pool:
            print(json.dumps(pool.map(work, range(4), chunksize=1)))
''')


def test_functions_of_main_share_the_initializers_globals_in_each_process(no_cluster, tmp_path):
    # Functions defined in __main__ travel by value, each with a copy of the globals it
    # uses: in the pool they are bound to one namespace per process, as in a forked pool.
    script = tmp_path / "pool_main.py"
    script.write_text(_MAIN_SCRIPT)
    r = subprocess.run([sys.executable, str(script)], capture_output=True, text=True,
                       timeout=60, cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    import json
    got = json.loads(r.stdout.strip().splitlines()[-1])
    assert all(c.startswith("connected to db in ") for c, _, _ in got)
    assert [v for _, v, _ in got] == [1, 2, 3, 4]
    assert [n for _, _, n in got] == [1, 2, 3, 4]   # the helper's global counts in one place


def test_a_pool_starts_a_local_cluster_when_there_is_none(no_cluster):
    try:
        with Pool(1) as pool:
            assert pool.map(square, [1, 2]) == [1, 4]
        assert orchestra.is_initialized()
    finally:
        orchestra.shutdown()


# ------------------------------------------------------------------ concurrent.futures

def test_the_executors_futures_work_with_as_completed_and_wait(start_cluster):
    start_cluster(num_cpus=2)
    with OrchestraExecutor() as ex:
        fs = [ex.submit(square, i) for i in range(20)]
        assert sorted(f.result() for f in cf.as_completed(fs, timeout=T)) == \
            sorted(i * i for i in range(20))
        done, not_done = cf.wait([ex.submit(sleep_then, 0.1), ex.submit(fail_on, 3)],
                                 timeout=T, return_when=cf.ALL_COMPLETED)
        assert not not_done
        errors = [f.exception() for f in done if f.exception() is not None]
        assert len(errors) == 1 and isinstance(errors[0], KeyError)
        assert ex.submit(pow, 3, 3).result(timeout=T) == 27   # a builtin, shipped by value
        assert list(ex.map(square, range(10))) == [i * i for i in range(10)]
        assert list(ex.map(pow, [2, 3], [3, 2], chunksize=5)) == [8, 9]


def test_the_executor_runs_at_most_max_workers_and_cancels_what_waits(start_cluster):
    start_cluster(num_cpus=2)
    ex = OrchestraExecutor(max_workers=1)
    first = ex.submit(sleep_then, 0.5)
    queued = ex.submit(sleep_then, 0.5)
    assert not first.cancel()   # running
    assert queued.cancel() and queued.cancelled()
    third = ex.submit(square, 4)
    started = time.monotonic()
    assert third.result(timeout=T) == 16
    assert first.done()          # the third started only once the first was done
    with pytest.raises(cf.TimeoutError):
        list(ex.map(sleep_then, [0.5, 0.5], timeout=0.1))
    ex.shutdown(wait=True)
    assert time.monotonic() - started < T
    with pytest.raises(RuntimeError, match="after shutdown"):
        ex.submit(square, 1)
    with pytest.raises(ValueError, match="max_workers"):
        OrchestraExecutor(max_workers=0)


def test_shutdown_can_cancel_the_queued_calls(start_cluster):
    start_cluster(num_cpus=1)
    ex = OrchestraExecutor(max_workers=1)
    running = ex.submit(sleep_then, 0.3)
    queued = [ex.submit(square, i) for i in range(5)]
    ex.shutdown(wait=True, cancel_futures=True)
    assert running.result() == 0.3 and all(f.cancelled() for f in queued)
