"""ObjectRef.future() and ``await ref``: concurrent.futures.Futures resolved by one
thread per process, not one per ref.

    ref.future() -> value here already: a Future resolved at once
                 -> else: RefFutures.pending[id] += Future; the waiter thread (started
                    on demand, gone when nothing is pending) waits in the client's
                    wait_until for any pending id, then resolves the Futures of those
                    that came (their value, or their error as the Future's exception)
    await ref    -> asyncio.wrap_future(ref.future())
"""
from __future__ import annotations

import threading
from concurrent.futures import Future
from typing import TYPE_CHECKING, Any

from ..exceptions import ClusterLostError, ObjectLostError

if TYPE_CHECKING:
    from .context import Client

# How long the waiter waits before looking again when nothing came: it is woken by every
# frame the client reads, so this only bounds how long it lingers.
_WAIT_S = 1.0


class RefFutures:
    """The Futures handed out for one client's refs, and the thread that resolves them."""

    def __init__(self, client: Client) -> None:
        self.client = client
        self.lock = threading.Lock()
        self.pending: dict[bytes, list[tuple[Future[Any], Any]]] = {}
        self.added = False          # a new id since the waiter took its snapshot
        self.thread: threading.Thread | None = None

    def future(self, ref: Any) -> Future[Any]:
        fut: Future[Any] = Future()
        client = self.client
        if ref._id in client.results:
            _resolve(client, fut, ref)
            return fut
        with self.lock:
            self.pending.setdefault(ref._id, []).append((fut, ref))
            self.added = True
            if self.thread is None:
                self.thread = threading.Thread(target=self._run, name="orchestra-futures",
                                               daemon=True)
                self.thread.start()
        client.subscribe_missing([ref._id])
        client.wake()
        return fut

    def _run(self) -> None:
        import time
        client = self.client
        results = client.results
        while True:
            with self.lock:
                ids = list(self.pending)
                self.added = False
                if not ids:
                    self.thread = None
                    return

            def ready(ids: list[bytes] = ids) -> bool:
                return self.added or any(oid in results for oid in ids)
            try:
                client.wait_until(ready, time.monotonic() + _WAIT_S)
            except ClusterLostError as exc:
                self._fail_all(exc)
                return
            came: list[tuple[Future[Any], Any]] = []
            with self.lock:
                for oid in ids:
                    if oid in results:
                        came.extend(self.pending.pop(oid, ()))
            for fut, ref in came:
                _resolve(client, fut, ref)

    def _fail_all(self, exc: BaseException) -> None:
        with self.lock:
            waiting, self.pending = self.pending, {}
            self.thread = None
        for entries in waiting.values():
            for fut, _ in entries:
                if not fut.done():
                    fut.set_exception(exc)


def _resolve(client: Client, fut: Future[Any], ref: Any) -> None:
    if not fut.set_running_or_notify_cancel():
        return   # the caller cancelled the Future: nothing to deliver
    try:
        value = client.values.get_one(ref, 0)
    except BaseException as exc:  # noqa: BLE001 - the task's error is the Future's
        fut.set_exception(exc)
    else:
        fut.set_result(value)


def future_of(ref: Any) -> Future[Any]:
    """A concurrent.futures.Future of ``ref``'s value (or error)."""
    from .context import client_or_none
    client = client_or_none()
    if client is None or ref._client is not client:
        # Waited for on a closed connection, it would never resolve.
        raise ObjectLostError(
            f"{ref!r} belongs to a session that was shut down; refs do not outlive "
            "orchestra.shutdown(). Put the value again, or re-run its task, in this session.")
    if client.lost is not None:
        raise ClusterLostError(client.lost)
    futures = client.__dict__.get("ref_futures")
    if futures is None:
        futures = client.__dict__.setdefault("ref_futures", RefFutures(client))
    result: Future[Any] = futures.future(ref)
    return result
