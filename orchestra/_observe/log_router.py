"""The head's part of log forwarding: which driver's log connection gets which lines.

    worker --LOG_LINES (chunks, each with its job)--> Head.handle -> route() ->
        {driver's log connection id: LogLines} -> one LOG_LINES frame per driver

A job is the connection id of the driver that submitted the task (Call.job, passed on
to nested tasks and fixed for an actor by its creator). Lines of no job (printed by a
worker before its first task) go to the driver that started the cluster. A driver
without a log connection (``init(log_to_driver=False)``) gets nothing: the lines stay
in the worker's log files only.
"""
from __future__ import annotations

from .._protocol import pb


class LogRoutes:
    """Log connections by the job (driver connection id) they take lines for."""

    def __init__(self) -> None:
        self.by_job: dict[int, int] = {}     # job -> the log connection's id
        self.jobs: dict[int, int] = {}       # log connection id -> its job

    def add(self, conn_id: int, job: int) -> None:
        """A driver's log connection ``conn_id`` takes the lines of ``job``."""
        self.by_job[job] = conn_id
        self.jobs[conn_id] = job

    def remove(self, conn_id: int) -> bool:
        """Forget a closed log connection; False when it was none."""
        job = self.jobs.pop(conn_id, None)
        if job is None:
            return False
        if self.by_job.get(job) == conn_id:
            del self.by_job[job]
        return True

    def route(self, msg: pb.LogLines, default_job: int | None, ip: str) -> dict[int, pb.LogLines]:
        """The chunks of one worker's LogLines by the log connection that takes them
        (``default_job``: the job of lines without one; ``ip``: set on each chunk, the
        worker's node on a cluster of several)."""
        out: dict[int, pb.LogLines] = {}
        by_job = self.by_job
        for chunk in msg.chunks:
            job = chunk.job or default_job
            target = by_job.get(job) if job is not None else None
            if target is None:
                continue
            if ip:
                chunk.ip = ip
            dest = out.get(target)
            if dest is None:
                dest = out[target] = pb.LogLines()
            dest.chunks.append(chunk)
        return out
