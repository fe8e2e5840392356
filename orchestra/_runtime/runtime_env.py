"""runtime_env= from local paths: checked where it is given, applied in the worker.

    init(runtime_env=) / @remote(runtime_env=) / .options(runtime_env=)
        --check (at the call: unknown keys, anything that would download)--> RuntimeEnvSpec
        --merge (job's under the task's, once per function and client)--> Call.runtime_env
    worker: enter(spec) before the call (env vars, cwd, sys.path) -> the setup hook, the
        first time this process meets it -> run -> restore; an actor's constructor
        enters it for the actor's life

Nothing is downloaded or installed: the paths must exist on the node that runs the task
(this machine, or a filesystem every node mounts at the same path).
"""
from __future__ import annotations

import importlib
import os
import sys
from collections.abc import Callable

from .._protocol import pb

SUPPORTED = ("env_vars", "working_dir", "py_modules", "worker_process_setup_hook")
# Keys of Ray's runtime_env that fetch or build something: refused by name.
_DOWNLOADS = {
    "pip": "installs packages from a package registry",
    "uv": "installs packages from a package registry",
    "conda": "creates a conda environment (downloads packages)",
    "container": "pulls a container image",
    "image_uri": "pulls a container image",
    "java_jars": "fetches jars",
}
_URL_SCHEMES = ("http://", "https://", "s3://", "gs://", "gcs://", "file://", "hdfs://",
                "azure://", "abfss://")


def _refuse(what: str) -> ValueError:
    return ValueError(f"runtime_env: {what}. orchestra runs tasks in the Python environment "
                      "the cluster was started with and downloads nothing; supported keys: "
                      f"{', '.join(SUPPORTED)}, from local paths. Install packages into that "
                      "environment, or pass local directories as working_dir / py_modules.")


def _local_path(key: str, value: object) -> str:
    if not isinstance(value, (str, os.PathLike)):
        raise TypeError(f"runtime_env[{key!r}] takes a local path, got {value!r}")
    path = os.fspath(value)
    if path.startswith(_URL_SCHEMES) or "://" in path:
        raise _refuse(f"{key}={path!r} is a URL, which would be downloaded")
    if path.endswith((".zip", ".whl", ".tar.gz")):
        raise _refuse(f"{key}={path!r} is an archive, which would be unpacked")
    full = os.path.abspath(path)
    if not os.path.exists(full):
        raise ValueError(f"runtime_env[{key!r}]: {full!r} does not exist; give a directory (or, "
                         "for py_modules, a module file) on this machine")
    return full


def check(runtime_env: object) -> pb.RuntimeEnvSpec | None:
    """runtime_env= as a RuntimeEnvSpec (None for none); raises naming the bad key."""
    if runtime_env is None:
        return None
    if not isinstance(runtime_env, dict):
        raise TypeError(f"runtime_env must be a dict such as {{'env_vars': {{...}}}}, got {runtime_env!r}")
    for key in runtime_env:
        if key in _DOWNLOADS:
            raise _refuse(f"key {key!r} {_DOWNLOADS[key]}")
        if key not in SUPPORTED:
            raise _refuse(f"key {key!r} is not supported")
    spec = pb.RuntimeEnvSpec()
    env_vars = runtime_env.get("env_vars") or {}
    if not isinstance(env_vars, dict) or not all(
            isinstance(k, str) and k and isinstance(v, str) for k, v in env_vars.items()):
        raise TypeError(f"runtime_env['env_vars'] must map names to strings, got {env_vars!r}")
    spec.env_vars.update(env_vars)
    if runtime_env.get("working_dir") is not None:
        spec.working_dir = _local_path("working_dir", runtime_env["working_dir"])
        if not os.path.isdir(spec.working_dir):
            raise ValueError(f"runtime_env['working_dir']: {spec.working_dir!r} is not a directory")
    mods = runtime_env.get("py_modules") or []
    if not isinstance(mods, (list, tuple)):
        raise TypeError(f"runtime_env['py_modules'] takes a list of local paths, got {mods!r}")
    spec.py_modules.extend(_local_path("py_modules", m) for m in mods)
    hook = runtime_env.get("worker_process_setup_hook")
    if hook is not None:
        spec.setup_hook = _setup_hook(hook)
    return spec


def _setup_hook(hook: object) -> bytes:
    """worker_process_setup_hook=: a callable taking no arguments, or the "module.fn"
    name of one that the workers import; pickled for the worker."""
    import cloudpickle
    if isinstance(hook, str):
        mod, _, fn = hook.rpartition(".")
        if not mod or not fn:
            raise ValueError(f"runtime_env['worker_process_setup_hook']={hook!r}: give a "
                             "callable or its importable name, 'module.function'")
    elif not callable(hook):
        raise TypeError(f"runtime_env['worker_process_setup_hook'] takes a callable or its "
                        f"'module.function' name, got {hook!r}")
    return cloudpickle.dumps(hook, protocol=5)


def run_setup_hook(pickled: bytes) -> None:
    """Run a worker_process_setup_hook in this process (its name imported first)."""
    import cloudpickle
    hook = cloudpickle.loads(pickled)
    if isinstance(hook, str):
        mod, _, name = hook.rpartition(".")
        hook = getattr(importlib.import_module(mod), name)
    hook()


def merge(job: pb.RuntimeEnvSpec | None,
          task: pb.RuntimeEnvSpec | None) -> pb.RuntimeEnvSpec | None:
    """The task's runtime_env over the job's (init's): env_vars merged, the task's
    winning; working_dir, py_modules and the setup hook the task's when it gives them."""
    if job is None:
        return task
    if task is None:
        return job
    out = pb.RuntimeEnvSpec()
    out.CopyFrom(job)
    out.env_vars.update(task.env_vars)
    if task.working_dir:
        out.working_dir = task.working_dir
    if task.py_modules:
        del out.py_modules[:]
        out.py_modules.extend(task.py_modules)
    if task.setup_hook:
        out.setup_hook = task.setup_hook
    return out


def _import_root(path: str) -> str:
    """What goes on sys.path so that ``path`` imports by its name: a package's (a
    directory with __init__.py) or a module file's parent; a plain directory itself."""
    if os.path.isfile(path) or os.path.isfile(os.path.join(path, "__init__.py")):
        return os.path.dirname(path)
    return path


def enter(spec: pb.RuntimeEnvSpec) -> Callable[[], None]:
    """Apply ``spec`` in this process; returns what undoes it."""
    saved = {k: os.environ.get(k) for k in spec.env_vars}
    os.environ.update(spec.env_vars)
    cwd = os.getcwd() if spec.working_dir else None
    added = [_import_root(p) for p in spec.py_modules]
    if spec.working_dir:
        os.chdir(spec.working_dir)
        added.insert(0, spec.working_dir)
    for p in reversed(added):
        sys.path.insert(0, p)
    if added:
        importlib.invalidate_caches()

    def undo() -> None:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
        if cwd is not None:
            os.chdir(cwd)
        for p in added:
            try:
                sys.path.remove(p)
            except ValueError:
                pass
    return undo
