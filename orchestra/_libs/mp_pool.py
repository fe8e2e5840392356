"""``orchestra.util.multiprocessing.Pool``: the standard library's ``multiprocessing.Pool``
on the cluster, with its semantics (``ray.util.multiprocessing.Pool`` names it too).

    Pool(n)          -> n actors (_PoolWorker, one CPU each), initializer run in each
    apply_async/map  -> chunks (a list of argument tuples) queued in the pool's PoolBook
                        (_libs/pool_book.py: the decisions, no I/O), which says what to send
                        to which actor (two calls out per actor; several chunks per call
                        while many wait); a call's ref resolves on the process's futures
                        thread (ObjectRef.future), which hands its results to their
                        AsyncResults and sends what the book says next
    maxtasksperchild -> an actor that ran that many chunks takes no more; once its last
                        one is back it is killed and a new one (initializer again) starts;
                        an actor that died is replaced the same way
    close/join       -> no new work; join waits for the queue to drain, then the actors go
    terminate        -> the actors are killed now; results not in yet fail

State shared between the caller's threads and the futures thread (the book, the actor
of each slot) is the pool's, under ``_lock``;
user callbacks run on the futures thread outside it, as the standard library runs them
on its result thread.

A task's exception comes back as itself (its class, args and the remote traceback as
its ``__cause__``, as the standard library's ``RemoteTraceback``).

Functions copied by value (defined in ``__main__`` or a notebook: cloudpickle ships
them with a copy of the globals they use) are bound, in each pool worker, to one
namespace per module, so what the initializer sets in its globals is what the
functions that worker runs later see, as in a forked worker of the standard library.
"""
from __future__ import annotations

import builtins
import collections
import itertools
import multiprocessing
import os
import pickle
import sys
import threading
import traceback
import types
from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import Future
from typing import Any

from ..exceptions import ActorDiedError
from .pool_book import RUN, TERMINATE, PoolBook

# ---------------------------------------------------------------- in the pool's workers

class RemoteTraceback(Exception):
    """The traceback of a pool task's exception, as text (its ``__cause__``)."""

    def __init__(self, tb: str) -> None:
        super().__init__(tb)
        self.tb = tb

    def __str__(self) -> str:
        return self.tb


class _Failed:
    """A chunk's exception, carried as a value (re-raised as itself by the caller)."""

    __slots__ = ("exc", "tb")

    def __init__(self, exc: BaseException, tb: str) -> None:
        self.exc, self.tb = exc, tb


def _portable(exc: BaseException) -> BaseException:
    """``exc`` if it pickles and comes back, else a RuntimeError naming it (the standard
    library's MaybeEncodingError case)."""
    try:
        pickle.loads(pickle.dumps(exc))
        return exc
    except Exception:  # noqa: BLE001 - any failure to round-trip
        return RuntimeError(f"{type(exc).__name__}: {exc} (the exception could not be "
                            "pickled back to the caller)")


class Namespaces:
    """One globals dict per module for functions copied by value, in one process."""

    def __init__(self) -> None:
        self.by_module: dict[str, dict[str, Any]] = {}

    def bind(self, fn: Any) -> Any:
        """``fn`` itself when its globals are a real module's; else the same function
        over its module's one namespace in this process."""
        if not isinstance(fn, types.FunctionType):
            return fn
        module = fn.__module__ or "__main__"
        real = sys.modules.get(module)
        if real is not None and getattr(real, "__dict__", None) is fn.__globals__:
            return fn
        ns = self.by_module.get(module)
        if ns is None:
            ns = self.by_module[module] = {"__builtins__": builtins, "__name__": module}
        return self._rebind(fn, fn.__globals__, ns, {})

    def _rebind(self, fn: types.FunctionType, old: dict[str, Any], ns: dict[str, Any],
                done: dict[int, Any]) -> types.FunctionType:
        got = done.get(id(fn))
        if got is not None:
            return got
        new = types.FunctionType(fn.__code__, ns, fn.__name__, fn.__defaults__, fn.__closure__)
        done[id(fn)] = new
        new.__kwdefaults__ = fn.__kwdefaults__
        new.__qualname__ = fn.__qualname__
        new.__module__ = fn.__module__
        new.__doc__ = fn.__doc__
        new.__dict__.update(fn.__dict__)
        for name, value in old.items():
            if name in ns:
                continue   # set in this process already (by the initializer, say): it stays
            if isinstance(value, types.FunctionType) and value.__globals__ is old:
                value = self._rebind(value, old, ns, done)   # a helper copied along with it
            ns[name] = value
        return new


class _PoolWorker:
    """One of the pool's processes (an actor): runs the initializer once, then chunks."""

    def __init__(self, initializer: Callable[..., object] | None, initargs: tuple[Any, ...]) -> None:
        self.namespaces = Namespaces()
        if initializer is not None:
            self.namespaces.bind(initializer)(*initargs)

    def pid(self) -> int:
        return os.getpid()

    def run(self, fn: Callable[..., Any] | _Call, chunk: list[Any],
            star: bool) -> list[Any] | _Failed:
        f = fn.bind_in(self.namespaces) if isinstance(fn, _Call) else self.namespaces.bind(fn)
        try:
            if star:
                return [f(*args) for args in chunk]
            return [f(arg) for arg in chunk]
        except BaseException as exc:  # noqa: BLE001 - the caller re-raises it as itself
            return _Failed(_portable(exc), traceback.format_exc())

    def run_many(self, calls: list[tuple[Callable[..., Any] | _Call, list[Any], bool]]
                 ) -> list[list[Any] | _Failed]:
        """Several chunks in one call (the pool groups them while its queue is long)."""
        return [self.run(fn, chunk, star) for fn, chunk, star in calls]


# ---------------------------------------------------------------- results

class ApplyResult:
    """The result of apply_async (``multiprocessing.pool.AsyncResult``); ``callback``
    gets the value, ``error_callback`` the exception, on the pool's result thread."""

    def __init__(self, callback: Callable[[Any], object] | None,
                 error_callback: Callable[[BaseException], object] | None) -> None:
        self._event = threading.Event()
        self._callback, self._error_callback = callback, error_callback
        self._success = False
        self._value: Any = None

    def ready(self) -> bool:
        """Whether the call has completed."""
        return self._event.is_set()

    def successful(self) -> bool:
        """Whether the call completed without raising; ValueError if not ready."""
        if not self.ready():
            raise ValueError(f"{self!r} not ready")
        return self._success

    def wait(self, timeout: float | None = None) -> None:
        """Wait until the result is available, at most ``timeout`` seconds."""
        self._event.wait(timeout)

    def get(self, timeout: float | None = None) -> Any:
        """The result when it arrives; the call's exception raised as itself; after
        ``timeout`` seconds, ``multiprocessing.TimeoutError``."""
        self.wait(timeout)
        if not self.ready():
            raise multiprocessing.TimeoutError
        if self._success:
            return self._value
        raise self._value

    def _chunk_done(self, index: int, ok: bool, value: Any) -> None:
        self._set(ok, value[0] if ok else value)

    def _set(self, ok: bool, value: Any) -> None:
        self._success, self._value = ok, value
        callback = self._callback if ok else self._error_callback
        try:
            if callback is not None:
                callback(value)
        except Exception:  # noqa: BLE001 - shown, and the result still comes
            traceback.print_exc()
        finally:
            self._event.set()


AsyncResult = ApplyResult


class MapResult(ApplyResult):
    """The result of map_async / starmap_async: a list, or the first chunk's error
    (``n_chunks`` chunks of ``chunksize`` of the ``n_items`` items; ``callback`` and
    ``error_callback`` as ApplyResult's)."""

    def __init__(self, n_chunks: int, n_items: int, chunksize: int,
                 callback: Callable[[Any], object] | None,
                 error_callback: Callable[[BaseException], object] | None) -> None:
        super().__init__(callback, error_callback)
        self._items: list[Any] = [None] * n_items
        self._chunksize = chunksize
        self._left = n_chunks
        self._lock = threading.Lock()
        if n_chunks == 0:
            self._set(True, [])

    def _chunk_done(self, index: int, ok: bool, value: Any) -> None:
        with self._lock:
            if self._left <= 0:
                return   # failed already: the first error stands
            if ok:
                self._items[index * self._chunksize: index * self._chunksize + len(value)] = value
                self._left -= 1
                if self._left:
                    return
            else:
                self._left = 0
        self._set(ok, self._items if ok else value)


class IMapIterator:
    """The iterator of imap (``ordered`` True) and imap_unordered; ``next(timeout)``
    raises ``multiprocessing.TimeoutError``."""

    def __init__(self, ordered: bool) -> None:
        self._ordered = ordered
        self._cond = threading.Condition()
        # Under _cond: chunks come in as (ok, the chunk's results or its error).
        self._chunks: dict[int, tuple[bool, Any]] = {}   # ordered: those ahead of their turn
        self._ready: collections.deque[tuple[bool, Any]] = collections.deque()
        self._next_chunk = 0
        self._n_chunks: int | None = None   # known once the input is consumed
        self._came = 0                      # chunks in _ready so far
        # The caller's own: the chunk being handed out, item by item, without the lock.
        self._current: Iterator[Any] | None = None
        self._taken = 0

    def __iter__(self) -> IMapIterator:
        return self

    def _set_length(self, n_chunks: int) -> None:
        with self._cond:
            self._n_chunks = n_chunks
            self._cond.notify_all()

    def _chunk_done(self, index: int, ok: bool, value: Any) -> None:
        with self._cond:
            if self._ordered:
                self._chunks[index] = (ok, value)
                while self._next_chunk in self._chunks:
                    self._ready.append(self._chunks.pop(self._next_chunk))
                    self._next_chunk += 1
            else:
                self._ready.append((ok, value))
            self._cond.notify_all()

    def next(self, timeout: float | None = None) -> Any:
        """The next result, waiting at most ``timeout`` seconds (then
        ``multiprocessing.TimeoutError``); a task's exception is raised as itself."""
        current = self._current
        if current is not None:
            for value in current:
                return value
            self._current = None
        with self._cond:
            while not self._ready:
                if self._n_chunks is not None and self._taken >= self._n_chunks:
                    raise StopIteration
                if not self._cond.wait(timeout):
                    raise multiprocessing.TimeoutError
            ok, value = self._ready.popleft()
            self._taken += 1
        if not ok:
            raise value
        self._current = iter(value)
        return next(self._current)   # a chunk is never empty

    __next__ = next


# ---------------------------------------------------------------- the pool

class Pool:
    """A process pool on the cluster, with ``multiprocessing.Pool``'s interface.

    ``processes``: how many of the pool's processes (actors, one CPU each) across the
    cluster (default: the cluster's CPUs). ``initializer(*initargs)`` runs once in each;
    ``maxtasksperchild``: a process is replaced after that many tasks (chunks).
    ``address`` (or ``ray_address``): the cluster to connect to when this process has
    none yet (default: ORCHESTRA_ADDRESS, else a local cluster starts).
    ``orchestra_remote_args`` (or ``ray_remote_args``): options of the pool's actors
    (``num_cpus``, ``resources``, ...). ``context`` is accepted and ignored (the
    processes are the cluster's)."""

    def __init__(self, processes: int | None = None,
                 initializer: Callable[..., object] | None = None,
                 initargs: Iterable[Any] = (), maxtasksperchild: int | None = None,
                 context: Any = None, *, address: str | None = None,
                 ray_address: str | None = None,
                 orchestra_remote_args: dict[str, Any] | None = None,
                 ray_remote_args: dict[str, Any] | None = None) -> None:
        from .._api.session import cluster_resources, init, is_initialized
        if initializer is not None and not callable(initializer):
            raise TypeError("initializer must be a callable")
        if maxtasksperchild is not None and (
                isinstance(maxtasksperchild, bool) or not isinstance(maxtasksperchild, int)
                or maxtasksperchild < 1):
            raise ValueError("maxtasksperchild must be a positive int or None, "
                             f"got {maxtasksperchild!r}")
        if processes is not None and (isinstance(processes, bool) or not isinstance(processes, int)):
            raise TypeError(f"processes must be an int or None, got {processes!r}")
        if processes is not None and processes < 1:
            raise ValueError("Number of processes must be at least 1")
        if not is_initialized():
            init(address=address or ray_address)
        options = {"num_cpus": 1, **(orchestra_remote_args or ray_remote_args or {})}
        cpus = cluster_resources().get("CPU", 0.0)
        per = float(options.get("num_cpus") or 0)
        most = int(cpus // per) if per else None
        if processes is None:
            processes = max(1, most if most is not None else int(cpus) or 1)
        elif most is not None and processes > most:
            raise ValueError(
                f"Pool(processes={processes}): the cluster has {cpus:g} CPUs, room for "
                f"{most} pool processes of {per:g} CPU each. Ask for fewer processes, add "
                "nodes, or give the pool's processes fewer CPUs (orchestra_remote_args="
                "{'num_cpus': 0.5}).")
        self._processes = processes
        self._initializer = initializer
        self._initargs = tuple(initargs)
        self._maxtasksperchild = maxtasksperchild
        self._options = options
        self._lock = threading.Lock()
        self._idle = threading.Condition(self._lock)   # the queue drained, nothing out
        self._book = PoolBook(processes, maxtasksperchild)   # under _lock
        self._worker_cls = _worker_class()
        self._actors = [self._new_actor() for _ in range(processes)]   # by slot, under _lock

    @property
    def _state(self) -> str:
        return self._book.state

    def _new_actor(self) -> Any:
        return self._worker_cls.options(**self._options).remote(self._initializer, self._initargs)

    # ------------------------------------------------------------ submitting
    def _check_running(self) -> None:
        if self._book.state != RUN:
            raise ValueError("Pool not running")

    def _submit(self, result: Any, fn: Callable[..., Any] | _Call, chunks: Iterable[list[Any]],
                star: bool) -> int:
        """Queue ``chunks`` for ``result``; the number of chunks."""
        n = 0
        for i, chunk in enumerate(chunks):
            with self._lock:
                self._book.add((result, i, fn, chunk, star))
                started = self._send()
            self._watch(started)
            n += 1
        return n

    def _send(self) -> list[tuple[Any, int]]:
        """Send the calls the book says to (holding _lock): (ref, call id) each."""
        started = []
        for call, slot, entries in self._book.pump():
            actor = self._actors[slot]
            if len(entries) == 1:
                _, _, fn, chunk, star = entries[0]
                ref = actor.run.remote(fn, chunk, star)
            else:
                ref = actor.run_many.remote([e[2:] for e in entries])
            started.append((ref, call))
        return started

    def _watch(self, started: list[tuple[Any, int]]) -> None:
        for ref, call in started:
            ref.future().add_done_callback(lambda fut, call=call: self._done(call, fut))

    def _done(self, call: int, fut: Future[Any]) -> None:
        """A call came back (on the futures thread): its chunks' results, the next calls."""
        exc = fut.exception()
        old = None
        with self._lock:
            got = self._book.done(call, isinstance(exc, ActorDiedError))
            if got is None:
                return   # terminated meanwhile: failed already
            entries, replace, slot = got
            if replace:   # died, or maxtasksperchild: a fresh process (initializer again)
                old, self._actors[slot] = self._actors[slot], self._new_actor()
            started = self._send()
            if self._book.drained():
                self._idle.notify_all()
        if old is not None:
            _kill_quietly(old)
        self._watch(started)
        if exc is not None:
            outcomes: list[Any] = [exc] * len(entries)
        else:
            outcomes = fut.result() if len(entries) > 1 else [fut.result()]
        for (result, index, *_), value in zip(entries, outcomes, strict=True):
            if isinstance(value, BaseException):
                result._chunk_done(index, False, value)
            elif isinstance(value, _Failed):
                value.exc.__cause__ = RemoteTraceback(f'\n"""\n{value.tb}"""')
                result._chunk_done(index, False, value.exc)
            else:
                result._chunk_done(index, True, value)

    # ------------------------------------------------------------ the API
    def apply(self, func: Callable[..., Any], args: Iterable[Any] = (),
              kwds: dict[str, Any] | None = None) -> Any:
        """``func(*args, **kwds)`` in one of the pool's processes; its result."""
        return self.apply_async(func, args, kwds).get()

    def apply_async(self, func: Callable[..., Any], args: Iterable[Any] = (),
                    kwds: dict[str, Any] | None = None,
                    callback: Callable[[Any], object] | None = None,
                    error_callback: Callable[[BaseException], object] | None = None) -> ApplyResult:
        """``func(*args, **kwds)`` in one of the pool's processes; an AsyncResult.
        ``callback(result)`` or ``error_callback(exception)`` runs when it ends."""
        self._check_running()
        result = ApplyResult(callback, error_callback)
        call = _Call(func, kwds or {})
        self._submit(result, call, [[tuple(args)]], True)
        return result

    def map(self, func: Callable[[Any], Any], iterable: Iterable[Any],
            chunksize: int | None = None) -> list[Any]:
        """``[func(x) for x in iterable]`` over the pool, in chunks of ``chunksize``
        items (default: about four chunks per process)."""
        return self._map_async(func, iterable, chunksize, False, None, None).get()

    def map_async(self, func: Callable[[Any], Any], iterable: Iterable[Any],
                  chunksize: int | None = None,
                  callback: Callable[[Any], object] | None = None,
                  error_callback: Callable[[BaseException], object] | None = None) -> MapResult:
        """map(``func``, ``iterable``, ``chunksize``) without waiting: a MapResult;
        ``callback(list)`` or ``error_callback(exception)`` runs when it ends."""
        return self._map_async(func, iterable, chunksize, False, callback, error_callback)

    def starmap(self, func: Callable[..., Any], iterable: Iterable[Iterable[Any]],
                chunksize: int | None = None) -> list[Any]:
        """``[func(*args) for args in iterable]`` over the pool (``chunksize`` as map's)."""
        return self._map_async(func, iterable, chunksize, True, None, None).get()

    def starmap_async(self, func: Callable[..., Any], iterable: Iterable[Iterable[Any]],
                      chunksize: int | None = None,
                      callback: Callable[[Any], object] | None = None,
                      error_callback: Callable[[BaseException], object] | None = None) -> MapResult:
        """starmap(``func``, ``iterable``, ``chunksize``) without waiting: a MapResult,
        with ``callback`` and ``error_callback`` as map_async's."""
        return self._map_async(func, iterable, chunksize, True, callback, error_callback)

    def _map_async(self, func: Callable[..., Any], iterable: Iterable[Any],
                   chunksize: int | None, star: bool,
                   callback: Callable[[Any], object] | None,
                   error_callback: Callable[[BaseException], object] | None) -> MapResult:
        self._check_running()
        items = list(iterable)
        if star:
            items = [tuple(a) for a in items]
        if chunksize is None:
            chunksize, extra = divmod(len(items), self._processes * 4)
            if extra:
                chunksize += 1
        chunksize = _check_chunksize(chunksize, allow_zero_items=not items)
        chunks = [items[i: i + chunksize] for i in range(0, len(items), chunksize)]
        result = MapResult(len(chunks), len(items), chunksize, callback, error_callback)
        self._submit(result, func, chunks, star)
        return result

    def imap(self, func: Callable[[Any], Any], iterable: Iterable[Any],
             chunksize: int = 1) -> IMapIterator:
        """``func`` over ``iterable``, results in order as they come: an iterator
        (``next(timeout)``), ``chunksize`` items per task."""
        return self._imap(func, iterable, chunksize, True)

    def imap_unordered(self, func: Callable[[Any], Any], iterable: Iterable[Any],
                       chunksize: int = 1) -> IMapIterator:
        """As imap(``func``, ``iterable``, ``chunksize``), results in the order they
        finish."""
        return self._imap(func, iterable, chunksize, False)

    def _imap(self, func: Callable[[Any], Any], iterable: Iterable[Any], chunksize: int,
              ordered: bool) -> IMapIterator:
        self._check_running()
        chunksize = _check_chunksize(chunksize)
        it = IMapIterator(ordered)
        source = iter(iterable)
        chunks = iter(lambda: list(itertools.islice(source, chunksize)), [])
        it._set_length(self._submit(it, func, chunks, False))
        return it

    # ------------------------------------------------------------ lifetime
    def close(self) -> None:
        """No more work; the processes exit once what was submitted is done (join)."""
        with self._lock:
            self._book.close()

    def terminate(self) -> None:
        """Stop the processes now; results not in yet fail."""
        with self._lock:
            if self._book.state == TERMINATE:
                return
            pending = self._book.terminate()
            self._idle.notify_all()
        error = RuntimeError("the pool was terminated before this result came")
        for result, index, *_ in pending:
            result._chunk_done(index, False, error)
        for actor in self._actors:
            _kill_quietly(actor)

    def join(self) -> None:
        """Wait for the work submitted to finish, then for the processes to go; close()
        or terminate() first."""
        if self._book.state == RUN:
            raise ValueError("Pool is still running")
        with self._lock:
            while self._book.state != TERMINATE and not self._book.drained():
                self._idle.wait()
        self.terminate()

    def __enter__(self) -> Pool:
        self._check_running()
        return self

    def __exit__(self, *exc: object) -> None:
        self.terminate()

    def __del__(self) -> None:
        book = getattr(self, "_book", None)
        if book is not None and book.state != TERMINATE and not sys.is_finalizing():
            try:
                self.terminate()
            except Exception:  # noqa: BLE001 - the session is gone: so are the actors
                pass

    def __repr__(self) -> str:
        return f"<{type(self).__module__}.Pool state={self._state} pool_size={self._processes}>"

    def __reduce__(self) -> Any:
        raise NotImplementedError("pool objects cannot be passed between processes or pickled")


def _kill_quietly(actor: Any) -> None:
    from .._api.actor import kill
    try:
        kill(actor)
    except Exception:  # noqa: BLE001 - dead already, or the session is gone (so is it)
        pass


class _Call:
    """apply_async's function with its keyword arguments, run with star arguments."""

    __slots__ = ("fn", "kwds")

    def __init__(self, fn: Callable[..., Any], kwds: dict[str, Any]) -> None:
        self.fn, self.kwds = fn, kwds

    def bind_in(self, namespaces: Namespaces) -> Callable[..., Any]:
        fn, kwds = namespaces.bind(self.fn), self.kwds
        return lambda *args: fn(*args, **kwds)


def _check_chunksize(chunksize: Any, allow_zero_items: bool = False) -> int:
    if isinstance(chunksize, bool) or not isinstance(chunksize, int):
        raise TypeError(f"chunksize must be an int, got {chunksize!r}")
    if chunksize < 1:
        if allow_zero_items and chunksize == 0:
            return 1
        raise ValueError(f"Chunksize must be 1+, not {chunksize}")
    return chunksize


_WORKER: Any = None


def _worker_class() -> Any:
    """The pool's actor class (made once per process: @remote needs the session's API)."""
    global _WORKER
    if _WORKER is None:
        from .._api.remote import remote
        _WORKER = remote(_PoolWorker)
    return _WORKER

