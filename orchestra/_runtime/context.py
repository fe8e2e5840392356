"""The connection of this process to its cluster, set by init() or by the worker main,
and what ``get_runtime_context()`` reads.

Nothing is set at import; ``current_client`` starts a local cluster with the defaults
the first time a driver needs one before ``init`` (as Ray does), and raises
ClusterLostError once the cluster's head is gone.

What the runtime context says, and who sets it:

    driver:  init() -> set_client                      job, node, worker (its connection)
    worker:  main -> set_client                        job, node, worker (its connection)
             each task/call -> set_call(call) (a ContextVar: per thread and per
             coroutine, so concurrent actor calls each see their own)   task id, resources
             become_actor -> set_actor(...)             actor id, restarts, its resources
"""
from __future__ import annotations

import collections
import contextvars
import threading
import uuid
from collections.abc import Callable, Iterable, Sequence
from typing import TYPE_CHECKING, Any, Protocol

from .._objects.refs import RefCounts
from .._observe import metrics as _metrics
from .._protocol import pb

if TYPE_CHECKING:
    from .direct import DirectCalls


class Submitting(Protocol):
    """What the API uses of the client's submitter (submit.Submitter: it imports ObjectRef,
    which imports this module, hence a protocol; refs typed Any)."""

    templates: dict[tuple[bytes, str, int, int, int], bytes]   # actor methods' Calls

    def register_function(self, function_id: bytes, req_bytes: bytes) -> None: ...
    def submit(self, template: bytes, num_returns: int, args: Sequence[Any],
               kwargs: dict[str, Any], shape: tuple[tuple[str, float], ...] | None = None,
               name: str = "", function_id: bytes = b"", tid: bytes = b"") -> list[Any]: ...
    def submit_actor(self, actor_id: bytes, token: Any, template: bytes, num_returns: int,
                     args: Sequence[Any], kwargs: dict[str, Any], name: str,
                     tid: bytes = b"") -> list[Any]: ...
    def retire_route(self, actor_id: bytes) -> None: ...
    def cancel(self, object_id: bytes, force: bool, recursive: bool = False) -> None: ...


class Valuing(Protocol):
    """What the API uses of the client's values (values.Values, a protocol for the same
    reason)."""

    def put(self, value: object) -> Any: ...
    def put_serialized(self, ser: Any) -> Any: ...
    def get_one(self, ref: Any, timeout: float | None) -> Any: ...
    def get_many(self, refs: Sequence[Any], timeout: float | None) -> list[Any]: ...
    def wait(self, refs: Sequence[Any], num_returns: int,
             timeout: float | None) -> tuple[list[Any], list[Any]]: ...
    def prefetch(self, refs: Sequence[Any]) -> None: ...
    def wait_for(self, ready: Callable[[], bool], deadline: float | None,
                 ids: Iterable[bytes] = ()) -> bool: ...


class Client(Protocol):
    """What the API uses of this process's connection: CoreClient (_runtime/client.py,
    which imports modules that import this one, hence a protocol). Refs are ObjectRefs
    (typed Any here for the same reason)."""

    lost: str | None
    info: pb.HelloReply               # the head's answer to this process's hello
    conn_id: int
    namespace: str
    runtime_env: pb.RuntimeEnvSpec | None

    @property
    def add_ref(self) -> Callable[[bytes, bool], None]: ...   # ObjectRef's counts
    @property
    def remove_ref(self) -> Callable[[bytes], None]: ...

    refs: RefCounts                   # this process's counts of objects
    results: dict[bytes, pb.ObjectData]   # objects made, as the head pushed them
    closed_streams: collections.deque[bytes]

    @property
    def streams(self) -> dict[bytes, Any]: ...   # generators.Stream (it imports this)
    @property
    def direct(self) -> DirectCalls: ...
    def send_raw(self, frame: bytes) -> None: ...
    def send(self, kind: int, msg: Any) -> None: ...
    def wake(self) -> None: ...
    def subscribe_missing(self, ids: Iterable[bytes]) -> None: ...
    def wait_until(self, pred: Callable[[], bool], deadline: float | None) -> bool: ...
    def request(self, req: pb.Request, timeout_s: float = 60.0) -> pb.Reply: ...
    # What encoding a call uses (calls.Encoder): refs that live until the next request
    # is sent, and how arguments are encoded.
    _keep_until_sent: list[Any]
    inline_threshold: int
    job_suffix: bytes
    def escape(self, ids: Iterable[bytes]) -> None: ...
    # Its parts: calls submitted and cancelled; values put, got and waited for.
    @property
    def submitter(self) -> Submitting: ...
    @property
    def values(self) -> Valuing: ...

_client: Client | None = None
# A driver whose head is started again when it dies (_runtime/reconnect.py): lost client ->
# the client connected to the restarted head, once it is (None: it will not be).
_reconnect: Callable[[Client], Client | None] | None = None


def set_client(client: Client | None) -> None:
    global _client
    _client = client


def set_reconnect(wait: Callable[[Client], Client | None] | None) -> None:
    global _reconnect
    _reconnect = wait


def reconnected(client: Client) -> Client | None:
    """A call on ``client`` met the head's death: the client connected to the restarted
    head once it is (to make the call again), or None (nothing restarts it)."""
    return _reconnect(client) if _reconnect is not None else None


def once_more_on_a_new_head(client: Client, call: Callable[[Client], Any]) -> Any:
    """``call(client)``; made again on the client of the restarted head when it met the
    head's death before it was sent (ClusterLostError), if something restarts the head."""
    from ..exceptions import ClusterLostError
    try:
        return call(client)
    except ClusterLostError:
        again = reconnected(client)
        if again is None:
            raise
        return call(again)


def current_client() -> Client:
    client = _client
    if client is None or client.lost is not None:
        if client is None:
            return _implicit_init()
        if _reconnect is not None:   # a call made while the head restarts waits for it
            again = _reconnect(client)
            if again is not None:
                return again
        # The head died: every later call fails at once with the same error, also
        # those that would otherwise go straight to a (dying) worker.
        from ..exceptions import ClusterLostError
        raise ClusterLostError(client.lost)
    return client


def _implicit_init() -> Client:
    """The first call that needs a cluster before init(): start one with the defaults
    (Ray's behaviour). Only on this path: an initialised process never comes here."""
    with _init_lock:
        if _client is None:   # else another thread started it meanwhile
            if _starter is None:
                raise RuntimeError("orchestra is not initialized: call orchestra.init() first")
            _starter()
    return current_client()


# init() with the defaults, set by the session module (which imports this one): None in
# a process that never imported it.
_starter: Callable[[], None] | None = None
_init_lock = threading.Lock()


def set_starter(starter: Callable[[], None]) -> None:
    global _starter
    _starter = starter


def client_or_none() -> Client | None:
    return _client


_gpu_ids: list[int] = []


def set_gpu_ids(ids: list[int]) -> None:
    global _gpu_ids
    _gpu_ids = ids


def gpu_ids() -> list[int]:
    return list(_gpu_ids)


# ---------------------------------------------------------------- runtime context state

# The Call the current thread or coroutine runs (None in a driver, between tasks).
current_call: contextvars.ContextVar[pb.Call | None] = contextvars.ContextVar(
    "orchestra_call", default=None)
set_call = current_call.set

_actor: tuple[bytes, int, dict[str, float]] | None = None   # (id, restarts, resources)
# The namespace given to init() (None: this job's anonymous one, as in Ray).
namespace: str | None = None


def set_actor(actor_id: bytes, restarts: int, resources: dict[str, float]) -> None:
    global _actor
    _actor = (actor_id, restarts, resources)


def in_actor() -> bool:
    return _actor is not None


class ActorExitRequest(BaseException):
    """Raised by exit_actor() inside an actor method; the worker ends the actor.

    A BaseException, so that the method's own ``except Exception`` lets it through. It
    lives here, below the API, because the worker process catches it."""


class RuntimeContext:
    """What this process is within its cluster (``orchestra.get_runtime_context()``).

    Ids are hex strings, as in Ray. In a driver the task and actor ids are None."""

    def get_node_id(self) -> str:
        """The id of the node this process runs on (as ``orchestra.nodes()`` names it)."""
        from .._ids import node_hex
        return node_hex(current_client().info.node_id)

    @property
    def node_id(self) -> str:
        """``get_node_id()``, as a property (Ray has both)."""
        return self.get_node_id()

    def get_job_id(self) -> str:
        """The job: one per cluster session (the driver and every task and actor of it)."""
        return bytes(current_client().info.session_id).hex()

    @property
    def job_id(self) -> str:
        """``get_job_id()``, as a property (Ray has both)."""
        return self.get_job_id()

    def get_task_id(self) -> str | None:
        """The id of the task or actor call running here (None in a driver)."""
        call = current_call.get()
        return call.task_id.hex() if call is not None else None

    @property
    def task_id(self) -> str | None:
        """``get_task_id()``, as a property (Ray has both)."""
        return self.get_task_id()

    def get_actor_id(self) -> str | None:
        """The id of the actor this process serves (None outside an actor)."""
        if _actor is not None:
            return _actor[0].hex()
        call = current_call.get()   # in the constructor, before the actor is set
        if call is not None and call.HasField("actor"):
            return bytes(call.actor.actor_id).hex()
        return None

    @property
    def actor_id(self) -> str | None:
        """``get_actor_id()``, as a property (Ray has both)."""
        return self.get_actor_id()

    def get_worker_id(self) -> str:
        """This process's id (a driver's or a worker's): its connection's at the head,
        unique in the cluster."""
        return f"{current_client().conn_id:016x}"

    @property
    def worker_id(self) -> str:
        """``get_worker_id()``, as a property (Ray has both)."""
        return self.get_worker_id()

    @property
    def namespace(self) -> str:
        """The namespace given to init(); else this job's anonymous one (a uuid, as in Ray)."""
        if namespace is not None:
            return namespace
        return str(uuid.uuid5(uuid.NAMESPACE_OID, "orchestra-" + self.get_job_id()))

    def get_assigned_resources(self) -> dict[str, float]:
        """The resources the running task (or this actor) holds: {} in a driver."""
        if _actor is not None:
            return dict(_actor[2])
        call = current_call.get()
        return dict(call.resources) if call is not None else {}

    def was_current_actor_reconstructed(self) -> bool:
        """True in an actor that the cluster restarted after its process died."""
        if _actor is not None:
            return _actor[1] > 0
        call = current_call.get()
        return call is not None and call.HasField("actor") and call.actor.restart_count > 0

    def get(self) -> dict[str, Any]:
        """The context as a dict (Ray's keys)."""
        return {"job_id": self.get_job_id(), "node_id": self.get_node_id(),
                "task_id": self.get_task_id(), "actor_id": self.get_actor_id(),
                "namespace": self.namespace}


def get_runtime_context() -> RuntimeContext:
    """The runtime context of this process (a driver, a task's or an actor's worker)."""
    return RuntimeContext()


# The user metrics' recorder (_observe/metrics.py) reports on this process's connection.
_metrics.set_client_source(client_or_none)
