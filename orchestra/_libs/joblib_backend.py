"""``orchestra.util.joblib``: a joblib backend named "orchestra" (``register_orchestra()``),
so ``with joblib.parallel_backend("orchestra"):`` runs scikit-learn's ``n_jobs=-1`` work
in the cluster's processes.

    Parallel(n_jobs) -> OrchestraBackend.configure: a TaskPool of n_jobs slots (-1: the
                        cluster's CPUs); no process is started for it
    each batch       -> TaskPool.apply_async(_ShippedOnce(batch)): a task of its own on
                        the cluster's workers, at most n_jobs at once (Slots decides, the
                        rest wait in order); the batch pickled with every numpy array
                        from _PUT_MIN bytes replaced by the ref of one put of it, kept per
                        array while it lives (a GridSearchCV's X is put once, not pickled
                        into each of its hundreds of batches); the worker reads it
                        zero-copy (read-only, as joblib's memmaps)

The workers are the cluster's: a Parallel call finds them started, with what the calls
before imported, as loky's reusable executor keeps its processes, and an idle one
holds no CPU (a pool of actors kept between calls held them, and starved other work).

Who owns what: a TaskPool's Slots and its running refs are under its lock, taken by the
caller's thread (apply_async, terminate) and the futures thread (a batch's end).

joblib is optional: importing this module without it raises ImportError naming it.
"""
from __future__ import annotations

import collections
import io
import threading
import weakref
from collections.abc import Callable
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
        from .._api.session import put
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
    from .._api.session import get
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


class Slots:
    """Which batches run now: at most ``limit`` at once, the others in their order. No
    I/O; the pool's lock is held for each call (tests/unit/test_joblib_slots.py)."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.running = 0
        self.waiting: collections.deque[Any] = collections.deque()
        self.stopped = False

    def offer(self, item: Any) -> list[Any]:
        """A batch submitted: [it] when it starts now, [] when it waits."""
        if self.stopped:
            raise ValueError("the pool was terminated")
        if self.running < self.limit:
            self.running += 1
            return [item]
        self.waiting.append(item)
        return []

    def finished(self) -> list[Any]:
        """A batch ended: the next one to start, if one waits."""
        self.running -= 1
        if self.waiting and not self.stopped:
            self.running += 1
            return [self.waiting.popleft()]
        return []

    def stop(self) -> list[Any]:
        """No batch starts any more: those that waited (to be failed)."""
        self.stopped = True
        left = list(self.waiting)
        self.waiting.clear()
        return left


def _run_batch(batch: Callable[[], Any]) -> Any:
    return batch()


_BATCH: Any = None


class TaskPool:
    """What joblib's MultiprocessingBackend asks of a pool (apply_async, close,
    terminate), over tasks: each batch one task on the cluster's workers, at most
    ``n_jobs`` at once; ``remote_args``: the tasks' options (num_cpus=1 by default)."""

    def __init__(self, n_jobs: int, remote_args: dict[str, Any] | None = None) -> None:
        global _BATCH
        from .._api.remote import remote
        from .mp_pool import ApplyResult
        if _BATCH is None:
            _BATCH = remote(_run_batch)
        self._result_cls = ApplyResult
        self._fn = _BATCH.options(**{"num_cpus": 1, "max_retries": 0,
                                     "name": "joblib batch", **(remote_args or {})})
        self._lock = threading.Lock()
        self._slots = Slots(n_jobs)    # under _lock
        self._running: set[Any] = set()   # the refs of the batches running, under _lock

    def apply_async(self, func: Callable[[], Any], args: tuple[Any, ...] = (),
                    kwds: dict[str, Any] | None = None, callback: Any = None,
                    error_callback: Any = None) -> Any:
        result = self._result_cls(callback, error_callback)
        with self._lock:
            go = self._slots.offer((result, func))
        self._start(go)
        return result

    def _start(self, items: list[Any]) -> None:
        for result, func in items:
            ref = self._fn.remote(func)
            with self._lock:
                self._running.add(ref)
            ref.future().add_done_callback(
                lambda fut, result=result, ref=ref: self._done(result, ref, fut))

    def _done(self, result: Any, ref: Any, fut: Any) -> None:
        """A batch ended (on the futures thread): the next starts, its result is set."""
        with self._lock:
            self._running.discard(ref)
            nxt = self._slots.finished()
        self._start(nxt)
        exc = fut.exception()
        result._set(exc is None, fut.result() if exc is None else exc)

    def close(self) -> None:
        pass

    def terminate(self) -> None:
        """No batch starts any more; those waiting fail, those running are cancelled
        (joblib terminates a call that raised: its other batches are not needed)."""
        from .._api.session import cancel
        with self._lock:
            left = self._slots.stop()
            running = list(self._running)
        for ref in running:
            try:
                cancel(ref)
            except Exception:  # noqa: BLE001 - ended meanwhile, or the session is gone
                pass
        error = RuntimeError("the joblib call was terminated before this batch ran")
        for result, _ in left:
            result._set(False, error)


class OrchestraBackend(MultiprocessingBackend):
    """joblib's multiprocessing backend over the cluster's workers (TaskPool): large
    arrays are put in the object store once (``nesting_level``, ``inner_max_num_threads``
    and ``kwargs`` as joblib passes them; ``orchestra_remote_args``: options of the
    batches' tasks, e.g. {"num_cpus": 2})."""

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
        from .._api.session import cluster_resources, init, is_initialized
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
        """Make the pool of a Parallel call of ``n_jobs`` (``parallel``, ``prefer``,
        ``require`` and ``kwargs`` as joblib gives them): no process starts."""
        n_jobs = self.effective_n_jobs(n_jobs)
        self.parallel = parallel
        self._pool: TaskPool | None = TaskPool(n_jobs, self.orchestra_remote_args)
        return n_jobs

    def submit(self, func: Any, callback: Any = None) -> Any:
        """Run a batch ``func`` in the pool; ``callback`` gets its outcome."""
        return super().submit(_ShippedOnce(func, self.shipped), callback=callback)

    def terminate(self) -> None:
        """End the pool (the workers stay the cluster's); the arrays put for it go with
        their refs."""
        if self._pool is not None:
            self._pool.terminate()
            self._pool = None
        self.shipped.clear()


def register_orchestra() -> None:
    """Register the joblib backend "orchestra": ``with joblib.parallel_backend(
    "orchestra"):`` or ``joblib.parallel_config(backend="orchestra")``."""
    joblib.register_parallel_backend("orchestra", OrchestraBackend)
