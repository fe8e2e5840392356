"""ActorPool: spread calls over a fixed set of actors, one call per actor at a time,
with Ray's semantics (``ray.util.ActorPool``), method for method.

    submit(fn, v) -> an idle actor: ref = fn(actor, v), kept with its index and actor
                  -> none idle: (fn, v) waits in _pending_submits
    get_next()    -> the result of the oldest submit (in order); the actor is idle
                     again and the oldest pending submit starts on it
    get_next_unordered() -> whichever result is ready first (wait(num_returns=1))

A call whose actor died (ActorDiedError) drops that actor from the pool.
"""
from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from typing import Any, TypeVar

from .._api.session import get, wait
from .._runtime.object_ref import ObjectRef
from ..exceptions import ActorDiedError

V = TypeVar("V")

_TIMEOUT_MSG = "Timed out waiting for result"


class ActorPool:
    """A pool of actors sharing work: ``ActorPool([a1, a2]).map(lambda a, v:
    a.f.remote(v), values)``. Not thread-safe (as in Ray): one thread drives it."""

    def __init__(self, actors: Iterable[Any]) -> None:
        self._idle_actors = list(actors)
        self._future_to_actor: dict[Any, tuple[int, Any]] = {}
        self._index_to_future: dict[int, Any] = {}
        self._next_task_index = 0
        self._next_return_index = 0
        self._pending_submits: list[tuple[Callable[[Any, Any], Any], Any]] = []

    def map(self, fn: Callable[[Any, V], Any], values: Iterable[V]) -> Iterator[Any]:
        """Apply ``fn(actor, value)`` to each value; the results in the values' order.
        Results of earlier submits not fetched yet are dropped first."""
        self._drop_unfetched(ordered=True)
        for v in values:
            self.submit(fn, v)

        def results() -> Iterator[Any]:
            while self.has_next():
                yield self.get_next()
        return results()

    def map_unordered(self, fn: Callable[[Any, V], Any], values: Iterable[V]) -> Iterator[Any]:
        """As map(``fn``, ``values``), the results in the order they finish."""
        self._drop_unfetched(ordered=False)
        for v in values:
            self.submit(fn, v)

        def results() -> Iterator[Any]:
            while self.has_next():
                yield self.get_next_unordered()
        return results()

    def _drop_unfetched(self, ordered: bool) -> None:
        while self.has_next():
            try:
                if ordered:
                    self.get_next(timeout=0, ignore_if_timedout=True)
                else:
                    self.get_next_unordered(timeout=0, ignore_if_timedout=True)
            except TimeoutError:
                pass

    def submit(self, fn: Callable[[Any, V], Any], value: V) -> None:
        """Run ``fn(actor, value)`` (it returns the ref(s) of one actor call) on an idle
        actor, or once one is free."""
        if not callable(fn):
            raise TypeError(f"ActorPool.submit takes fn(actor, value) -> ObjectRef, e.g. "
                            f"lambda a, v: a.method.remote(v); got {fn!r}")
        if self._idle_actors:
            actor = self._idle_actors.pop()
            future = fn(actor, value)
            key = _key(future)
            self._future_to_actor[key] = (self._next_task_index, actor)
            self._index_to_future[self._next_task_index] = future
            self._next_task_index += 1
        else:
            self._pending_submits.append((fn, value))

    def has_next(self) -> bool:
        """Whether a submitted call's result is still to be fetched."""
        return bool(self._future_to_actor)

    def get_next(self, timeout: float | None = None, ignore_if_timedout: bool = False) -> Any:
        """The next result in submit order. TimeoutError after ``timeout`` seconds (the
        call stays next, unless ``ignore_if_timedout``: then it is dropped).
        StopIteration when nothing is pending."""
        if not self.has_next():
            raise StopIteration("No more results to get")
        if self._next_return_index >= self._next_task_index:
            raise ValueError("It is not allowed to call get_next() after get_next_unordered().")
        future = self._index_to_future[self._next_return_index]
        ignored = False
        if timeout is not None:
            ready, _ = wait(list(_refs(future)), num_returns=len(_refs(future)), timeout=timeout)
            if not ready or len(ready) < len(_refs(future)):
                if not ignore_if_timedout:
                    raise TimeoutError(_TIMEOUT_MSG)
                ignored = True
        del self._index_to_future[self._next_return_index]
        self._next_return_index += 1
        _, actor = self._future_to_actor.pop(_key(future))
        if ignored:
            self._return_actor(actor)
            raise TimeoutError(f"{_TIMEOUT_MSG}. The task {future} has been ignored.")
        return self._get_result(future, actor)

    def get_next_unordered(self, timeout: float | None = None,
                           ignore_if_timedout: bool = False) -> Any:
        """Whichever result is ready first. TimeoutError after ``timeout`` seconds (with
        ``ignore_if_timedout``, the oldest pending call is dropped). StopIteration when
        nothing is pending."""
        if not self.has_next():
            raise StopIteration("No more results to get")
        keys = list(self._future_to_actor)
        first_refs = {_refs(k)[0]: k for k in keys}
        ready, _ = wait(list(first_refs), num_returns=1, timeout=timeout)
        ignored = False
        if ready:
            key = first_refs[ready[0]]
        elif not ignore_if_timedout:
            raise TimeoutError(_TIMEOUT_MSG)
        else:
            # Ray names an unbound variable here; the oldest call is the one dropped.
            key = min(keys, key=lambda k: self._future_to_actor[k][0])
            ignored = True
        i, actor = self._future_to_actor.pop(key)
        future = self._index_to_future.pop(i)
        self._next_return_index = max(self._next_return_index, i + 1)
        if ignored:
            self._return_actor(actor)
            raise TimeoutError(f"{_TIMEOUT_MSG}. The task {future} has been ignored.")
        return self._get_result(future, actor)

    def _get_result(self, future: Any, actor: Any) -> Any:
        alive = True
        try:
            return get(future)
        except ActorDiedError:
            alive = False   # a dead actor leaves the pool
            raise
        finally:
            self._return_actor(actor, alive)

    def _return_actor(self, actor: Any, alive: bool = True) -> None:
        if alive:
            self._idle_actors.append(actor)
        if self._pending_submits and self._idle_actors:
            self.submit(*self._pending_submits.pop(0))

    def has_free(self) -> bool:
        """Whether an actor is idle and no submit waits for one."""
        return bool(self._idle_actors) and not self._pending_submits

    def pop_idle(self) -> Any:
        """Take an idle actor out of the pool (None when none is free)."""
        if self.has_free():
            return self._idle_actors.pop()
        return None

    def push(self, actor: Any) -> None:
        """Add an actor to the pool (it takes a waiting submit at once, if any)."""
        busy = [a for _, a in self._future_to_actor.values()]
        if actor in self._idle_actors or actor in busy:
            raise ValueError("Actor already belongs to current ActorPool")
        self._return_actor(actor)


def _key(future: Any) -> Any:
    """A submit's key: its ref, or the tuple of its refs (num_returns > 1)."""
    if isinstance(future, list):
        return tuple(future)
    if not isinstance(future, ObjectRef) and not (
            isinstance(future, tuple) and all(isinstance(r, ObjectRef) for r in future)):
        raise TypeError(f"ActorPool: fn(actor, value) must return the ObjectRef(s) of an "
                        f"actor call (e.g. lambda a, v: a.method.remote(v)), not {future!r}")
    return future


def _refs(future: Any) -> tuple[ObjectRef, ...]:
    if isinstance(future, ObjectRef):
        return (future,)
    return tuple(future)
