"""Options beside placement: memory=, max_calls=, runtime_env=, namespaces (init and
actor options, get_actor(namespace=)), get_if_exists=, max_task_retries=, and
lifetime="detached" (a second driver process reaching the actor after the first exited,
on a cluster of its own started as `orchestra start --head` does)."""
from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

import pytest

import _helpers as h
import orchestra
from orchestra.exceptions import ActorDiedError, InfeasibleResourcesError

pytestmark = pytest.mark.timeout(120)

T = 30


@orchestra.remote
def pid() -> int:
    return os.getpid()


@orchestra.remote
def env_of(name: str) -> str | None:
    return os.environ.get(name)


@orchestra.remote
def cwd_and_import(module: str) -> tuple[str, str]:
    import importlib
    return os.getcwd(), importlib.import_module(module).VALUE


@orchestra.remote
class Counter:
    def __init__(self) -> None:
        self.n = 0

    def inc(self) -> int:
        self.n += 1
        return self.n

    def env(self, name: str) -> str | None:
        return os.environ.get(name)


@orchestra.remote(max_restarts=1)
class Fragile:
    """Its process dies in the first call of ``crash_once`` (a marker file says it did)."""

    def ping(self) -> str:
        return "pong"

    def crash_once(self, marker: str) -> str:
        if not os.path.exists(marker):
            h.touch(marker)
            os._exit(1)
        return "survived"


# ------------------------------------------------------------------ memory=

def test_a_task_holding_memory_runs_and_gives_it_back(cluster):
    total = orchestra.cluster_resources()["memory"]
    assert orchestra.get(h.add.options(memory=1 << 20).remote(1, 1), timeout=T) == 2
    assert orchestra.available_resources()["memory"] == total


def test_more_memory_than_a_node_has_is_refused(cluster):
    with pytest.raises(InfeasibleResourcesError, match="memory"):
        h.add.options(memory=1 << 60).remote(1, 1)


def test_memory_in_resources_is_refused_naming_the_option(cluster):
    with pytest.raises(ValueError, match="memory="):
        h.add.options(resources={"memory": 1}).remote(1, 1)


# ------------------------------------------------------------------ max_calls=

def test_max_calls_replaces_the_worker_after_that_many_calls(cluster):
    once = pid.options(max_calls=1)
    pids = [orchestra.get(once.remote(), timeout=T) for _ in range(4)]
    assert len(set(pids)) == 4
    assert orchestra.get(h.add.remote(2, 2), timeout=T) == 4   # the pool is whole


@pytest.mark.parametrize("bad", [-1, 1.5, True])
def test_a_bad_max_calls_is_refused(cluster, bad):
    with pytest.raises(ValueError, match="max_calls"):
        pid.options(max_calls=bad)


# ------------------------------------------------------------------ runtime_env=

def test_env_vars_are_set_for_the_task_only(cluster):
    with_env = env_of.options(runtime_env={"env_vars": {"ORCH_T": "yes"}})
    assert orchestra.get(with_env.remote("ORCH_T"), timeout=T) == "yes"
    assert orchestra.get([env_of.remote("ORCH_T") for _ in range(4)], timeout=T) == [None] * 4


def test_working_dir_is_the_task_s_cwd_and_importable(cluster, tmp_path):
    (tmp_path / "wd_module.py").write_text("VALUE = 'from working_dir'\n")
    f = cwd_and_import.options(runtime_env={"working_dir": str(tmp_path)})
    assert orchestra.get(f.remote("wd_module"), timeout=T) == (str(tmp_path), "from working_dir")


def test_py_modules_are_importable(cluster, tmp_path):
    pkg = tmp_path / "lib" / "orch_pkg"
    pkg.mkdir(parents=True)
    (pkg / "__init__.py").write_text("VALUE = 'from py_modules'\n")
    f = cwd_and_import.options(runtime_env={"py_modules": [str(pkg)]})
    assert orchestra.get(f.remote("orch_pkg"), timeout=T)[1] == "from py_modules"


def test_an_actor_keeps_its_runtime_env_for_life(cluster):
    a = Counter.options(runtime_env={"env_vars": {"ORCH_A": "actor"}}).remote()
    assert orchestra.get([a.env.remote("ORCH_A") for _ in range(3)], timeout=T) == ["actor"] * 3


@pytest.mark.parametrize("env, match", [
    ({"pip": ["requests"]}, "'pip'"),
    ({"conda": "env"}, "'conda'"),
    ({"container": {"image": "x"}}, "'container'"),
    ({"excludes": ["*.log"]}, "'excludes' is not supported"),
    ({"working_dir": "https://example.com/code.zip"}, "URL"),
    ({"py_modules": ["s3://bucket/mod"]}, "URL"),
    ({"working_dir": "/no/such/directory"}, "does not exist"),
])
def test_runtime_env_that_would_download_or_is_unknown_is_refused_at_once(cluster, env, match):
    with pytest.raises(ValueError, match=match):
        env_of.options(runtime_env=env)
    with pytest.raises(ValueError, match=match):
        Counter.options(runtime_env=env)


def test_init_s_runtime_env_reaches_every_task(start_cluster, tmp_path):
    with pytest.raises(ValueError, match="'pip'"):
        orchestra.init(num_cpus=1, runtime_env={"pip": ["x"]})
    start_cluster(num_cpus=1, runtime_env={"env_vars": {"ORCH_JOB": "job", "ORCH_BOTH": "job"}})
    assert orchestra.get(env_of.remote("ORCH_JOB"), timeout=T) == "job"
    merged = env_of.options(runtime_env={"env_vars": {"ORCH_BOTH": "task"}})
    assert orchestra.get(merged.remote("ORCH_BOTH"), timeout=T) == "task"
    assert orchestra.get(merged.remote("ORCH_JOB"), timeout=T) == "job"


@orchestra.remote
def hooked() -> tuple[int, object]:
    return os.getpid(), getattr(sys, "_orch_hooked", None)


@orchestra.remote
class HookedActor:
    def seen(self) -> tuple[int, object]:
        return os.getpid(), getattr(sys, "_orch_hooked", None)


def test_worker_process_setup_hook_runs_once_in_each_worker_before_its_first_task(
        start_cluster, tmp_path):
    log = tmp_path / "hook.log"

    def setup() -> None:   # as a user sets up logging: once per process, before any task
        with open(log, "a") as f:
            f.write(f"{os.getpid()}\n")
        sys._orch_hooked = os.getpid()  # type: ignore[attr-defined]

    start_cluster(num_cpus=2, runtime_env={"worker_process_setup_hook": setup})
    seen = orchestra.get([hooked.remote() for _ in range(40)], timeout=T)
    actor = HookedActor.remote()
    seen += orchestra.get([actor.seen.remote() for _ in range(3)], timeout=T)
    assert all(p == hooked_in for p, hooked_in in seen), seen   # before the first task
    ran = log.read_text().split()
    assert sorted(ran) == sorted(set(ran)), ran                 # once in each process
    assert {str(p) for p, _ in seen} <= set(ran)


def test_a_setup_hook_by_name_that_raises_fails_the_tasks_with_its_error(start_cluster, tmp_path):
    (tmp_path / "orch_hooks.py").write_text(
        "def broken():\n    raise ValueError('the hook broke')\n"
        "def fine():\n    import sys\n    sys._orch_hooked = 'by name'\n")
    with pytest.raises(ValueError, match="module.function"):
        env_of.options(runtime_env={"worker_process_setup_hook": "nodots"})
    with pytest.raises(TypeError, match="callable"):
        env_of.options(runtime_env={"worker_process_setup_hook": 3})
    start_cluster(num_cpus=1, runtime_env={"worker_process_setup_hook": "orch_hooks.broken",
                                           "py_modules": [str(tmp_path / "orch_hooks.py")]})
    for _ in range(2):   # every task of the job, not only the first
        with pytest.raises(orchestra.exceptions.TaskError, match="the hook broke") as err:
            orchestra.get(hooked.remote(), timeout=T)
        assert isinstance(err.value, ValueError)
    fixed = hooked.options(runtime_env={"worker_process_setup_hook": "orch_hooks.fine"})
    assert orchestra.get(fixed.remote(), timeout=T)[1] == "by name"


# ------------------------------------------------------------------ namespaces, get_if_exists

def test_names_are_per_namespace(cluster):
    a = Counter.options(name="shared", namespace="ns-a").remote()
    b = Counter.options(name="shared", namespace="ns-b").remote()
    orchestra.get([a.inc.remote(), a.inc.remote(), b.inc.remote()], timeout=T)
    assert orchestra.get(orchestra.get_actor("shared", namespace="ns-a").inc.remote(), timeout=T) == 3
    assert orchestra.get(orchestra.get_actor("shared", namespace="ns-b").inc.remote(), timeout=T) == 2
    with pytest.raises(ValueError, match="namespace"):
        orchestra.get_actor("shared")   # this driver's own (anonymous) namespace has none
    orchestra.kill(a)
    orchestra.kill(b)


def test_get_if_exists_returns_the_live_actor(cluster):
    first = Counter.options(name="once", get_if_exists=True).remote()
    again = Counter.options(name="once", get_if_exists=True).remote()
    assert first == again
    orchestra.get(first.inc.remote(), timeout=T)
    assert orchestra.get(again.inc.remote(), timeout=T) == 2
    with pytest.raises(ValueError, match="already taken"):
        Counter.options(name="once").remote()
    orchestra.kill(first)


def test_get_if_exists_needs_a_name(cluster):
    with pytest.raises(ValueError, match="needs name="):
        Counter.options(get_if_exists=True)


def test_init_namespace_is_where_names_live(start_cluster):
    start_cluster(num_cpus=1, namespace="team")
    c = Counter.options(name="c").remote()
    assert orchestra.get_actor("c", namespace="team") == c
    assert orchestra.get_actor("c") == c


# ------------------------------------------------------------------ max_task_retries=

@pytest.mark.parametrize("warm", [False, True], ids=["through-head", "direct"])
def test_a_call_in_flight_when_the_actor_dies_is_retried_on_the_restarted_actor(cluster, tmp_path, warm):
    a = Fragile.options(max_task_retries=1).remote()
    if warm:   # later calls go straight to the actor's process
        assert orchestra.get(a.ping.remote(), timeout=T) == "pong"
    assert orchestra.get(a.crash_once.remote(str(tmp_path / "m")), timeout=T) == "survived"


def test_without_max_task_retries_the_call_in_flight_fails(cluster, tmp_path):
    a = Fragile.remote()
    with pytest.raises(ActorDiedError):
        orchestra.get(a.crash_once.remote(str(tmp_path / "m")), timeout=T)
    assert orchestra.get(a.ping.remote(), timeout=T) == "pong"   # restarted


# ------------------------------------------------------------------ lifetime="detached"

_SECOND_DRIVER = """
import sys, orchestra
orchestra.init(address=sys.argv[1], namespace="apart")

@orchestra.remote
class Keeper:
    def ping(self):
        return "still here"

k = Keeper.options(name="keeper", lifetime="detached").remote()
print(orchestra.get(k.ping.remote(), timeout=30))
"""


def test_a_detached_actor_on_a_private_cluster_outlives_the_driver_that_made_it(cluster, caplog):
    # As in Ray: accepted on a cluster init() started (said once), and the actor lives
    # on after its creator, a second driver of this cluster, exits.
    import logging
    import subprocess
    import sys
    with caplog.at_level(logging.WARNING, logger="orchestra"):
        mine = Counter.options(name="d", lifetime="detached").remote()
        Counter.options(name="d2", lifetime="detached").remote()
    said = [r for r in caplog.records if "detached actor" in r.getMessage()]
    assert len(said) <= 1 and all("stops when the driver" in r.getMessage() for r in said)
    r = subprocess.run([sys.executable, "-c", _SECOND_DRIVER, cluster.session_dir],
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 0 and r.stdout.strip() == "still here", r.stderr
    keeper = orchestra.get_actor("keeper", namespace="apart")
    assert orchestra.get(keeper.ping.remote(), timeout=T) == "still here"
    for a in (keeper, mine, orchestra.get_actor("d2")):
        orchestra.kill(a)


def test_detached_needs_a_name(cluster):
    with pytest.raises(ValueError, match="needs name="):
        Counter.options(lifetime="detached")


_DRIVER = """
import json, os, sys, orchestra
from orchestra.util import get_placement_group, placement_group, remove_placement_group
orchestra.init(address=os.environ["ORCH_ADDRESS"], token=os.environ["ORCH_TOKEN"],
               namespace="svc")

@orchestra.remote
class Counter:
    def __init__(self):
        self.n = 0
    def inc(self):
        self.n += 1
        return self.n
"""


def _driver(c, code: str) -> object:
    """Run a driver process connected to cluster ``c``; what it printed last, as JSON."""
    env = {**os.environ, "ORCH_ADDRESS": c.address, "ORCH_TOKEN": c.token,
           "PYTHONPATH": os.pathsep.join(sys.path)}
    r = subprocess.run([sys.executable, "-c", _DRIVER + textwrap.dedent(code)], env=env,
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    return json.loads(r.stdout.strip().splitlines()[-1])


def test_detached_actors_and_groups_outlive_their_driver_and_plain_ones_do_not(tmp_path):
    from orchestra.cluster_utils import Cluster
    if orchestra.is_initialized():
        orchestra.shutdown()
    c = Cluster(initialize_head=True, head_node_args={"num_cpus": 1})
    try:
        assert _driver(c, """
            d = Counter.options(name="kept", lifetime="detached").remote()
            p = Counter.options(name="plain").remote()
            kept = placement_group([{"CPU": 0.5}], name="kept-pg", lifetime="detached")
            placement_group([{"CPU": 0.25}], name="plain-pg")
            assert kept.wait(30)
            print(json.dumps(orchestra.get([d.inc.remote(), p.inc.remote()])))
        """) == [1, 1]
        assert _driver(c, """
            d = orchestra.get_actor("kept")        # this driver's namespace is "svc" too
            try:
                orchestra.get_actor("plain")
                plain = "alive"
            except ValueError:
                plain = "gone"
            try:
                get_placement_group("plain-pg")
                plain_pg = "alive"
            except ValueError:
                plain_pg = "gone"
            kept = get_placement_group("kept-pg")
            assert kept.wait(30)
            remove_placement_group(kept)
            print(json.dumps([orchestra.get(d.inc.remote()), plain, plain_pg]))
        """) == [2, "gone", "gone"]
        assert _driver(c, """
            orchestra.kill(orchestra.get_actor("kept", namespace="svc"))
            try:
                orchestra.get_actor("kept")
                print(json.dumps("alive"))
            except ValueError:
                print(json.dumps("gone"))
        """) == "gone"
    finally:
        c.shutdown()
