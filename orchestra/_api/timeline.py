"""``orchestra.timeline()``: task and actor call events in Chrome's trace event format
(what Perfetto and chrome://tracing open), in Ray's shape.

    list_tasks(detail) + list_nodes + list_workers -> events:
      "M" metadata: a process per node ("Node <id> (<ip>)"), a thread per worker or
          driver process ("worker <id> (pid N)", "driver (pid N)")
      "X" complete event per call that started: pid = node, tid = worker pid, name,
          cat = NORMAL_TASK / ACTOR_TASK / ACTOR_CREATION_TASK, args with its task id
      "i" instant event where a call was submitted (on its caller's thread), and a
          flow ("s" -> "f") from there to the call's start, when the head saw the submit
Every event carries ph, ts, dur, pid, tid and name (ts in microseconds of unix time;
dur 0 for instants and metadata), so readers that expect them all find them.
"""
from __future__ import annotations

import json
import time
from typing import Any


def _pid(node_hex: str | None) -> int:
    """A node's process id in the trace: its id + 1 (0 reads as "no process")."""
    return int(node_hex, 16) + 1 if node_hex else 0


def timeline_events(tasks: list[dict[str, Any]], nodes: list[dict[str, Any]],
                    workers: list[dict[str, Any]], now_us: int | None = None) -> list[dict[str, Any]]:
    """The trace events of these rows (list_tasks(detail=True), list_nodes, list_workers);
    a call still running ends at ``now_us``."""
    now_us = int(time.time() * 1_000_000) if now_us is None else now_us
    events: list[dict[str, Any]] = []

    def meta(kind: str, pid: int, tid: int, name: str) -> None:
        events.append({"ph": "M", "name": kind, "pid": pid, "tid": tid, "ts": 0, "dur": 0,
                       "args": {"name": name}})

    for n in nodes:
        meta("process_name", _pid(n["node_id"]), 0, f"Node {n['node_id']} ({n['node_ip']})")
    threads: set[tuple[int, int]] = set()
    for w in workers:
        if w["pid"]:
            key = (_pid(w["node_id"]), w["pid"])
            threads.add(key)
            label = (f"driver (pid {w['pid']})" if w["worker_type"] == "DRIVER"
                     else f"worker {int(w['worker_id'], 16)} (pid {w['pid']})")
            meta("thread_name", key[0], key[1], label)
    flow = 0
    for t in tasks:
        start, end = t["start_time_us"], t["end_time_us"]
        args = {"task_id": t["task_id"], "state": t["state"], "job_id": t["job_id"],
                "actor_id": t["actor_id"], "error_type": t["error_type"],
                "attempt_number": t["attempt_number"]}
        pid, tid = _pid(t["node_id"]), t["worker_pid"] or 0
        if start is not None:
            stop = end if end is not None else now_us
            events.append({"ph": "X", "cat": t["type"], "name": t["name"], "pid": pid,
                           "tid": tid, "ts": start, "dur": max(stop - start, 0),
                           "args": args})
            if (pid, tid) not in threads:   # a worker gone since
                threads.add((pid, tid))
                meta("thread_name", pid, tid, f"worker (pid {tid})")
        created = t["creation_time_us"]
        if created is None or t.get("caller_pid") is None:
            continue
        cpid, ctid = _pid(t.get("caller_node_id")), t["caller_pid"]
        events.append({"ph": "i", "s": "t", "cat": "submit", "name": f"submit {t['name']}",
                       "pid": cpid, "tid": ctid, "ts": created, "dur": 0,
                       "args": {"task_id": t["task_id"]}})
        if start is not None:
            flow += 1
            common = {"cat": "submit", "name": "submit", "id": flow, "dur": 0}
            events.append({"ph": "s", "pid": cpid, "tid": ctid, "ts": created, **common})
            events.append({"ph": "f", "bp": "e", "pid": pid, "tid": tid, "ts": start,
                           **common})
    return events


def timeline(filename: str | None = None) -> list[dict[str, Any]] | None:
    """Every task and actor call the head keeps, as Chrome trace events (open the file in
    https://ui.perfetto.dev or chrome://tracing).

    Args:
        filename: write the events there as JSON; None: return them instead.

    Returns: the list of events when ``filename`` is None, else None."""
    from .state import list_nodes, list_tasks, list_workers
    events = timeline_events(list_tasks(limit=0, detail=True), list_nodes(limit=0),
                             list_workers(limit=0))
    if filename is None:
        return events
    with open(filename, "w") as f:
        json.dump(events, f)
    return None
