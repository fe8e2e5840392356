"""``orchestra.util.futures.OrchestraExecutor``: a ``concurrent.futures.Executor`` whose
calls are tasks on the cluster.

    submit(fn, ...) -> a Future, PENDING; fewer than max_workers running: the task starts
                       now (the Future RUNNING), else it waits in _queue (cancel() works
                       there, as in the standard executors)
    the task's ref  -> its ObjectRef.future() resolves on the process's futures thread:
                       the result (or the task's error) into the Future, the next queued
                       task started
    shutdown        -> no more submits (RuntimeError); cancel_futures drops the queued;
                       wait: until every running Future is done

The queue, the running set and the shut-down flag are the executor's, under ``_lock``.
"""
from __future__ import annotations

import collections
import concurrent.futures as cf
import itertools
import threading
import time
import weakref
from collections.abc import Callable, Iterable, Iterator
from typing import Any


def _call(fn: Callable[..., Any], args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    return fn(*args, **kwargs)


def _chunk(fn: Callable[..., Any], chunk: list[tuple[Any, ...]]) -> list[Any]:
    return [fn(*args) for args in chunk]


class OrchestraExecutor(cf.Executor):
    """Run calls as tasks on the cluster: ``with OrchestraExecutor() as ex:
    ex.submit(f, x)``, ``ex.map(f, xs)``; the Futures work with
    ``concurrent.futures.as_completed`` and ``wait``.

    ``max_workers``: tasks running at once (default: the cluster's CPUs); more wait in
    the executor, where they can be cancelled. ``address``: the cluster to connect to
    when this process has none yet. ``orchestra_remote_args`` (or ``ray_remote_args``):
    options of the tasks (``num_cpus``, ``resources``, ``max_retries``, ...)."""

    def __init__(self, max_workers: int | None = None, *, address: str | None = None,
                 orchestra_remote_args: dict[str, Any] | None = None,
                 ray_remote_args: dict[str, Any] | None = None) -> None:
        from .._api.session import cluster_resources, init, is_initialized
        if max_workers is not None and (isinstance(max_workers, bool)
                                        or not isinstance(max_workers, int)):
            raise TypeError(f"max_workers must be an int or None, got {max_workers!r}")
        if max_workers is not None and max_workers <= 0:
            raise ValueError("max_workers must be greater than 0")
        if not is_initialized():
            init(address=address)
        self._max_workers = max_workers or max(1, int(cluster_resources().get("CPU", 1)))
        self._options = dict(orchestra_remote_args or ray_remote_args or {})
        self._lock = threading.Lock()
        self._queue: collections.deque[tuple[cf.Future[Any], Callable[..., Any],
                                             tuple[Any, ...], dict[str, Any]]] = collections.deque()
        self._running: set[cf.Future[Any]] = set()
        self._shutdown = False
        self._remotes: weakref.WeakKeyDictionary[Any, Any] = weakref.WeakKeyDictionary()
        self._call = self._remote(_call)
        self._chunk = self._remote(_chunk)

    def _remote(self, fn: Callable[..., Any]) -> Any:
        from .._api.remote import remote
        rf = remote(fn)
        return rf.options(**self._options) if self._options else rf

    def submit(self, fn: Callable[..., Any], /, *args: Any, **kwargs: Any) -> cf.Future[Any]:
        """``fn(*args, **kwargs)`` as a task: a Future of its result."""
        if not callable(fn):
            raise TypeError(f"submit() needs a callable, got {fn!r}")
        return self._enqueue(fn, args, kwargs)

    def _enqueue(self, fn: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> cf.Future[Any]:
        fut: cf.Future[Any] = cf.Future()
        with self._lock:
            if self._shutdown:
                raise RuntimeError("cannot schedule new futures after shutdown")
            if len(self._running) >= self._max_workers:
                self._queue.append((fut, fn, args, kwargs))
                return fut
            self._running.add(fut)
        self._start(fut, fn, args, kwargs)
        return fut

    def _start(self, fut: cf.Future[Any], fn: Callable[..., Any], args: tuple[Any, ...],
               kwargs: dict[str, Any]) -> None:
        if not fut.set_running_or_notify_cancel():
            self._finished(fut, None)
            return
        try:
            ref = self._task(fn, args, kwargs)
        except BaseException as exc:  # noqa: BLE001 - a bad argument: the Future's error
            fut.set_exception(exc)
            self._finished(fut, None)
            return
        ref.future().add_done_callback(lambda done: self._finished(fut, done))

    def _task(self, fn: Callable[..., Any], args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        """Start fn(*args, **kwargs) as a task: through a RemoteFunction of ``fn`` kept
        while ``fn`` lives (its code shipped once), else one that is given ``fn``."""
        if isinstance(fn, _ChunkOf):
            return self._chunk.remote(fn.fn, *args)
        try:
            rf = self._remotes.get(fn)
            if rf is None:
                rf = self._remotes[fn] = self._remote(fn)
        except TypeError:   # not weakly referenceable (a builtin, a partial): shipped each time
            return self._call.remote(fn, args, kwargs)
        return rf.remote(*args, **kwargs)

    def _finished(self, fut: cf.Future[Any], done: cf.Future[Any] | None) -> None:
        """A task ended (on the futures thread): its outcome into ``fut``, the next
        queued call started."""
        if done is not None and not fut.done():
            exc = done.exception()
            if exc is not None:
                fut.set_exception(exc)
            else:
                fut.set_result(done.result())
        nxt = None
        with self._lock:
            self._running.discard(fut)
            while self._queue and nxt is None:
                nxt = self._queue.popleft()
                if nxt[0].cancelled():
                    nxt = None
            if nxt is not None:
                self._running.add(nxt[0])
        if nxt is not None:
            self._start(*nxt)

    def map(self, fn: Callable[..., Any], *iterables: Iterable[Any], timeout: float | None = None,
            chunksize: int = 1, buffersize: int | None = None) -> Iterator[Any]:
        """``fn`` over the ``iterables``' items, in order; ``chunksize`` items per task.
        The iterator raises TimeoutError when a result is not in ``timeout`` seconds
        after the call. ``buffersize`` is accepted for the standard signature (every
        item is submitted at once)."""
        if isinstance(chunksize, bool) or not isinstance(chunksize, int) or chunksize < 1:
            raise ValueError("chunksize must be >= 1.")
        end = None if timeout is None else time.monotonic() + timeout
        items = zip(*iterables, strict=False)   # as the built-in map: the shortest ends it
        if chunksize == 1:
            fs = [self.submit(fn, *args) for args in items]
        else:
            fs = []
            while chunk := list(itertools.islice(items, chunksize)):
                fs.append(self._submit_chunk(fn, chunk))
        return _results(fs, end, flat=chunksize > 1)

    def _submit_chunk(self, fn: Callable[..., Any], chunk: list[tuple[Any, ...]]) -> cf.Future[Any]:
        return self._enqueue(_ChunkOf(fn), (chunk,), {})

    def shutdown(self, wait: bool = True, *, cancel_futures: bool = False) -> None:
        """No more submits (RuntimeError); ``cancel_futures``: the calls still queued are
        cancelled; ``wait``: return once the others are done."""
        with self._lock:
            self._shutdown = True
            queued: list[Any] = []
            if cancel_futures:
                queued, self._queue = list(self._queue), collections.deque()
            running = set(self._running)
        for fut, *_ in queued:
            fut.cancel()
        if wait:
            # The queued ones start as the running ones end: wait until none is left.
            while running:
                cf.wait(running)
                with self._lock:
                    running = set(self._running) | {f for f, *_ in self._queue}


class _ChunkOf:
    """A chunk of map's calls: queued as one task running ``fn`` over each argument
    tuple (see OrchestraExecutor._task)."""

    __slots__ = ("fn",)

    def __init__(self, fn: Callable[..., Any]) -> None:
        self.fn = fn


def _results(fs: list[cf.Future[Any]], end: float | None, flat: bool) -> Iterator[Any]:
    try:
        fs.reverse()
        while fs:
            fut = fs.pop()
            value = fut.result(None if end is None else max(0.0, end - time.monotonic()))
            if flat:
                yield from value
            else:
                yield value
    finally:
        for fut in fs:
            fut.cancel()
