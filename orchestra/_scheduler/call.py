"""A task's call as the scheduler reads it: what runs, on which arguments and resources,
where, retried how; the spec of the actor a call creates; a registered function. No I/O,
no protocol.

    a frame or record with a Call (Submit, a create_actor request, AdoptCalls, a
    TaskDone's lineage, a state store's actor record)
        --> the head's edge (_head/inbound.py: call_in) --> Call(..., wire=that message)
        --> queued, placed, sent, retried, kept by the scheduler
        --> the edge writes ``wire`` into the Execute (_head/outbound.py: call_out),
            what the scheduler changed written into it first

Why the message rides along: a worker reads all of a call (its arguments' bytes, the
keyword names, the runtime env, the actor's methods), the scheduler a dozen fields. A
call made again from the fields would cost a copy of every argument's bytes per task
and each time it is sent; the fields read once at the edge cost ~2.5 us a task
(_head/inbound.py: call_in), a core that reads plain attributes saves about as much.

What the scheduler changes in a call, and the edge writes back into ``wire`` before it
is sent or kept (call_out): an actor's ``namespace`` (its creator's, where it named
none), its ``restart_count``, ``get_if_exists`` and the call's ``job`` (a restarted
head's restore: _scheduler/durable.py), and the ``placement`` of a child task captured
by its parent's placement group (``edited``: _scheduler/groups.py). Nothing else.
"""
from __future__ import annotations

from typing import Any, NamedTuple

# PlacementSpec.strategy (_scheduler/placement.py decides with them); "": the default.
SPREAD = "SPREAD"
NODE_AFFINITY = "NODE_AFFINITY"
PLACEMENT_GROUP = "PLACEMENT_GROUP"


class PlacementSpec(NamedTuple):
    """Where a call may run (scheduling_strategy=): ``strategy`` with ``node_id`` and
    ``soft`` (NODE_AFFINITY), or placement group ``group_id``'s bundle
    ``bundle_index`` (-1: any of its bundles), its child tasks captured into it with
    ``capture_child_tasks``."""

    strategy: str = ""
    node_id: int = 0
    soft: bool = False
    group_id: bytes = b""
    bundle_index: int = 0
    capture_child_tasks: bool = False


class ActorSpec:
    """The actor a call creates, as the scheduler reads it: its id, its name in its
    namespace (empty: unnamed), its class's name, and how it lives (detached, restarts
    allowed, restarts so far). ``wire``: the spec's message, forwarded (the edge's
    spec_out writes what changed into it)."""

    __slots__ = ("actor_id", "name", "namespace", "class_name", "detached", "get_if_exists",
                 "max_restarts", "restart_count", "wire")

    def __init__(self, actor_id: bytes, name: str = "", namespace: str = "",
                 class_name: str = "", detached: bool = False, get_if_exists: bool = False,
                 max_restarts: int = 0, restart_count: int = 0, wire: Any = None) -> None:
        self.actor_id = actor_id
        self.name = name
        self.namespace = namespace
        self.class_name = class_name
        self.detached = detached
        self.get_if_exists = get_if_exists
        self.max_restarts = max_restarts
        self.restart_count = restart_count
        self.wire = wire

    def __repr__(self) -> str:
        return f"ActorSpec({self.class_name} {self.actor_id.hex()}, name={self.name!r})"


class Call:
    """One call of a function or an actor's method (``actor_id`` set), or an actor's
    construction (``actor`` set), as submitted.

    ``refs``: the ids of its arguments passed as refs, in order (an id twice when passed
    twice); ``nested``: refs pickled inside its inline arguments (held while it waits).
    ``resources``: what it holds while it runs; ``placement``: its strategy, None for the
    default. ``max_retries``: runs again after its process died (-1: without limit), and
    after an exception with ``retry_exceptions``. ``generator``: 0 none, 1 dynamic, 2
    streaming. ``max_calls``: its worker is replaced after that many calls (0: never).
    ``job``: the driver whose output its prints are (0: none). ``wire``: the message it
    came in (module docstring)."""

    __slots__ = ("task_id", "function_id", "name", "refs", "nested", "num_returns",
                 "resources", "max_retries", "retry_exceptions", "generator", "max_calls",
                 "job", "actor_id", "actor", "placement", "edited", "wire")

    def __init__(self, task_id: bytes, function_id: bytes = b"", name: str = "",
                 refs: tuple[bytes, ...] = (), nested: tuple[bytes, ...] = (),
                 num_returns: int = 1, resources: dict[str, float] | None = None,
                 max_retries: int = 0, retry_exceptions: bool = False, generator: int = 0,
                 max_calls: int = 0, job: int = 0, actor_id: bytes = b"",
                 actor: ActorSpec | None = None, placement: PlacementSpec | None = None,
                 wire: Any = None) -> None:
        self.task_id = task_id
        self.function_id = function_id
        self.name = name
        self.refs = refs
        self.nested = nested
        self.num_returns = num_returns
        self.resources = resources if resources is not None else {}
        self.max_retries = max_retries
        self.retry_exceptions = retry_exceptions
        self.generator = generator
        self.max_calls = max_calls
        self.job = job
        self.actor_id = actor_id
        self.actor = actor
        self.placement = placement
        self.edited = False   # placement or job changed here: the edge writes them back
        self.wire = wire

    @property
    def group_id(self) -> bytes:
        """The placement group it runs in (b"": none)."""
        p = self.placement
        return p.group_id if p is not None else b""

    def place(self, placement: PlacementSpec) -> None:
        """Runs where ``placement`` says (a child task its parent's group captured)."""
        self.placement = placement
        self.edited = True

    def __repr__(self) -> str:
        return f"Call({self.name}, task {self.task_id.hex()})"


class FunctionDef(NamedTuple):
    """A registered function or actor class: its id, and the message that registered it
    (sent once to each worker that runs it, and kept in an actor's durable record)."""

    function_id: bytes
    wire: Any
