"""Task events: what every task and actor call did, and when. No I/O.

    worker: prepare() -> EventBuffer.started.append(tuple)     (one append per call)
            send_done() -> EventBuffer.ended.append(tuple)
            client's background thread, every 0.5 s while any -> take() -> TaskEventBatch
            --TASK_EVENTS frame--> head
    head:   SUBMIT frames -> TaskTable.submitted (their calls, read at the next tick)
            TASK_EVENTS   -> TaskTable.worker_batch(..., the worker's id, pid, node)
            a state query -> TaskTable.settle(scheduler view) -> rows (_head/state_query.py)

Direct calls (tasks a driver sends straight to a lent worker, calls straight to an
actor) never pass the head: their worker's events are all it learns of them, so a direct
call shows from its start, with its caller's connection as its job. Tasks the head
schedules also have a submit time and the scheduler's state while they wait.

The table is bounded (``max_tasks``, 100k by default): past it, the oldest ended tasks
are dropped first (counted in ``dropped``), then the oldest of any state.
"""
from __future__ import annotations

import collections
import os
import threading
import time
from collections.abc import Callable, Iterable, Sequence
from typing import Any

from .._protocol import pb

# Kinds of call, as Ray names them (TaskEventBatch.start_kind is the index).
KINDS = ("NORMAL_TASK", "ACTOR_TASK", "ACTOR_CREATION_TASK")
NORMAL_TASK, ACTOR_TASK, ACTOR_CREATION_TASK = range(len(KINDS))
# A worker's rows, plain tuples (built once per call on the task path, where a named
# tuple costs ~8x a tuple): a call's start and its end.
StartRow = tuple[bytes, str, bytes, int, int, float]   # task id, name, actor id, kind, owner, time
EndRow = tuple[bytes, float, str]                       # task id, time, error type or ""

# TaskTable.departed: a driver's connection (a worker's holds its worker id, >= 0).
DRIVER = -1
_DEPARTED_MAX = 4096

# Ray's task states (those this table uses).
PENDING_ARGS_AVAIL = "PENDING_ARGS_AVAIL"
PENDING_NODE_ASSIGNMENT = "PENDING_NODE_ASSIGNMENT"
RUNNING = "RUNNING"
FINISHED = "FINISHED"
FAILED = "FAILED"
ENDED = frozenset({FINISHED, FAILED})

# Legal transitions (STYLE rule 4). A task goes back to pending when it is retried
# (its worker died) or handed back (stolen before it started); an ended task starts again
# when it is retried after a failure of user code (retry_exceptions=).
TRANSITIONS: dict[str, frozenset[str]] = {
    PENDING_ARGS_AVAIL: frozenset({PENDING_NODE_ASSIGNMENT, RUNNING, FINISHED, FAILED}),
    PENDING_NODE_ASSIGNMENT: frozenset({PENDING_ARGS_AVAIL, RUNNING, FINISHED, FAILED}),
    RUNNING: frozenset({PENDING_ARGS_AVAIL, PENDING_NODE_ASSIGNMENT, RUNNING, FINISHED, FAILED}),
    FINISHED: frozenset({RUNNING}),
    FAILED: frozenset({RUNNING}),
}

# Error types the table gives on its own (the others are the exception's class name).
WORKER_DIED = "WORKER_DIED"
TASK_CANCELLED = "TASK_CANCELLED"
NOT_RUN = "TASK_NOT_RUN"   # ended without a worker running it: dependency failed, cancelled, ...

# A submitted task the scheduler forgot and no worker reported is taken to have ended
# without running once this old: workers report every 0.5 s (REPORT_S), so a task that
# ran would have been heard of by then. A state query asks the workers first instead.
_SETTLE_S = 2.0
# Workers send what they buffered this often (and at once when a state query asks).
REPORT_S = 0.5
# While a call runs, a worker reports its usage at least this often.
USAGE_S = 2.0
# A failed call's message and traceback, as kept for the dashboard, at most.
ERROR_MESSAGE_MAX = 2000
ERROR_TRACEBACK_MAX = 16000
_PAGE = os.sysconf("SC_PAGE_SIZE") if hasattr(os, "sysconf") else 4096
DEFAULT_MAX_TASKS = 100_000
# Changes (starts and ends) kept for the task stream, and failed calls' texts kept.
CHANGES_KEPT = 200_000
ERRORS_KEPT = 1000


class IllegalTaskTransition(RuntimeError):
    """A task event that no legal transition explains (a bug of ours)."""


# ------------------------------------------------------------------ worker side

class EventBuffer:
    """A worker's events since its last report: tuples appended on the task path
    (list.append is atomic, so any thread may append), taken by the background thread."""

    __slots__ = ("started", "ended", "error_types", "errors", "last_report", "lock")

    def __init__(self) -> None:
        self.started: list[StartRow] = []
        self.ended: list[EndRow] = []
        # task id -> the class name of the error user code raised, until its end is noted
        self.error_types: dict[bytes, str] = {}
        # (task id, message, traceback) of failed calls, for the dashboard (cut short)
        self.errors: list[tuple[bytes, str, str]] = []
        self.last_report = time.monotonic()
        self.lock = threading.Lock()

    def due(self, now: float) -> bool:
        """Whether a periodic report is due (something buffered, REPORT_S passed)."""
        return bool(self.started or self.ended) and now - self.last_report >= REPORT_S

    def usage_due(self, now: float, busy: bool) -> bool:
        """Whether a report of usage alone is due: a call runs, and none was sent for
        USAGE_S (the dashboard's charts of a node then follow a long task)."""
        return busy and now - self.last_report >= USAGE_S

    def failed(self, task_id: bytes, exc: BaseException, traceback_text: str) -> None:
        """Keep a failed call's message and traceback for the next report."""
        try:
            message = str(exc)
        except Exception:  # noqa: BLE001 - a __str__ that raises: its type alone
            message = type(exc).__name__
        self.errors.append((task_id, message[:ERROR_MESSAGE_MAX],
                            traceback_text[-ERROR_TRACEBACK_MAX:]))

    def take(self, flush_id: int = 0) -> pb.TaskEventBatch | None:
        """What was buffered, as one TaskEventBatch; the buffer keeps what is appended
        meanwhile (slices, then deletes, of the lengths read first). The ends are
        counted before the starts: every end taken then has its start taken too (a
        call's start is appended before its end), never one batch later, where the
        head would have seen a call end before it started."""
        with self.lock:   # the background thread and a flush request may both take
            self.last_report = time.monotonic()
            batch = pb.TaskEventBatch(flush_id=flush_id)
            n_end, n = len(self.ended), len(self.started)
            # Column by column (zip(*rows) of thousands of rows costs ~0.6 us a row).
            if n:
                rows = self.started[:n]
                del self.started[:n]
                batch.start_task_id.extend([r[0] for r in rows])
                batch.start_name.extend([r[1] for r in rows])
                batch.start_actor_id.extend([r[2] for r in rows])
                batch.start_kind.extend([r[3] for r in rows])
                batch.start_owner.extend([r[4] for r in rows])
                batch.start_time.extend([r[5] for r in rows])
            if n_end:
                ends = self.ended[:n_end]
                del self.ended[:n_end]
                batch.end_task_id.extend([e[0] for e in ends])
                batch.end_time.extend([e[1] for e in ends])
                batch.end_error_type.extend([e[2] for e in ends])
            if self.errors:
                errors, self.errors = self.errors, []
                batch.error_task_id.extend([e[0] for e in errors])
                batch.error_message.extend([e[1] for e in errors])
                batch.error_traceback.extend([e[2] for e in errors])
            batch.rss_bytes, batch.cpu_seconds = usage()
            return batch


def usage() -> tuple[int, float]:
    """This process's resident memory (bytes) and CPU time so far (seconds)."""
    t = os.times()
    try:
        with open("/proc/self/statm", "rb") as f:
            rss = int(f.read().split()[1]) * _PAGE
    except (OSError, ValueError, IndexError):
        rss = 0
    return rss, t.user + t.system


def end_error_type(done: pb.TaskDone, error_types: dict[bytes, str]) -> str:
    """The error type of a TaskDone about to be sent ("" for a call that finished)."""
    raised = error_types.pop(done.task_id, "") if error_types else ""
    if done.cancelled:
        return TASK_CANCELLED
    if done.user_error:
        return raised or "TaskError"
    return ""


# ------------------------------------------------------------------ head side

class TaskRecord:
    """One task or actor call, as list_tasks shows it."""

    __slots__ = ("task_id", "name", "kind", "actor_id", "caller", "state", "submit_time",
                 "start_time", "end_time", "error_type", "worker_id", "pid", "node_id",
                 "attempts")

    def __init__(self, task_id: bytes) -> None:
        self.task_id = task_id
        self.name = ""
        self.kind = 0
        self.actor_id = b""
        self.caller = 0          # the submitting connection (driver or worker) at the head
        self.state = PENDING_NODE_ASSIGNMENT
        self.submit_time = 0.0   # unix time; 0: unknown (a direct call)
        self.start_time = 0.0
        self.end_time = 0.0
        self.error_type = ""
        self.worker_id = -1
        self.pid = 0
        self.node_id = -1
        self.attempts = 0        # times a worker started it

    def move(self, new: str) -> None:
        if new != self.state and new not in TRANSITIONS[self.state]:
            raise IllegalTaskTransition(f"task {self.name or self.task_id.hex()}: "
                                        f"{self.state} -> {new}")
        self.state = new


class SchedView:
    """What the table reads of the scheduler when it settles (plain callables, so the
    table is tested without one): a task's scheduler state (None: not there), whether a
    worker is still connected, and whether a worker that is gone was killed to cancel
    the task it ran (orchestra.cancel(force=True), or its driver's death): that task
    settles as TASK_CANCELLED, not WORKER_DIED."""

    def __init__(self, task_state: Callable[[bytes], str | None],
                 worker_alive: Callable[[int], bool],
                 killed_to_cancel: Callable[[int], bool] = lambda _wid: False) -> None:
        self.task_state = task_state
        self.worker_alive = worker_alive
        self.killed_to_cancel = killed_to_cancel


class TaskTable:
    """The head's bounded table of task records, fed by submits and worker batches."""

    def __init__(self, max_tasks: int = DEFAULT_MAX_TASKS) -> None:
        if max_tasks < 1:
            raise ValueError(f"max_tasks={max_tasks}: the task table keeps at least one "
                             "task; pass a positive number (cfg task_events_max)")
        self.max_tasks = max_tasks
        self.records: dict[bytes, TaskRecord] = {}   # insertion order: oldest first
        self.dropped = 0
        # (unix time, connection, calls): appended per SUBMIT frame, read by ingest()
        self.submits: list[tuple[float, int, Sequence[pb.Call]]] = []
        # worker id -> the task it started last (the job of what that task submits)
        self.last_started: dict[int, TaskRecord] = {}
        # Connections closed, the newest _DEPARTED_MAX: -> DRIVER, or the worker id
        # behind it, so that a dead driver's tasks (and its tasks' tasks) keep their job.
        self.departed: dict[int, int] = {}
        # Kept as records change, so that a summary (the dashboard asks every second)
        # and settling never walk the whole table: tasks by state, and those not ended.
        self._counts: dict[str, int] = {}
        self.live: dict[bytes, TaskRecord] = {}
        # Starts and ends in the order reported, numbered: the dashboard's task stream
        # asks for those after the last number it saw (only what changed is sent).
        self.seq = 0
        self.changes: collections.deque[tuple[int, TaskRecord]] = collections.deque(
            maxlen=CHANGES_KEPT)
        # Failed calls' (message, traceback), the newest ERRORS_KEPT.
        self.errors: dict[bytes, tuple[str, str]] = {}

    def _new(self, tid: bytes, state: str) -> TaskRecord:
        r = self.records[tid] = TaskRecord(tid)
        r.state = state
        self._counts[state] = self._counts.get(state, 0) + 1
        if state not in ENDED:
            self.live[tid] = r
        return r

    def _move(self, r: TaskRecord, new: str) -> None:
        old = r.state
        r.move(new)
        if old == new:
            return
        counts = self._counts
        counts[old] -= 1
        counts[new] = counts.get(new, 0) + 1
        if new in ENDED:
            self.live.pop(r.task_id, None)
        else:
            self.live[r.task_id] = r

    # -------------------------------------------------------------- feeding
    def submitted(self, conn: int, calls: Sequence[pb.Call], now: float | None = None) -> None:
        """Calls (pb.Call) that reached the head: kept as given (cheap: one tuple per
        frame), read at the next ingest, so that a task the scheduler drops before that
        (cancelled, its driver gone) keeps its name."""
        self.submits.append((time.time() if now is None else now, conn, calls))

    def ingest(self) -> None:
        """Read the submits noted since the last call."""
        subs, self.submits = self.submits, []
        records = self.records
        for when, conn, calls in subs:
            for call in calls:
                tid = call.task_id
                r = records.get(tid)
                if r is None:
                    r = self._new(tid, PENDING_ARGS_AVAIL)
                    if call.HasField("actor"):
                        r.name, r.kind, r.actor_id = call.name, ACTOR_CREATION_TASK, \
                            call.actor.actor_id
                    else:
                        r.name, r.actor_id = call.name, call.actor_id
                        r.kind = ACTOR_TASK if call.actor_id else NORMAL_TASK
                r.caller = r.caller or conn
                r.submit_time = r.submit_time or when
        self._bound()

    def adopted(self, conn: int, worker_id: int, calls: Iterable[pb.Call]) -> None:
        """Direct calls handed to the head when their connection to ``worker_id`` closed
        (AdoptCalls): known here even when the worker died before it reported them."""
        records = self.records
        for call in calls:
            r = records.get(call.task_id)
            if r is None:
                r = self._new(call.task_id, PENDING_NODE_ASSIGNMENT)
                r.name, r.kind = call.name, (1 if call.actor_id else 0)
                r.actor_id, r.caller = call.actor_id, conn
            if r.worker_id < 0:
                r.worker_id = worker_id
        self._bound()

    def worker_batch(self, batch: pb.TaskEventBatch, worker_id: int, pid: int,
                     node_id: int) -> None:
        """A worker's report: its starts, then its ends (one batch holds both of a call
        that was quick). Every call passes here once or twice: the usual transitions
        (new -> RUNNING -> ended) are written out, the others go through _move."""
        records, counts, live = self.records, self._counts, self.live
        changes, seq = self.changes, self.seq
        r = None
        for tid, name, aid, kind, owner, t in zip(
                batch.start_task_id, batch.start_name, batch.start_actor_id,
                batch.start_kind, batch.start_owner, batch.start_time, strict=True):
            r = records.get(tid)
            if r is None:
                r = records[tid] = TaskRecord(tid)
                r.state = RUNNING
                counts[RUNNING] = counts.get(RUNNING, 0) + 1
                live[tid] = r
            else:
                self._move(r, RUNNING)
                r.end_time, r.error_type = 0.0, ""
            r.name, r.kind, r.actor_id = name, kind, aid
            if owner:
                r.caller = owner
            r.start_time = t
            r.worker_id, r.pid, r.node_id = worker_id, pid, node_id
            r.attempts += 1
            seq += 1
            changes.append((seq, r))
        if r is not None:
            self.last_started[worker_id] = r
        for tid, t, err in zip(batch.end_task_id, batch.end_time, batch.end_error_type,
                               strict=True):
            r = records.get(tid)
            if r is None:   # dropped meanwhile (the table is full of newer tasks)
                continue
            new = FAILED if err else FINISHED
            if r.state == RUNNING:
                r.state = new
                counts[RUNNING] -= 1
                counts[new] = counts.get(new, 0) + 1
                del live[tid]
            else:
                try:
                    self._move(r, new)
                except IllegalTaskTransition:
                    continue   # a second end of one run (never seen): the first stands
            r.end_time, r.error_type = t, err
            seq += 1
            changes.append((seq, r))
        self.seq = seq
        if batch.error_task_id:
            errors = self.errors
            for tid, message, tb in zip(batch.error_task_id, batch.error_message,
                                        batch.error_traceback, strict=True):
                errors.pop(tid, None)
                errors[tid] = (message, tb)
            while len(errors) > ERRORS_KEPT:
                del errors[next(iter(errors))]
        self._bound()

    def changed_since(self, seq: int) -> tuple[list[TaskRecord], bool]:
        """The records started or ended after change number ``seq`` (each once, oldest
        change first), and whether that is all of them (False: older changes than
        ``seq`` are no longer kept, so the caller has missed some)."""
        changes = self.changes
        out: dict[bytes, TaskRecord] = {}
        for n, r in reversed(changes):
            if n <= seq:
                break
            out.setdefault(r.task_id, r)
        complete = not changes or changes[0][0] <= seq + 1
        return list(reversed(out.values())), complete

    def _bound(self) -> None:
        records = self.records
        excess = len(records) - self.max_tasks
        if excess <= 0:
            return
        doomed = []
        for tid, r in records.items():   # oldest first; ended tasks go first
            if r.state in ENDED:
                doomed.append(tid)
                if len(doomed) == excess:
                    break
        if len(doomed) < excess:
            chosen = set(doomed)
            for tid in records:
                if tid not in chosen:
                    doomed.append(tid)
                    if len(doomed) == excess:
                        break
        for tid in doomed:
            r = records.pop(tid)
            self._counts[r.state] -= 1
            self.live.pop(tid, None)
            if self.last_started.get(r.worker_id) is r:
                del self.last_started[r.worker_id]
        self.dropped += len(doomed)

    # -------------------------------------------------------------- reading
    def settle(self, view: SchedView, flushed: bool, now: float | None = None) -> None:
        """Bring what the workers did not say up to date with the scheduler: a waiting
        task's pending state; a running task whose worker is gone failed (WORKER_DIED)
        or waits for its retry; a submitted task that neither the scheduler nor a worker
        has (any more) ended without running. ``flushed``: every worker has just
        reported, so that conclusion needs no waiting."""
        now = time.time() if now is None else now
        for r in list(self.live.values()):
            st = r.state
            sched = view.task_state(r.task_id)
            if st == RUNNING:
                if view.worker_alive(r.worker_id):
                    continue
                if sched is None:   # killed under it: by a cancel with force, or not
                    self._move(r, FAILED)
                    r.end_time, r.error_type = now, (
                        TASK_CANCELLED if view.killed_to_cancel(r.worker_id)
                        else WORKER_DIED)
                else:
                    self._move(r, sched)
            elif sched is not None:
                self._move(r, sched)
            elif flushed or now - r.submit_time > _SETTLE_S:
                self._move(r, FAILED)
                died = r.worker_id >= 0 and not view.worker_alive(r.worker_id)
                r.end_time, r.error_type = now, (WORKER_DIED if died else NOT_RUN)

    def client_gone(self, conn: int, worker_id: int) -> None:
        """A connection closed: a driver's (``worker_id`` DRIVER) or a worker's. Its
        tasks' job stays known (job_of) while it is among the newest closed."""
        departed = self.departed
        departed[conn] = worker_id
        if len(departed) > _DEPARTED_MAX:
            del departed[next(iter(departed))]

    def job_of(self, caller: int, is_driver: Callable[[int], bool],
               worker_of_conn: Callable[[int], int]) -> int:
        """The driver connection behind a caller: itself, or the job of the task its
        worker ran last (tasks of tasks, bounded); 0 when unknown. The callbacks tell
        of live connections; closed ones are looked up in ``departed``."""
        departed = self.departed
        for _ in range(64):
            if not caller:
                return caller
            gone = departed.get(caller)
            if gone == DRIVER or (gone is None and is_driver(caller)):
                return caller
            r = self.last_started.get(worker_of_conn(caller) if gone is None else gone)
            if r is None or r.caller == caller:
                return 0
            caller = r.caller
        return 0

    def counts(self) -> dict[str, int]:
        """Tasks by state (those with none left out)."""
        return {k: v for k, v in self._counts.items() if v}


def summarize(rows: Iterable[dict[str, Any]]) -> dict[str, Any]:
    """summarize_tasks()'s shape (Ray's): per function or method name, its type and
    counts by state, and the totals."""
    by_name: dict[str, dict[str, Any]] = {}
    total = 0
    for row in rows:
        total += 1
        name = row["name"] or "?"
        s = by_name.get(name)
        if s is None:
            s = by_name[name] = {"func_or_class_name": name, "type": row["type"],
                                 "state_counts": {}}
        counts = s["state_counts"]
        counts[row["state"]] = counts.get(row["state"], 0) + 1
    return {"cluster": {"summary": by_name, "total_tasks": total,
                        "total_actor_tasks": sum(1 for s in by_name.values()
                                                 if s["type"] == "ACTOR_TASK"),
                        "total_actor_scheduled": sum(1 for s in by_name.values()
                                                     if s["type"] == "ACTOR_CREATION_TASK"),
                        "summary_by": "func_name"}}
