"""``orchestra.util.joblib``: a joblib backend named "orchestra" (``register_orchestra()``),
so ``with joblib.parallel_backend("orchestra"):`` runs scikit-learn's ``n_jobs=-1`` work
in the cluster's processes.

    Parallel(n_jobs) -> OrchestraBackend.configure: a Pool (_api/mp_pool.py) of
                        n_jobs processes (-1: the cluster's CPUs)
    each batch       -> Pool.apply_async(_ShippedOnce(batch)): the batch pickled with
                        every numpy array from _PUT_MIN bytes replaced by the ref of one
                        put of it, kept per array while it lives (a GridSearchCV's X is put
                        once, not pickled into each of its hundreds of batches); the pool
                        process reads it zero-copy (read-only, as joblib's memmaps)

joblib is optional: importing this module without it raises ImportError naming it.
"""
from __future__ import annotations

import io
import threading
import weakref
from typing import Any

try:
    import joblib
    from joblib._parallel_backends import MultiprocessingBackend
except ImportError as exc:   # pragma: no cover - the message is the point
    raise ImportError("orchestra.util.joblib needs joblib: pip install joblib") from exc

import cloudpickle

_PUT_MIN = 1 << 20   # arrays from this size travel as refs


class _Shipped:
    """The refs of arrays put once (by the identity of each array, while it lives)."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.refs: dict[int, tuple[weakref.ref[Any], Any]] = {}
        self.puts = 0   # how many arrays were put (for tests and curiosity)

    def ref_for(self, array: Any) -> Any:
        from .session import put
        key = id(array)
        with self.lock:
            got = self.refs.get(key)
            if got is not None and got[0]() is array:
                return got[1]
        ref = put(array)

        def gone(_: object, key: int = key) -> None:
            with self.lock:
                self.refs.pop(key, None)
        with self.lock:
            self.refs[key] = (weakref.ref(array, gone), ref)
            self.puts += 1
        return ref

    def clear(self) -> None:
        with self.lock:
            self.refs.clear()


class _RefPickler(cloudpickle.Pickler):
    """cloudpickle, with large numpy arrays replaced by refs of one put each."""

    def __init__(self, file: io.BytesIO, shipped: _Shipped) -> None:
        super().__init__(file, protocol=5)
        self.shipped = shipped

    def reducer_override(self, obj: Any) -> Any:
        np = _numpy()
        if np is not None and type(obj) is np.ndarray and obj.nbytes >= _PUT_MIN:
            return _from_ref, (self.shipped.ref_for(obj),)
        return super().reducer_override(obj)


def _numpy() -> Any:
    import sys
    return sys.modules.get("numpy")


def _from_ref(ref: Any) -> Any:
    from .session import get
    return get(ref)


def _load(data: bytes) -> Any:
    return cloudpickle.loads(data)


class _ShippedOnce:
    """A joblib batch that pickles with its large arrays as refs (see the module doc)."""

    def __init__(self, inner: Any, shipped: _Shipped) -> None:
        self.inner, self.shipped = inner, shipped

    def __reduce__(self) -> tuple[Any, ...]:
        buf = io.BytesIO()
        _RefPickler(buf, self.shipped).dump(self.inner)
        return _load, (buf.getvalue(),)

    def __call__(self) -> Any:   # run in place (a sequential fallback)
        return self.inner()


class OrchestraBackend(MultiprocessingBackend):
    """joblib's multiprocessing backend over orchestra's Pool: the processes are the
    cluster's, large arrays are put in the object store once (``nesting_level``,
    ``inner_max_num_threads`` and ``kwargs`` as joblib passes them;
    ``orchestra_remote_args``: options of the pool's actors)."""

    supports_retrieve_callback = True
    supports_return_generator = False

    def __init__(self, nesting_level: int | None = None,
                 inner_max_num_threads: int | None = None,
                 orchestra_remote_args: dict[str, Any] | None = None, **kwargs: Any) -> None:
        super().__init__(nesting_level=nesting_level,
                         inner_max_num_threads=inner_max_num_threads, **kwargs)
        self.orchestra_remote_args = orchestra_remote_args
        self.shipped = _Shipped()

    def effective_n_jobs(self, n_jobs: int | None) -> int:
        """How many processes ``n_jobs`` stands for on this cluster (-1: all its CPUs)."""
        from .session import cluster_resources, init, is_initialized
        if n_jobs == 0:
            raise ValueError("n_jobs == 0 in Parallel has no meaning")
        if not is_initialized():
            init()
        cpus = max(1, int(cluster_resources().get("CPU", 1)))
        if n_jobs is None:
            return 1
        if n_jobs < 0:
            return max(cpus + 1 + n_jobs, 1)
        return min(n_jobs, cpus)

    def configure(self, n_jobs: int = 1, parallel: Any = None, prefer: Any = None,
                  require: Any = None, **kwargs: Any) -> int:
        """Start the pool for a Parallel call of ``n_jobs`` (``parallel``, ``prefer``,
        ``require`` and ``kwargs`` as joblib gives them)."""
        from .mp_pool import Pool
        n_jobs = self.effective_n_jobs(n_jobs)
        self.parallel = parallel
        self._pool: Pool | None = Pool(processes=n_jobs,
                                       orchestra_remote_args=self.orchestra_remote_args)
        return n_jobs

    def submit(self, func: Any, callback: Any = None) -> Any:
        """Run a batch ``func`` in the pool; ``callback`` gets its outcome."""
        return super().submit(_ShippedOnce(func, self.shipped), callback=callback)

    def terminate(self) -> None:
        """Stop the pool; the arrays put for it go with their refs."""
        if self._pool is not None:
            self._pool.terminate()
            self._pool = None
        self.shipped.clear()


def register_orchestra() -> None:
    """Register the joblib backend "orchestra": ``with joblib.parallel_backend(
    "orchestra"):`` or ``joblib.parallel_config(backend="orchestra")``."""
    joblib.register_parallel_backend("orchestra", OrchestraBackend)
