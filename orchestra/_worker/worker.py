"""Worker process: runs tasks the scheduler sends, one at a time, in its main thread.

    reader thread <- Execute frames -> local queue (the scheduler pipelines a few)
    main thread: pop -> load function (cached) -> decode args -> run -> encode returns
                 -> TaskDone (results inline, or written to a segment first)

A task that blocks in get()/wait() hands its queued tasks back and lends its CPU
(Blocked frame, naming what it waits for), so nested tasks cannot deadlock on a full
pool. When what it waits for has not started anywhere, the head hands that task to this
worker (EXECUTE_NESTED) and the main thread runs it inside the get(), nested on its
stack: rec(n) = 1 + get(rec.remote(n - 1)) nests on a few workers, whatever n
(_scheduler/blocking.py). Cancel: the reader
thread signals the main thread (SIGUSR1), which raises inside the task (deferred
while the main thread is in the client's socket code); a signal also interrupts
time.sleep and blocking I/O. The worker exits when its connection to
the head closes, and dies with the head (PR_SET_PDEATHSIG).

A concurrent actor's calls run on threads or an event loop (actors.py); what is made of
arguments and results beside running the call is in calls.py.
"""
from __future__ import annotations

import collections
import inspect
import os
import signal
import sys
import threading
import time
from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING, Any, ParamSpec, TypeVar

import cloudpickle

from .. import _ids

# _code_source: loaded here, in the fork server, for functions copied by value.
from .._objects.errors import make_error
from .._objects.serialization import dumps_exception, serialize
from .._observe.log_capture import LOGS_DIR, LogCapture, short_name
from .._observe.task_events import ACTOR_CREATION_TASK, ACTOR_TASK, NORMAL_TASK, EventBuffer, end_error_type
from .._platform.proctitle import set_title
from .._platform.procutil import die_with_parent
from .._protocol import codec as _codec
from .._protocol import pb
from .._protocol import wire as _wire
from .._runtime import context as _context
from .._runtime import runtime_env as _runtime_env
from .._runtime.client import CoreClient
from ..exceptions import ActorDiedError, ClusterLostError, TaskError
from . import frames as _frames
from . import preload as _preload
from . import rejoin as _rejoin
from .actors import ActorRuntime
from .calls import (
    ArgumentError,
    decode_args,
    error_done,
    error_returns,
    format_error,
    in_finalizer,
    split_returns,
    task_error,
    yielded_returns,
)
from .producer import Acks, produce

if TYPE_CHECKING:
    from types import FrameType

    from .._protocol.connection import Connection

_set_call = _context.set_call
P = ParamSpec("P")
T = TypeVar("T")
_HEAD_ROUTE = (None, 0, False)   # reply_to's answer for a task the head sent

# Tasks run nested inside blocked get()s (_run_nested) stack up on the main thread. Each
# level costs the frames below: user function -> get -> _wait -> nested wait ->
# _run_nested -> _execute -> function: 7, measured (rec(10) on one worker; one more since
# _execute_plain); twice that leaves room for wrappers around them. The recursion limit
# rises by that much per level, so the innermost task keeps the room a task has on its
# own (an infinite recursion still ends at the usual depth).
_FRAMES_PER_NESTED = 16
# Nesting is bounded by the C stack the main thread may grow to: measured on CPython 3.10
# (each Python frame is a C frame there too) ~340 bytes per frame, so 512 keeps a margin;
# 3.11+ use far less C stack per Python call. With the usual 8 MiB: ~960 levels.
_FRAME_BYTES = 512
# A worker without work this long titles itself idle (orchestra::worker); a title costs
# ~1 us (setproctitle), worth not paying twice per task of a get() loop.
_IDLE_TITLE_S = 0.1
# A worker forked before the fork server preloaded the driver's modules imports them
# itself when idle, once it has lived this long (not in init()'s first tasks' way).
_IMPORT_LATER_S = 1.0


def _max_nested(base_limit: int) -> int:
    import resource
    soft, _ = resource.getrlimit(resource.RLIMIT_STACK)
    stack = 8 << 20 if soft == resource.RLIM_INFINITY or soft <= 0 else soft
    return max((stack // _FRAME_BYTES - base_limit) // _FRAMES_PER_NESTED, 0)


def _ready() -> bool:
    """An actor's ``__ray_ready__`` (_api/actor.py READY): it runs once the constructor
    has; the answer itself says nothing more."""
    return True


class _Cancelled(BaseException):
    """Raised inside a running task by orchestra.cancel (not an Exception: `except
    Exception` in user code must not swallow it)."""


class WorkerRuntime:
    def __init__(self, sock_path: str, worker_id: int) -> None:
        self.queue: collections.deque[pb.InvokeCallRequest] = collections.deque()
        self.cond = threading.Condition()
        self.functions: dict[bytes, pb.RegisterFunctionRequest] = {}
        self.loaded: dict[bytes, Any] = {}
        # worker_process_setup_hook=s this process has run (each once, before its first call).
        self.hooks_run: set[bytes] = set()
        self.running: bytes | None = None
        self.running_name = ""
        self.cancel_target: bytes | None = None
        self.blocked = False
        self.block_depth = 0   # get()s blocked in (nested ones, and other threads' too)
        # Tasks the head handed the main thread while blocked in get() (EXECUTE_NESTED),
        # not started yet; the ids of the tasks blocked below the one running inline.
        self.nested: collections.deque[pb.InvokeCallRequest] = collections.deque()
        self.outer: list[bytes] = []
        # Deeper than max_nested, a blocked get() lends its CPU instead.
        self.base_limit = sys.getrecursionlimit()
        self.max_nested = _max_nested(self.base_limit)
        self.actor: ActorRuntime | None = None
        self.worker_id = worker_id
        # Calls a caller sent straight to this actor: task id -> (its connection, the
        # caller's connection id at the head, whether the caller holds arguments for it
        # until told), until answered.
        self.reply_to: dict[bytes, tuple[Connection, int, bool]] = {}
        self.holding: dict[bytes, Any] = {}   # results holding refs, until answered
        # Tasks whose results are in shared memory or hold refs, until answered: a
        # direct caller gets those through the head.
        self.heavy: set[bytes] = set()
        self.acks = Acks()   # items read by the consumers of streams made here (_worker/producer.py)
        # Streams of direct calls, until answered: task id -> call name. Their answer goes
        # through the head after their items, a cancel's too (with its error).
        self.direct_streams: dict[bytes, str] = {}
        self.main_ident = threading.get_ident()
        # What ran here and when, reported to the head in batches (_observe/task_events.py):
        # one tuple append when a call starts and one when it is answered.
        self.events = EventBuffer()
        # Orchestra's GPU ids index the devices the driver could see: with
        # CUDA_VISIBLE_DEVICES=2,3 in the driver's environment, id 0 is device 2.
        visible = os.environ.get("CUDA_VISIBLE_DEVICES", "")
        self.physical_gpus = [d.strip() for d in visible.split(",") if d.strip()]
        self._gpu_ids: list[int] | None = None   # what the last task ran with (_set_gpus)
        self._gpu_env = ""
        # A cancel raises in the main thread wherever it is (SIGUSR1). Inside the client's
        # socket code it cut a frame in half (the head then waited for the rest of it,
        # and the task never finished) or lost frames already read: there it is deferred
        # until the main thread leaves that code (socket_guard=self._guard).
        self._in_socket_code = 0
        self._cancel_deferred = False
        self.sock_path = sock_path
        # The plain task the head sent that the main thread runs or answers, and what it
        # returned: a head lost meanwhile, the answer goes to the restarted one
        # (_worker/rejoin.py resume); ``resuming``: set once connected there.
        self.answering: pb.InvokeCallRequest | None = None
        self.result: Any = None
        self.resuming: threading.Event | None = None
        # Started below, once every handler can run (see CoreClient.start).
        self.client: CoreClient = _rejoin.connect(self, pb.Hello(
            kind="worker", pid=os.getpid(), workerid=worker_id))
        info = self.client.info
        # Output to the log files (and, line by line, to the driver of the task that
        # printed it): from here on, also what this constructor prints below.
        self.logs: LogCapture | None = None
        self._job = 0   # Call.job of the task running (an actor's: its creator's)
        self._title: str | None = ""   # the running call's name; None: idle
        self._started = time.monotonic()
        try:
            self.logs = LogCapture(os.path.join(info.node_dir or info.session_dir, LOGS_DIR),
                                   worker_id, self.client.send_raw, _context.current_call)
            self.logs.install()
        except OSError as exc:
            print(f"orchestra worker: output stays where it was, no log files: {exc}",
                  file=sys.stderr)
        if info.cwd and os.path.isdir(info.cwd):
            os.chdir(info.cwd)
        for p in info.sys_path:
            if p not in sys.path:
                sys.path.append(p)
        _rejoin.wire(self)
        signal.signal(signal.SIGUSR1, self._on_cancel_signal)
        self.client.start()

    # ------------------------------------------------------------ reader thread side
    def _report_events(self) -> None:
        """The client's background thread, every few ms: send the buffered task events
        when a report is due (or, while a call runs, the process's usage)."""
        now = time.monotonic()
        if self.events.due(now) or self.events.usage_due(now, self.running is not None):
            self.client.send(_wire.TASK_EVENTS, self.events.take())

    def _on_peer_frame(self, peer: Connection, kind: int, msg: Any) -> None:
        """A frame from a caller connected straight to this actor or lent worker: its
        handler (_worker/frames.py)."""
        handler = _frames.PEER_FRAMES.get(kind)
        if handler is not None:
            handler(self, peer, msg)

    def send_done(self, done: pb.TaskDone) -> None:
        """Answer a call: to the head, or straight to the caller that sent it here. A
        result the caller cannot hold alone (in shared memory, or holding refs) goes
        through the head, which makes it the caller's object; the caller then hears
        only that the call ended. What the call printed goes first."""
        logs = self.logs
        if logs is not None and logs.dirty:
            logs.flush()
        events = self.events
        events.ended.append((done.task_id, time.time(),
                             end_error_type(done, events.error_types)
                             if done.user_error or done.cancelled else ""))
        try:
            self._send_done(done)
        finally:
            if self.heavy:
                self.heavy.discard(done.task_id)
            if self.holding:
                self.holding.pop(done.task_id, None)

    def _send_done(self, done: pb.TaskDone) -> None:
        route = self.reply_to.pop(done.task_id, None)
        client = self.client
        if route is None:
            client.send(_wire.TASK_DONE, done)
            return
        peer, owner, held = route
        if done.task_id in self.heavy:
            name = self.direct_streams.pop(done.task_id, None) if self.direct_streams else None
            if name is not None and done.cancelled:
                done.returns.add(object_id=done.task_id + bytes(4),
                                 error=make_error("cancelled", name=name))
            done.owner = owner
            client.send(_wire.TASK_DONE, done)
            frame = _wire.encode(_wire.TASK_DONE, pb.TaskDone(task_id=done.task_id, owner=owner))
        else:
            frame = _wire.encode(_wire.TASK_DONE, done)
        if not peer.send(frame) and not done.owner:
            done.owner = owner   # the caller is gone or handed the call to the head
            client.send(_wire.TASK_DONE, done)
        if held:
            # The caller keeps the call's arguments (refs inside them, objects in shared
            # memory) until the head has this process's own counts and pins of them: sent
            # before this frame on the same connection, so the head sees them first.
            client.send(_wire.RELEASE_CALL, pb.TaskDone(task_id=done.task_id, owner=owner))

    def _give_back(self, wanted: set[bytes]) -> None:
        """Another worker went idle: return the asked-for tasks that have not started."""
        if self.actor is None:
            self._return(self._take_queued(wanted, None))

    def _take_queued(self, wanted: set[bytes], sender: Connection | None) -> list[bytes]:
        """Take the queued (not started) tasks among ``wanted`` that ``sender`` sent here
        (a caller's connection; None: the head) off the queue.

        Only its own: a task id can be queued here by the other one. A driver's STEAL
        may arrive after the tasks it names came back to it (the worker blocked, or
        answered an earlier STEAL), went through the head, and were queued here by
        the head: handed to that driver, which has forgotten them, they were lost
        (the head waited for them forever)."""
        reply_to = self.reply_to
        with self.cond:
            back = [inv for inv in self.queue if inv.call.task_id in wanted
                    and reply_to.get(inv.call.task_id, _HEAD_ROUTE)[0] is sender]
            for inv in back:
                self.queue.remove(inv)
        return [inv.call.task_id for inv in back]

    def _return(self, task_ids: list[bytes], before: bytes = b"") -> None:
        """Hand queued tasks back to whoever sent them: the head, or a driver that sent
        them straight here (``before``: frames for the head that go first)."""
        to_head: list[bytes] = []
        to_peers: dict[Connection, list[bytes]] = {}
        for tid in task_ids:
            route = self.reply_to.pop(tid, None)
            if route is None:
                to_head.append(tid)
            else:
                to_peers.setdefault(route[0], []).append(tid)
        if to_head:
            before += _wire.encode(_wire.RETURN_TASKS, pb.ReturnTasks(task_ids=to_head))
        if before:
            self.client.send_raw(before)
        for peer, ids in to_peers.items():
            peer.send(_wire.encode(_wire.RETURN_TASKS, pb.ReturnTasks(task_ids=ids)))

    def _cancel(self, task_id: bytes, recursive: bool = False) -> None:
        # An actor's process serves many callers: what it submitted is not one call's.
        if recursive and self.actor is None and (self.running == task_id or task_id in self.outer):
            self.client.submitter.cancel_submitted()   # its children first, then the task itself
        with self.cond:
            if self.running == task_id:
                self.cancel_target = task_id
                signal.pthread_kill(self.main_ident, signal.SIGUSR1)
                return
            if task_id in self.outer:
                # Blocked in a get() that runs a nested task now: raised in it once the
                # nested task ends (_run_nested).
                self.cancel_target = task_id
                return
            for inv in self.nested:
                if inv.call.task_id == task_id:   # handed over inline, not started
                    self.nested.remove(inv)
                    break
            else:
                for inv in self.queue:
                    if inv.call.task_id == task_id:
                        self.queue.remove(inv)
                        break
                else:
                    if self.actor is not None and self.actor.concurrent:
                        self.actor.cancel(task_id)   # a call on its threads or event loop
                    return
        self.send_done(pb.TaskDone(task_id=task_id, cancelled=True))

    # ------------------------------------------------------------ main thread side
    def _on_cancel_signal(self, signum: int, frame: FrameType | None) -> None:
        target = self.cancel_target
        if target is None or target != self.running:
            return
        if self._in_socket_code:
            self._cancel_deferred = True   # raised by _guard on the way out
            return
        if in_finalizer(frame):
            # Raised in __del__ or a weakref callback, it is printed and dropped, and the
            # cancel lost: ask again in a moment.
            threading.Timer(0.005, self._resignal, (target,)).start()
            return
        self.cancel_target = None
        raise _Cancelled()

    def _resignal(self, target: bytes) -> None:
        if self.cancel_target == target and self.running == target:
            signal.pthread_kill(self.main_ident, signal.SIGUSR1)

    def _guard(self, fn: Callable[P, T]) -> Callable[P, T]:
        """``fn`` (client socket code) with a cancel of the main thread deferred past it."""
        main = self.main_ident

        def guarded(*args: P.args, **kwargs: P.kwargs) -> T:
            if threading.get_ident() != main:
                return fn(*args, **kwargs)
            self._in_socket_code += 1
            try:
                return fn(*args, **kwargs)
            finally:
                self._in_socket_code -= 1
                if not self._in_socket_code and self._cancel_deferred:
                    self._cancel_deferred = False
                    self._on_cancel_signal(signal.SIGUSR1, sys._getframe())
        return guarded

    def _on_block(self, blocked: bool, ids: Iterable[bytes] = ()) -> bool:
        """A get()/wait() blocks on ``ids`` (or ends); True: this thread runs the tasks
        the head hands it meanwhile (only the main thread runs tasks)."""
        if blocked:
            main = threading.get_ident() == self.main_ident
            with self.cond:
                self.block_depth += 1
                self.blocked = True
                queued = [inv.call.task_id for inv in self.queue]
                self.queue.clear()
            # Blocked before the returned tasks: while this worker still counts as
            # busy, the scheduler pipelines returned tasks straight back to it (and
            # they bounce once more) instead of giving them to another worker. One
            # write: a cancel between the two lost the tasks taken off the queue.
            # Past max_nested the head is not asked for tasks to run here; one it sent
            # before (for a get() that ended first) still runs in this one.
            ask = main and len(self.outer) < self.max_nested
            msg = pb.Blocked(blocked=True, object_ids=ids if ask else (),
                             task_id=self.running or b"", task_name=self.running_name)
            self._return(queued, _wire.encode(_wire.BLOCKED, msg))
            return main
        with self.cond:
            self.block_depth = max(self.block_depth - 1, 0)
            self.blocked = self.block_depth > 0
        self.client.send(_wire.BLOCKED, pb.Blocked(blocked=False))
        return False

    def _unblock_to(self, depth: int) -> None:
        """Resume the blocks a cancel cut short (raised in get()'s bookkeeping, past
        its resume) down to ``depth``: the head counts them."""
        while self.block_depth > depth:
            self._on_block(False)

    def _run_nested(self) -> None:
        """In a get() of the main thread: run a task the head handed over for it."""
        cond = self.cond
        with cond:
            if not self.nested:
                return
            inv = self.nested.popleft()
            outer, outer_name = self.running, self.running_name
            self.outer.append(outer or b"")
            self.running, self.running_name = inv.call.task_id, inv.call.name
        depth = self.block_depth
        sys.setrecursionlimit(self.base_limit + len(self.outer) * _FRAMES_PER_NESTED)
        done = None
        job, suffix = self._job, self.client.job_suffix   # the outer task's, restored below
        try:
            done = self._execute(inv)
            with cond:
                self.running, self.running_name = outer, outer_name
        except _Cancelled:
            with cond:
                self.running, self.running_name = outer, outer_name
            if done is None:
                done = pb.TaskDone(task_id=inv.call.task_id, cancelled=True)
        finally:
            self._job, self.client.job_suffix = job, suffix
            self.outer.pop()
            sys.setrecursionlimit(self.base_limit + len(self.outer) * _FRAMES_PER_NESTED)
        if self.cancel_target == inv.call.task_id:
            self.cancel_target = None
        self._unblock_to(depth)
        self.send_done(done)
        if outer is not None and self.cancel_target == outer:
            # The task blocked below was cancelled while this one ran: it ends now.
            self.cancel_target = None
            raise _Cancelled()

    def run(self) -> None:
        cond, queue = self.cond, self.queue

        nested = self.nested

        def has_task() -> bool:
            return bool(queue) or bool(nested)

        while True:
            if not queue and not nested:
                # Idle: this thread reads the socket itself, so a task starts without a
                # hand-off from the reader thread.
                if self._title is None:
                    self._idle(has_task)
                elif not self.client.wait_until(has_task, time.monotonic() + _IDLE_TITLE_S):
                    # The title says idle after a moment without work, so a worker that
                    # answers one task at a time sets no title per task.
                    self._set_title(None)
                    self._idle(has_task)
            if self.nested:   # handed over for a get() that ended first
                self._run_nested()
                continue
            with cond:
                if not queue:
                    continue
                inv = queue.popleft()
                self.running = inv.call.task_id
                self.running_name = inv.call.name
                self.answering = inv if self.actor is None else None
            if self.actor is not None and self.actor.concurrent and inv.call.actor_id:
                self.running = None
                self.actor.submit(inv)     # runs on the actor's threads or event loop
                continue
            if inv.call.name != self._title:
                self._set_title(inv.call)
            done = None
            try:
                done = self._execute(inv)
                with cond:   # _cancel signals only while this task runs
                    self.running = None
            except _Cancelled:
                # Also a cancel that lands after the task returned, before `running` is
                # cleared: it escaped run() and killed the worker. The result stands.
                with cond:
                    self.running = None
                if done is None:
                    done = pb.TaskDone(task_id=inv.call.task_id, cancelled=True)
            except ClusterLostError:   # the head was lost as it answered (_execute_plain)
                with cond:
                    self.running = None
                done = _rejoin.answer_again(self, inv, None)
            self.cancel_target = None
            if self.block_depth:   # a cancel landed in get()'s bookkeeping, past its unblock
                self._unblock_to(0)
            try:
                self.send_done(done)
            except ClusterLostError:   # the head was lost: the restarted one is answered
                if not _rejoin.resume(self):
                    raise
                self.send_done(_rejoin.answer_again(self, inv, done))
            self.answering = self.result = None

    def _idle(self, has_task: Callable[[], bool]) -> None:
        """Wait for work; a worker forked before the fork server preloaded the driver's
        modules imports them here, once it has lived _IMPORT_LATER_S (not an actor's:
        hundreds of them, started at once, would each import them at once)."""
        if _preload.LATER and self.actor is None:
            if self.client.wait_until(has_task, self._started + _IMPORT_LATER_S):
                return
            # What the last task let go of (its argument's pin) goes first: the imports
            # hold the GIL for ~0.1 s.
            import gc
            gc.collect()
            self.client.flush_refs()
            _preload.import_later()
        self.client.wait_until(has_task, None)

    def _set_title(self, call: pb.Call | None) -> None:
        """The process title: what runs now (``call``), or idle (None). Set only when it
        changes: ~1 us each (_platform/proctitle.py)."""
        actor = self.actor
        if call is None:
            self._title = None
            set_title(f"orchestra::actor {actor.spec.class_name}" if actor is not None
                      else "orchestra::worker")
            return
        self._title = call.name
        if actor is not None or call.actor_id or call.HasField("actor"):
            set_title(f"orchestra::actor {call.name}")
        else:
            set_title(f"orchestra::worker {short_name(call.name)}")

    def _function(self, fid: bytes) -> Any:
        fn = self.loaded.get(fid)
        if fn is None:
            req = self.functions.get(fid)
            if req is None:
                raise RuntimeError("the scheduler sent a task before its function")
            fn = self.loaded[fid] = cloudpickle.loads(req.pickled)
        return fn

    def _execute(self, inv: pb.InvokeCallRequest) -> pb.TaskDone:
        call = inv.call
        if call.HasField("runtime_env"):
            return self._execute_in_env(inv)
        return self._execute_plain(inv)

    def _execute_in_env(self, inv: pb.InvokeCallRequest) -> pb.TaskDone:
        """A call with runtime_env=: applied around it; an actor's constructor keeps it
        for the actor's life."""
        undo = _runtime_env.enter(inv.call.runtime_env)
        try:
            hook = inv.call.runtime_env.setup_hook
            if hook and hook not in self.hooks_run:
                try:
                    _runtime_env.run_setup_hook(hook)
                except BaseException as exc:  # noqa: BLE001 - the call fails with it; the next tries again
                    return self.failed(inv, exc)
                self.hooks_run.add(hook)
            return self._execute_plain(inv)
        finally:
            if not inv.call.HasField("actor"):
                undo()

    def _execute_plain(self, inv: pb.InvokeCallRequest) -> pb.TaskDone:
        call = inv.call
        tid = call.task_id
        # An actor holds the GPUs given to its constructor for life (a call sent straight
        # here by its caller names none).
        gpu_ids = self.actor.gpu_ids if self.actor is not None else list(inv.gpu_ids)
        if gpu_ids != self._gpu_ids or os.environ.get("CUDA_VISIBLE_DEVICES") != self._gpu_env:
            self._set_gpus(gpu_ids)   # else as the last task left them
        ran = False
        try:
            fn, args, kwargs = self.prepare(inv)
            result = fn(*args, **kwargs)
            ran = True
            if inv is self.answering:   # until answered (_worker/rejoin.py answer_again)
                self.result = result
            del args, kwargs
            if call.HasField("actor"):
                self.become_actor(call.actor, result, list(inv.gpu_ids), dict(call.resources))
                return pb.TaskDone(task_id=tid)
            return self.finish(inv, result)
        except _Cancelled:
            raise
        except ClusterLostError as exc:   # lost as it answered: it answers the restarted head
            if ran and inv is self.answering and _rejoin.resume(self):
                raise
            if self.client.lost is not None and self.actor is None:
                _rejoin.task_lost(call.name)   # no failure of the task: it runs again
            return self.failed(inv, exc)
        except BaseException as exc:  # noqa: BLE001 - every failure of user code is reported
            return self.failed(inv, exc)

    def _set_gpus(self, gpu_ids: list[int]) -> None:
        ids = [self.physical_gpus[i] if i < len(self.physical_gpus) else str(i) for i in gpu_ids]
        self._gpu_ids, self._gpu_env = gpu_ids, ",".join(ids)
        os.environ["CUDA_VISIBLE_DEVICES"] = self._gpu_env
        # get_gpu_ids() gives the device numbers CUDA_VISIBLE_DEVICES names (orchestra's
        # own id where the driver's environment names devices by UUID).
        _context.set_gpu_ids([int(p) if p.isdigit() else i
                              for p, i in zip(ids, gpu_ids, strict=True)])

    def prepare(self, inv: pb.InvokeCallRequest) -> tuple[Any, list[Any], dict[str, Any]]:
        """The callable and decoded arguments of a task, constructor or actor method."""
        call = inv.call
        _set_call(call)   # get_runtime_context(): per thread and per coroutine
        if call.job != self._job and self.actor is None:
            # Tasks this one submits print on its driver too (an actor's: its creator's).
            self._job = call.job
            self.client.job_suffix = _codec.job_field(call.job)
        aid = call.actor_id
        if aid:
            kind, actor = ACTOR_TASK, aid
        elif call.HasField("actor"):
            kind, actor = ACTOR_CREATION_TASK, call.actor.actor_id
        else:
            kind, actor = NORMAL_TASK, b""
        self.events.started.append((call.task_id, call.name, actor, kind, inv.owner, time.time()))
        if aid:
            assert self.actor is not None, "an actor call reached a worker with no actor"
            fn = _ready if call.method == "__ray_ready__" else \
                getattr(self.actor.instance, call.method)
        else:
            fn = self._function(call.function_id)
        args = decode_args(call, inv.resolved, self.client.objects.map_object)
        nk = len(call.kwarg_names)
        kwargs: dict[str, Any] = {}
        if nk:
            kwargs = dict(zip(call.kwarg_names, args[-nk:], strict=True))
            args = args[:-nk]
        return fn, args, kwargs

    def finish(self, inv: pb.InvokeCallRequest, result: Any, produced: bool = False) -> pb.TaskDone:
        """TaskDone carrying what a call returned. A generator call's generator runs
        here first (_worker/producer.py), unless ``produced`` already."""
        call = inv.call
        if call.generator and not produced:
            result = produce(self, call, result)
        tid = call.task_id
        n = call.num_returns
        failure = None
        if n == 1:
            values = [result]
        elif inspect.isgenerator(result):
            values, failure = yielded_returns(result, n, call.name)
        else:
            values = split_returns(result, n, call.name)
        del result
        sers = [serialize(v) for v in values]
        # Filled in place: a message passed to the constructor is copied.
        done = pb.TaskDone(task_id=tid)
        make, add = self.client.objects.make_object_data, done.returns.add
        threshold = self.client.inline_threshold
        try:
            for i, ser in enumerate(sers):
                make(_ids.object_id(tid, i), ser, add())
                if ser.contained or ser.size > threshold:
                    self.heavy.add(tid)
        except BaseException:
            # This answer is never sent: the results written already give their
            # segments back too (the failed one did so itself).
            for r in done.returns:
                if r.HasField("segment"):
                    self.client.objects.abort_segment(r.segment.name)
            raise
        if failure is not None:   # the refs after the values it yielded hold its error
            self.events.error_types[tid] = type(failure).__name__
            self.events.failed(tid, failure, format_error(failure))
            blob = dumps_exception(task_error(call, failure))
            for i in range(len(values), n):
                add(object_id=_ids.object_id(tid, i), error=blob)
            done.user_error = True
        if call.max_retries and tid in self.heavy and not call.actor_id and tid in self.reply_to:
            # A direct call's results through the head: with the call, which the head
            # runs again should the node holding them die (TaskDone.lineage).
            done.lineage.CopyFrom(call)
        if any(ser.contained for ser in sers):
            # Refs inside the results live until the answer is sent: dropped before, their
            # release could reach the head first (the reader flushes every 20 ms) and free
            # them before the answer counts them.
            self.holding[tid] = values
        return done

    def failed(self, inv: pb.InvokeCallRequest, exc: BaseException) -> pb.TaskDone:
        """TaskDone carrying the error of user code (an ActorDiedError for a constructor)."""
        if isinstance(exc, _context.ActorExitRequest) and self.actor is not None:
            return self._exit_actor(inv)
        raised = exc.error if isinstance(exc, ArgumentError) else exc
        self.events.error_types[inv.call.task_id] = type(raised).__name__
        self.events.failed(inv.call.task_id, raised, format_error(raised))
        try:
            return error_done(inv, exc)
        except RecursionError:
            if inv.call.HasField("actor"):
                raise
            # The error of a task hundreds of levels down a recursion: its chain of
            # causes is too deep to format or pickle within the recursion limit. Raised
            # out of here, it killed the worker, and every caller up the chain waited.
            root, levels = exc, 0
            while isinstance(root, TaskError) and root.cause is not None:
                root, levels = root.cause, levels + 1
            tb = (f"(the error of a task {levels} levels down; the chain of their remote "
                  "tracebacks is too deep to keep)\n")
            err = TaskError.wrap(inv.call.name, tb, root, os.getpid())
            return pb.TaskDone(task_id=inv.call.task_id, user_error=True,
                               returns=error_returns(inv.call, dumps_exception(err)))

    def _exit_actor(self, inv: pb.InvokeCallRequest) -> pb.TaskDone:
        """exit_actor() in a method: the head ends the actor for good (queued and later
        calls fail with why) and stops this process; the calling method's caller gets
        ActorDiedError (Ray's answer) here, or as a call in flight if the process ends
        first. Either error says the actor exited on purpose."""
        assert self.actor is not None
        spec = self.actor.spec
        reason = f"it exited on purpose: exit_actor() was called in {inv.call.name}()"
        try:
            self.client.request(pb.Request(kill_actor=pb.KillActor(
                actor_id=spec.actor_id, no_restart=True, reason=reason)))
        except Exception:  # noqa: BLE001 - the cluster is going: the process ends anyway
            os._exit(0)
        err = ActorDiedError(f"actor {spec.class_name} is dead: {reason}")
        return pb.TaskDone(task_id=inv.call.task_id, user_error=True,
                           returns=error_returns(inv.call, dumps_exception(err)))

    def become_actor(self, spec: pb.ActorSpec, instance: Any, gpu_ids: list[int],
                     resources: dict[str, float]) -> None:
        """This worker now serves one actor for life."""
        self.actor = ActorRuntime(self, spec, instance, gpu_ids)
        _context.set_actor(spec.actor_id, spec.restart_count, resources)
        if self.logs is not None:
            self.logs.mark_actor(spec.actor_id, spec.class_name, self._job)
        # Calls queued behind a blocking get() belong to this actor: never hand them back.
        self.client.values.on_block = None


def main(argv: list[str] | None = None) -> None:
    argv = sys.argv[1:] if argv is None else argv
    sock_path, worker_id = argv[0], int(argv[1])
    die_with_parent()
    # Ctrl-C in the driver's terminal reaches the whole process group: the driver
    # handles it; a worker must not die of it.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    if os.environ.get("ORCHESTRA_RAY_COMPAT"):
        # A driver run with `orchestra run --ray`: `import ray` here means orchestra too.
        from ..compat.ray import install
        install()
    set_title("orchestra::worker")
    runtime = WorkerRuntime(sock_path, worker_id)
    while True:
        try:
            runtime.run()
        except ClusterLostError:   # the head was lost: a detached actor's process waits
            if not (_rejoin.may_rejoin(runtime) and _rejoin.rejoin(runtime)):
                os._exit(1)


if __name__ == "__main__":
    main()
