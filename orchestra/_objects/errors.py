"""Error objects: the pickled exception an object stands for when its task failed.

The scheduler decides *that* a task failed (crash, cancel, lost argument, infeasible
request); this module words the error so that it names the cause and the remedy.
"""
from __future__ import annotations

import signal
from typing import Any

from .._resources import format_resources
from ..exceptions import (
    ActorDiedError,
    InfeasibleResourcesError,
    ObjectLostError,
    OutOfMemoryError,
    TaskCancelledError,
    WorkerCrashedError,
)
from .serialization import dumps_exception


def describe_exit(returncode: int | None) -> str:
    """'exit code 3' / 'signal SIGSEGV' / 'an unknown cause', with the likely reason."""
    if returncode is None:
        return "an unknown cause (its connection closed)"
    if returncode >= 0:
        return f"exit code {returncode} (the task or a library called exit)"
    try:
        name = signal.Signals(-returncode).name
    except ValueError:
        name = f"signal {-returncode}"
    hint = {
        "SIGSEGV": "a crash in native code",
        "SIGBUS": "a crash in native code or shared memory exhausted",
        "SIGABRT": "an abort in native code",
        "SIGKILL": "killed from outside, or by the OOM killer when memory ran out",
        "SIGTERM": "terminated from outside",
    }.get(name, "killed by a signal")
    return f"signal {name} ({hint})"


_said_detached: set[str] = set()


def note_private_detached(what: str) -> None:
    """lifetime="detached" on a cluster started by init(): accepted, as Ray does (the
    actor or group outlives the driver that made it, not the cluster), said once per
    kind on the orchestra logger."""
    if what in _said_detached:
        return
    _said_detached.add(what)
    import logging
    logging.getLogger("orchestra").warning(
        "orchestra: a detached %s on a cluster started by orchestra.init(): it lives as long as "
        "this cluster, which stops when the driver that started it exits. Start a cluster with "
        "`orchestra start --head` and connect with orchestra.init(address=...) to keep detached "
        "%ss across drivers.", what, what)


# The start of the reason a worker killed by its node's memory monitor dies of
# (_node/memory.py, _scheduler/memory.py): its task fails with OutOfMemoryError.
MEMORY_KILL = "killed by the memory monitor"


def make_error(kind: str, **d: Any) -> bytes:
    name = d.get("name") or "?"
    exc: BaseException
    reason = str(d.get("reason", ""))
    if kind == "crashed" and reason.startswith(MEMORY_KILL):
        kind = "oom"
    if kind == "actor_dead" and MEMORY_KILL in reason and "died while running" in reason:
        # The call an actor ran when the memory monitor killed its process (later calls
        # get ActorDiedError, naming the same cause, unless it restarts).
        exc = OutOfMemoryError(
            f"actor {name} ran out of memory: {reason}. Give the actor max_restarts= and "
            "the method max_task_retries= to have it made again and the call run again; "
            "keep less in the actor, or give the node more memory.")
    elif kind == "oom":
        exc = OutOfMemoryError(
            f"task {name}() ran out of memory: its worker (pid={d.get('pid')}) was "
            f"{d.get('reason')}; attempts made: {d.get('attempts')}. Retries are set by "
            "max_retries= in @orchestra.remote or .options(). Run fewer such tasks at once "
            "(ask for more num_cpus= or memory= each), give the node more memory, or set "
            "ORCHESTRA_MEMORY_USAGE_THRESHOLD (0.95) higher or "
            "ORCHESTRA_MEMORY_MONITOR_REFRESH_MS=0 to leave memory to the kernel.")
    elif kind == "crashed":
        exc = WorkerCrashedError(
            f"the worker (pid={d.get('pid')}) running task {name}() died of {d.get('reason')}; "
            f"attempts made: {d.get('attempts')}. Retries are set by max_retries= in "
            "@orchestra.remote or .options(). What it printed last (a native crash's report "
            f"too) is in its log files: `orchestra logs {d.get('pid')}`.")
    elif kind == "cancelled":
        exc = TaskCancelledError(f"task {name}() was cancelled by orchestra.cancel()")
    elif kind == "lost":
        oid = d.get("object_id", b"")
        exc = ObjectLostError(
            f"object {oid.hex()} is not in the cluster: it was freed when its last ref was "
            "dropped, or it belongs to another session. Keep an ObjectRef alive for as "
            "long as its value is needed.")
    elif kind == "node_lost":
        oid = d.get("object_id", b"")
        exc = ObjectLostError(
            f"object {oid.hex()} was lost with node {d.get('node')}: {d.get('reason')}. Its "
            "only copy was in that node's store, and the task that made it cannot be run "
            "again (a put, or a task without retries left). Give the task max_retries= to "
            "have lost results rebuilt.")
    elif kind == "actor_dead":
        limit = d.get("max_restarts", 0)
        if "exit_actor()" in str(d.get("reason")):
            # It ended itself (orchestra.actor.exit_actor()): nothing crashed, and no
            # max_restarts would have brought it back.
            exc = ActorDiedError(f"actor {name} is dead: {d.get('reason')}. Calls to it "
                                 "fail; start a new one if more work is needed.")
        elif limit:
            # It had restarts and used them all: advising max_restarts= misled.
            exc = ActorDiedError(
                f"actor {name} is dead: {d.get('reason')}. It was restarted "
                f"{d.get('restarts')} times (max_restarts={limit}), all it may be. Calls to it "
                "fail; start a new one, or allow more restarts (max_restarts=-1: no limit).")
        else:
            exc = ActorDiedError(f"actor {name} is dead: {d.get('reason')}. Calls to it fail; "
                                 "start a new one, or give it max_restarts= to have it "
                                 "restarted after a crash.")
    elif kind == "infeasible":
        res = format_resources(d.get("resources", {}), "")
        node = d.get("node")
        if node:
            exc = InfeasibleResourcesError(
                f"task {name}() asks for {res or 'nothing'} on node {node} "
                f"(NodeAffinitySchedulingStrategy, soft=False), but {d.get('reason')}. Name a "
                "node of orchestra.nodes() that can hold it, or pass soft=True to run it "
                "elsewhere when that node cannot.")
        else:
            exc = InfeasibleResourcesError(
                f"task {name}() asks for {res}, which no node of the cluster has")
    elif kind == "group":   # placement groups (_scheduler/groups.py): gone, or too small
        text = d.get("text", "")
        exc = TaskCancelledError(text) if d.get("cancelled") else InfeasibleResourcesError(text)
    else:
        exc = RuntimeError(f"task {name}() failed: {kind}")
    return dumps_exception(exc)
