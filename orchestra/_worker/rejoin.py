"""A worker's connection to the head: made at start (wire), and made again when the
head was lost while this worker serves a detached actor (rejoin).

    start: CoreClient connects (Hello) -> wire(): handlers, direct-call listeners, the
        context's client
    the head's connection closes -> lost(): a worker with nothing worth keeping exits
        (as it always did); one serving a detached actor on a node that joins again
        ($ORCHESTRA_RECONNECT_S > 0, set by a joined node) lives on: its main thread
        finds the client lost (ClusterLostError) and calls rejoin()
    rejoin(): every _PAUSE_S, for up to $ORCHESTRA_RECONNECT_S, connect with
        Hello(resume_actor=its actor, node_id=its node): accepted -> the new client
        replaces the old one, the actor's state untouched; refused (the head made the
        actor again, or does not know it) or out of time -> False: the worker exits

What the old head knew is gone with it: calls in flight there and their callers'
connections (their answers are dropped), objects of its store, lent-worker routes.
The actor's instance and its attributes are what outlive it.
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
    running: bytes | None
    blocked: bool
    reply_to: dict[bytes, Any]
    holding: dict[bytes, Any]
    heavy: set[bytes]
    direct_streams: dict[bytes, str]

    def _on_frame(self, kind: int, msg: Any) -> None: ...
    def _guard(self, fn: Callable[..., Any]) -> Callable[..., Any]: ...
    def _on_block(self, blocking: bool, ids: Any) -> bool: ...
    def _run_nested(self) -> None: ...
    def _on_peer_frame(self, *args: Any) -> Any: ...
    def _report_events(self) -> None: ...

# Between two tries to reach a head that is away (its supervisor starts it again).
_PAUSE_S = 0.2


def wait_s() -> float:
    """How long a worker of a joined node waits for a lost head (0: it exits at once)."""
    try:
        return float(os.environ.get("ORCHESTRA_RECONNECT_S", "0"))
    except ValueError:
        return 0.0


def may_rejoin(rt: WorkerRuntime) -> bool:
    """Whether this worker outlives a lost head: it serves a detached actor (the one
    kind of actor a restarted head makes again) and its node joins again."""
    return rt.actor is not None and rt.actor.spec.detached and wait_s() > 0


def lost(rt: WorkerRuntime) -> None:
    """The client's on_lost (its reader thread): exit, unless this worker rejoins (its
    main thread then finds the client lost and calls rejoin)."""
    if not may_rejoin(rt):
        os._exit(1)


def connect(rt: WorkerRuntime, hello: pb.Hello, timeout_s: float = 30.0) -> CoreClient:
    """A client for ``hello``, not started (CoreClient.start, once wired)."""
    return CoreClient(rt.sock_path, hello, on_frame=rt._on_frame,
                      on_lost=lambda: lost(rt), socket_guard=rt._guard, start=False,
                      connect_timeout_s=timeout_s)


def wire(rt: WorkerRuntime) -> None:
    """Hook rt.client up: the context's client, the worker's handlers, and the
    listeners of direct calls (this node's socket; TCP on a cluster, its address told
    to the head)."""
    client, info = rt.client, rt.client.info
    _context.set_client(client)
    # Calls queued behind a blocking get() of an actor belong to it: never handed back.
    client.on_block = rt._on_block if rt.actor is None else None
    client.nested_ready = rt.nested.__len__   # type: ignore[assignment]
    client.run_nested = rt._run_nested
    client.direct.on_peer_frame = rt._on_peer_frame
    # Callers send calls straight here once the head gives them this address: a
    # driver this worker is lent to (Loan), or callers of the actor it becomes.
    path = os.path.join(info.node_dir or info.session_dir, f"worker-{rt.worker_id}.sock")
    with contextlib.suppress(OSError):
        os.unlink(path)   # this process's own, from before the head was lost
    try:
        client.listen(path)
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
    deadline = time.monotonic() + wait_s()
    while time.monotonic() < deadline:
        time.sleep(_PAUSE_S)
        try:
            client = connect(rt, hello, timeout_s=5.0)
        except ClusterLostError:   # away, or its node not joined again yet
            continue
        except OrchestraError as exc:   # refused: the actor was made again meanwhile
            print(f"orchestra worker: the restarted head did not take this actor back: {exc}",
                  file=sys.stderr, flush=True)
            return False
        rt.client = client
        if rt.logs is not None:
            rt.logs.rebind(client.send_raw)
        wire(rt)
        client.start()
        print(f"orchestra worker: serving actor {rt.actor.spec.class_name} again after "
              "the head's restart", file=sys.stderr, flush=True)
        return True
    return False
