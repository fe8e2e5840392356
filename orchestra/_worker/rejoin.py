"""A worker's connection to the head: made at start (wire), and made again when the
head was lost while this worker serves an actor (rejoin) or runs a plain task
the head sent (resume).

    start: CoreClient connects (Hello) -> wire(): handlers, direct-call listeners, the
        context's client
    the head's connection closes -> lost(): a worker with nothing worth keeping exits
        (as it always did); one serving an actor on a node that joins again
        ($ORCHESTRA_RECONNECT_S > 0, set by a joined node) lives on: its main thread
        finds the client lost (ClusterLostError) and calls rejoin()
    rejoin(): every _PAUSE_S, for up to $ORCHESTRA_RECONNECT_S, connect with
        Hello(resume_actor=its actor, node_id=its node): accepted -> the new client
        replaces the old one, the actor's state untouched; refused (the head made the
        actor again, or does not know it) or out of time -> False: the worker exits

    resume() (the reader thread that found the head lost, or the main thread whose
        answer met it first): a plain task the head sent runs on (not a generator, not
        an actor's constructor, not a direct call, none nested below it, not one
        blocked in get(): what it waits for went with the head); a thread connects
        with Hello(resume_task=its id), and the restarted head takes the worker back
        as that task's (_scheduler/kept.py). Calls the task makes meanwhile wait for it
        (_context.set_reconnect). answer_again(): the main thread's answer, once
        connected, made there (its results written again: the segments made for the
        head before are gone) and sent; the head then stops the worker. A result
        holding refs cannot be (their objects went with the head): the worker exits,
        and the task runs again when its driver makes it again.

What the old head knew is gone with it: calls in flight there and their callers'
connections (their answers are dropped), objects of its store, lent-worker routes.
The actor's instance and its attributes, a running task and its result, are what
outlive it.

Rule: ``rt.resuming`` is made once per loss under _RESUME_LOCK (by whichever thread
finds the head lost first), set by the connecting thread once the new client runs.
"""
from __future__ import annotations

import collections
import contextlib
import os
import sys
import threading
import time
from collections.abc import Callable
from typing import Any, Protocol

from .._observe.log_capture import LogCapture
from .._protocol import pb
from .._protocol import wire as _wire
from .._runtime import context as _context
from .._runtime.client import CoreClient
from ..exceptions import ClusterLostError, OrchestraError
from . import frames as _frames
from .actors import ActorRuntime


class WorkerRuntime(Protocol):
    """What this module uses of the worker (worker.WorkerRuntime)."""

    sock_path: str
    worker_id: int
    client: CoreClient
    actor: ActorRuntime | None
    logs: LogCapture | None
    cond: threading.Condition
    queue: collections.deque[pb.InvokeCallRequest]
    nested: collections.deque[pb.InvokeCallRequest]
    outer: list[bytes]
    block_depth: int
    running: bytes | None
    answering: pb.InvokeCallRequest | None
    result: Any
    resuming: threading.Event | None
    blocked: bool
    reply_to: dict[bytes, Any]
    holding: dict[bytes, Any]
    heavy: set[bytes]
    direct_streams: dict[bytes, str]
    functions: dict[bytes, pb.RegisterFunctionRequest]
    acks: Any
    events: Any

    def _cancel(self, task_id: bytes, recursive: bool = False) -> None: ...
    def _give_back(self, wanted: set[bytes]) -> None: ...
    def _take_queued(self, wanted: set[bytes], sender: Any) -> list[bytes]: ...
    def _guard(self, fn: Callable[..., Any]) -> Callable[..., Any]: ...
    def _on_block(self, blocking: bool, ids: Any) -> bool: ...
    def _run_nested(self) -> None: ...
    def _on_peer_frame(self, *args: Any) -> Any: ...
    def _report_events(self) -> None: ...
    def finish(self, inv: pb.InvokeCallRequest, result: Any, produced: bool = False) -> pb.TaskDone: ...
    def failed(self, inv: pb.InvokeCallRequest, exc: BaseException) -> pb.TaskDone: ...

# Between two tries to reach a head that is away (its supervisor starts it again).
_PAUSE_S = 0.2


def wait_s() -> float:
    """How long a worker of a joined node waits for a lost head (0: it exits at once)."""
    try:
        return float(os.environ.get("ORCHESTRA_RECONNECT_S", "0"))
    except ValueError:
        return 0.0


def may_rejoin(rt: WorkerRuntime) -> bool:
    """Whether this worker outlives a lost head: it serves an actor (a head with a
    state store keeps the detached ones and those drivers made) and its node joins
    again. One the restarted head does not know is refused, and exits."""
    return rt.actor is not None and wait_s() > 0


def lost(rt: WorkerRuntime) -> None:
    """The client's on_lost (its reader thread): exit, unless this worker rejoins (its
    main thread then finds the client lost and calls rejoin) or resumes its task."""
    if not (may_rejoin(rt) or rt.actor is None and resume(rt)):
        os._exit(1)


def task_lost(name: str) -> None:
    """A task met the head's loss before it had run (locating its arguments, a get of
    its own): that is no failure of the task, and no answer of it may reach the
    restarted head. The worker exits; the task runs again where its driver makes it
    again, as when a worker dies."""
    print(f"orchestra worker: the head was lost while {name}() started: it runs again",
          file=sys.stderr, flush=True)
    os._exit(1)


def connect(rt: WorkerRuntime, hello: pb.Hello, timeout_s: float = 30.0) -> CoreClient:
    """A client for ``hello``, not started (CoreClient.start, once wired)."""
    return CoreClient(rt.sock_path, hello, frames=_frames.table(rt),
                      on_lost=lambda: lost(rt), socket_guard=rt._guard, start=False,
                      connect_timeout_s=timeout_s)


def wire(rt: WorkerRuntime) -> None:
    """Hook rt.client up: the context's client, the worker's handlers, and the
    listeners of direct calls (this node's socket; TCP on a cluster, its address told
    to the head)."""
    client, info = rt.client, rt.client.info
    _context.set_client(client)
    # Calls queued behind a blocking get() of an actor belong to it: never handed back.
    client.values.on_block = rt._on_block if rt.actor is None else None
    client.values.nested_ready = rt.nested.__len__   # type: ignore[assignment]
    client.values.run_nested = rt._run_nested
    client.direct.on_peer_frame = rt._on_peer_frame
    # Callers send calls straight here once the head gives them this address: a
    # driver this worker is lent to (Loan), or callers of the actor it becomes.
    path = os.path.join(info.node_dir or info.session_dir, f"worker-{rt.worker_id}.sock")
    with contextlib.suppress(OSError):
        os.unlink(path)   # this process's own, from before the head was lost
    try:
        client.direct.listen(path)
    except OSError as exc:   # callers stay on the head's path
        print(f"orchestra worker: not taking calls at {path}: {exc}", file=sys.stderr)
    token = os.environ.get("ORCHESTRA_TOKEN", "")
    if info.node_address and token:
        # On a cluster: callers on other nodes too, over TCP with the cluster token.
        try:
            address = client.direct.listen_tcp(info.node_address, token)
            client.send(_wire.WORKER_ADDRESS, pb.WorkerAddress(address=address))
        except (OSError, ValueError) as exc:
            print(f"orchestra worker: no direct calls from other nodes: {exc}",
                  file=sys.stderr)
    client.on_tick = rt._report_events


def rejoin(rt: WorkerRuntime) -> bool:
    """Connect to the head again as the process of the same actor (see the module
    docstring); True once the new client runs."""
    assert rt.actor is not None
    old = rt.client
    old.pacer.stop()
    old.direct.close()
    # What the old head sent or waited for is void; the main thread starts afresh.
    with rt.cond:
        rt.queue.clear()
        rt.nested.clear()
        rt.running = None
        rt.blocked = False
    rt.reply_to.clear()
    rt.holding.clear()
    rt.heavy.clear()
    rt.direct_streams.clear()
    hello = pb.Hello(kind="worker", pid=os.getpid(), workerid=rt.worker_id,
                     node_id=old.info.node_id, resume_actor=rt.actor.spec.actor_id)
    # refused: the actor was made again meanwhile
    if not _reconnect(rt, hello, "this actor"):
        return False
    print(f"orchestra worker: serving actor {rt.actor.spec.class_name} again after "
          "the head's restart", file=sys.stderr, flush=True)
    return True


def _reconnect(rt: WorkerRuntime, hello: pb.Hello, what: str) -> bool:
    """Connect to the restarted head with ``hello`` until it answers, for as long as
    this worker waits (wait_s); the new client wired and started. False: out of time,
    or the head refused to take ``what`` back (said on stderr)."""
    deadline = time.monotonic() + wait_s()
    while time.monotonic() < deadline:
        time.sleep(_PAUSE_S)
        try:
            client = connect(rt, hello, timeout_s=5.0)
        except ClusterLostError:   # away, or its node not joined again yet
            continue
        except OrchestraError as exc:
            print(f"orchestra worker: the restarted head did not take {what} back: {exc}",
                  file=sys.stderr, flush=True)
            return False
        rt.client = client
        if rt.logs is not None:
            rt.logs.rebind(client.send_raw)
        wire(rt)
        client.start()
        return True
    return False


_RESUME_LOCK = threading.Lock()


def resume(rt: WorkerRuntime) -> bool:
    """The head was lost: whether this worker's task runs on and answers the restarted
    head (a thread connects to it, once per loss). See the module docstring."""
    inv = rt.answering
    call = inv.call if inv is not None else None
    if call is None or wait_s() <= 0 or rt.outer or rt.block_depth or call.generator \
            or call.HasField("actor") or call.task_id in rt.reply_to:
        return False
    with _RESUME_LOCK:
        if rt.resuming is None or rt.resuming.is_set() and rt.client.lost is not None:
            rt.resuming = threading.Event()
            _context.set_reconnect(lambda _client: _resumed(rt))
            threading.Thread(target=_connect_again, args=(rt, call.task_id, rt.resuming),
                             name="orchestra-resume", daemon=True).start()
    return True


def _resumed(rt: WorkerRuntime) -> CoreClient | None:
    """(A call of the task while the head is away.) The new client, once connected."""
    ev = rt.resuming
    return rt.client if ev is not None and ev.wait(wait_s() + 5.0) else None


def _connect_again(rt: WorkerRuntime, task_id: bytes, done: threading.Event) -> None:
    """(Its own thread.) Connect to the restarted head as the worker running
    ``task_id``; out of time, or refused: the worker exits (the task runs again when its
    driver makes it again)."""
    old = rt.client
    old.pacer.stop()
    old.direct.close()
    with rt.cond:   # what the old head queued behind the task is made again by it
        rt.queue.clear()
        rt.nested.clear()
    hello = pb.Hello(kind="worker", pid=os.getpid(), workerid=rt.worker_id,
                     node_id=old.info.node_id, resume_task=task_id)
    if not _reconnect(rt, hello, "this task"):
        os._exit(1)
    print("orchestra worker: answering the restarted head for the task it runs",
          file=sys.stderr, flush=True)
    done.set()


def answer_again(rt: WorkerRuntime, inv: pb.InvokeCallRequest,
                 done: pb.TaskDone | None) -> pb.TaskDone:
    """(The main thread.) The answer to ``inv`` for the restarted head, once connected:
    ``done`` as it is when it holds no segment of the head before, else made again from
    the task's result (None: made again). Exits when it cannot be."""
    ev = rt.resuming
    if ev is None or not ev.wait(wait_s() + 5.0):
        os._exit(1)
    if done is None or any(r.HasField("segment") for r in done.returns):
        try:
            done = rt.finish(inv, rt.result)
        except ClusterLostError:
            os._exit(1)   # lost again: its driver makes it again
        except BaseException as exc:  # noqa: BLE001 - as a result that cannot be made
            done = rt.failed(inv, exc)
    if any(r.contained for r in done.returns):
        print("orchestra worker: a result holding refs cannot outlive the head: the task "
              "runs again", file=sys.stderr, flush=True)
        os._exit(1)
    return done
