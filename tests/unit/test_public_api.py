"""The public surface of orchestra, pinned: what ``import orchestra`` offers and what it does.

Changing the API means changing this file on purpose. Importing must have no side effects
(STYLE rule 7): no threads, no atexit hooks, no child processes, no environment, signal,
cwd or sys.path changes. Those are checked in a fresh interpreter, since this one has
already imported orchestra.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
import types
from pathlib import Path
from typing import Any

import pytest

import orchestra
from _probes import child_env
from orchestra import exceptions

pytestmark = pytest.mark.timeout(60)

REPO_ROOT = Path(__file__).resolve().parents[2]

DOCUMENTED_API = [
    "init", "shutdown", "is_initialized", "remote", "RemoteFunction", "get", "put", "wait",
    "as_completed", "cancel", "get_gpu_ids", "cluster_resources", "available_resources", "ObjectRef",
    "nodes", "get_runtime_context", "RuntimeContext", "exceptions", "ActorClass", "ActorHandle",
    "ObjectRefGenerator", "DynamicObjectRefGenerator",
    "get_actor", "kill", "method", "actor", "dag", "util",
    "gang", "Gang", "gang_context", "GangContext", "GangDevice", "GangError",
    "GangAbortedError", "GangTimeoutError", "GangMemberDiedError", "timeline",
]

DOCUMENTED_ERRORS = [
    "OrchestraError", "TaskError", "GetTimeoutError", "WorkerCrashedError",
    "TaskCancelledError", "ObjectLostError", "ObjectStoreFullError", "ObjectStoreError",
    "InfeasibleResourcesError", "ActorDiedError", "DeserializationError", "ClusterLostError",
    "AuthenticationError",
]


# ------------------------------------------------------------------ the names

def test_all_is_the_documented_api() -> None:
    assert sorted(orchestra.__all__) == sorted(DOCUMENTED_API)
    assert len(set(orchestra.__all__)) == len(orchestra.__all__), "a name is listed twice"


@pytest.mark.parametrize("name", DOCUMENTED_API)
def test_every_documented_name_is_importable(name: str) -> None:
    assert getattr(orchestra, name) is not None


def test_no_public_name_outside_all() -> None:
    # Submodules are skipped: importing orchestra.x anywhere binds `x` on the package.
    public = {n for n, v in vars(orchestra).items()
              if not n.startswith("_") and not isinstance(v, types.ModuleType)}
    assert public <= set(orchestra.__all__)


def test_exceptions_is_the_exceptions_module() -> None:
    assert orchestra.exceptions is exceptions
    assert exceptions.__name__ == "orchestra.exceptions"


@pytest.mark.parametrize("name", DOCUMENTED_ERRORS)
def test_documented_error_is_an_orchestra_error(name: str) -> None:
    cls = getattr(exceptions, name)
    assert name in exceptions.__all__
    assert issubclass(cls, exceptions.OrchestraError)
    assert issubclass(cls, Exception)


def test_get_timeout_error_is_a_builtin_timeout_error() -> None:
    assert issubclass(exceptions.GetTimeoutError, TimeoutError)


def test_exceptions_all_names_only_orchestra_errors() -> None:
    for name in exceptions.__all__:
        assert issubclass(getattr(exceptions, name), exceptions.OrchestraError), name


@pytest.mark.skipif(os.environ.get("ORCHESTRA_TEST_INSTALLED") != "1",
                    reason="only under tox, which installs the package (ORCHESTRA_TEST_INSTALLED=1)")
def test_tests_import_the_installed_package_not_the_source_tree() -> None:
    source = (REPO_ROOT / "orchestra").resolve()
    imported = Path(orchestra.__file__).resolve().parent
    assert imported != source, (
        f"orchestra was imported from the source tree {source}, not the installed package: run "
        "pytest from tests/ (as tox does), never with the repo root on sys.path or PYTHONPATH")


# ------------------------------------------------------------------ import side effects

_PROBE = textwrap.dedent("""
    import atexit, importlib, json, os, pkgutil, signal, sys, threading

    # Third-party libraries orchestra depends on may start native thread pools when
    # loaded (numpy's BLAS), or set the environment (joblib 1.6 sets KMP_INIT_AT_FORK,
    # and orchestra.util.joblib imports joblib): load them first so that only
    # orchestra's own effects show.
    for lib in ("numpy", "pyarrow", "joblib"):
        try:
            importlib.import_module(lib)
        except ImportError:
            pass

    registered = []
    _register = atexit.register
    def recording_register(fn, *args, **kwargs):
        registered.append(f"{getattr(fn, '__module__', '?')}.{getattr(fn, '__qualname__', fn)}")
        return _register(fn, *args, **kwargs)
    atexit.register = recording_register

    def os_threads():
        with open("/proc/self/status") as f:
            return int(f.read().split("Threads:")[1].split()[0])

    def children():
        out = []
        for tid in os.listdir("/proc/self/task"):
            with open(f"/proc/self/task/{tid}/children") as f:
                out += f.read().split()
        return sorted(out)

    def snapshot():
        return {
            "python threads": sorted(t.name for t in threading.enumerate()),
            "os threads": os_threads(),
            "child processes": children(),
            "environment": dict(os.environ),
            "signal handlers": {int(s): repr(signal.getsignal(s)) for s in signal.valid_signals()
                                if signal.getsignal(s) is not None},
            "cwd": os.getcwd(),
            "sys.path": list(sys.path),
        }

    before = snapshot()
    import orchestra
    if sys.argv[1] == "every-module":
        for m in pkgutil.walk_packages(orchestra.__path__, "orchestra."):
            importlib.import_module(m.name)
    after = snapshot()
    after["atexit hooks"] = [r for r in registered if r.startswith("orchestra")]
    before["atexit hooks"] = []
    print(json.dumps({k: [before[k], after[k]] for k in after}))
""")

SIDE_EFFECTS = ["python threads", "os threads", "child processes", "environment",
                "signal handlers", "cwd", "sys.path", "atexit hooks"]


@pytest.fixture(scope="module", params=["orchestra", "every-module"])
def import_report(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
                  ) -> dict[str, Any]:
    """What changed in a fresh interpreter across ``import orchestra`` (or every module)."""
    # The probe must import the orchestra this process did (child_env).
    proc = subprocess.run([sys.executable, "-c", _PROBE, request.param], env=child_env(),
                          cwd=tmp_path_factory.mktemp("import-probe"), capture_output=True,
                          text=True, timeout=50)
    assert proc.returncode == 0, proc.stderr
    report: dict[str, Any] = json.loads(proc.stdout)
    return report


@pytest.mark.parametrize("effect", SIDE_EFFECTS)
def test_import_has_no_side_effect(import_report: dict[str, Any], effect: str) -> None:
    before, after = import_report[effect]
    assert after == before, f"importing orchestra changed {effect}"


def test_util_placement_group_stays_the_function_once_its_module_is_imported() -> None:
    """``orchestra.util.placement_group`` names a function and a module (as in Ray): the
    module imported after the package took the name, and `from orchestra.util import
    placement_group` then gave a module (not callable)."""
    probe = ("from orchestra.util.placement_group import placement_group as f\n"
             "from orchestra.util import placement_group\n"
             "assert callable(placement_group) and placement_group is f, placement_group\n")
    proc = subprocess.run([sys.executable, "-c", probe], env=child_env(), capture_output=True,
                          text=True, timeout=50)
    assert proc.returncode == 0, proc.stderr
