"""Queue: a FIFO queue shared by the driver, tasks and actors, as Ray's
``ray.util.queue.Queue``: the items live in an async actor's ``asyncio.Queue``.

    Queue(maxsize) -> _QueueActor (async: a blocked get or put waits as a coroutine, so
                      thousands can wait at once and none holds a thread)
    put/get        -> one actor call each; a timeout or a full/empty queue comes back
                      as a status, raised here as Full/Empty (not a TaskError)
    pickled        -> the actor handle travels: pass the Queue to tasks and actors

Empty and Full subclass queue.Empty and queue.Full, so code written for the standard
library's queues catches them.
"""
from __future__ import annotations

import asyncio
import math
import queue as _stdqueue
from collections.abc import Iterable
from typing import Any

from .._api.actor import kill
from .._api.remote import remote
from .._api.session import get, wait
from .._checks import is_int, is_number


class Empty(_stdqueue.Empty):
    """get() found the queue empty (at once, or for ``timeout`` seconds)."""


class Full(_stdqueue.Full):
    """put() found the queue full (at once, or for ``timeout`` seconds)."""


_OK, _EMPTY, _FULL = 0, 1, 2


class _QueueActor:
    """The queue itself, inside an async actor. Methods answer (status, value)."""

    def __init__(self, maxsize: int) -> None:
        self.maxsize = maxsize
        self.queue: asyncio.Queue[Any] = asyncio.Queue(maxsize)

    def qsize(self) -> int:
        return self.queue.qsize()

    def empty(self) -> bool:
        return self.queue.empty()

    def full(self) -> bool:
        return self.queue.full()

    async def put(self, item: object, timeout: float | None = None) -> tuple[int, Any]:
        try:
            await asyncio.wait_for(self.queue.put(item), timeout)
        except asyncio.TimeoutError:
            return _FULL, None
        return _OK, None

    async def get(self, timeout: float | None = None) -> tuple[int, Any]:
        try:
            return _OK, await asyncio.wait_for(self.queue.get(), timeout)
        except asyncio.TimeoutError:
            return _EMPTY, None

    async def put_nowait(self, item: object) -> tuple[int, Any]:
        try:
            self.queue.put_nowait(item)
        except asyncio.QueueFull:
            return _FULL, None
        return _OK, None

    async def put_nowait_batch(self, items: list[object]) -> tuple[int, Any]:
        if self.maxsize > 0 and len(items) + self.queue.qsize() > self.maxsize:
            return _FULL, (f"Cannot add {len(items)} items to queue of size "
                           f"{self.queue.qsize()} and maxsize {self.maxsize}.")
        for item in items:
            self.queue.put_nowait(item)
        return _OK, None

    async def get_nowait(self) -> tuple[int, Any]:
        try:
            return _OK, self.queue.get_nowait()
        except asyncio.QueueEmpty:
            return _EMPTY, None

    async def get_nowait_batch(self, num_items: int) -> tuple[int, Any]:
        if num_items > self.queue.qsize():
            return _EMPTY, f"Cannot get {num_items} items from queue of size {self.queue.qsize()}."
        return _OK, [self.queue.get_nowait() for _ in range(num_items)]

    def terminate(self) -> None:
        from .._api.actor import exit_actor
        exit_actor()


def _answer(reply: tuple[int, Any], what: str) -> Any:
    status, value = reply
    if status == _OK:
        return value
    if status == _EMPTY:
        raise Empty(value or f"the queue is empty ({what})")
    raise Full(value or f"the queue is full ({what})")


def _check_timeout(block: bool, timeout: float | None) -> None:
    if timeout is None:
        return
    if not is_number(timeout) or math.isnan(timeout) \
            or timeout < 0:
        raise ValueError(f"'timeout' must be a non-negative number or None, got {timeout!r}")


class Queue:
    """A first-in first-out queue any task or actor can use (pass the Queue to it).

    ``maxsize`` <= 0: unbounded. ``actor_options``: options of the actor holding the
    items (e.g. {"num_cpus": 0, "name": "work"})."""

    def __init__(self, maxsize: int = 0, actor_options: dict[str, Any] | None = None) -> None:
        if not is_int(maxsize):
            raise TypeError(f"Queue(maxsize=...) takes an int (0: unbounded), got {maxsize!r}")
        if actor_options is not None and not isinstance(actor_options, dict):
            raise TypeError(f"actor_options must be a dict of actor options, got {actor_options!r}")
        self.maxsize = maxsize
        self.actor: Any = remote(_QueueActor).options(**(actor_options or {})).remote(maxsize)

    def _actor(self) -> Any:
        if self.actor is None:
            raise RuntimeError("this Queue was shut down (Queue.shutdown()); make a new one")
        return self.actor

    def __len__(self) -> int:
        return self.size()

    def size(self) -> int:
        """How many items are in the queue now."""
        return int(get(self._actor().qsize.remote()))

    def qsize(self) -> int:
        """The number of items in the queue now (``size()``)."""
        return self.size()

    def empty(self) -> bool:
        """Whether the queue holds no item now."""
        return bool(get(self._actor().empty.remote()))

    def full(self) -> bool:
        """Whether the queue holds ``maxsize`` items now (never, for maxsize 0)."""
        return bool(get(self._actor().full.remote()))

    def put(self, item: object, block: bool = True, timeout: float | None = None) -> None:
        """Add an item; with ``block``, wait up to ``timeout`` (None: forever) for room,
        else raise Full."""
        _check_timeout(block, timeout)
        if not block:
            _answer(get(self._actor().put_nowait.remote(item)), "put_nowait")
        else:
            _answer(get(self._actor().put.remote(item, timeout)), f"put() waited {timeout} s")

    async def put_async(self, item: object, block: bool = True,
                        timeout: float | None = None) -> None:
        """put() for async code: awaits instead of blocking the event loop. ``item``,
        ``block``, ``timeout``: as for put()."""
        _check_timeout(block, timeout)
        if not block:
            _answer(await self._actor().put_nowait.remote(item), "put_nowait")
        else:
            _answer(await self._actor().put.remote(item, timeout), f"put_async() waited {timeout} s")

    def get(self, block: bool = True, timeout: float | None = None) -> Any:
        """Take the oldest item; with ``block``, wait up to ``timeout`` (None: forever)
        for one, else raise Empty."""
        _check_timeout(block, timeout)
        if not block:
            return _answer(get(self._actor().get_nowait.remote()), "get_nowait")
        return _answer(get(self._actor().get.remote(timeout)), f"get() waited {timeout} s")

    async def get_async(self, block: bool = True, timeout: float | None = None) -> Any:
        """get() for async code: awaits instead of blocking the event loop. ``block``,
        ``timeout``: as for get()."""
        _check_timeout(block, timeout)
        if not block:
            return _answer(await self._actor().get_nowait.remote(), "get_nowait")
        return _answer(await self._actor().get.remote(timeout), f"get_async() waited {timeout} s")

    def put_nowait(self, item: object) -> None:
        """Add ``item`` if there is room now, else raise Full."""
        self.put(item, block=False)

    def put_nowait_batch(self, items: Iterable[object]) -> None:
        """Add all items at once, or none (Full) if they do not all fit."""
        if not isinstance(items, Iterable):
            raise TypeError("Argument 'items' must be an Iterable")
        _answer(get(self._actor().put_nowait_batch.remote(list(items))), "put_nowait_batch")

    def get_nowait(self) -> Any:
        """Take an item if there is one now, else raise Empty."""
        return self.get(block=False)

    def get_nowait_batch(self, num_items: int) -> list[Any]:
        """Take ``num_items`` items at once, or none (Empty) if there are fewer."""
        if not is_int(num_items):
            raise TypeError("Argument 'num_items' must be an int")
        if num_items < 0:
            raise ValueError("'num_items' must be nonnegative")
        result: list[Any] = _answer(get(self._actor().get_nowait_batch.remote(num_items)),
                                    "get_nowait_batch")
        return result

    def shutdown(self, force: bool = False, grace_period_s: float = 5) -> None:
        """Stop the queue's actor: at once with ``force``, else it exits by itself,
        killed if it has not within ``grace_period_s``. Items left are lost."""
        if self.actor is None:
            return
        if force:
            kill(self.actor, no_restart=True)
        else:
            done = self.actor.terminate.remote()
            ready, _ = wait([done], timeout=grace_period_s)
            if not ready:
                kill(self.actor, no_restart=True)
        self.actor = None


__all__ = ["Queue", "Empty", "Full"]
