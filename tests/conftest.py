"""Fixtures: the shared cluster, and clusters of a test's own (probes: tests/_probes.py).

orchestra holds one session per process. ``cluster`` hands out one shared cluster
(started on first use, kept while consecutive tests ask for it: init costs ~0.3 s); it
is stopped before any test that does not ask for it. ``start_cluster`` starts one with
the test's own arguments, for tests that kill processes or need special init arguments.
Every cluster is shut down in teardown.
"""
from __future__ import annotations

import os
from collections.abc import Callable, Iterator
from typing import Any

import pytest

import orchestra
from _probes import Cluster
from orchestra._runtime import context as _context


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption("--none-ok", action="store_true",
                     help="exit 0 when no test is selected (tox runs the tests marked alone "
                          "as a second pass: a run of files with none of them is fine)")


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    if exitstatus == pytest.ExitCode.NO_TESTS_COLLECTED and session.config.getoption("none_ok"):
        session.exitstatus = pytest.ExitCode.OK


SHARED_INIT: dict[str, Any] = {
    "num_cpus": 2, "num_gpus": 2, "resources": {"widget": 1},
    "object_store_memory": 512 << 20,
}


class _Shared:
    cluster: Cluster | None = None
    client: Any = None      # the shared cluster's driver client
    gates: list[Any] = []   # opened at teardown, so no gated task outlives its test


def _open_gates() -> None:
    gates, _Shared.gates = _Shared.gates, []
    for g in gates:
        g.open()


def _stop_shared() -> None:
    """Shut the shared cluster down, unless a module's own cluster replaced it already
    (a module-scoped fixture is set up before this runs for its first test: shutting
    down then stopped that fixture's cluster instead)."""
    if _Shared.cluster is not None:
        _Shared.cluster = None
        if _context.client_or_none() is _Shared.client:
            orchestra.shutdown()


@pytest.fixture(autouse=True)
def _shared_cluster_only_where_asked(request: pytest.FixtureRequest) -> None:
    """Stop the shared cluster before a test that does not ask for it: such a test may
    call orchestra.init() itself, and a session per process is all there is."""
    if "cluster" not in request.fixturenames:
        _stop_shared()


@pytest.fixture
def cluster() -> Iterator[Cluster]:
    """The shared cluster: num_cpus=2, num_gpus=2 (ids only), resources widget=1."""
    if _Shared.cluster is None:
        if orchestra.is_initialized():  # a test's own cluster left running: never reuse it
            orchestra.shutdown()
        c = Cluster(orchestra.init(**SHARED_INIT))
        _Shared.cluster, _Shared.client = c, _context.client_or_none()
        # The pool starts with init; waiting for it keeps tests that expect two tasks
        # to run side by side from pipelining both onto the first worker.
        c.wait_idle_workers(SHARED_INIT["num_cpus"])
    c = _Shared.cluster
    yield c
    _open_gates()
    try:
        c.wait_quiescent()
    except BaseException:
        _stop_shared()  # the next test gets a fresh cluster, not this one's leftovers
        raise


@pytest.fixture
def start_cluster() -> Iterator[Callable[..., Cluster]]:
    """Start a cluster of the test's own: ``start_cluster(num_cpus=1, ...)``."""
    _stop_shared()
    orchestra.shutdown()   # a session some other test left behind

    def start(**init_args: Any) -> Cluster:
        c = Cluster(orchestra.init(**init_args))
        num_workers = max(int(init_args.get("num_cpus") or os.cpu_count() or 1), 1)
        c.wait_idle_workers(num_workers)
        return c

    yield start
    _open_gates()
    orchestra.shutdown()


@pytest.fixture
def gates(tmp_path: Any) -> Iterator[Callable[[str], Any]]:
    """``gates("name")``: a Gate in the test's tmp_path, opened at teardown."""
    from _helpers import Gate  # tests/integration is on sys.path once its tests are collected

    def make(name: str = "gate") -> Any:
        g = Gate(tmp_path, name)
        _Shared.gates.append(g)
        return g

    yield make
    _open_gates()


@pytest.fixture
def no_cluster() -> Iterator[None]:
    """No session in this process."""
    _stop_shared()
    if orchestra.is_initialized():
        orchestra.shutdown()
    yield
    orchestra.shutdown()


@pytest.fixture(scope="session", autouse=True)
def _shutdown_at_end() -> Iterator[None]:
    yield
    _Shared.cluster = None
    orchestra.shutdown()
