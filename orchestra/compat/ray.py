"""Run a Ray Core script on orchestra: ``orchestra run --ray SCRIPT [ARGS]`` or
``python -m orchestra.compat.ray SCRIPT [ARGS]``.

``install()`` puts module objects named ``ray``, ``ray.util``, ``ray.util.queue``,
``ray.util.actor_pool``, ``ray.util.placement_group``, ``ray.util.scheduling_strategies``,
``ray.util.multiprocessing``, ``ray.util.joblib``, ``ray.util.dask``, ``ray.util.metrics``,
``ray.exceptions``, ``ray.actor``, ``ray.dag``, ``ray.experimental.tqdm_ray`` and
``ray._raylet`` into sys.modules; each maps Ray's names onto orchestra's objects
(names only: every behaviour is orchestra's). It also sets $ORCHESTRA_RAY_COMPAT,
which the workers of this driver's cluster inherit, so that orchestra's worker installs
the same modules (a task may ``import ray``, and a function
pickled with a reference to the module finds it). A meta path finder answers any other
``ray.*`` import with an error naming what is missing. It puts orchestra/compat/shim on
sys.path and $PYTHONPATH too: there ``import ray`` installs the same modules, in the
processes the script starts itself (a spawn or forkserver pool re-imports the script).
"""
from __future__ import annotations

import importlib
import importlib.abc
import importlib.machinery
import os
import runpy
import sys
import types
from collections.abc import Callable, Sequence
from typing import Any

ENV = "ORCHESTRA_RAY_COMPAT"

_HINT = "see docs/coming-from-ray.md"

# Keyword arguments of ray.init() that only change logging or the dashboard's host (it
# binds where the cluster listens): accepted, without effect.
_IGNORED_INIT_KWARGS = frozenset({
    "dashboard_host",
    "configure_logging", "logging_level", "logging_format",
})
# Keyword arguments of ray.init() that orchestra's init() takes under the same name.
_PASSED_INIT_KWARGS = frozenset({
    "num_cpus", "num_gpus", "resources", "object_store_memory", "ignore_reinit_error",
    "namespace", "runtime_env", "_system_config", "log_to_driver", "include_dashboard",
    "dashboard_port",
})


def _missing(name: str) -> str:
    return f"{name} is not available on orchestra (orchestra has no equivalent); {_HINT}"


def _module(name: str, doc: str, names: dict[str, Any],
            package: bool = False) -> types.ModuleType:
    """A plain module called ``name`` holding ``names`` (plain, so cloudpickle pickles a
    reference to it by name and a worker imports it by name), whose ``__getattr__``
    answers any other public name with AttributeError saying orchestra has none."""
    mod = types.ModuleType(name, doc)
    mod.__spec__ = importlib.machinery.ModuleSpec(name, None, is_package=package)
    if package:
        mod.__path__ = []

    def __getattr__(attr: str) -> Any:
        if attr.startswith("__"):
            raise AttributeError(f"module {name!r} has no attribute {attr!r}")
        raise AttributeError(_missing(f"{name}.{attr}"))

    mod.__dict__.update(names, __getattr__=__getattr__, _orchestra_compat=True)
    return mod


def _lazy_module(name: str, doc: str, load: Callable[[], dict[str, Any]]) -> types.ModuleType:
    """As _module, its names made by ``load()`` at the first use of one (it imports an
    optional library: joblib, dask; missing, the ImportError names it)."""
    mod = _module(name, doc, {})

    def __getattr__(attr: str) -> Any:
        if attr.startswith("__"):
            raise AttributeError(f"module {name!r} has no attribute {attr!r}")
        names = load()
        mod.__dict__.update(names)
        if attr not in names:
            raise AttributeError(_missing(f"{name}.{attr}"))
        return names[attr]

    mod.__getattr__ = __getattr__  # type: ignore[method-assign]
    return mod


def _joblib_names() -> dict[str, Any]:
    import joblib  # its ImportError, if missing, names it

    from ..util import joblib as ojoblib

    def register_ray() -> None:
        """``ray.util.joblib.register_ray``: the backend "ray" is orchestra's."""
        joblib.register_parallel_backend("ray", ojoblib.OrchestraBackend)
    return {"register_ray": register_ray}


def _dask_names() -> dict[str, Any]:
    from ..util import dask as odask
    return {"ray_dask_get": odask.orchestra_dask_get,
            "enable_dask_on_ray": odask.enable_dask_on_orchestra,
            "disable_dask_on_ray": odask.disable_dask_on_orchestra}


def init(address: str | None = None, **kwargs: Any) -> dict[str, Any]:
    """``ray.init``: Ray's common keyword arguments flow to orchestra.init(); the
    logging ones and dashboard_host are accepted without effect; any other raises TypeError
    naming it (it would change what the script means)."""
    import orchestra
    unknown = sorted(set(kwargs) - _IGNORED_INIT_KWARGS - _PASSED_INIT_KWARGS)
    if unknown:
        raise TypeError(f"ray.init() got keyword arguments orchestra does not support: "
                        f"{', '.join(unknown)}; remove them ({_HINT})")
    passed = {k: v for k, v in kwargs.items() if k in _PASSED_INIT_KWARGS}
    if isinstance(address, str) and address.startswith("ray://"):
        raise ValueError(f"ray.init(address={address!r}): Ray Client addresses are not "
                         f"available on orchestra; give a cluster's HOST:PORT or 'auto' "
                         f"({_HINT})")
    return orchestra.init(address, **passed)


def _exceptions_names() -> dict[str, Any]:
    from .. import exceptions as ex
    names: dict[str, Any] = {
        "RayError": ex.OrchestraError,
        "RaySystemError": ex.OrchestraError,
        "RayTaskError": ex.TaskError,
        "RayActorError": ex.ActorDiedError,
        "ActorDiedError": ex.ActorDiedError,
        "GetTimeoutError": ex.GetTimeoutError,
        "TaskCancelledError": ex.TaskCancelledError,
        "WorkerCrashedError": ex.WorkerCrashedError,
        "ObjectLostError": ex.ObjectLostError,
        "OwnerDiedError": ex.ObjectLostError,
        "ObjectReconstructionFailedError": ex.ObjectLostError,
        "ObjectStoreFullError": ex.ObjectStoreFullError,
        "OutOfDiskError": ex.ObjectStoreFullError,
        "LocalRayletDiedError": ex.ClusterLostError,
        "RaySystemDeserializationError": ex.DeserializationError,
    }
    return names


def _build() -> dict[str, types.ModuleType]:
    """The module objects, by their Ray names."""
    import orchestra

    from .. import actor as oactor
    from .. import util as outil
    from ..util import actor_pool as opool
    from ..util import queue as oqueue
    from ..util import scheduling_strategies as oss
    from ..util import state as ostate
    opg = importlib.import_module("orchestra.util.placement_group")  # not the function

    exceptions = _module("ray.exceptions", "Ray's exception names, as orchestra's errors.",
                         _exceptions_names())
    actor = _module("ray.actor", "ray.actor on orchestra.", {
        "exit_actor": oactor.exit_actor, "ActorClass": orchestra.ActorClass,
        "ActorHandle": orchestra.ActorHandle, "method": orchestra.method})
    queue = _module("ray.util.queue", "ray.util.queue on orchestra.", {
        "Queue": oqueue.Queue, "Empty": oqueue.Empty, "Full": oqueue.Full})
    pool = _module("ray.util.actor_pool", "ray.util.actor_pool on orchestra.",
                   {"ActorPool": opool.ActorPool})
    pg_names = {n: getattr(opg, n) for n in (
        "PlacementGroup", "placement_group", "get_placement_group",
        "remove_placement_group", "placement_group_table")}
    pg = _module("ray.util.placement_group", "ray.util.placement_group on orchestra.",
                 pg_names)
    strategies = _module("ray.util.scheduling_strategies",
                         "ray.util.scheduling_strategies on orchestra.", {
                             "PlacementGroupSchedulingStrategy":
                                 oss.PlacementGroupSchedulingStrategy,
                             "NodeAffinitySchedulingStrategy":
                                 oss.NodeAffinitySchedulingStrategy})
    state = _module("ray.util.state", "ray.util.state on orchestra.", {
        n: getattr(ostate, n) for n in ("list_tasks", "list_actors", "list_objects",
                                        "list_nodes", "list_workers", "list_jobs",
                                        "summarize_tasks")})
    from ..util import multiprocessing as omp
    mp = _module("ray.util.multiprocessing", "ray.util.multiprocessing on orchestra.",
                 {"Pool": omp.Pool, "TimeoutError": omp.TimeoutError})
    jl = _lazy_module("ray.util.joblib", "ray.util.joblib on orchestra.", _joblib_names)
    dk = _lazy_module("ray.util.dask", "ray.util.dask on orchestra.", _dask_names)
    from ..util import metrics as ometrics
    metrics = _module("ray.util.metrics", "ray.util.metrics on orchestra.", {
        n: getattr(ometrics, n) for n in ("Counter", "Gauge", "Histogram")})
    util = _module("ray.util", "ray.util on orchestra.", {
        "ActorPool": outil.ActorPool, **pg_names, "queue": queue, "actor_pool": pool,
        "scheduling_strategies": strategies, "state": state, "multiprocessing": mp,
        "joblib": jl, "dask": dk, "metrics": metrics}, package=True)
    top = {n: getattr(orchestra, n) for n in (
        "remote", "get", "put", "wait", "cancel", "kill", "get_actor", "method", "nodes",
        "cluster_resources", "available_resources", "get_runtime_context", "get_gpu_ids",
        "shutdown", "is_initialized", "ObjectRef", "ObjectRefGenerator",
        "DynamicObjectRefGenerator", "timeline")}
    # Scripts import the ref types from Ray's extension module too.
    raylet = _module("ray._raylet", "ray._raylet's ref types, as orchestra's.", {
        "ObjectRef": orchestra.ObjectRef, "ObjectRefGenerator": orchestra.ObjectRefGenerator,
        "DynamicObjectRefGenerator": orchestra.DynamicObjectRefGenerator})
    from ..util import tqdm as otqdm
    tqdm_ray = _module("ray.experimental.tqdm_ray", "ray.experimental.tqdm_ray on orchestra.",
                       {"tqdm": otqdm.tqdm, "safe_print": otqdm.safe_print})
    experimental = _module("ray.experimental", "ray.experimental on orchestra.",
                           {"tqdm_ray": tqdm_ray}, package=True)
    from .. import dag as odag
    dag = _module("ray.dag", "ray.dag on orchestra.", {n: getattr(odag, n) for n in odag.__all__})
    ray = _module("ray", "Ray Core's names, as orchestra's objects (orchestra.compat.ray).", {
        **top, "init": init, "util": util, "exceptions": exceptions, "actor": actor,
        "_raylet": raylet, "dag": dag, "experimental": experimental,
        "__version__": orchestra.__version__}, package=True)
    return {m.__name__: m for m in (ray, util, queue, pool, pg, strategies, exceptions, actor,
                                    state, mp, jl, dk, raylet, dag, experimental,
                                    tqdm_ray, metrics)}


class _MissingRayFinder(importlib.abc.MetaPathFinder):
    """Answers ``import ray.X`` for a module orchestra has no equivalent of with a
    ModuleNotFoundError saying so (the known ones are already in sys.modules)."""

    def find_spec(self, fullname: str, path: Sequence[str] | None,
                  target: types.ModuleType | None = None) -> importlib.machinery.ModuleSpec | None:
        if fullname == "ray" or fullname.startswith("ray."):
            # No name on it: `from ray.util import missing` tries the submodule first
            # and would swallow an error naming the module it looked for, then raise
            # a bare "cannot import name ... (unknown location)"; this one reaches the
            # script.
            raise ModuleNotFoundError(_missing(fullname))
        return None


def install() -> None:
    """Make ``import ray`` (and its submodules above) resolve to orchestra in this
    process, and set $ORCHESTRA_RAY_COMPAT so the workers it starts do the same (and
    $PYTHONPATH, so that any other Python process it starts does)."""
    os.environ[ENV] = "1"
    from .shim import PATH
    if PATH not in sys.path:
        sys.path.insert(0, PATH)
    paths = os.environ.get("PYTHONPATH", "").split(os.pathsep)
    if PATH not in paths:
        os.environ["PYTHONPATH"] = os.pathsep.join(p for p in [PATH, *paths] if p)
    if getattr(sys.modules.get("ray"), "_orchestra_compat", False):
        return
    sys.modules.update(_build())
    if not any(isinstance(f, _MissingRayFinder) for f in sys.meta_path):
        sys.meta_path.insert(0, _MissingRayFinder())


def run_script(argv: list[str]) -> int:
    """``SCRIPT [ARGS]``: install, then run SCRIPT as __main__ with sys.argv = argv."""
    if not argv or argv[0] in ("-h", "--help"):
        print("usage: orchestra run --ray SCRIPT [ARGS]\n"
              "       python -m orchestra.compat.ray SCRIPT [ARGS]\n\n"
              "Runs a Ray Core script on orchestra: `import ray` gives orchestra's objects "
              "under Ray's names.", file=sys.stderr if not argv else sys.stdout)
        return 2 if not argv else 0
    script = argv[0]
    if not os.path.isfile(script):
        print(f"orchestra run --ray: no such script {script!r}", file=sys.stderr)
        return 2
    install()
    sys.argv = list(argv)
    sys.path.insert(0, os.path.dirname(os.path.abspath(script)))
    runpy.run_path(script, run_name="__main__")
    return 0


def _entry() -> Callable[[list[str]], int]:
    # Run as ``python -m orchestra.compat.ray``, this file is __main__: use the module
    # under its package name, so there is one set of ray modules.
    from orchestra.compat import ray as compat
    return compat.run_script


if __name__ == "__main__":
    sys.exit(_entry()(sys.argv[1:]))
