"""init() / shutdown() and the public calls that need the session.

init() starts a local cluster: a session directory (mode 0700, holding the head's unix
socket), the head process (scheduler + the local node's object store and worker pool,
see _head/head.py and _node/node.py; started by local_head.py), and a CoreClient
connection from this driver. The session is an explicit object; the module only
remembers the current one between init() and shutdown().
"""
from __future__ import annotations

import atexit
import logging
import math
import os
import shlex
import shutil
import signal
import subprocess
import sys
import threading
import time
import uuid
import warnings
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any, TypeVar, overload

from .._checks import a_type, is_int, is_number
from .._ids import machine_id, node_hex
from .._objects.segments import remove_private_dir, sweep_stale_segments
from .._runtime import context as _context
from .._runtime import runtime_env as _runtime_env
from .._runtime import verbs as _verbs
from .._runtime.client import CoreClient
from .._runtime.generators import ObjectRefGenerator, wait_with_generators
from .._runtime.object_ref import ObjectRef
from .._runtime.reconnect import Rejoin
from ..exceptions import ClusterLostError, OrchestraError
from .args import check_session as _check_session
from .args import check_timeout as _check_timeout
from .local_head import build_cfg, launch_head, new_session_dir, sweep_stale_sessions

if TYPE_CHECKING:
    from types import FrameType

    from .._observe.log_printer import LogPrinter

_HEAD_EXIT_TIMEOUT_S = 5.0
# At interpreter exit, tasks and actor calls still pending get this long to finish
# before the cluster stops (init(exit_grace_s=...) or ORCHESTRA_EXIT_GRACE_S). An exit
# with nothing pending costs one request to the head (~1 ms), then stops as before.
DEFAULT_EXIT_GRACE_S = 5.0
_EXIT_POLL_S = 0.02
_log = logging.getLogger("orchestra")
# What wait() takes and hands back: refs and ObjectRefGenerators, as given.
_W = TypeVar("_W", bound="ObjectRef[Any] | ObjectRefGenerator")
R = TypeVar("R")


class Session:
    def __init__(self, client: CoreClient, session_dir: str, head: subprocess.Popen[bytes] | None) -> None:
        self.client = client
        self.session_dir = session_dir
        self.head = head
        self.spill_dir = ""   # when outside session_dir: removed here too if the head was not
        self.exit_grace_s = DEFAULT_EXIT_GRACE_S
        self.log_printer: LogPrinter | None = None   # with log_to_driver
        self.rejoin: Rejoin | None = None   # connects to a restarted head (_runtime/reconnect.py)

    def keep_connected(self, address: str, token: str | None, namespace: str,
                       key: bytes) -> None:
        """A head started again when it dies (at a HOST:PORT): connect to it again when
        it is lost, with the same driver ``key`` (the actors this driver made are its)."""
        if self.client.info.reconnect_s > 0 and _verbs.over_tcp(address):
            self.rejoin = Rejoin(address, token, lambda: _hello(namespace, key), self.client,
                                 self._swap, self._logs_again)
            _context.set_reconnect(self.rejoin.wait)

    def _swap(self, old: CoreClient, new: CoreClient) -> None:
        """(The rejoin thread.) ``new`` is connected to the restarted head: it is this
        session's client from now on."""
        self.client = new
        if _context.client_or_none() is old:
            _context.set_client(new)

    def _logs_again(self) -> None:
        """(The rejoin thread, after the swap.) The task output's own connection, to
        the restarted head."""
        if self.log_printer is not None:
            self.log_printer.close()
            self.forward_logs()

    def forward_logs(self) -> None:
        """Print the output of this driver's tasks and actors here (init's log_to_driver)."""
        from .._observe.log_printer import LogPrinter
        client = self.client
        try:
            self.log_printer = LogPrinter(client.conn.address, client.conn_id, client.token)
        except (OSError, ClusterLostError) as exc:
            _log.warning("orchestra: the output of tasks is not shown here (%s); it is in "
                         "the session's log files (`orchestra logs`)", exc)

    def stop(self) -> None:
        if self.rejoin is not None:
            self.rejoin.close()
            _context.set_reconnect(None)
        client = self.client
        if self.log_printer is not None:
            self.log_printer.close()
        if client.lost is None:   # its job ends as asked (list_jobs(): SUCCEEDED)
            try:
                _verbs.end_job(client)
            except ClusterLostError:
                pass
        if self.head is not None:
            if client.lost is None:
                try:
                    _verbs.stop_cluster(client)
                except ClusterLostError:
                    pass
            try:
                self.head.wait(_HEAD_EXIT_TIMEOUT_S)
            except subprocess.TimeoutExpired:
                self.head.kill()
                self.head.wait(_HEAD_EXIT_TIMEOUT_S)
        elif client.lost is None and client.direct.lent.ever_loaned:
            # A cluster that lives on: give back the idle workers lent to this driver
            # (those still on loan when it goes are retired, as a dead job's may run
            # its calls: SchedulerState._job_gone).
            try:   # (read before the connection's end: frames are handled in order)
                client.direct.lent.return_idle()
            except ClusterLostError:
                pass
        client.close()
        if self.head is not None:
            shutil.rmtree(self.session_dir, ignore_errors=True)
            if self.spill_dir:
                shutil.rmtree(self.spill_dir, ignore_errors=True)
            if client.shm_dir:   # the head removes it; not when it was killed
                remove_private_dir(client.shm_dir)
            sweep_stale_segments()


_session: Session | None = None
exiting = False   # set at interpreter exit: no implicit init() after the cluster stopped
# Run by shutdown() once the cluster is gone (the gang module stops its coordinators):
# registered by those modules, so this one imports none of them.
_shutdown_hooks: list[Callable[[], None]] = []


def add_shutdown_hook(hook: Callable[[], None]) -> None:
    """Have ``shutdown()`` call ``hook`` after the cluster stopped (once per hook)."""
    if hook not in _shutdown_hooks:
        _shutdown_hooks.append(hook)


_shm_warned = False


def init(address: str | None = None, *, num_cpus: int | None = None,
         num_gpus: int | None = None, resources: dict[str, float] | None = None,
         object_store_memory: int | None = None, spill_dir: str | os.PathLike[str] | None = None,
         ignore_reinit_error: bool = False, token: str | None = None,
         namespace: str | None = None, runtime_env: dict[str, Any] | None = None,
         exit_grace_s: float | None = None, log_to_driver: bool = True,
         include_dashboard: bool = True, dashboard_port: int | None = None,
         tls_cert: str | os.PathLike[str] | None = None,
         tls_key: str | os.PathLike[str] | None = None,
         tls_ca: str | os.PathLike[str] | None = None,
         _system_config: dict[str, Any] | None = None) -> dict[str, Any]:
    """Start a local cluster (or connect to one) and make it this process's session.
    Returns a dict with the session's address and resources.

    ``address``: None starts a private cluster on this machine (unless ORCHESTRA_ADDRESS
    names one). "HOST:PORT" connects to a cluster (``orchestra start --head`` printed its
    address), authenticating with ``token`` (default: the ORCHESTRA_TOKEN environment
    variable, else the token of a head this user started at that address on this
    machine, with ``orchestra start`` or ``cluster_utils.Cluster``); this driver uses
    the store of the cluster's node on this machine. "auto"
    connects to the cluster ``orchestra start`` started on this machine (its token with
    it). A session directory or its head.sock connects to another driver's private
    cluster of this user.

    ``num_cpus``, ``num_gpus``, ``resources``: what the local node offers (default: the
    machine's CPUs, its GPUs found, nothing else). ``object_store_memory``: bytes of
    shared memory for objects (default: 30% of RAM, within what /dev/shm has free);
    ``spill_dir``: an existing directory where objects spill when the store is full
    (default: under the session's directory).
    ``ignore_reinit_error``: a second init() returns the session's dict instead of
    raising. ``_system_config``: internal settings, for tests.

    ``namespace``: where this driver's actor names live (default: an anonymous one of
    its own). ``runtime_env``: env_vars / working_dir / py_modules for every task and
    actor this driver starts (their own runtime_env= is merged over it).

    ``exit_grace_s``: at interpreter exit, how long tasks and actor calls still pending
    may run before the cluster stops (default: ORCHESTRA_EXIT_GRACE_S, else 5 s; 0 stops
    at once). An exit with nothing pending does not wait.

    ``log_to_driver``: print what this driver's tasks and actors write to stdout and
    stderr here, each line prefixed ``(square pid=4242)`` (default True); False keeps
    it in the session's log files only (``orchestra logs``).

    ``include_dashboard``: the head serves a web dashboard and Prometheus's ``/metrics``
    on 127.0.0.1 (its URL is the returned dict's ``dashboard_url``; "" without one).
    ``dashboard_port``: its port (default 8265, or any free port when that is taken;
    0: any free port). Both apply to a cluster this call starts.

    ``tls_cert``, ``tls_key``, ``tls_ca``: for a cluster on certificates of its own
    (``orchestra start --tls-cert ...``): this machine's certificate, its unencrypted
    key, and the CA (default: ORCHESTRA_TLS_CERT, _KEY, _CA). Checked at once:
    ``TLSConfigError`` names a file that does not hold up.

    Returns a dict: session_dir, address, node_id, node_resources, object_store_memory,
    dashboard_url."""
    global _session
    grace = exit_grace(exit_grace_s)
    if _session is not None and _session.client.lost is not None:
        _forget_lost_session()
    if _session is not None:
        if ignore_reinit_error:
            return _info(_session)
        raise RuntimeError("orchestra.init() was already called in this process: call "
                           "orchestra.shutdown() first, or pass ignore_reinit_error=True")
    if _context.client_or_none() is not None:
        raise RuntimeError("orchestra.init() inside a task: the task is already connected "
                           "to its cluster; call remote functions directly")
    if namespace is not None and (not isinstance(namespace, str) or not namespace):
        raise ValueError(f"namespace must be a non-empty string, got {namespace!r}")
    env = _runtime_env.check(runtime_env)
    _verbs.use_tls_files(tls_cert, tls_key, tls_ca)
    # Names of actors are per namespace; a driver without one gets one of its own (Ray's
    # anonymous namespace).
    ns = namespace or f"anonymous-{uuid.uuid4().hex}"
    _context.namespace = namespace   # get_runtime_context().namespace
    address, token = resolve_address(address, token)
    if address is not None:
        key = os.urandom(16)   # this session's, on each of its connections (Hello.driver_key)
        _session = _connect(address, token, ns, key)
        _session.keep_connected(address, token, ns, key)
        _session.client.runtime_env = env
        _session.exit_grace_s = grace
        if log_to_driver:
            _session.forward_logs()
        _context.set_client(_session.client)
        atexit.register(_shutdown_at_exit)
        return _info(_session)
    store_warning, cfg = build_cfg(num_cpus=num_cpus, num_gpus=num_gpus, resources=resources,
                                   object_store_memory=object_store_memory,
                                   spill_dir=spill_dir, include_dashboard=include_dashboard,
                                   dashboard_port=dashboard_port, system_config=_system_config)
    global _shm_warned
    if store_warning and not _shm_warned:
        _shm_warned = True
        warnings.warn(f"orchestra: {store_warning}", RuntimeWarning, stacklevel=2)
    sweep_stale_sessions()
    session_dir = new_session_dir(cfg)
    head = launch_head(cfg)
    sock = os.path.join(session_dir, "head.sock")
    try:
        client = _connect_client(sock, head, ns)
    except BaseException:
        head.kill()
        head.wait()
        shutil.rmtree(session_dir, ignore_errors=True)
        raise
    _session = Session(client, session_dir, head)
    client.runtime_env = env
    _session.spill_dir = cfg["spill_dir"]
    _session.exit_grace_s = grace
    if log_to_driver:
        _session.forward_logs()
    _context.set_client(client)
    atexit.register(_shutdown_at_exit)
    return _info(_session)


def _hello(namespace: str = "", key: bytes = b"") -> Any:
    """This driver's Hello (_runtime/verbs.py)."""
    return _verbs.hello(namespace, key, machine_id(), _entrypoint(), _as_tool)


# The `orchestra` commands that connect (status, list, ...) set it: they are no job.
_as_tool = False


def connect_as_tool() -> None:
    """This process's connections are a command's, not a program's: no job is listed."""
    global _as_tool
    _as_tool = True


def _entrypoint(limit: int = 300) -> str:
    """This driver's command line, on one line (its job's entrypoint in list_jobs())."""
    text = shlex.join(getattr(sys, "orig_argv", None) or [sys.executable, *sys.argv])
    text = " ".join(text.split())
    return text if len(text) <= limit else text[:limit - 3] + "..."


def _connect_client(sock: str, head: subprocess.Popen[bytes], namespace: str) -> CoreClient:
    deadline = time.monotonic() + 30
    while not os.path.exists(sock):
        if head.poll() is not None:
            raise OrchestraError(f"the head process exited with code {head.returncode} while "
                                 "starting; its error is printed above")
        if time.monotonic() > deadline:
            raise OrchestraError("the head process did not start within 30 s")
        time.sleep(0.002)
    return CoreClient(sock, _hello(namespace))


def resolve_address(address: str | None, token: str | None) -> tuple[str | None, str | None]:
    """The address (and token) init() connects to: ``address``, else ORCHESTRA_ADDRESS;
    "auto" is the cluster ``orchestra start`` started on this machine, whose token comes
    with it unless one was given. None: start a private local cluster."""
    if address is None:
        address = os.environ.get("ORCHESTRA_ADDRESS") or None
    if address != "auto":
        if address is not None and token is None and not os.environ.get("ORCHESTRA_TOKEN") \
                and ":" in address and not os.path.exists(address):
            # HOST:PORT of a head this user started here (orchestra start, or a
            # cluster_utils.Cluster): its token from its record, as "auto" does.
            from .._runtime.cluster_file import token_for
            token = token_for(address)
        return address, token
    from .._runtime.cluster_file import local_cluster
    found = local_cluster()
    if found is None:
        raise ConnectionError(
            "address='auto' (or ORCHESTRA_ADDRESS=auto): no cluster started by `orchestra "
            "start` runs on this machine for this user. Start one with `orchestra start "
            "--head`, or pass address='IP:PORT' of a running head")
    found_address, found_token = found
    return found_address, (found_token if token is None else token)


def _connect(address: str, token: str | None = None, namespace: str = "",
             key: bytes = b"") -> Session:
    if _verbs.over_tcp(address):   # a cluster's HOST:PORT
        try:
            client = CoreClient(address, _hello(namespace, key), token=token,
                                connect_timeout_s=10.0)
        except ClusterLostError as exc:
            raise ConnectionError(f"no orchestra cluster answers at {address}: {exc}. Start "
                                  "one with `orchestra start --head`, or check the address "
                                  "and the firewall") from None
        return Session(client, "", None)
    sock = address
    if os.path.isdir(address):
        sock = os.path.join(address, "head.sock")
    try:
        os.stat(sock)
        client = CoreClient(sock, _hello(namespace, key))
    except PermissionError as exc:
        # The session directory is 0700 and its socket 0600: another user's session
        # was reported as "not a running orchestra session", which sent users hunting
        # for a dead cluster.
        owner = _owner(os.path.dirname(sock))
        raise PermissionError(
            f"permission denied: the orchestra session at {address!r} belongs to {owner}, "
            f"not to this user (uid {os.geteuid()}). Only the user who started a session can "
            "connect to it (tasks run as that user); start a cluster of your own with "
            "orchestra.init()") from exc
    except FileNotFoundError:
        raise ValueError(f"address {address!r} is not a running orchestra session: give the "
                         "session directory or its head.sock (see orchestra.init()'s "
                         "return value)") from None
    return Session(client, os.path.dirname(sock), None)


def _owner(path: str) -> str:
    try:
        uid = os.stat(path).st_uid
    except OSError:
        return "another user"
    try:
        import pwd
        return f"user {pwd.getpwuid(uid).pw_name!r} (uid {uid})"
    except KeyError:
        return f"uid {uid}"


def _info(s: Session) -> dict[str, Any]:
    address = s.client.conn.address if not s.session_dir else os.path.join(s.session_dir, "head.sock")
    return {"session_dir": s.session_dir, "address": address, "node_id": node_hex(s.client.info.node_id),
            "node_resources": dict(s.client.info.node_resources),
            "object_store_memory": s.client.info.store_capacity,
            "dashboard_url": s.client.info.dashboard_url}


def _flush_metrics() -> None:
    """Send the user metrics recorded here since their last report (a driver that joined
    a cluster that outlives it loses none)."""
    from .._observe.metrics import recorder
    try:
        recorder().flush()
    except Exception:  # noqa: BLE001 - the cluster is gone already: nothing to send to
        pass


def shutdown() -> None:
    """Stop the cluster this driver started (every process and segment), or disconnect.

    Ctrl-C does not cut the cleanup short: the first one stops waiting for the head (it
    is killed; its workers die with it and the segments are swept here), later ones are
    ignored, and the Ctrl-C reaches the program's own handler (KeyboardInterrupt by
    default) once, after everything is gone.
    """
    global _session
    s = _session
    if s is None:
        return
    _context.namespace = None
    _flush_metrics()
    # A KeyboardInterrupt raised in the head's wait abandoned the cleanup: the head, its
    # zygote and workers, the segments and the session directory all stayed
    # (test_ctrl_c_during_shutdown_cuts_its_wait_short_and_leaves_nothing). Installed
    # before the session is marked gone: from then on every Ctrl-C is absorbed.
    presses = 0

    def on_sigint(signum: int, frame: FrameType | None) -> None:
        nonlocal presses
        presses += 1
        if presses == 1 and s.head is not None and s.head.returncode is None:
            s.head.kill()   # stop() reaps it, then removes what it would have removed

    # Only the main thread may set handlers; a program that ignores SIGINT keeps ignoring
    # it; None: a handler set outside Python, which could not be put back.
    previous: Any = None
    if threading.current_thread() is threading.main_thread():
        previous = signal.getsignal(signal.SIGINT)
        if previous is signal.SIG_IGN:
            previous = None
        if previous is not None:
            signal.signal(signal.SIGINT, on_sigint)
    _session = None
    _context.set_client(None)
    try:
        s.stop()
    finally:
        try:
            for hook in list(_shutdown_hooks):
                hook()   # gangs' coordinators, after their members are gone
        finally:
            if previous is not None:
                signal.signal(signal.SIGINT, previous)
    if presses:
        signal.raise_signal(signal.SIGINT)   # the Ctrl-C, deferred to its own handler


def exit_grace(asked: float | None) -> float:
    """init()'s exit_grace_s, else ORCHESTRA_EXIT_GRACE_S, else the default; checked."""
    where = "exit_grace_s"
    if asked is None:
        env = os.environ.get("ORCHESTRA_EXIT_GRACE_S")
        if not env:
            return DEFAULT_EXIT_GRACE_S
        where = "ORCHESTRA_EXIT_GRACE_S"
        try:
            asked = float(env)
        except ValueError:
            raise ValueError(f"ORCHESTRA_EXIT_GRACE_S={env!r} is not a number of seconds; "
                             "set it to e.g. 5, or 0 to stop at exit at once") from None
    if not is_number(asked) or math.isnan(asked) \
            or asked < 0:
        raise ValueError(f"{where} must be a number of seconds >= 0, got {asked!r}")
    return float(asked)


def pending_tasks(client: CoreClient, own_only: bool = False) -> int:
    """Tasks and actor calls of this driver (and, unless ``own_only``, those tasks made)
    not finished: the head's count, and calls this process sent straight to workers.
    ``own_only`` on a cluster other drivers share: their tasks' tasks are not ours."""
    direct = client.direct
    n = len(direct.call_route) + sum(len(q) for q in list(direct.lent.queue.values()))
    return n + _verbs.pending_tasks(client, own_only)


def _drain(s: Session) -> None:
    """At exit: let pending tasks run for up to the session's grace (Ray users expect
    `f.remote()` at the end of a script to run). Returns at once when none is pending."""
    if s.exit_grace_s <= 0 or s.client.lost is not None:
        return
    deadline = time.monotonic() + s.exit_grace_s
    said = False
    while True:
        try:
            n = pending_tasks(s.client, own_only=s.head is None)
        except (ClusterLostError, OrchestraError, TimeoutError):
            return
        if n == 0:
            return
        if time.monotonic() >= deadline:
            # A driver of a cluster it did not start stops its job's work, not the cluster.
            what = "stopping the cluster" if s.head is not None else "stopping this job's work"
            _log.warning("orchestra: %d task(s) still pending %g s after the script ended; "
                         "%s (raise init(exit_grace_s=...) or ORCHESTRA_EXIT_GRACE_S to "
                         "wait longer, or get() their results)", n, s.exit_grace_s, what)
            return
        if not said:
            said = True
            _log.info("orchestra: waiting up to %g s for %d pending task(s) before stopping",
                      s.exit_grace_s, n)
        time.sleep(_EXIT_POLL_S)


def _shutdown_at_exit() -> None:
    global exiting
    exiting = True
    s = _session
    # A script that ended on an uncaught Ctrl-C (the interpreter set sys.last_type as
    # it printed the traceback) asked to stop: its pending work is not waited for.
    interrupted = getattr(sys, "last_type", None) is KeyboardInterrupt
    if s is not None and not interrupted:
        try:
            _drain(s)
        except KeyboardInterrupt:
            pass   # Ctrl-C cuts the grace short; the cluster still stops below
    try:
        shutdown()
    except KeyboardInterrupt:
        pass   # Ctrl-C while exiting: the cleanup finished anyway (see shutdown())
    except Exception as exc:  # noqa: BLE001 - interpreter exit: report, never raise
        print(f"orchestra: error during shutdown at exit: {exc}", file=sys.stderr)


def _start_implicitly() -> None:
    """init() with the defaults, for the first call that needs a cluster before init()
    (as in Ray), said once on the orchestra logger. Never after the cluster stopped at
    interpreter exit."""
    if exiting or sys.is_finalizing():
        raise RuntimeError("orchestra is not initialized (the cluster stopped when the "
                           "interpreter began to exit)")
    # WARNING, not INFO: Python shows warnings with no logging set up, and a cluster
    # that starts unasked (processes, shared memory) should be seen once.
    _log.warning("orchestra.init() was not called: starting a local cluster with the "
                 "defaults (call orchestra.init(...) first to choose its size or address)")
    init()


_context.set_starter(_start_implicitly)


def is_initialized() -> bool:
    """True between init() and shutdown(), while the cluster's head is alive."""
    return _session is not None and _session.client.lost is None


def _forget_lost_session() -> None:
    """The head died: clean up what it left (its session directory, segments) so that
    init() can start a new cluster without a shutdown() first."""
    global _session
    s = _session
    _session = None
    _context.set_client(None)
    if s is not None:
        s.stop()


# ---------------------------------------------------------------- calls on the session

def _client() -> _context.Client:
    return _context.current_client()


def _lost_with_head(client: _context.Client, exc: ClusterLostError) -> None:
    """A get() or wait() whose head was lost meanwhile: returns once this driver is
    connected to the restarted head (_runtime/reconnect.py: its refs carried over, the call
    goes on there); else raises ``exc``."""
    s = _session
    if s is None or s.rejoin is None or s.rejoin.wait(client) is None:
        if s is not None and s.rejoin is not None and s.rejoin.failed:
            raise ClusterLostError(f"{exc}; connecting to it again failed: "
                                   f"{s.rejoin.failed}") from exc
        raise exc


def _left(deadline: float | None) -> float | None:
    return None if deadline is None else max(0.0, deadline - time.monotonic())


@overload
def get(refs: ObjectRef[R], *, timeout: float | None = None, progress: bool | str = False) -> R: ...


@overload
def get(refs: Sequence[ObjectRef[R]], *, timeout: float | None = None,
        progress: bool | str = False) -> list[R]: ...


def get(refs: ObjectRef[Any] | Sequence[ObjectRef[Any]], *, timeout: float | None = None,
        progress: bool | str = False) -> Any:
    """The value of a ref, or the values of a list of refs (in order).

    ``refs``: an ObjectRef, or a list or tuple of them. A task's error is raised here
    (TaskError, or the error's own class where it can be both).
    ``timeout``: seconds to wait at most (None or ``inf``: no limit); then
    GetTimeoutError, and the tasks keep running.
    ``progress``: True draws a progress bar of the refs whose values are here (tqdm:
    counts and rate; a widget in a notebook), a string draws it with that label; False
    (the default) draws nothing and costs nothing."""
    timeout = _check_timeout(timeout)
    deadline = None if timeout is None else time.monotonic() + timeout
    client = _client()
    if isinstance(refs, ObjectRef):
        _check_session(refs, client)
        if progress is not False:
            from .progress import get_with_progress
            return get_with_progress(client, [refs], timeout, progress)[0]
        try:
            return client.values.get_one(refs, timeout)
        except ClusterLostError as exc:
            _lost_with_head(client, exc)
            return get(refs, timeout=_left(deadline))
    if isinstance(refs, (list, tuple)):
        for r in refs:
            if not isinstance(r, ObjectRef):
                raise TypeError(f"get() takes an ObjectRef or a list of ObjectRefs; the list "
                                f"holds {a_type(r)} {r!r}")
            _check_session(r, client)
        if progress is not False:
            from .progress import get_with_progress
            return get_with_progress(client, refs, timeout, progress)
        try:
            return client.values.get_many(refs, timeout)
        except ClusterLostError as exc:
            _lost_with_head(client, exc)
            return get(refs, timeout=_left(deadline))
    raise TypeError(f"get() takes an ObjectRef or a list of ObjectRefs, not a "
                    f"{type(refs).__name__}; f.remote(...) and orchestra.put(...) return refs")


def put(value: R) -> ObjectRef[R]:
    """Store ``value`` in the cluster and return its ref; large values go to shared
    memory once, and tasks on this node read them from there without a copy.

    ``value``: anything cloudpickle can pickle (numpy arrays, Arrow tables and pandas
    frames travel as buffers, not pickled bytes)."""
    client = _client()
    try:
        return client.values.put(value)
    except ClusterLostError as exc:   # the head died as it was sent: to the restarted one
        _lost_with_head(client, exc)
        return put(value)


def wait(refs: Sequence[_W], *, num_returns: int = 1, timeout: float | None = None,
         fetch_local: bool = True, progress: bool | str = False) -> tuple[list[_W], list[_W]]:
    """(ready, not_ready): the first ``num_returns`` refs ready, and the others, each
    list in input order.

    ``refs``: a list of distinct ObjectRefs; an ObjectRefGenerator among them is ready
    when next() on it returns at once. ``num_returns``: how many to wait for, between 1
    and ``len(refs)``. ``timeout``: seconds to wait at most (None: no limit; 0: look
    and return); at the timeout ``ready`` holds those ready then, no error.
    ``fetch_local``: on a cluster of several nodes, start copying the ready values that
    live on another node to this one (as Ray does), so that the get() that follows
    reads them here; False leaves them where they are (get() copies them when it reads).
    Either way a ref counts as ready once its value exists anywhere in the cluster.
    ``progress``: True draws a progress bar up to ``num_returns`` (tqdm), a string
    draws it with that label; False (the default) draws nothing."""
    if not isinstance(fetch_local, bool):
        raise TypeError(f"fetch_local must be True or False, got {fetch_local!r}")
    if isinstance(refs, ObjectRef) or not isinstance(refs, (list, tuple)):
        raise TypeError(f"wait() takes a list of ObjectRefs, not {a_type(refs)}")
    client = _client() if refs else None
    # One comprehension: wait() over thousands of refs is on users' hot paths. A ref of
    # another class or session is left out, and the slow pass below names it.
    ids = {r._id for r in refs if r.__class__ is ObjectRef and r._client is client}
    streams = False
    if len(ids) != len(refs):
        for r in refs:
            if isinstance(r, ObjectRefGenerator) and r._client is client:
                streams = True
                continue
            if not isinstance(r, ObjectRef):
                raise TypeError(f"wait() takes a list of ObjectRefs; it holds {a_type(r)}")
            _check_session(r, client)
        if len({id(r) if streams else r._id for r in refs}) != len(refs):
            raise ValueError("wait() got the same ObjectRef twice; pass each ref once")
    if not is_int(num_returns):
        raise TypeError(f"num_returns must be an int, got {num_returns!r}")
    if num_returns < 1 or num_returns > len(refs):
        if not refs and num_returns >= 0:
            return [], []
        raise ValueError(f"num_returns must be between 1 and len(refs)={len(refs)}, got {num_returns}")
    timeout = _check_timeout(timeout)
    if progress is not False:
        from .progress import wait_with_progress
        return wait_with_progress(_client(), list(refs), num_returns, timeout, progress, streams)
    if streams:
        return wait_with_generators(_client(), list(refs), num_returns, timeout)
    client = _client()
    deadline = None if timeout is None else time.monotonic() + timeout
    try:
        ready: Any = client.values.wait(list(refs), num_returns, timeout)   # the refs given: _W's
    except ClusterLostError as exc:
        _lost_with_head(client, exc)
        return wait(refs, num_returns=num_returns, timeout=_left(deadline),
                    fetch_local=fetch_local)
    if fetch_local and client.info.joinable and ready[0]:
        client.values.prefetch(ready[0])
    return ready


def cancel(ref: ObjectRef, *, force: bool = False, recursive: bool = True) -> None:
    """Stop the task behind ``ref``: queued, waiting for arguments, or running; get()
    on its refs then raises TaskCancelledError. A finished task is left alone.

    ``ref``: a ref the task returns (an ObjectRefGenerator: its task). ``force``: kill
    the worker running it (else the task is interrupted where it runs Python).
    ``recursive`` (default, as in Ray): the tasks it submitted that have not finished
    are cancelled too, and theirs."""
    if isinstance(ref, ObjectRefGenerator):
        ref = ref.completed()
    if not isinstance(ref, ObjectRef):
        raise TypeError(f"cancel() takes an ObjectRef, not {a_type(ref)}")
    _client().submitter.cancel(ref.binary(), bool(force), bool(recursive))


def nodes() -> list[dict[str, Any]]:
    """One dict per node of the cluster, alive or dead, with Ray's keys: NodeID,
    Alive, NodeManagerAddress, Resources; and ObjectStoreCapacity, ObjectStoreUsed,
    AvailableResources, Pid, and DeathReason for a dead one."""
    return _verbs.nodes(_client())


def cluster_resources() -> dict[str, float]:
    """Total resources of the cluster."""
    return _verbs.resources(_client(), "cluster_resources")


def available_resources() -> dict[str, float]:
    """Resources not held by running tasks at this moment."""
    return _verbs.resources(_client(), "available_resources")


def debug_info() -> Any:
    """SchedulerDebugInfoReply: tasks, workers, objects and resources (for tests and tools)."""
    return _verbs.debug_info(_client())


def get_gpu_ids() -> list[int]:
    """GPU ids given to the current task (empty in the driver and in non-GPU tasks)."""
    return _context.gpu_ids()
