"""The actor a worker serves, for concurrent actors: calls on threads
(max_concurrency > 1) or as coroutines on one uvloop event loop (async actors).

    submit(inv) -> a thread of the pool, or a coroutine on the actor's loop (at most
        max_concurrency at once) -> worker.prepare -> the method -> worker.finish or
        worker.failed -> worker.send_done (or a cancelled answer)
    cancel(task id) -> the coroutine gets CancelledError where it awaits; a thread runs on
        and its result is dropped

A sync actor with max_concurrency=1 runs its calls in the worker's main thread
(worker.py); this class holds its instance all the same.
"""
from __future__ import annotations

import threading
from typing import Any, Protocol

from .._protocol import pb
from .producer import produce_async


class CallRunner(Protocol):
    """What an actor's calls use of their worker (worker.WorkerRuntime)."""

    def prepare(self, inv: pb.InvokeCallRequest) -> tuple[Any, list[Any], dict[str, Any]]: ...
    def finish(self, inv: pb.InvokeCallRequest, result: Any,
               produced: bool = False) -> pb.TaskDone: ...
    def failed(self, inv: pb.InvokeCallRequest, exc: BaseException) -> pb.TaskDone: ...
    def send_done(self, done: pb.TaskDone) -> None: ...


class ActorRuntime:
    """The actor this worker serves: its instance and how its calls run.

    max_concurrency=1 sync actors run calls one at a time in the main thread (in order,
    cancellable). max_concurrency=n>1 runs them on n threads; async actors run them as
    coroutines on one uvloop event loop, at most max_concurrency at once.
    """

    def __init__(self, worker: CallRunner, spec: pb.ActorSpec, instance: Any,
                 gpu_ids: list[int]) -> None:
        self.worker = worker
        self.gpu_ids = gpu_ids
        self.spec = spec
        self.instance = instance
        self.concurrent = spec.is_async or spec.max_concurrency > 1
        # Calls running on the threads or the loop (their asyncio futures), and those of
        # them cancelled: answered as cancelled whatever they return.
        self.lock = threading.Lock()
        self.running: dict[bytes, Any] = {}
        self.cancelled: set[bytes] = set()
        self.pool: Any = None   # a ThreadPoolExecutor (a threaded actor's)
        self.loop: asyncio.AbstractEventLoop | None = None
        self.sem: Any = None    # an asyncio.Semaphore (an async actor's)
        if spec.is_async:
            import asyncio

            import uvloop
            self.loop = uvloop.new_event_loop()
            self.sem = asyncio.Semaphore(spec.max_concurrency)
            threading.Thread(target=self.loop.run_forever, name="orchestra-actor-loop",
                             daemon=True).start()
        elif spec.max_concurrency > 1:
            from concurrent.futures import ThreadPoolExecutor
            self.pool = ThreadPoolExecutor(spec.max_concurrency, thread_name_prefix="orchestra-actor")

    def submit(self, inv: pb.InvokeCallRequest) -> None:
        with self.lock:
            self.running[inv.call.task_id] = None   # the asyncio task, once it starts
        if self.loop is not None:
            import asyncio
            asyncio.run_coroutine_threadsafe(self._run_async(inv), self.loop)
        else:
            self.pool.submit(self._run_threaded, inv)

    def cancel(self, task_id: bytes) -> None:
        """orchestra.cancel of a call running here: a coroutine gets CancelledError where
        it awaits; a thread cannot be interrupted safely, so it runs on and what it
        returns is dropped. Either way the caller's get raises TaskCancelledError."""
        with self.lock:
            if task_id not in self.running:
                return   # answered already: the result stands
            self.cancelled.add(task_id)
        if self.loop is not None:
            self.loop.call_soon_threadsafe(self._cancel_on_loop, task_id)

    def _cancel_on_loop(self, task_id: bytes) -> None:
        # On the loop's thread, like the start of _run_async: a call cancelled before it
        # started is caught there, one that started has its task here.
        task = self.running.get(task_id)
        if task is not None:
            task.cancel()

    def _was_cancelled(self, task_id: bytes) -> bool:
        with self.lock:
            return task_id in self.cancelled

    def _ended(self, inv: pb.InvokeCallRequest, done: pb.TaskDone | None) -> None:
        """Answer a call; None: it was cancelled (nothing of its result was stored)."""
        tid = inv.call.task_id
        with self.lock:
            self.running.pop(tid, None)
            self.cancelled.discard(tid)
        self.worker.send_done(done if done is not None else pb.TaskDone(task_id=tid, cancelled=True))

    def _run_threaded(self, inv: pb.InvokeCallRequest) -> None:
        w = self.worker
        tid = inv.call.task_id
        try:
            fn, args, kwargs = w.prepare(inv)
            result = fn(*args, **kwargs)
            done = None if self._was_cancelled(tid) else w.finish(inv, result)
        except BaseException as exc:  # noqa: BLE001 - reported to the caller
            done = None if self._was_cancelled(tid) else w.failed(inv, exc)
        self._ended(inv, done)

    async def _run_async(self, inv: pb.InvokeCallRequest) -> None:
        import asyncio
        import inspect
        w = self.worker
        tid = inv.call.task_id
        done = None
        with self.lock:
            started = tid not in self.cancelled
            if started:
                self.running[tid] = asyncio.current_task()
        try:
            if started:
                async with self.sem:
                    try:
                        fn, args, kwargs = w.prepare(inv)
                        result = fn(*args, **kwargs)
                        if inspect.isawaitable(result):
                            result = await result
                        produced = bool(inv.call.generator) and inspect.isasyncgen(result)
                        if produced:   # run here, on this loop
                            result = await produce_async(w, inv.call, result)
                        if not self._was_cancelled(tid):
                            done = w.finish(inv, result, produced)
                    except BaseException as exc:  # noqa: BLE001 - reported to the caller
                        if not self._was_cancelled(tid):
                            done = w.failed(inv, exc)
                        elif isinstance(exc, asyncio.CancelledError):
                            done = _cancelled_while_running(inv, exc)
        except asyncio.CancelledError:   # cancelled while waiting for its turn
            pass
        self._ended(inv, done)


def _cancelled_while_running(inv: pb.InvokeCallRequest, exc: BaseException) -> pb.TaskDone:
    """The answer of an async call cancelled while it ran: cancelled, its returns holding
    a CancelledWhileRunningError (a TaskCancelledError and a TaskError caused by the
    coroutine's CancelledError, as Ray's RayTaskError) with where it was awaiting."""
    import os
    import traceback

    from .._objects.serialization import dumps_exception
    from ..exceptions import CancelledWhileRunningError
    from .calls import error_returns
    call = inv.call
    err = dumps_exception(CancelledWhileRunningError(
        call.name, "".join(traceback.format_exception(exc)), exc, os.getpid()))
    return pb.TaskDone(task_id=call.task_id, cancelled=True, returns=error_returns(call, err))
