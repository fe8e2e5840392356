"""The head's side of the job table (_scheduler/jobs.py), on the head's loop.

    Head.hello, a driver -> driver_hello: its job (new, or its own of before a restart)
        or the reason it is refused (its job ended: a driver is not resurrected)
    JOB_END (frames.py: the driver's shutdown()) -> JobBook.ending
    Head._client_gone -> client_gone: its job ends with its last connection
    rejoin.restore -> restore: the jobs of the heads before; those whose driver does
        not connect again within the reconnect timeout (and UNCLAIMED_SLACK_S) failed
    rejoin.stop_store -> stopped: running jobs stopped with the cluster
    each change -> the state store (HeadState.write, its own thread), when there is one
"""
from __future__ import annotations

import sys
import time
from typing import Any, Protocol

from .._protocol import pb
from .._scheduler.jobs import RUNNING, JobBook, JobRecord
from .._scheduler.state import SchedulerState
from . import records
from .state_store import HeadState


class Head(Protocol):
    jobs: JobBook
    state: SchedulerState
    durable: HeadState | None
    cfg: dict[str, Any]
    loop: Any


def _now_ms() -> int:
    return int(time.time() * 1000)


def flush(head: Head) -> None:
    """Hand the job table's changes to the state store (none without one)."""
    out = head.jobs.out
    if head.durable is not None:
        for d in out:
            head.durable.write(d.table, d.key, records.encode(d.table, d.value))
    out.clear()


def driver_hello(head: Head, conn_id: int, hello: pb.Hello, node_id: int) -> str | None:
    """A driver connected: None, or why it is refused."""
    job = head.jobs.connected(conn_id, hello.driver_key, pid=hello.pid, node_id=node_id,
                              namespace=hello.namespace, entrypoint=hello.entrypoint,
                              now_ms=_now_ms())
    flush(head)
    if job is not None:
        return None
    old = head.jobs.jobs[hello.driver_key].rec
    return (f"this driver's job {old.job_id} ended ({old.status}"
            f"{': ' + old.message if old.message else ''}); a driver whose job ended is not "
            "taken back: run it again to start a new job")


def node_away(head: Head, hello: pb.Hello) -> bool:
    """Whether ``hello`` is a driver connecting again to a restarted head whose node of
    before (the node beside the head, say) has not joined it again yet: it is asked to
    try again (a quiet close), so that it goes back to that node's store rather than
    to the head's."""
    job = head.jobs.jobs.get(hello.driver_key) if hello.driver_key else None
    return job is not None and job.rec.status == RUNNING and not job.conns \
        and job.rec.node_id in head.state.kept.nodes


def client_gone(head: Head, conn_id: int) -> None:
    head.jobs.disconnected(conn_id, _now_ms())
    flush(head)


def restore(head: Head, kept: dict[str, JobRecord], slack_s: float) -> None:
    """The jobs the heads before kept (read from the store: _head/records.py); those
    running wait for their drivers."""
    for problem in head.jobs.restore(kept):
        print(f"orchestra head: not restored: {problem}", file=sys.stderr, flush=True)
    flush(head)
    if head.jobs.waiting():
        wait_s = float(head.cfg.get("reconnect_timeout_s", 0.0))
        head.loop.call_later(wait_s + slack_s, _expire, head, wait_s)


def _expire(head: Head, wait_s: float) -> None:
    gone = head.jobs.expire(wait_s, _now_ms())
    flush(head)
    if gone:
        print(f"orchestra head: {len(gone)} job(s) whose driver did not connect again "
              f"ended: {', '.join(j.rec.job_id for j in gone)}", file=sys.stderr, flush=True)


def stopped(head: Head) -> None:
    """The head stops, and its cluster: running jobs are stopped (written before the
    store is let go)."""
    head.jobs.stopped(_now_ms())
    flush(head)

