"""The head's answers about the cluster's state: list_tasks/actors/objects/nodes/workers,
summarize_tasks, `orchestra status|list|memory|timeline`, and the cluster summary.

    SUBMIT frame         -> StateQueries.table.submitted (a tuple per frame)
    TASK_EVENTS frame    -> worker_batch: kept with the worker's id, pid and node, read
                            into the table when a query or summary needs it (catch_up)
    Request.state_query  -> TASK_EVENTS_FLUSH to every worker -> their TASK_EVENTS
                            (flush_id set) -> or after _FLUSH_WAIT_S -> rows as JSON
                            in Reply.state_json
    cluster_summary(): the dict the dashboard and `status` show

The rows are Ray's (orchestra.util.state): dicts with Ray's keys where they mean the
same. Reading the scheduler's tables is all this module does with them: it decides
nothing for the scheduler and keeps only the task table (_observe/task_events.py).
"""
from __future__ import annotations

import itertools
import json
import os
import sys
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from .._ids import node_hex
from .._observe.metrics_table import MetricsTable
from .._observe.task_events import (
    DEFAULT_MAX_TASKS,
    KINDS,
    PENDING_ARGS_AVAIL,
    PENDING_NODE_ASSIGNMENT,
    SchedView,
    TaskTable,
)
from .._protocol import pb
from .._protocol import wire as _wire
from .._scheduler.data import ERROR, INLINE
from .._scheduler.instructions import CANCEL_KILL
from .._scheduler.model import Obj, TaskState, WorkerState, cluster_free, cluster_total
from .outbound import call_out
from .remote_node import RemoteNode

if TYPE_CHECKING:
    from .._scheduler.model import Task

# A state query waits this long at most for the workers' reports (a worker busy in a
# long call still answers from its reader thread within ~20 ms; one that is stuck in
# native code holding the GIL is not waited for).
_FLUSH_WAIT_S = 0.5
WHATS = ("tasks", "actors", "objects", "nodes", "workers", "jobs", "summary")
_ACTOR_STATES = {"pending": "PENDING_CREATION", "starting": "PENDING_CREATION",
                 "alive": "ALIVE", "restarting": "RESTARTING", "dead": "DEAD"}
# A placement group's readiness pseudo-object ends so (_scheduler/groups.py); not the user's.
_GROUP_SUFFIX = b"\xff\xff\xff\xfe"


def sched_state(task: Task) -> str:
    """A scheduler task's state in Ray's names (one not started by a worker yet)."""
    return PENDING_ARGS_AVAIL if task.state is TaskState.WAITING else PENDING_NODE_ASSIGNMENT


def nbytes(o: Obj) -> int:
    """An object's bytes: an inline value's are counted when asked (reading the field
    copies it: ~70 us for 100 KB, too much on every seal), a segment's when sealed."""
    d = o.data
    if d is not None and d.kind == INLINE:
        return len(d.wire.inline) if d.wire is not None else len(d.payload)
    return o.size


def select(rows: list[dict[str, Any]], filters: list[Any], limit: int) -> list[dict[str, Any]]:
    """The rows that pass every filter ([key, "=" or "!=", value]; values compared as
    text, states case-blind), the last ``limit`` of them (0: all)."""
    for f in filters:
        if not isinstance(f, (list, tuple)) or len(f) != 3 or f[1] not in ("=", "!="):
            raise ValueError(f"bad filter {f!r}: a filter is (key, '=' or '!=', value), "
                             "e.g. ('state', '=', 'RUNNING')")
        key, op, value = f
        if rows and key not in rows[0]:
            raise ValueError(f"unknown filter key {key!r}: the rows have "
                             f"{', '.join(sorted(rows[0]))}")
        want = str(value).lower()
        rows = [r for r in rows if (str(r.get(key)).lower() == want) == (op == "=")]
    return rows[-limit:] if limit else rows


class StateQueries:
    """The task table and the state queries waiting for the workers' reports."""

    def __init__(self, head: Any) -> None:
        self.head = head   # the _head.Head (not imported: it imports this module)
        self.table = TaskTable(int(head.cfg.get("task_events_max", DEFAULT_MAX_TASKS)))
        self._flush_ids = itertools.count(1)
        # flush id -> (the asker's connection, its request, workers yet to report)
        self.waiting: dict[int, tuple[Any, Any, set[int]]] = {}
        # Workers' reports not read into the table yet: (batch, worker id, pid, node id)
        self.backlog: list[tuple[pb.TaskEventBatch, int, int, int]] = []
        self.backlog_events = 0
        # Each worker's last reported (resident bytes, CPU seconds): the dashboard's charts.
        self.usage: dict[int, tuple[int, float]] = {}
        # User metrics (orchestra.util.metrics) of every process: /metrics, the dashboard.
        self.metrics = MetricsTable()

    # -------------------------------------------------------------- events in
    def worker_batch(self, conn_id: int, batch: pb.TaskEventBatch) -> None:
        """A worker's TASK_EVENTS frame: kept as it came until someone asks (catch_up),
        so a cluster nobody watches spends nothing on its direct calls here beyond
        reading the frame."""
        c = self.head.state.clients.get(conn_id)
        w = c.worker if c is not None else None
        if w is not None and batch.cpu_seconds:
            self.usage[w.worker_id] = (batch.rss_bytes, batch.cpu_seconds)
        if w is not None and (batch.start_task_id or batch.end_task_id):
            self.backlog.append((batch, w.worker_id, w.pid, w.node_id))
            self.backlog_events += len(batch.start_task_id) + len(batch.end_task_id)
        if batch.flush_id:
            q = self.waiting.get(batch.flush_id)
            if q is not None:
                q[2].discard(conn_id)
                if not q[2]:
                    self._answer(batch.flush_id)

    def tick(self) -> None:
        """The head's timer: read the submits noted since the last tick, and the
        workers' reports once they hold as
        many events as the table keeps tasks (their memory stays bounded)."""
        try:
            self.table.ingest()
            if self.backlog_events > self.table.max_tasks:
                self.catch_up()
        except Exception as exc:  # noqa: BLE001 - a bug of ours must not stop the head's timer
            print(f"orchestra head: task events not read: {exc!r}", file=sys.stderr)

    def catch_up(self) -> None:
        """Bring the table up to date with every report and submit received."""
        backlog, self.backlog, self.backlog_events = self.backlog, [], 0
        for batch, worker_id, pid, node_id in backlog:
            self.table.worker_batch(batch, worker_id, pid, node_id)
        self.table.ingest()

    def dashboard_views(self) -> Any:
        """The dashboard's data (_head/dashboard_views.py), its sampler started."""
        from .dashboard_views import DashboardViews
        views = DashboardViews(self.head)
        views.start()
        return views

    # -------------------------------------------------------------- queries
    def query(self, conn: Any, req: pb.Request) -> None:
        """A state query: ask every worker for its buffered events, answer once all
        did (or _FLUSH_WAIT_S passed). Every kind of query asks: the summary counts
        tasks, and a list of actors or workers is read beside one of tasks."""
        st = self.head.state
        targets = {w.conn for w in st.workers.values()
                   if w.conn >= 0 and w.state is not WorkerState.DEAD and w.conn in self.head.conns}
        fid = next(self._flush_ids)
        self.waiting[fid] = (conn, req, targets)
        if not targets:
            self._answer(fid)
            return
        for cid in targets:
            self.head.send(cid, _wire.TASK_EVENTS_FLUSH, pb.TaskEventFlush(flush_id=fid))
        self.head.loop.call_later(_FLUSH_WAIT_S, self._answer, fid)

    def _answer(self, fid: int) -> None:
        q = self.waiting.pop(fid, None)
        if q is None:
            return
        conn, req, missing = q
        sq = req.state_query
        reply = pb.Reply(req_id=req.req_id)
        try:
            reply.state_json = json.dumps(self.answer(sq.what, json.loads(sq.filters_json or "[]"),
                                                      sq.limit, sq.detail, flushed=not missing))
        except ValueError as exc:
            reply.error, reply.error_kind = str(exc), "ValueError"
        except Exception as exc:  # noqa: BLE001 - a bug of ours: the asker hears of it at once
            reply.error = f"the head could not answer a state query: {exc!r}"
        self.head.queue_if_open(conn, _wire.encode(_wire.REPLY, reply))
        self.head.carry_out()

    def answer(self, what: str, filters: list[Any], limit: int = 0, detail: bool = False,
               flushed: bool = False) -> Any:
        """The rows of ``what`` (or the summary dict); ValueError for what is unknown."""
        if what == "summary":
            return self.cluster_summary(flushed=flushed)
        if what == "tasks":
            rows = self.task_rows(detail, flushed)
        elif what == "actors":
            rows = self.actor_rows()
        elif what == "objects":   # largest first: the limit drops the smallest
            return select(self.object_rows(), filters, 0)[:limit or None]
        elif what == "nodes":
            rows = self.node_rows()
        elif what == "workers":
            rows = self.worker_rows()
        elif what == "jobs":   # (the head's JobBook: _scheduler/jobs.py)
            rows = self.head.jobs.rows()
        else:
            raise ValueError(f"unknown state {what!r}: one of {', '.join(WHATS)}")
        return select(rows, filters, limit)

    # -------------------------------------------------------------- tasks
    def _settle(self, flushed: bool) -> None:
        st = self.head.state
        self.catch_up()
        for tid, t in st.tasks.items():   # tasks the head holds that no report named yet
            if tid not in self.table.records and t.state is not TaskState.DONE:
                self.table.submitted(t.owner, (call_out(t.call),), 0.0)   # when: unknown
        self.table.ingest()

        def task_state(tid: bytes) -> str | None:
            t = st.tasks.get(tid)
            return None if t is None or t.state is TaskState.DONE else sched_state(t)

        def worker_alive(wid: int) -> bool:
            w = st.workers.get(wid)
            return w is not None and w.state is not WorkerState.DEAD and w.conn in self.head.conns

        def killed_to_cancel(wid: int) -> bool:
            dead = st.dead_workers.get(wid)
            return dead is not None and dead.reason == CANCEL_KILL

        self.table.settle(SchedView(task_state, worker_alive, killed_to_cancel), flushed)

    def job_hex(self, conn: int) -> str | None:
        """The job id of a driver connection (list_jobs()'s: its first connection's, also
        after a restart of the head), else the connection's id in hex; None for 0."""
        return (self.head.jobs.job_id(conn) or f"{conn:08x}") if conn else None

    def job_finder(self) -> Callable[[int], int]:
        """caller connection -> the driver connection whose job it works for (0:
        unknown), each caller looked up once (TaskTable.job_of)."""
        clients = self.head.state.clients
        jobs: dict[int, int] = {}

        def is_driver(conn: int) -> bool:
            c = clients.get(conn)
            return c is not None and c.kind == "driver"

        def worker_of(conn: int) -> int:
            c = clients.get(conn)
            return c.worker.worker_id if c is not None and c.worker is not None else -1

        def job_of(caller: int) -> int:
            job = jobs.get(caller)
            if job is None:
                job = jobs[caller] = self.table.job_of(caller, is_driver, worker_of)
            return job
        return job_of

    def task_rows(self, detail: bool = False, flushed: bool = False) -> list[dict[str, Any]]:
        """list_tasks()'s rows, oldest first."""
        self._settle(flushed)
        clients = self.head.state.clients
        job_of = self.job_finder()
        rows = []
        for r in self.table.records.values():
            job = job_of(r.caller)
            row = {
                "task_id": r.task_id.hex(), "attempt_number": max(r.attempts - 1, 0),
                "name": r.name, "state": r.state, "job_id": self.job_hex(job),
                "actor_id": r.actor_id.hex() or None, "type": KINDS[r.kind],
                "func_or_class_name": r.name,
                "node_id": node_hex(r.node_id) if r.node_id >= 0 else None,
                "worker_id": f"{r.worker_id:016x}" if r.worker_id >= 0 else None,
                "worker_pid": r.pid or None, "error_type": r.error_type or None,
                "creation_time_ms": _ms(r.submit_time), "start_time_ms": _ms(r.start_time),
                "end_time_ms": _ms(r.end_time)}
            if detail:   # the caller, and the times in microseconds (the timeline's)
                c = clients.get(r.caller)
                row["caller_pid"] = c.pid if c is not None else None
                row["caller_node_id"] = node_hex(c.node_id) if c is not None else None
                row["creation_time_us"] = _us(r.submit_time)
                row["start_time_us"] = _us(r.start_time)
                row["end_time_us"] = _us(r.end_time)
            rows.append(row)
        return rows

    # -------------------------------------------------------------- the rest
    def actor_rows(self) -> list[dict[str, Any]]:
        """list_actors()'s rows."""
        st = self.head.state
        rows = []
        for aid, a in st.actor_table.actors.items():
            spec = a.spec
            state = _ACTOR_STATES[a.state.value]
            if state == "PENDING_CREATION" and a.creation.state is TaskState.WAITING:
                state = "DEPENDENCIES_UNREADY"
            w = a.worker
            alive = w is not None and state != "DEAD"
            rows.append({
                "actor_id": aid.hex(), "class_name": spec.class_name, "state": state,
                "name": spec.name, "ray_namespace": spec.namespace,
                "job_id": self.job_hex(a.owner),
                "node_id": node_hex(w.node_id) if alive else None,
                "pid": w.pid if alive else None,
                "num_restarts": a.restarts, "is_detached": bool(spec.detached)})
        return rows

    def object_rows(self) -> list[dict[str, Any]]:
        """list_objects()'s rows, largest first: where each object lives and which
        processes hold refs to it (pid, DRIVER or WORKER, count)."""
        st = self.head.state
        holders: dict[bytes, list[dict[str, Any]]] = {}
        for c in st.clients.values():
            kind = "DRIVER" if c.kind == "driver" else "WORKER"
            for oid, n in c.holds.items():
                holders.setdefault(oid, []).append({"pid": c.pid, "type": kind, "count": n})
        actors = st.actor_table.actors
        rows: list[dict[str, Any]] = []
        for oid, o in st.objects.items():
            if oid in actors or oid.endswith(_GROUP_SUFFIX):
                continue   # an actor handle's or placement group's pseudo-object
            d = o.data
            where, node = "PENDING", None
            if d is not None:
                if d.segment is not None:
                    where = "SPILLED" if d.segment.path else "SHARED_MEMORY"
                    node = node_hex(d.segment.node_id)
                elif d.kind == ERROR:
                    where = "ERROR"
                else:
                    where = "INLINE"
            owner = st.clients.get(o.owner)
            held = holders.get(oid, [])
            rows.append({
                "object_id": oid.hex(), "object_size": nbytes(o), "location": where,
                "node_id": node, "ref_count": o.count,
                "pid": owner.pid if owner is not None else None,
                "type": ("DRIVER" if owner.kind == "driver" else "WORKER") if owner else None,
                "task_status": "FINISHED" if d is not None else "PENDING",
                "holders": held,
                "copies": sorted(node_hex(n) for n in o.copies) if o.copies else []})
        rows.sort(key=lambda r: -r["object_size"])
        return rows

    def nodes_info(self) -> list[pb.NodeInfo]:
        """Every node, alive or gone, for orchestra.nodes()."""
        out = []
        head = self.head
        st = head.state
        for nid, node in sorted(head.nodes.items()):
            rec = st.nodes.get(nid)
            host = head.node_address(node) or "127.0.0.1"
            info = node.store_info()
            ni = pb.NodeInfo(node_id=nid, alive=True, address=host,
                             store_capacity=node.capacity, store_used=info.used,
                             spilled_bytes=info.spilled_bytes,
                             pid=node.pid if type(node) is RemoteNode else os.getpid())
            if rec is not None:
                ni.resources.update(rec.resources.total)
                ni.available.update({k: max(v, 0.0) for k, v in rec.resources.free.items()})
            out.append(ni)
        for nid, g in sorted(head.gone.items()):
            ni = pb.NodeInfo(node_id=nid, alive=False, address=g.host, pid=g.pid, death=g.reason)
            ni.resources.update(g.resources)
            out.append(ni)
        return out

    def debug_info(self) -> pb.SchedulerDebugInfoReply:
        """The scheduler's tables for debug_info() (tests and tools read it)."""
        st = self.head.state
        info = pb.SchedulerDebugInfoReply(
            total_resources=cluster_total(st.nodes), available_resources=cluster_free(st.nodes))
        for t in st.tasks.values():
            info.task.append(call_out(t.call))
        for w in st.workers.values():
            info.workers.append(pb.WorkerInfo(
                workerid=w.worker_id, pid=w.pid, node_id=w.node_id, state=w.state.value,
                running=[t.call.task_id for t in w.queue]))
            if w.state is WorkerState.IDLE:
                info.avail_worker.append(w.worker_id)
        for oid, o in st.objects.items():
            d = o.data
            path = d.segment.path if d is not None and d.segment is not None else None
            info.objects.append(pb.ObjectInfo(
                objref=oid, state="ready" if d is not None else "pending",
                refcount=o.count, size=nbytes(o), in_shared_memory=path == "",
                spilled=bool(path)))
        for f in st.functions.values():
            info.function_table[f.wire.fnname].num_return_vals = f.wire.num_return_vals
        return info

    def node_rows(self) -> list[dict[str, Any]]:
        """list_nodes()'s rows (Ray's keys), alive and dead."""
        head = self.head
        rows = []
        for ni in self.nodes_info():
            nid = node_hex(ni.node_id)
            rows.append({
                "node_id": nid, "node_ip": ni.address or "127.0.0.1",
                "is_head_node": ni.node_id == head.local.node_id,
                "state": "ALIVE" if ni.alive else "DEAD", "state_message": ni.death or None,
                "resources_total": dict(ni.resources),
                "resources_available": dict(ni.available),
                "store_used": ni.store_used, "store_capacity": ni.store_capacity,
                "spilled_bytes": ni.spilled_bytes, "pid": ni.pid})
        return rows

    def worker_rows(self) -> list[dict[str, Any]]:
        """list_workers()'s rows: task and actor workers, then drivers."""
        head = self.head
        st = head.state
        rows = []
        for w in st.workers.values():
            rows.append({
                "worker_id": f"{w.worker_id:016x}", "worker_type": "WORKER",
                "is_alive": w.state is not WorkerState.DEAD, "state": w.state.value.upper(),
                "node_id": node_hex(w.node_id), "pid": w.pid or None,
                "actor_id": w.actor.spec.actor_id.hex() if w.actor is not None else None,
                "running_task_id": w.queue[0].call.task_id.hex() if w.queue else None})
        for c in st.clients.values():
            if c.kind == "driver":
                rows.append({
                    "worker_id": f"driver-{c.conn:08x}", "worker_type": "DRIVER",
                    "is_alive": True, "state": "CONNECTED", "node_id": node_hex(c.node_id),
                    "pid": c.pid, "actor_id": None, "running_task_id": None})
        return rows

    def cluster_summary(self, flushed: bool = False) -> dict[str, Any]:
        """The cluster summary (the dashboard's data, `orchestra status`): nodes,
        resources, object store, tasks and actors by state, workers, drivers. Reads
        the task events reported so far (within ~1 s); no I/O."""
        head = self.head
        st = head.state
        nodes = []
        store = {"used": 0, "capacity": 0, "pooled": 0, "spilled_bytes": 0, "spilled_objects": 0}
        for node in head.nodes.values():
            info = node.store_info()
            store["used"] += info.used
            store["pooled"] += info.pooled
            store["capacity"] += info.capacity
            store["spilled_bytes"] += info.spilled_bytes
            store["spilled_objects"] += info.spilled_objects
        for row in self.node_rows():
            nodes.append({
                "node_id": row["node_id"], "address": row["node_ip"],
                "alive": row["state"] == "ALIVE", "resources_total": row["resources_total"],
                "resources_available": row["resources_available"],
                "store_used": row["store_used"], "store_capacity": row["store_capacity"],
                "spilled_bytes": row["spilled_bytes"]})
        self._settle(flushed)
        actors: dict[str, int] = {}
        for row in self.actor_rows():
            actors[row["state"]] = actors.get(row["state"], 0) + 1
        return {
            "session": str(head.cfg.get("session_id", "")), "nodes": nodes,
            "resources_total": cluster_total(st.nodes),
            "resources_available": cluster_free(st.nodes), "store": store,
            "tasks": self.table.counts(), "actors": actors,
            "workers": sum(1 for w in st.workers.values() if w.state is not WorkerState.DEAD),
            "drivers": sum(1 for c in st.clients.values() if c.kind == "driver"),
            "tasks_dropped": self.table.dropped, "time": time.time(),
            # Started again by its supervisor (_cluster/supervisor.py): how often, why last.
            "head_restarts": int(head.cfg.get("head_restarts", 0)),
            "head_last_restart": head.cfg.get("last_restart") or None,
            # Its state store (_head/state_store.py): None when it keeps none.
            "state_store": head.durable.health() if head.durable is not None else None,
            "security": _security(head.token, head.address)}


def _security(token: str, address: str) -> dict[str, Any] | None:
    """How its port speaks to other machines: TLS (with the cluster key's fingerprint),
    or plain, on loopback or beyond it (--insecure-no-tls). None: no TCP port."""
    from .._protocol import tls
    from .._protocol.connection import parse_host
    if not token or not address or address.startswith(("/", "unix:")):
        return None
    from .._protocol import pki
    on = tls.enabled(token)
    own = pki.current() if on else None
    return {"tls": on, "key": tls.cluster_fingerprint(token) if on and own is None else "",
            "certificate": tls.certificate_fingerprint(token) if on else "",
            # On certificates of the user's own: their CA, and when the head's expires.
            "ca": own.ca_subject if own is not None else "",
            "ca_fingerprint": own.ca_fingerprint if own is not None else "",
            "certificate_expires": own.not_after if own is not None else "",
            "loopback": tls.is_loopback(parse_host(address))}


def _ms(t: float) -> int | None:
    return int(t * 1000) if t else None


def _us(t: float) -> int | None:
    return int(t * 1_000_000) if t else None
