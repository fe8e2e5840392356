"""The libraries users combine with orchestra, for real, on a local cluster: joblib's
backend "orchestra" under scikit-learn's GridSearchCV, Dask graphs (dask.array,
dask.dataframe, dask.delayed) on orchestra_dask_get, and the Ray names of both (and of
the Pool) under ``orchestra run --ray``."""
from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import time

import numpy as np
import pytest

import orchestra
from orchestra.util import state

pytestmark = pytest.mark.timeout(120)

T = 60


def _pid_scorer(estimator: object, X: object, y: object) -> float:
    return float(os.getpid())


def test_grid_search_on_the_orchestra_backend_equals_the_serial_one(start_cluster):
    joblib = pytest.importorskip("joblib")
    pytest.importorskip("sklearn")
    from sklearn.datasets import make_classification
    from sklearn.model_selection import GridSearchCV
    from sklearn.svm import SVC

    from orchestra.util.joblib import register_orchestra
    start_cluster(num_cpus=2)
    register_orchestra()
    X, y = make_classification(n_samples=600, n_features=400, random_state=0)   # 1.9 MB
    grid = {"C": [0.1, 1.0, 10.0], "gamma": ["scale", 0.01]}
    scoring = {"acc": "accuracy", "pid": _pid_scorer}
    serial = GridSearchCV(SVC(), grid, cv=3, scoring=scoring, refit="acc").fit(X, y)
    with joblib.parallel_backend("orchestra"):
        par = GridSearchCV(SVC(), grid, cv=3, n_jobs=-1, scoring=scoring, refit="acc").fit(X, y)
        backend, n_jobs = joblib.parallel.get_active_backend()
    np.testing.assert_allclose(par.cv_results_["mean_test_acc"], serial.cv_results_["mean_test_acc"])
    assert par.best_params_ == serial.best_params_
    pids = {int(p) for k in par.cv_results_ if k.startswith("split") and k.endswith("_test_pid")
            for p in par.cv_results_[k]}
    assert os.getpid() not in pids and pids   # the fits ran in the cluster's processes
    assert backend.shipped.puts == 1   # X was put once, not pickled into every batch


def test_large_arrays_reach_joblib_calls_through_the_store_once(start_cluster):
    joblib = pytest.importorskip("joblib")
    from orchestra.util.joblib import register_orchestra
    start_cluster(num_cpus=2)
    register_orchestra()
    big = np.arange(1 << 20, dtype=np.float64)   # 8 MiB
    with joblib.parallel_config(backend="orchestra", n_jobs=2):
        sums = joblib.Parallel()(joblib.delayed(np.sum)(big[:0] if i < 0 else big) for i in range(40))
        backend, _ = joblib.parallel.get_active_backend()
    assert sums == [big.sum()] * 40 and backend.shipped.puts == 1


def _busy(seconds: float) -> tuple[int, float, float]:
    import time
    start = time.time()
    time.sleep(seconds)
    return os.getpid(), start, time.time()


def _most_at_once(spans: list[tuple[int, float, float]]) -> int:
    edges = sorted([(s, 1) for _, s, _ in spans] + [(e, -1) for _, _, e in spans])
    most = now = 0
    for _, step in edges:
        now += step
        most = max(most, now)
    return most


def _cpus_free(want: float, within_s: float = 5.0) -> bool:
    """The cluster's free CPUs come back to ``want`` within ``within_s``. A query gives
    back the driver's idle lent workers first, but not one whose queued tasks it is
    taking back from a slow one (LOAN_SLOW_S: the answer comes from that worker, not the
    head): that loan goes back when the answer is in, a moment later."""
    deadline = time.monotonic() + within_s
    while orchestra.available_resources().get("CPU") != want:
        if time.monotonic() > deadline:
            return False
        time.sleep(0.02)
    return True


def test_joblib_calls_run_on_the_clusters_workers_and_hold_no_cpu_between_calls(start_cluster):
    """As loky's reusable executor: a Parallel call starts no process (its batches are
    tasks on the cluster's workers, which the next call finds with what the last one
    imported), runs at most n_jobs batches at once, and holds no CPU once it returned
    (an idle pool of actors kept for the next call would have held them for good)."""
    joblib = pytest.importorskip("joblib")
    from orchestra.util.joblib import register_orchestra
    start_cluster(num_cpus=4)
    register_orchestra()
    workers = {w["pid"] for w in state.list_workers(limit=0) if w["worker_type"] == "WORKER"}
    assert len(workers) == 4
    with joblib.parallel_config(backend="orchestra", n_jobs=2):
        first = joblib.Parallel()(joblib.delayed(_busy)(0.15) for _ in range(8))
        assert _cpus_free(4)
        second = joblib.Parallel()(joblib.delayed(_busy)(0.15) for _ in range(8))
    assert {pid for pid, _, _ in first + second} <= workers   # no process started
    assert _most_at_once(first) <= 2 and _most_at_once(second) <= 2
    assert _cpus_free(4)


@pytest.fixture
def dask_cluster(start_cluster):
    pytest.importorskip("dask")
    start_cluster(num_cpus=2)


def _pid(_: object = None) -> int:
    return os.getpid()


def test_a_dask_array_graph_runs_as_orchestra_tasks(dask_cluster):
    import dask.array as da

    from orchestra.util.dask import orchestra_dask_get
    x = da.random.default_rng(0).random((1200, 1200), chunks=(300, 300))
    y = (x + x.T).mean(axis=0)
    np.testing.assert_allclose(y.compute(scheduler=orchestra_dask_get), y.compute(scheduler="sync"))
    names = {t["name"] for t in state.list_tasks(limit=10_000)}
    assert {"random", "mean_chunk"} <= names


def test_a_dask_dataframe_groupby_and_delayed_graphs_on_orchestra(dask_cluster):
    import dask
    import dask.dataframe as dd
    import pandas as pd

    from orchestra.util.dask import (
        disable_dask_on_orchestra,
        enable_dask_on_orchestra,
        orchestra_dask_get,
    )
    df = pd.DataFrame({"k": np.arange(20_000) % 7, "v": np.arange(20_000.0)})
    ddf = dd.from_pandas(df, npartitions=4)
    with enable_dask_on_orchestra():
        assert dask.config.get("scheduler") is orchestra_dask_get
        got = ddf.groupby("k").v.sum().compute()
    pd.testing.assert_series_equal(got.sort_index(), df.groupby("k").v.sum())
    disable_dask_on_orchestra()
    assert dask.config.get("scheduler", None) is None

    inc = dask.delayed(lambda v: v + 1, name="inc")
    pids = [dask.delayed(_pid)(i) for i in range(4)]
    total = dask.delayed(sum)([inc(1), inc(2)])
    out = dask.compute(total, pids, scheduler=orchestra_dask_get)
    assert out[0] == 5 and os.getpid() not in out[1]


_RAY_SCRIPT = textwrap.dedent('''
    import json, os
    import ray
    from ray.util.multiprocessing import Pool
    from ray.util.dask import ray_dask_get, enable_dask_on_ray
    from ray.util.joblib import register_ray
    import dask, joblib

    ray.init(num_cpus=2)
    with Pool(2) as pool:
        squares = pool.map(abs, [-1, -2, 3])
    register_ray()
    with joblib.parallel_backend("ray"):
        powers = joblib.Parallel(n_jobs=2)(joblib.delayed(pow)(2, i) for i in range(4))
    total = dask.delayed(sum)([1, 2, 3]).compute(scheduler=ray_dask_get)
    print(json.dumps([squares, powers, total]))
''')


def test_the_ray_names_of_the_pool_joblib_and_dask_run_on_orchestra(no_cluster, tmp_path):
    pytest.importorskip("joblib")
    pytest.importorskip("dask")
    script = tmp_path / "ray_ecosystem.py"
    script.write_text(_RAY_SCRIPT)
    r = subprocess.run([sys.executable, "-m", "orchestra", "run", "--ray", str(script)],
                       capture_output=True, text=True, timeout=T, cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    import json
    assert json.loads(r.stdout.strip().splitlines()[-1]) == [[1, 2, 3], [1, 2, 4, 8], 6]


def test_without_the_library_the_error_names_it(tmp_path):
    # joblib hidden: importing the backend says what to install.
    code = ("import sys; sys.modules['joblib'] = None\n"
            "try:\n    import orchestra.util.joblib\n"
            "except ImportError as e:\n    print(e)\n")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=30)
    assert "pip install joblib" in r.stdout, r.stdout + r.stderr
