"""Ray Core names beside tasks and actors, on a real local cluster: implicit init, the
grace pending tasks get at exit, exit_actor(), @orchestra.method(num_returns=), the
runtime context, ObjectRef.future() and ``await ref``, wait(fetch_local=) and
cancel(recursive=).

Implicit init and the exit grace need a fresh interpreter: they run as scripts.
"""
from __future__ import annotations

import asyncio
import concurrent.futures
import os
import subprocess
import sys
import textwrap
import time
from pathlib import Path
from typing import Any

import pytest

import _helpers as h
import orchestra
from _probes import wait_until
from orchestra.exceptions import ActorDiedError, ObjectLostError, TaskCancelledError

pytestmark = pytest.mark.timeout(90)

T = 30
REPO_ROOT = Path(__file__).resolve().parents[2]


def run_script(code: str, timeout: float = 60, **env: str) -> subprocess.CompletedProcess[str]:
    """Run ``code`` in a fresh interpreter (this checkout's orchestra); fails on error."""
    environ = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO_ROOT), str(Path(__file__).parent)]),
               **env}
    r = subprocess.run([sys.executable, "-c", textwrap.dedent(code)], capture_output=True,
                       text=True, timeout=timeout, env=environ)
    assert r.returncode == 0, f"the script failed:\n{r.stdout}\n{r.stderr}"
    return r


# ------------------------------------------------------------------ implicit init

def test_the_first_remote_call_before_init_starts_a_local_cluster_and_says_so() -> None:
    r = run_script("""
        import orchestra
        @orchestra.remote
        def f(x):
            return x + 1
        assert not orchestra.is_initialized()
        print(orchestra.get(f.remote(1)))
        assert orchestra.is_initialized()
    """)
    assert r.stdout.strip() == "2"
    assert r.stderr.count("starting a local cluster") == 1, r.stderr


@pytest.mark.parametrize("first", ["orchestra.put(1)", "A.remote()", "orchestra.wait([orchestra.put(1)])",
                                   "orchestra.cluster_resources()"])
def test_put_actor_wait_and_queries_start_the_cluster_too(first: str) -> None:
    run_script(f"""
        import orchestra
        @orchestra.remote
        class A:
            pass
        {first}
        assert orchestra.is_initialized()
    """)


def test_init_after_an_implicit_start_says_it_was_already_called() -> None:
    run_script("""
        import orchestra
        orchestra.put(1)
        try:
            orchestra.init()
        except RuntimeError as exc:
            assert "already called" in str(exc)
        else:
            raise AssertionError("init() twice passed")
        orchestra.init(ignore_reinit_error=True)
    """)


# ------------------------------------------------------------------ exit grace

GRACE_SCRIPT = """
    import sys, time, orchestra
    orchestra.init(num_cpus=2{grace})
    @orchestra.remote
    def mark(path, s):
        time.sleep(s)
        open(path, "w").close()
    for i in range(3):
        mark.remote(f"{tmp}/done-{{i}}", {sleep})
    print(time.monotonic(), flush=True)
"""


def test_tasks_submitted_when_the_script_ends_still_run(tmp_path: Path) -> None:
    run_script(GRACE_SCRIPT.format(grace="", tmp=tmp_path, sleep=0.5))
    assert sorted(os.listdir(tmp_path)) == ["done-0", "done-1", "done-2"]


def test_actor_calls_made_when_the_script_ends_still_run(tmp_path: Path) -> None:
    run_script(f"""
        import time, orchestra
        orchestra.init(num_cpus=1)
        @orchestra.remote
        class Writer:
            def write(self, path):
                time.sleep(0.2)
                open(path, "w").close()
        w = Writer.remote()
        orchestra.get(w.write.remote("{tmp_path}/first"))   # later calls go straight to it
        for i in range(3):
            w.write.remote(f"{tmp_path}/call-{{i}}")
    """)
    assert sorted(os.listdir(tmp_path)) == ["call-0", "call-1", "call-2", "first"]


def test_the_exit_grace_is_bounded_and_says_what_it_left(tmp_path: Path) -> None:
    t = time.monotonic()
    r = run_script(GRACE_SCRIPT.format(grace=", exit_grace_s=0.5", tmp=tmp_path, sleep=30))
    assert time.monotonic() - t < 20
    assert "still pending" in r.stderr and "exit_grace_s" in r.stderr
    assert "stopping the cluster" in r.stderr   # it started the cluster: it stops it
    assert os.listdir(tmp_path) == []


def test_the_exit_grace_comes_from_the_environment_too(tmp_path: Path) -> None:
    r = run_script(GRACE_SCRIPT.format(grace="", tmp=tmp_path, sleep=30),
                   ORCHESTRA_EXIT_GRACE_S="0.3")
    assert "still pending 0.3 s" in r.stderr


def test_an_exit_with_nothing_pending_does_not_wait() -> None:
    r = run_script("""
        import time, orchestra
        orchestra.init(num_cpus=1, exit_grace_s=30)
        orchestra.get(orchestra.put(1))
    """)
    assert "waiting" not in r.stderr and "pending" not in r.stderr


@pytest.mark.parametrize("bad", [-1, float("nan"), "5"])
def test_a_bad_exit_grace_is_refused(bad: Any) -> None:
    with pytest.raises(ValueError, match="exit_grace_s"):
        orchestra.init(exit_grace_s=bad)
    assert not orchestra.is_initialized()


# ------------------------------------------------------------------ exit_actor

@orchestra.remote(max_restarts=3)
class Leaver:
    def ping(self) -> str:
        return "pong"

    def leave(self) -> str:
        orchestra.actor.exit_actor()
        return "not reached"

    def swallow_and_leave(self) -> str:
        try:
            orchestra.actor.exit_actor()
        except Exception:   # exit_actor is not an Exception: this does not stop it
            return "swallowed"
        return "not reached"


@orchestra.remote
class AsyncLeaver:
    async def ping(self) -> str:
        return "pong"

    async def leave(self) -> None:
        await asyncio.sleep(0)
        orchestra.actor.exit_actor()


@orchestra.remote(max_concurrency=4)
class ThreadedLeaver:
    def ping(self) -> str:
        return "pong"

    def leave(self) -> None:
        orchestra.actor.exit_actor()


@pytest.mark.parametrize("cls", [Leaver, AsyncLeaver, ThreadedLeaver],
                         ids=["sync", "async", "threaded"])
def test_exit_actor_ends_the_actor_and_later_calls_say_it_exited_on_purpose(
        cluster: Any, cls: Any) -> None:
    a = cls.remote()
    assert orchestra.get(a.ping.remote(), timeout=T) == "pong"
    with pytest.raises(ActorDiedError, match="exit_actor"):
        orchestra.get(a.leave.remote(), timeout=T)
    with pytest.raises(ActorDiedError, match=r"exited on purpose: exit_actor\(\) was called"):
        orchestra.get(a.ping.remote(), timeout=T)


def test_an_actor_that_exits_is_not_restarted_despite_max_restarts(cluster: Any) -> None:
    a = Leaver.remote()
    with pytest.raises(ActorDiedError):
        orchestra.get(a.swallow_and_leave.remote(), timeout=T)
    time.sleep(0.5)   # a restart, were there one, would have begun
    for _ in range(3):
        with pytest.raises(ActorDiedError, match="exited on purpose"):
            orchestra.get(a.ping.remote(), timeout=T)


def test_exit_actor_outside_an_actor_is_a_clear_error(cluster: Any) -> None:
    with pytest.raises(TypeError, match="outside an actor"):
        orchestra.actor.exit_actor()

    @orchestra.remote
    def in_a_task() -> None:
        orchestra.actor.exit_actor()
    with pytest.raises(TypeError, match="outside an actor"):
        orchestra.get(in_a_task.remote(), timeout=T)


# ------------------------------------------------------------------ @orchestra.method

@orchestra.remote
class Splitter:
    @orchestra.method(num_returns=2)
    def pair(self, x: int) -> tuple[int, int]:
        return x, -x

    @orchestra.method(num_returns=0)
    def nothing(self) -> None:
        return None

    def one(self) -> tuple[int, int]:
        return 1, 2


def test_method_num_returns_gives_that_many_refs(cluster: Any) -> None:
    s = Splitter.remote()
    a, b = s.pair.remote(3)
    assert orchestra.get([a, b], timeout=T) == [3, -3]
    assert s.nothing.remote() is None
    assert orchestra.get(s.one.remote(), timeout=T) == (1, 2)
    # options() still overrides the decorator, as in Ray.
    assert orchestra.get(s.pair.options(num_returns=1).remote(1), timeout=T) == (1, -1)


def test_method_num_returns_holds_for_handles_passed_to_tasks(cluster: Any) -> None:
    @orchestra.remote
    def call_pair(handle: Any) -> list[int]:
        return orchestra.get(list(handle.pair.remote(5)))
    assert orchestra.get(call_pair.remote(Splitter.remote()), timeout=T) == [5, -5]


@pytest.mark.parametrize("args,kwargs,err", [
    ((), {"num_returns": -1}, ValueError), ((), {"num_returns": "2"}, ValueError),
    ((), {"concurrency_group": "io"}, TypeError), ((2,), {}, TypeError)])
def test_method_refuses_bad_options(args: Any, kwargs: Any, err: type[Exception]) -> None:
    with pytest.raises(err, match="num_returns"):
        orchestra.method(*args, **kwargs)


# ------------------------------------------------------------------ runtime context

@orchestra.remote
def task_context() -> dict[str, Any]:
    c = orchestra.get_runtime_context()
    return {"job": c.get_job_id(), "task": c.get_task_id(), "actor": c.get_actor_id(),
            "node": c.get_node_id(), "worker": c.get_worker_id(), "namespace": c.namespace,
            "resources": c.get_assigned_resources(),
            "reconstructed": c.was_current_actor_reconstructed()}


@orchestra.remote(num_cpus=0)
class ContextActor:
    def __init__(self) -> None:
        self.in_init = orchestra.get_runtime_context().get_actor_id()

    def context(self) -> dict[str, Any]:
        return {**orchestra.get(task_context.options(num_cpus=1).remote()),
                "own": orchestra.get_runtime_context().get_actor_id(), "init": self.in_init,
                "reconstructed": orchestra.get_runtime_context().was_current_actor_reconstructed()}

    def die(self) -> None:
        os._exit(1)


def test_runtime_context_in_a_task(cluster: Any) -> None:
    driver = orchestra.get_runtime_context()
    ref = task_context.remote()
    c = orchestra.get(ref, timeout=T)
    assert c["job"] == driver.get_job_id()
    assert c["task"] == ref.hex()[:len(c["task"])] and c["task"] != driver.get_task_id()
    assert c["actor"] is None and c["reconstructed"] is False
    assert c["node"] == driver.get_node_id()
    assert c["worker"] != driver.get_worker_id()
    assert c["namespace"] == driver.namespace
    assert c["resources"] == {"CPU": 1.0}


def test_runtime_context_in_a_driver(cluster: Any) -> None:
    c = orchestra.get_runtime_context()
    assert c.get_task_id() is None and c.get_actor_id() is None
    assert c.get_assigned_resources() == {}
    assert len(c.namespace) == 36   # an anonymous namespace: a uuid, as in Ray


def test_runtime_context_in_an_actor_and_after_its_restart(cluster: Any) -> None:
    a = ContextActor.options(max_restarts=1).remote()
    c = orchestra.get(a.context.remote(), timeout=T)
    assert c["own"] == c["init"] == a._actor_id.hex()
    assert c["reconstructed"] is False
    a.die.remote()
    seen: list[dict[str, Any]] = []

    def restarted() -> bool:
        try:
            seen.append(orchestra.get(a.context.remote(), timeout=T))
        except ActorDiedError:   # a call in flight when the process died
            return False
        return True
    wait_until(restarted, 20, "the actor restarted")
    assert seen[-1]["reconstructed"] is True


# ------------------------------------------------------------------ futures and await

def test_future_resolves_with_the_value_or_the_error(cluster: Any) -> None:
    fut = h.identity.remote(7).future()
    assert isinstance(fut, concurrent.futures.Future)
    assert fut.result(timeout=T) == 7
    bad = h.raise_value_error.remote("boom").future()
    with pytest.raises(ValueError, match="boom"):
        bad.result(timeout=T)


def test_many_futures_resolve_without_a_thread_each(cluster: Any, tmp_path: Path) -> None:
    gate = h.Gate(tmp_path)
    refs = [h.gated.remote(gate, i) for i in range(50)]
    before = len(__import__("threading").enumerate())
    futs = [r.future() for r in refs]
    assert len(__import__("threading").enumerate()) <= before + 1
    assert not any(f.done() for f in futs)
    gate.open()
    assert [f.result(timeout=T) for f in futs] == list(range(50))


def test_future_of_a_ref_from_a_shut_down_session_is_refused(start_cluster: Any) -> None:
    start_cluster(num_cpus=1)
    ref = orchestra.put(1)
    orchestra.shutdown()
    with pytest.raises(ObjectLostError, match="shut down"):
        ref.future()
    assert not orchestra.is_initialized()   # no cluster started for it


def test_await_ref_in_async_code(cluster: Any) -> None:
    async def main() -> list[Any]:
        return list(await asyncio.gather(*[h.identity.remote(i) for i in range(20)]))
    assert asyncio.run(main()) == list(range(20))


def test_await_ref_in_an_async_actor(cluster: Any) -> None:
    @orchestra.remote
    class Awaiter:
        async def double(self, ref_list: list[Any]) -> int:
            return 2 * await ref_list[0]
    assert orchestra.get(Awaiter.remote().double.remote([h.identity.remote(21)]), timeout=T) == 42


def test_wait_accepts_fetch_local(cluster: Any) -> None:
    refs = [h.identity.remote(i) for i in range(3)]
    ready, rest = orchestra.wait(refs, num_returns=3, timeout=T, fetch_local=False)
    assert ready == refs and rest == []
    with pytest.raises(TypeError, match="fetch_local"):
        orchestra.wait(refs, fetch_local="yes")   # type: ignore[arg-type]


# ------------------------------------------------------------------ cancel(recursive=)

@orchestra.remote(max_retries=0)
def parent_of_gated(gate: h.Gate) -> Any:
    child = h.gated.options(max_retries=0).remote(gate, "child")
    return orchestra.get(child)


def _gated_tasks() -> int:
    return sum(1 for t in orchestra._api.session.debug_info().task if t.name.endswith("gated"))


def test_cancel_is_recursive_by_default(cluster: Any, tmp_path: Path) -> None:
    gate = h.Gate(tmp_path)
    ref = parent_of_gated.remote(gate)
    gate.wait_started()
    orchestra.cancel(ref)
    with pytest.raises(TaskCancelledError):
        orchestra.get(ref, timeout=T)
    wait_until(lambda: _gated_tasks() == 0, 20, "the child task cancelled too")


def test_cancel_not_recursive_leaves_the_children_running(cluster: Any, tmp_path: Path) -> None:
    gate = h.Gate(tmp_path)
    ref = parent_of_gated.remote(gate)
    gate.wait_started()
    try:
        orchestra.cancel(ref, recursive=False)
        with pytest.raises(TaskCancelledError):
            orchestra.get(ref, timeout=T)
        time.sleep(0.3)
        assert _gated_tasks() == 1
    finally:
        gate.open()
    wait_until(lambda: _gated_tasks() == 0, 20, "the child finished")


def test_cancel_still_refuses_what_is_not_a_ref(cluster: Any) -> None:
    with pytest.raises(TypeError, match="ObjectRef"):
        orchestra.cancel("not a ref")   # type: ignore[arg-type]
