"""The cluster's jobs: one per driver session, as Ray counts them, kept in the head's
state store so that a restarted head lists them and knows which drivers it waits for.
No I/O: the head feeds it and writes what ``out`` collects.

    a driver connects (Hello.kind "driver", its driver_key) -> connected():
        a new key: a new job, RUNNING, under the id of that first connection
        the key of a RUNNING job (its driver connects again after a head restart): the
            same job, on this connection too
        the key of a job that ended: None (the head refuses the connection, naming it)
    shutdown() in the driver (JOB_END, before it closes its connection) -> ending()
    its connection closes -> disconnected(): SUCCEEDED after JOB_END; else FAILED (its
        driver exited without shutdown(), or was killed)
    a restarted head -> restore(records): RUNNING jobs wait for their drivers (no
        connection); expire() once the drivers' reconnect time is over: FAILED
    the head stops -> stopped(): RUNNING jobs are STOPPED
    each change --Durable(JOBS, key hex, a copy of its JobRecord)--> out; ended jobs
        beyond KEEP_ENDED are forgotten, the oldest first (deleted from the store too);
        the head's edge writes a record as bytes (_head/records.py)

Who owns it: the head's loop, the only caller. A job's id is its first connection's id
(hex, as the tasks' job_id names it); the connections of a later head map to it.
"""
from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass, field

from .durable import JOBS
from .instructions import Durable

KEEP_ENDED = 1000      # ended jobs listed (and kept) at most
RUNNING, SUCCEEDED, FAILED, STOPPED = "RUNNING", "SUCCEEDED", "FAILED", "STOPPED"
_KILLED = "its driver exited without shutdown(), or was killed"


@dataclass
class JobRecord:
    """What the store keeps of a job (a driver session): list_jobs()'s row."""

    job_id: str
    status: str
    driver_pid: int = 0
    node_id: int = 0
    namespace: str = ""
    entrypoint: str = ""
    start_ms: int = 0
    end_ms: int = 0
    message: str = ""


@dataclass
class Job:
    key: bytes
    rec: JobRecord
    conns: set[int] = field(default_factory=set)   # its open connections on this head
    seen: list[int] = field(default_factory=list)  # every one it had on this head
    ending: bool = False                           # its driver sent JOB_END


class JobBook:
    def __init__(self) -> None:
        self.jobs: dict[bytes, Job] = {}         # by driver key, oldest first
        self.of_conn: dict[int, Job] = {}        # every connection a job had here
        self.out: list[Durable] = []

    # ------------------------------------------------------------------ events
    def connected(self, conn: int, key: bytes, *, pid: int, node_id: int, namespace: str,
                  entrypoint: str, now_ms: int) -> Job | None:
        """A driver connected with ``key``: its job (new, or its RUNNING one of before);
        None when that key's job ended (such a driver is not taken back)."""
        key = key or conn.to_bytes(8, "big")   # (a private cluster's driver: no key)
        job = self.jobs.get(key)
        if job is None:
            job = Job(key, JobRecord(
                job_id=f"{conn:08x}", status=RUNNING, driver_pid=pid, node_id=node_id,
                namespace=namespace, entrypoint=entrypoint, start_ms=now_ms))
            self.jobs[key] = job
        elif job.rec.status != RUNNING:
            return None
        else:   # connected again (to a restarted head): where it runs now
            job.rec.driver_pid, job.rec.node_id = pid, node_id
        job.conns.add(conn)
        job.seen.append(conn)
        self.of_conn[conn] = job
        self._write(job)
        return job

    def ending(self, conn: int) -> None:
        """The driver on ``conn`` called shutdown(): its connection's end ends the job."""
        job = self.of_conn.get(conn)
        if job is not None:
            job.ending = True

    def disconnected(self, conn: int, now_ms: int) -> None:
        job = self.of_conn.get(conn)
        if job is None or conn not in job.conns:
            return
        job.conns.discard(conn)
        if job.conns or job.rec.status != RUNNING:
            return
        if job.ending:
            self._end(job, SUCCEEDED, "", now_ms)
        else:
            self._end(job, FAILED, _KILLED, now_ms)

    def expire(self, wait_s: float, now_ms: int) -> list[Job]:
        """The drivers' time to connect again to a restarted head is over: the jobs
        still waiting for theirs failed."""
        gone = [j for j in self.jobs.values() if j.rec.status == RUNNING and not j.conns]
        for job in gone:
            self._end(job, FAILED, f"its driver did not connect again within {wait_s:g} s "
                      "of the head's restart", now_ms)
        return gone

    def stopped(self, now_ms: int) -> None:
        """The head stops, and the cluster with it: every running job is stopped."""
        for job in list(self.jobs.values()):
            if job.rec.status == RUNNING:
                self._end(job, STOPPED, "the cluster stopped", now_ms)

    def restore(self, records: Mapping[str, JobRecord]) -> list[str]:
        """The jobs a head before this one kept (table JOBS, read by the head's edge),
        oldest first; RUNNING ones wait for their drivers. Returns what could not be
        used, in words (dropped)."""
        problems = []
        rows: list[tuple[bytes, JobRecord]] = []
        for hexkey, rec in records.items():
            try:
                rows.append((bytes.fromhex(hexkey), rec))
            except ValueError as exc:
                problems.append(f"job {hexkey}: {exc}")
                self.out.append(Durable(JOBS, hexkey, None))
        for key, rec in sorted(rows, key=lambda kr: (kr[1].start_ms, kr[1].job_id)):
            self.jobs[key] = Job(key, rec)
        return problems

    # ------------------------------------------------------------------ queries
    def job_id(self, conn: int) -> str | None:
        """The id of the job whose driver connection ``conn`` is (or was)."""
        job = self.of_conn.get(conn)
        return job.rec.job_id if job is not None else None

    def waiting(self) -> int:
        """Jobs of before whose drivers have not connected again."""
        return sum(1 for j in self.jobs.values() if j.rec.status == RUNNING and not j.conns)

    def rows(self) -> list[dict[str, object]]:
        """list_jobs()'s rows, oldest first (Ray's keys where it has them)."""
        return [{"job_id": r.job_id, "submission_id": None, "type": "DRIVER",
                 "status": r.status, "entrypoint": r.entrypoint,
                 "message": r.message or None, "namespace": r.namespace or None,
                 "driver_pid": r.driver_pid or None,
                 "driver_node_id": f"{r.node_id:016x}",
                 "connected": bool(j.conns), "start_time": r.start_ms or None,
                 "end_time": r.end_ms or None}
                for j in self.jobs.values() for r in (j.rec,)]

    # ------------------------------------------------------------------ records
    def _end(self, job: Job, status: str, message: str, now_ms: int) -> None:
        job.rec.status, job.rec.message, job.rec.end_ms = status, message, now_ms
        self._write(job)
        ended = [j for j in self.jobs.values() if j.rec.status != RUNNING]
        for old in ended[:max(len(ended) - KEEP_ENDED, 0)]:
            del self.jobs[old.key]
            for c in old.seen:
                self.of_conn.pop(c, None)
            self.out.append(Durable(JOBS, old.key.hex(), None))

    def _write(self, job: Job) -> None:
        # A copy: the record changes in place, the write happens after the batch.
        self.out.append(Durable(JOBS, job.key.hex(), dataclasses.replace(job.rec)))
