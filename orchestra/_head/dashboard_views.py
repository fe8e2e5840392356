"""What the dashboard's page asks the head for, as JSON-able data: one function per path
under /api/ (``routes()``; /api/summary, the cached cluster summary, is the server's own),
read from the head's tables on its loop.

    /api/actors        every actor: id, class, name, namespace, state, node, pid,
                       restarts, and for a dead one the cause
    /api/tasks         the recent and running tasks, failed ones first with their error,
                       filtered by state and name; counts by function
    /api/task?id=      one task, with its error message and traceback
    /api/stream?since= the task stream: tasks started or ended since change number
                       ``since`` (only what changed since the last poll), by worker
    /api/history?since= the nodes' and user metrics' points after time ``since``
    /api/objects       the largest objects, their node and holders
    /api/logs?pid=     a worker's log on this machine (the tail, then what was added
                       after the offsets the page passes back: follow)
    /api/drivers       the connected drivers, when they connected, their task counts
    /api/metrics       the user metrics' series and values

The sampler (every SAMPLE_S on the head's loop) adds a point per node to the history:
its workers' CPU use (from the CPU time they report) and memory, its object store's
bytes and spilled bytes, and a point per user metric series.
"""
from __future__ import annotations

import collections
import glob
import os
import sys
import time
from collections.abc import Callable
from typing import Any

from .._ids import node_from_hex, node_hex
from .._observe.history import SAMPLE_S, History
from .._observe.log_capture import LOGS_DIR, MARKER
from .._observe.progress_bars import PREFIX as BAR_PREFIX
from .._observe.task_events import ENDED, FAILED, KINDS, RUNNING
from .._scheduler.model import WorkerState

TASKS_LIMIT = 500           # rows of the tasks table per answer
STREAM_WINDOW_S = 90.0      # a page that starts (or missed changes) gets this much back
LOG_TAIL_BYTES = 64 << 10   # the first answer for a log: its last 64 KiB
LOG_CHUNK_BYTES = 256 << 10 # a follow answer: at most this much more
OBJECTS_LIMIT = 100
JOB_ROWS = 200              # the newest jobs shown (the head keeps up to 1,000 ended)
STREAM_MAX = 20_000         # tasks in one answer of the task stream, the newest
MERGE_MS = 50               # tasks shorter than this (under a pixel of the minute) that
MERGE_GAP_MS = 5            # ran this close after each other on a worker share a bar

View = Callable[[dict[str, str]], Any]


class DashboardViews:
    """The head's answers to the page (see the module docstring). ``head``: the Head."""

    def __init__(self, head: Any) -> None:
        self.head = head
        self.events = head.events
        self.history = History()
        self._cpu: dict[int, float] = {}          # worker id -> CPU seconds at the last sample
        self._last_sample = 0.0
        self._timer: Any = None

    def routes(self) -> dict[str, View]:
        """Path under /api/ -> the function answering it (given the query's pairs)."""
        return {"actors": self.actors,
                "tasks": self.tasks, "task": self.task, "stream": self.stream,
                "history": self.history_since, "objects": self.objects, "logs": self.logs,
                "drivers": self.drivers, "metrics": self.metric_rows}

    # ------------------------------------------------------------ sampling
    def start(self) -> None:
        """Sample now and every SAMPLE_S on the head's loop, until the head stops."""
        self.sample()

    def stop(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None

    def sample(self) -> None:
        head = self.head
        if getattr(head, "stopping", False):
            return
        try:
            self._sample(time.time())
        except Exception as exc:  # noqa: BLE001 - a bug here must not stop the head's loop
            print(f"orchestra head: the dashboard's sampler failed: {exc!r}", file=sys.stderr,
                  flush=True)
        self._timer = head.loop.call_later(SAMPLE_S, self.sample)

    def _sample(self, now: float) -> None:
        st = self.head.state
        usage = self.events.usage
        dt = now - self._last_sample if self._last_sample else 0.0
        self._last_sample = now
        cpu: dict[int, float] = {}
        mem: dict[int, float] = {}
        seen_cpu: dict[int, float] = {}
        for wid, w in st.workers.items():
            u = usage.get(wid)
            if u is None or w.state is WorkerState.DEAD:
                continue
            rss, cpu_s = u
            mem[w.node_id] = mem.get(w.node_id, 0.0) + rss
            before = self._cpu.get(wid)
            if dt > 0 and before is not None and cpu_s >= before:
                cpu[w.node_id] = cpu.get(w.node_id, 0.0) + (cpu_s - before) / dt
            seen_cpu[wid] = cpu_s
        self._cpu = seen_cpu
        values: dict[str, float] = {}
        for row in self.events.node_rows():
            nid = row["node_id"]
            n = node_from_hex(nid)
            alive = row["state"] == "ALIVE"
            values[f"node:{nid}:alive"] = 1.0 if alive else 0.0
            values[f"node:{nid}:cpu"] = cpu.get(n, 0.0) if alive else 0.0
            values[f"node:{nid}:mem"] = mem.get(n, 0.0) if alive else 0.0
            values[f"node:{nid}:store"] = float(row.get("store_used") or 0)
            values[f"node:{nid}:spilled"] = float(row.get("spilled_bytes") or 0)
        for key, v in self.events.metrics.values().items():
            values[f"metric:{key}"] = v
        self.history.add(now, values)
        for wid in [k for k in usage if k not in st.workers]:
            del usage[wid]

    # ------------------------------------------------------------ views
    def history_since(self, q: dict[str, str]) -> dict[str, Any]:
        since = _float(q.get("since"), 0.0)
        nodes = [{"node_id": r["node_id"], "address": r["node_ip"],
                  "alive": r["state"] == "ALIVE", "cpus": r["resources_total"].get("CPU", 0.0),
                  "store_capacity": r.get("store_capacity") or 0}
                 for r in self.events.node_rows()]
        return {"time": time.time(), "nodes": nodes, "series": self.history.since(since)}

    def actors(self, q: dict[str, str]) -> dict[str, Any]:
        table = self.head.state.actor_table.actors
        rows = []
        for row in self.events.actor_rows():
            a = table.get(bytes.fromhex(row["actor_id"]))
            rows.append({"actor_id": row["actor_id"], "class_name": row["class_name"],
                         "name": row["name"], "namespace": row["ray_namespace"],
                         "state": row["state"], "node_id": row["node_id"], "pid": row["pid"],
                         "restarts": row["num_restarts"], "detached": row["is_detached"],
                         "cause": (a.cause if a is not None else "") or None})
        order = {"ALIVE": 0, "RESTARTING": 1, "PENDING_CREATION": 2, "DEPENDENCIES_UNREADY": 3}
        rows.sort(key=lambda r: order.get(r["state"], 4))
        return {"actors": rows}

    def tasks(self, q: dict[str, str]) -> dict[str, Any]:
        self.events._settle(False)
        want_state = q.get("state") or ""
        want_name = (q.get("name") or "").lower()
        limit = max(int(_float(q.get("limit"), TASKS_LIMIT)), 0)
        table = self.events.table
        # One pass over the table (100k records: ~30 ms): the newest ``limit`` of each
        # group kept, the counts by function and state tallied.
        failed: collections.deque[Any] = collections.deque(maxlen=limit)
        running: collections.deque[Any] = collections.deque(maxlen=limit)
        other: collections.deque[Any] = collections.deque(maxlen=limit)
        tally: collections.Counter[tuple[str, int, str]] = collections.Counter()
        matched = 0
        for r in table.records.values():
            tally[(r.name, r.kind, r.state)] += 1
            if want_state and r.state != want_state:
                continue
            if want_name and want_name not in r.name.lower():
                continue
            matched += 1
            (failed if r.state == FAILED else running if r.state == RUNNING else other).append(r)
        picked = [*reversed(failed), *reversed(running), *reversed(other)][:limit]
        errors = table.errors
        rows = []
        for r in picked:
            row = _task_row(r)
            e = errors.get(r.task_id)
            if e is not None:
                row["error_message"] = e[0][:500]
            rows.append(row)
        fns: dict[str, dict[str, Any]] = {}
        for (name, kind, state), n in tally.items():
            f = fns.setdefault(name or "?", {"name": name or "?", "type": KINDS[kind], "counts": {}})
            f["counts"][state] = f["counts"].get(state, 0) + n
        by_fn = sorted(fns.values(), key=lambda d: -sum(d["counts"].values()))
        return {"tasks": rows, "matched": matched,
                "total": len(table.records), "dropped": table.dropped, "by_function": by_fn}

    def task(self, q: dict[str, str]) -> dict[str, Any]:
        try:
            tid = bytes.fromhex(q.get("id") or "")
        except ValueError:
            return {"error": "id must be a task id in hex"}
        self.events._settle(False)
        r = self.events.table.records.get(tid)
        if r is None:
            return {"error": "no such task (it may have been dropped from the table)"}
        row = _task_row(r)
        e = self.events.table.errors.get(tid)
        if e is not None:
            row["error_message"], row["traceback"] = e
        return {"task": row}

    def stream(self, q: dict[str, str]) -> dict[str, Any]:
        """The task stream's changes after change number ``since``: each bar as
        [function index, worker index, start, end or null, failed, tasks], the times in
        ms relative to ``time`` (short numbers: a busy cluster's answer stays small);
        short tasks back to back merged (merge_bars); at most STREAM_MAX tasks, the newest."""
        self.events.catch_up()
        table = self.events.table
        since = int(_float(q.get("since"), 0))
        records, complete = table.changed_since(since)
        now = time.time()
        reset = since == 0 or not complete
        if reset:   # a fresh page, or one that missed changes: the last window, whole
            cutoff = now - STREAM_WINDOW_S
            records = [r for r in table.records.values()
                       if r.start_time and (r.end_time == 0.0 and r.state == RUNNING
                                            or r.end_time >= cutoff)]
        if len(records) > STREAM_MAX:
            records = records[-STREAM_MAX:]
        names: dict[str, int] = {}
        workers: dict[str, int] = {}
        now_ms = int(now * 1000)
        rows: list[list[Any]] = []
        for r in records:
            if not r.start_time or r.pid == 0:
                continue
            fn = names.setdefault(r.name, len(names))
            wk = workers.setdefault(f"{node_hex(r.node_id) if r.node_id >= 0 else '?'}:{r.pid}",
                                    len(workers))
            end = int(r.end_time * 1000) - now_ms if r.end_time and r.state in ENDED else None
            rows.append([fn, wk, int(r.start_time * 1000) - now_ms, end,
                         1 if r.state == FAILED else 0, 1])
        out = merge_bars(rows)
        return {"seq": table.seq, "reset": reset, "time": now_ms,
                "names": list(names), "workers": list(workers), "tasks": out}

    def objects(self, q: dict[str, str]) -> dict[str, Any]:
        rows = self.events.object_rows()
        keep = [{"object_id": r["object_id"], "size": r["object_size"],
                 "location": r["location"], "node_id": r["node_id"],
                 "copies": r.get("copies", []), "holders": r.get("holders", []),
                 "owner_pid": r.get("pid"), "ref_count": r.get("ref_count")}
                for r in rows[:OBJECTS_LIMIT]]
        return {"objects": keep, "total": len(rows),
                "bytes": sum(int(r["object_size"] or 0) for r in rows)}

    def drivers(self, q: dict[str, str]) -> dict[str, Any]:
        """The jobs (list_jobs()'s rows, the ended ones too, newest first), each with its
        tasks by state (those this head saw)."""
        self.events._settle(False)
        job_of = self.events.job_finder()
        counts: dict[str, dict[str, int]] = {}
        for r in self.events.table.records.values():
            job = self.events.job_hex(job_of(r.caller))
            if job is not None:
                c = counts.setdefault(job, {})
                c[r.state] = c.get(r.state, 0) + 1
        rows = []
        for job in reversed(self.head.jobs.rows()[-JOB_ROWS:]):
            rows.append({"job_id": job["job_id"], "status": job["status"],
                         "pid": job["driver_pid"], "node_id": job["driver_node_id"],
                         "namespace": job["namespace"], "entrypoint": job["entrypoint"],
                         "message": job["message"], "connected_at_ms": job["start_time"],
                         "end_time_ms": job["end_time"],
                         "tasks": counts.get(str(job["job_id"]), {})})
        return {"drivers": rows}

    def metric_rows(self, q: dict[str, str]) -> dict[str, Any]:
        m = self.events.metrics
        return {"metrics": m.rows(), "conflicts": m.conflicts, "dropped": m.dropped}

    def logs(self, q: dict[str, str]) -> dict[str, Any]:
        """A worker's stdout and stderr files on this machine: the tail, or (offsets
        given) what was written after them."""
        try:
            pid = int(q.get("pid") or "")
        except ValueError:
            return {"error": "pid must be a worker's process id"}
        files = self._log_files(pid)
        if not files:
            w = next((w for w in self.head.state.workers.values() if w.pid == pid), None)
            where = (f" (it runs on node {node_hex(w.node_id)}: run `orchestra logs {pid}` "
                     "on that machine)" if w is not None else "")
            return {"pid": pid, "error": f"no log of a worker with pid {pid} on the head's "
                                         f"machine{where}"}
        out = {}
        for stream, path in files.items():
            offset = int(_float(q.get(f"offset_{stream}"), -1))
            out[stream] = _read_log(path, offset)
        return {"pid": pid, **out}

    def _log_files(self, pid: int) -> dict[str, str]:
        dirs = {self.head.session_dir}
        for node in self.head.nodes.values():
            d = getattr(node, "node_dir", "")
            if d and os.path.isdir(d):
                dirs.add(d)
        found: dict[str, str] = {}
        for d in dirs:
            for path in glob.glob(os.path.join(d, LOGS_DIR, f"worker-*-{pid}.*")):
                stream = path.rsplit(".", 1)[1]
                if stream in ("out", "err"):
                    found[stream] = path
        return found


def merge_bars(rows: list[list[Any]]) -> list[list[Any]]:
    """Task-stream rows [fn, worker, start, end, failed, count] with the short ended tasks
    that ran back to back on one worker, of one function, merged into one bar counting
    them: a bar under MERGE_MS is narrower than a pixel of the minute drawn, and a busy
    worker runs thousands a second. Running, failed and longer tasks stay bars of their own."""
    rows.sort(key=lambda x: (x[1], x[2]))
    out: list[list[Any]] = []
    last: list[Any] | None = None
    for row in rows:
        fn, wk, start, end, failed, _ = row
        if (last is not None and end is not None and not failed and last[1] == wk
                and last[0] == fn and last[3] is not None and not last[4]
                and start - last[3] <= MERGE_GAP_MS and end - start < MERGE_MS):
            last[3] = max(last[3], end)
            last[5] += 1
            continue
        out.append(row)
        last = row if end is not None and end - start < MERGE_MS else None
    return out


def _read_log(path: str, offset: int) -> dict[str, Any]:
    """{"text", "offset"}: from ``offset`` (-1: the last LOG_TAIL_BYTES) to the end, at
    most LOG_CHUNK_BYTES; "offset" is where the next read starts."""
    try:
        with open(path, "rb") as f:
            size = os.fstat(f.fileno()).st_size
            start = max(size - LOG_TAIL_BYTES, 0) if offset < 0 or offset > size else offset
            f.seek(start)
            data = f.read(LOG_CHUNK_BYTES)
    except OSError as exc:
        return {"text": "", "offset": 0, "error": str(exc)}
    if start and offset < 0:   # the tail starts at a line
        cut = data.find(b"\n")
        data, start = (data[cut + 1:], start + cut + 1) if cut >= 0 else (data, start)
    lines = [_shown(line) for line in data.decode("utf-8", "backslashreplace").splitlines(True)
             if not line.startswith(BAR_PREFIX)]
    return {"text": "".join(lines), "offset": start + len(data)}


def _shown(line: str) -> str:
    """A log file's line as `orchestra logs` prints it: a marker as a header."""
    if not line.startswith(MARKER):
        return line
    parts = line[len(MARKER):].split() + ["", "", ""]
    return f"--- {parts[0]} {parts[2]} {parts[1]} ---\n"


def _task_row(r: Any) -> dict[str, Any]:
    return {"task_id": r.task_id.hex(), "name": r.name, "state": r.state, "type": KINDS[r.kind],
            "node_id": node_hex(r.node_id) if r.node_id >= 0 else None,
            "pid": r.pid or None, "error_type": r.error_type or None,
            "submit_ms": int(r.submit_time * 1000) if r.submit_time else None,
            "start_ms": int(r.start_time * 1000) if r.start_time else None,
            "end_ms": int(r.end_time * 1000) if r.end_time else None,
            "attempts": r.attempts, "actor_id": r.actor_id.hex() or None}


def _float(text: str | None, default: float) -> float:
    try:
        return float(text) if text else default
    except ValueError:
        return default
