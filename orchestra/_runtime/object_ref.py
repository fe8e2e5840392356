"""ObjectRef: a handle to an object in the cluster, counted while it lives.

Each process counts its own refs (CoreClient.add_ref / remove_ref) and tells the
scheduler only when its count of an id goes 0 -> 1 or 1 -> 0. Pickling a ref records
its id in the value being serialized, so the object that contains it keeps it alive.
"""
from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any, Generic, Protocol, TypeVar

from .._objects.serialization import note_contained_ref

if TYPE_CHECKING:
    from collections.abc import Generator
    from concurrent.futures import Future

# The value's type, for type checkers: ``get(ref)`` of an ``ObjectRef[int]`` is an int.
# Covariant: a ref only hands its value out. (Generic adds nothing to making a ref:
# typing.Generic has no __new__ since Python 3.9.)
R_co = TypeVar("R_co", covariant=True)


class RefCounter(Protocol):
    """What a ref uses of the process's connection (CoreClient): its counts."""

    @property
    def add_ref(self) -> Callable[[bytes, bool], None]: ...
    @property
    def remove_ref(self) -> Callable[[bytes], None]: ...


class ObjectRef(Generic[R_co]):
    """A reference to a value that a task returns or ``put`` stored (``ObjectRef[T]``
    to a type checker: its value is a T). Pass it to ``get`` for the value, to
    ``wait``/``as_completed`` to learn when it is ready, or to another task as an
    argument (it arrives as its value). Equal refs name the same object.

    Made by orchestra, never by hand: ``f.remote(...)``, ``handle.m.remote(...)`` and
    ``put(value)`` return refs. ``object_id`` is the object's id, ``client`` the
    process's connection that counts the ref, ``counted`` whether the head already
    counts it."""

    __slots__ = ("_id", "_client", "__weakref__")

    def __init__(self, object_id: bytes, client: RefCounter, counted: bool = False) -> None:
        self._id = object_id
        self._client = client
        client.add_ref(object_id, counted)

    def __del__(self) -> None:
        client = self._client
        if client is not None:
            client.remove_ref(self._id)

    def binary(self) -> bytes:
        """The object's id, as bytes."""
        return self._id

    def hex(self) -> str:
        """The object's id, as a hex string."""
        return self._id.hex()

    def __repr__(self) -> str:
        return f"ObjectRef({self._id.hex()})"

    def __eq__(self, other: object) -> bool:
        return isinstance(other, ObjectRef) and other._id == self._id

    def __hash__(self) -> int:
        return hash(self._id)

    def __reduce__(self) -> tuple[Any, ...]:
        note_contained_ref(self._id)
        return (_rebuild_ref, (self._id,))

    def future(self) -> Future[R_co]:
        """A ``concurrent.futures.Future`` of the value (its exception: the task's error).
        One thread per process resolves every ref's Future (_runtime/futures.py)."""
        from .futures import future_of
        return future_of(self)

    def __await__(self) -> Generator[Any, None, R_co]:
        """``await ref`` inside async code: the value, while the loop keeps running (an
        asyncio wrap of ``future()``: no thread per awaited ref)."""
        import asyncio
        return asyncio.wrap_future(self.future()).__await__()


def _rebuild_ref(object_id: bytes) -> ObjectRef[Any]:
    from .context import current_client
    return ObjectRef(object_id, current_client())
