"""``orchestra start``, ``orchestra stop`` and ``orchestra status``: a cluster of machines
from the shell.

    start --head      -> _launch.start_head (a head that runs no work) -> record in the
                         state directory -> _launch.start_node beside it with the given
                         resources (this machine's work, which outlives the head) ->
                         prints the address and the command that joins another machine;
                         --head-runs-work: the head's own node runs it, no node beside
    start --address   -> _launch.start_node -> record
    --block           -> the same, then stays in the foreground until SIGTERM/SIGINT
                         (or until what it started exits), and stops what it started
    stop              -> _launch.stop_all over the state directory's records
    status            -> a driver connection: nodes(), resources, object store use, and
                         the cluster summary (tasks and actors by state, spilled bytes)

The state directory is per user (_runtime/cluster_file.py); ``init(address="auto")`` reads it.
"""
from __future__ import annotations

import argparse
import json
import os
import signal
import sys
import threading
import time
from typing import TYPE_CHECKING, Any

from .._cluster import launch as _launch
from .._cluster.launch import DEFAULT_HOST, DEFAULT_PORT, RECONNECT_TIMEOUT_S, LaunchError
from .._runtime import cluster_file as cf

if TYPE_CHECKING:
    from types import FrameType

START_HELP = f"""\
orchestra start --head [--host IP] [--port PORT] [--token TOKEN] [resources] [--block]
                       [--head-runs-work]
                       [--dashboard-port PORT] [--include-dashboard false]
                       [--state-store redis://HOST:PORT[/DB] | sqlite:///PATH]
                       [--reconnect-timeout SECONDS] [--tls | --insecure-no-tls]
                       [--tls-cert PEM --tls-key PEM --tls-ca PEM]
orchestra start --address IP:PORT --token TOKEN [--host IP] [resources] [--block]
                          [--reconnect-timeout SECONDS]
                          [--tls-cert PEM --tls-key PEM --tls-ca PEM]

Starts the cluster's head (its scheduler, and this machine's node in a process beside
it), or a node that joins it, in the background. The head listens on
{DEFAULT_HOST}:{DEFAULT_PORT} unless --host and --port say otherwise: pass --host with this
machine's address on the network the other machines share to let them join. Every
connection proves the cluster token. Its web dashboard listens on the same address
(port 8265, or any free one), and asks for the cluster token unless that address is
loopback.

The head keeps its durable state (the cluster's id and token) in a state store: by
default one SQLite file in the state directory per port (head-PORT.db), or in Redis with
--state-store. A head started again on the same store serves the same cluster, with the
same token; a second head on a store whose head still runs refuses to start. The head
runs under a supervisor that starts it again when it dies. This machine's tasks, actors
and objects live on the node beside it (the resources given are that node's) and outlive
the head's death as a joined machine's do (--head-runs-work runs them in the head's
process instead: one process fewer, but they die with it). A node that loses the head
joins it again for up to --reconnect-timeout seconds (60), under its id of before, its
detached actors' processes kept; a driver connected with init(address=...) waits as long
(the head's --reconnect-timeout) and connects to the restarted head.

A head that other machines reach speaks TLS on every port they use, keyed by the token:
nothing to set up. --tls-cert/--tls-key/--tls-ca put the cluster on certificates of your
own instead (every machine then presents one signed by the CA, and still proves the
token); --insecure-no-tls is plain TCP, for a network you trust.
"""


def _resources(text: str) -> dict[str, float]:
    try:
        value = json.loads(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(f"--resources takes JSON, e.g. '{{\"widget\": 2}}': "
                                         f"{exc}") from None
    if not isinstance(value, dict) or not all(
            isinstance(k, str) and isinstance(v, (int, float)) and not isinstance(v, bool)
            for k, v in value.items()):
        raise argparse.ArgumentTypeError(
            f"--resources takes a JSON object of names to numbers, e.g. '{{\"widget\": 2}}', "
            f"not {text!r}")
    return {k: float(v) for k, v in value.items()}


def _bytes(text: str) -> int:
    try:
        n = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number of bytes, got {text!r}") from None
    if n <= 0:
        raise argparse.ArgumentTypeError(f"expected a positive number of bytes, got {n}")
    return n


def _port(text: str) -> int:
    try:
        n = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a port number, got {text!r}") from None
    if not 0 <= n < 65536:
        raise argparse.ArgumentTypeError(f"a port is 0..65535 (0: any free port), got {n}")
    return n


def _bool(text: str) -> bool:
    low = text.lower()
    if low in ("true", "1", "yes"):
        return True
    if low in ("false", "0", "no"):
        return False
    raise argparse.ArgumentTypeError(f"expected true or false, got {text!r}")


def start_parser() -> argparse.ArgumentParser:
    # The synopsis as the usage (an error prints it, then the error line), the rest of
    # START_HELP as the description (--help prints it all).
    synopsis, _, text = START_HELP.partition("\n\n")
    p = argparse.ArgumentParser(prog="orchestra start", usage=synopsis,
                                description="Start a cluster head, or a node joining one.\n\n"
                                + text.strip(),
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    which = p.add_mutually_exclusive_group(required=True)
    which.add_argument("--head", action="store_true", help="start the cluster's head here")
    which.add_argument("--address", metavar="IP:PORT",
                       help="join the cluster whose head listens there")
    p.add_argument("--host", metavar="IP",
                   help=f"the address to listen on (head: default {DEFAULT_HOST}; node: "
                        "its address on the route to the head)")
    p.add_argument("--port", type=_port, default=None,
                   help=f"the head's port (default {DEFAULT_PORT})")
    p.add_argument("--token", help="the cluster token (default: $ORCHESTRA_TOKEN; a head "
                                   "without either generates one)")
    p.add_argument("--num-cpus", type=int, default=None, help="CPUs (default: all)")
    p.add_argument("--num-gpus", type=int, default=None, help="GPUs (default: those found)")
    p.add_argument("--resources", type=_resources, default=None,
                   help='custom resources as JSON, e.g. \'{"widget": 2}\'')
    p.add_argument("--object-store-memory", type=_bytes, default=None, metavar="BYTES",
                   help="the object store's size (default: 30%% of RAM, bounded by /dev/shm)")
    p.add_argument("--huge-pages", metavar="DIR", default=None,
                   help="a hugetlbfs mount where objects of 1 MiB and more live, in huge "
                        "pages (sets ORCHESTRA_HUGE_PAGES for what starts here; "
                        "docs/objects.md)")
    p.add_argument("--dashboard-port", type=_port, default=None, metavar="PORT",
                   help="the head's dashboard port (default 8265, or any free port when "
                        "that is taken; 0: any free port)")
    p.add_argument("--include-dashboard", type=_bool, default=True, metavar="BOOL",
                   help="serve the dashboard and /metrics (default true)")
    p.add_argument("--state-store", metavar="URL", default=None,
                   help="where the head keeps its durable state: redis://HOST:PORT[/DB] or "
                        "sqlite:///PATH (default: SQLite in the state directory)")
    p.add_argument("--reconnect-timeout", type=float, default=None, metavar="SECONDS",
                   help="a node that loses the head joins it again for this long; with "
                        "--head, its drivers wait this long for it to come back (default "
                        f"{RECONNECT_TIMEOUT_S:g}; 0: they stop at once)")
    tls = p.add_mutually_exclusive_group()
    tls.add_argument("--insecure-no-tls", dest="tls", action="store_false", default=None,
                     help="head: plain TCP between machines, for a network you trust "
                          "(default: TLS whenever --host is not loopback)")
    tls.add_argument("--tls", dest="tls", action="store_true", default=None,
                     help="head: TLS even on loopback (reached through a tunnel, say)")
    p.add_argument("--tls-cert", metavar="PEM", default=None,
                   help="certificates of your own instead of the key the token derives: "
                        "this machine's certificate (its chain after it; default: "
                        "$ORCHESTRA_TLS_CERT)")
    p.add_argument("--tls-key", metavar="PEM", default=None,
                   help="its private key, unencrypted (default: $ORCHESTRA_TLS_KEY)")
    p.add_argument("--tls-ca", metavar="PEM", default=None,
                   help="the CA every machine's certificate must chain to "
                        "(default: $ORCHESTRA_TLS_CA)")
    p.add_argument("--head-runs-work", action="store_true",
                   help="head: run this machine's tasks, actors and objects in the head's "
                        "own process instead of a node beside it (one process fewer; they "
                        "die with the head and its restart runs them again)")
    p.add_argument("--block", action="store_true",
                   help="stay in the foreground until SIGTERM/SIGINT, then stop")
    return p


def parse_start(argv: list[str]) -> argparse.Namespace:
    """The arguments of ``orchestra start``, checked (SystemExit(2) with a message)."""
    p = start_parser()
    args = p.parse_args(argv)
    if args.address is not None:
        if args.port is not None:
            p.error("--port is the head's; a node joining with --address takes none")
        if args.dashboard_port is not None:
            p.error("--dashboard-port is the head's; a node joining with --address takes none")
        if args.state_store is not None:
            p.error("--state-store is the head's; a node joining with --address takes none")
        if args.tls is not None:
            p.error("--tls and --insecure-no-tls are the head's: a node speaks TLS when its "
                    "token says so (it starts with 'tls-')")
        if args.head_runs_work:
            p.error("--head-runs-work is the head's; a node joining with --address runs "
                    "its work anyway")
        try:
            _launch.split_address(args.address)
        except ValueError as exc:
            p.error(str(exc))
        args.token = args.token or os.environ.get("ORCHESTRA_TOKEN") or None
        if not args.token:
            p.error("joining needs the cluster token: --token TOKEN or ORCHESTRA_TOKEN "
                    "(`orchestra start --head` printed it)")
    else:
        args.token = args.token or os.environ.get("ORCHESTRA_TOKEN") or None
        args.host = args.host or DEFAULT_HOST
        args.port = DEFAULT_PORT if args.port is None else args.port
    if args.head and args.tls is False and (args.tls_cert or args.tls_key or args.tls_ca):
        p.error("--insecure-no-tls turns TLS off; --tls-cert/--tls-key/--tls-ca are for TLS: "
                "give one or the other")
    if args.reconnect_timeout is None:
        args.reconnect_timeout = RECONNECT_TIMEOUT_S
    elif args.reconnect_timeout < 0:
        p.error("--reconnect-timeout must be >= 0")
    for name in ("num_cpus", "num_gpus"):
        if getattr(args, name) is not None and getattr(args, name) < 0:
            p.error(f"--{name.replace('_', '-')} must be >= 0")
    return args


def start(argv: list[str]) -> int:
    args = parse_start(argv)
    try:
        state = cf.state_dir()
    except PermissionError as exc:
        print(f"orchestra start: {exc}", file=sys.stderr)
        return 1
    # Under --block the processes' output is ours: a container's or a batch job's log.
    log = not args.block
    # Under --block, SIGTERM/SIGINT/SIGHUP are ours from here on: one that comes while
    # the head or node starts stops it once started (a batch system's SIGTERM right
    # after the head's record appeared killed this process and left the head running).
    stop_asked = _catch_stop_signals() if args.block else None
    try:
        from .._objects.store import huge_pages_dir
        from .._protocol import pki
        # Checked before anything starts; then in the environment, which the processes
        # started here inherit.
        own = pki.use(args.tls_cert, args.tls_key, args.tls_ca) if args.tls is not False \
            else None
        if own is not None and args.head and args.tls is None:
            args.tls = True   # certificates given: TLS even on loopback
        if args.huge_pages is not None:
            os.environ["ORCHESTRA_HUGE_PAGES"] = huge_pages_dir(
                {"ORCHESTRA_HUGE_PAGES": args.huge_pages}, "--huge-pages") or ""
        if args.head:
            every = _start_head(state, args, log)
        else:
            every = [_launch.start_node(
                state, head_address=args.address, token=args.token, host=args.host,
                num_cpus=args.num_cpus, num_gpus=args.num_gpus, resources=args.resources,
                object_store_memory=args.object_store_memory, log=log,
                reconnect_timeout_s=args.reconnect_timeout)]
    except (LaunchError, ValueError, TypeError) as exc:
        print(f"orchestra start: {exc}", file=sys.stderr)
        return 1
    _announce(every)
    if stop_asked is not None:
        return _block(every, stop_asked)
    return 0


def _start_head(state: str, args: argparse.Namespace, log: bool) -> list[_launch.Started]:
    """The head and, unless --head-runs-work, the node beside it that runs this machine's
    work with the resources given: a process of its own, which outlives the head's death
    and joins its restart as any joined node (the head then runs no work)."""
    beside = not args.head_runs_work
    head = _launch.start_head(
        state, host=args.host, port=args.port, token=args.token,
        num_cpus=0 if beside else args.num_cpus, num_gpus=0 if beside else args.num_gpus,
        resources=None if beside else args.resources,
        object_store_memory=args.object_store_memory, log=log,
        include_dashboard=args.include_dashboard, dashboard_port=args.dashboard_port,
        state_store=args.state_store, supervise=True,
        reconnect_timeout_s=args.reconnect_timeout, tls=args.tls,
        system_config={"runs_work": False} if beside else None)
    if not beside:
        return [head]
    try:
        node = _launch.start_node(
            state, head_address=head.address, token=head.token,
            num_cpus=args.num_cpus, num_gpus=args.num_gpus, resources=args.resources,
            object_store_memory=args.object_store_memory, log=log,
            reconnect_timeout_s=args.reconnect_timeout)
    except BaseException as exc:
        _launch.stop(head)
        if isinstance(exc, LaunchError):
            raise LaunchError(f"the head started, but the node beside it that runs this "
                              f"machine's work did not (the head was stopped): {exc}") from exc
        raise
    return [head, node]


def _announce(every: list[_launch.Started]) -> None:
    started = every[0]
    if started.kind == "head":
        from .._cluster.supervisor import head_pid
        pid = head_pid(started.run_dir) or started.pid
        from .._protocol import pki, tls
        own = pki.current() if tls.enabled(started.token) else None
        join = ""
        if own is not None:
            security = (f"Connections between machines use TLS with certificates of the CA "
                        f"{own.ca_subject} ({own.ca_fingerprint}), both ways: each machine "
                        f"needs one of them and the token. This one expires on "
                        f"{own.not_after}.")
            join = " --tls-cert CERT --tls-key KEY --tls-ca CA"
        elif tls.enabled(started.token):
            security = (f"Connections between machines use TLS; the token names the "
                        f"cluster's key ({tls.cluster_fingerprint(started.token)}).")
        elif tls.is_loopback(_launch.split_address(started.address)[0]):
            security = "It listens on loopback only: plain TCP (--tls encrypts it)."
        else:
            security = ("WARNING: connections between machines are NOT encrypted "
                        "(--insecure-no-tls): whoever reads the network reads every "
                        "argument, result and object, and can inject frames.")
        work = (f"This machine's tasks, actors and objects run on node {every[1].node_hex} "
                f"(pid {every[1].pid}) beside it, which outlives the head.\n"
                if len(every) > 1 else
                "This machine's tasks, actors and objects run in the head's process "
                "(--head-runs-work): they die with it.\n")
        print(f"orchestra: the head runs (pid {pid}) at {started.address}; its supervisor "
              f"(pid {started.pid}) starts it again if it dies\n{work}{security}\n\n"
              f"Join another machine with:\n"
              f"  orchestra start --address {started.address} --token {started.token}{join}\n\n"
              f"Connect a driver with orchestra.init(address=\"{started.address}\", "
              f"token=...) or, on this machine, orchestra.init(address=\"auto\").\n"
              f"Stop with: orchestra stop", flush=True)
        url = _launch.dashboard_url(started)
        if url:
            print(f"Dashboard: {_dashboard_link(url, started.token)}", flush=True)
        if url.startswith("https:") and own is None:
            print("  (HTTPS with the cluster's own certificate, which browsers do not know: "
                  "accept it once if its SHA-256 is "
                  f"{tls.certificate_fingerprint(started.token)})", flush=True)
    else:
        print(f"orchestra: node {started.node_hex} (pid {started.pid}) joined the head at "
              f"{started.address}. Stop with: orchestra stop", flush=True)


def _dashboard_link(url: str, token: str) -> str:
    """The dashboard's URL to print: with the token where the dashboard asks for it
    (beyond loopback; the page keeps it in a cookie and out of the address bar)."""
    from urllib.parse import quote, urlsplit
    host = urlsplit(url).hostname or ""
    if host in ("127.0.0.1", "::1", "localhost") or host.startswith("127."):
        return url
    return f"{url}?token={quote(token, safe='')}"


class _StopAsked:
    """A stop signal came (its name in ``why``)."""

    def __init__(self) -> None:
        self.done = threading.Event()
        self.why: list[str] = []


def _catch_stop_signals() -> _StopAsked:
    asked = _StopAsked()

    def on_signal(signum: int, frame: FrameType | None) -> None:
        asked.why.append(signal.Signals(signum).name)
        asked.done.set()

    for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        signal.signal(sig, on_signal)
    return asked


def _block(every: list[_launch.Started], asked: _StopAsked) -> int:
    """Wait for SIGTERM/SIGINT (or the end of a process started), then stop what was
    started (a node first, then the head)."""
    ended = None
    while ended is None and not asked.done.wait(0.2):
        ended = next((s for s in every if s.proc is not None and s.proc.poll() is not None),
                     None)
    for started in reversed(every):
        _launch.stop(started)
    if ended is not None:
        assert ended.proc is not None
        print(f"orchestra: the {ended.kind} (pid {ended.pid}) exited with code "
              f"{ended.proc.returncode}", file=sys.stderr, flush=True)
        return 1
    what = " and ".join(s.kind for s in every)
    print(f"orchestra: stopped the {what} ({asked.why[0]})", file=sys.stderr, flush=True)
    return 0


def stop(argv: list[str]) -> int:
    p = argparse.ArgumentParser(prog="orchestra stop",
                                description="Stop every head and node that `orchestra start` "
                                            "started on this machine.")
    p.add_argument("--timeout", type=float, default=_launch.STOP_TIMEOUT_S,
                   help="seconds each may take to stop before it is killed (default %(default)s)")
    args = p.parse_args(argv)
    try:
        state = cf.state_dir()
    except PermissionError as exc:
        print(f"orchestra stop: {exc}", file=sys.stderr)
        return 1
    records = _launch.stop_all(state, args.timeout)
    if not records:
        print("orchestra: nothing to stop (no head or node started here)")
    for rec in records:
        print(f"orchestra: stopped the {rec.get('kind', 'process')} (pid {rec['pid']})")
    return 0


# ---------------------------------------------------------------------------- status

def default_address(prog: str, address: str | None) -> str | None:
    """Where a command connects: ``address``, else $ORCHESTRA_ADDRESS, else the cluster
    ``orchestra start`` started here ("auto", also when it is down: that says why),
    else this user's one running init() cluster here (its session directory). None,
    said on stderr, when several init() clusters run and none was named."""
    address = address or os.environ.get("ORCHESTRA_ADDRESS")
    if address:
        return address
    try:
        started = cf.read_records(cf.state_dir())
    except OSError:
        started = []
    if started:   # a cluster orchestra start started here (down: "auto" says why)
        return "auto"
    sessions = cf.private_sessions()
    if len(sessions) > 1:
        print(f"{prog}: {len(sessions)} init() clusters of this user run here; name one "
              "with --address SESSION_DIR:\n" + "\n".join(f"  {d}" for d in sessions),
              file=sys.stderr)
        return None
    return sessions[0] if sessions else "auto"


def status(argv: list[str]) -> int:
    p = argparse.ArgumentParser(prog="orchestra status",
                                description="Print the cluster's nodes, resources, object "
                                            "store use and dashboard URL.")
    p.add_argument("--address", default=None,
                   help="the head's IP:PORT, or an init() cluster's session directory "
                        "(default: the cluster `orchestra start` started on this machine, "
                        "else this user's one init() cluster running here)")
    p.add_argument("--token", default=None, help="the cluster token (default: $ORCHESTRA_TOKEN, "
                                                 "or the one recorded here)")
    args = p.parse_args(argv)
    import orchestra
    address = default_address("orchestra status", args.address)
    if address is None:
        return 2
    try:
        from .._api.session import connect_as_tool
        connect_as_tool()
        info = orchestra.init(address=address, token=args.token)
    except Exception as exc:  # noqa: BLE001 - any failure to connect is reported, not raised
        print(f"orchestra status: cannot connect: {exc}", file=sys.stderr)
        for why in _heads_down():
            print(f"orchestra status: {why}", file=sys.stderr)
        return 1
    from .._api.state import cluster_summary
    try:
        nodes = orchestra.nodes()
        available = orchestra.available_resources()
        total = orchestra.cluster_resources()
        summary = cluster_summary()
    finally:
        orchestra.shutdown()
    print(format_status(nodes, total, available))
    print(format_summary(summary))
    if info.get("dashboard_url"):
        certificate = (summary.get("security") or {}).get("certificate")
        said = f"  (certificate SHA-256 {certificate})" if certificate and \
            info["dashboard_url"].startswith("https:") else ""
        print(f"dashboard: {info['dashboard_url']}{said}")
    return 0


def _heads_down() -> list[str]:
    """Why a head started here stays down (its supervisor gave up: _cluster/supervisor.py)."""
    from .._cluster.supervisor import down_reasons
    try:
        return down_reasons(cf.read_records(cf.state_dir()))
    except OSError:
        return []


def format_summary(summary: dict[str, Any]) -> str:
    """The lines of ``orchestra status`` from the cluster summary: the object store's
    use and spilled bytes, tasks and actors by state, workers and drivers."""
    store = summary["store"]

    def by_state(counts: dict[str, int]) -> str:
        return ", ".join(f"{printable(k)} {v}" for k, v in sorted(counts.items())) or "none"

    lines = [f"object store (in use/total): {_fmt_bytes(store['used'])}/"
             f"{_fmt_bytes(store['capacity'])}, kept for reuse "
             f"{_fmt_bytes(store.get('pooled', 0))}, spilled {_fmt_bytes(store['spilled_bytes'])} "
             f"({store['spilled_objects']} object(s))",
             f"tasks: {by_state(summary['tasks'])}",
             f"actors: {by_state(summary['actors'])}",
             f"processes: {summary['workers']} worker(s), {summary['drivers']} driver(s)"]
    restarts = summary.get("head_restarts", 0)
    if restarts:
        last = summary.get("head_last_restart") or {}
        when = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(last.get("time", 0)))
        lines.append(f"head: restarted {restarts} time(s), last at {when}: "
                     f"{last.get('reason', '?')}")
    security = summary.get("security")
    if security:
        lines.append(f"connections: {describe_security(security)}")
    store = summary.get("state_store")
    if store:
        kept = store.get("kept", {})
        line = (f"state store: {store['url']}: {kept.get('actors', 0)} actor(s), "
                f"{kept.get('groups', 0)} detached placement group(s), "
                f"{kept.get('nodes', 0)} joined node(s), {kept.get('jobs', 0)} job(s) kept")
        if store.get("away_since"):
            line += (f"; DOES NOT ANSWER for {time.time() - store['away_since']:.0f} s, "
                     f"{store.get('waiting', 0)} change(s) wait to be written")
        lines.append(line)
    return "\n".join(lines)


def describe_security(security: dict[str, Any]) -> str:
    """How the cluster's port speaks to other machines, in words (status, dashboard)."""
    if security.get("tls") and security.get("ca"):
        return (f"TLS 1.3, certificates of the CA {security['ca']} "
                f"({security.get('ca_fingerprint', '')}); the head's expires on "
                f"{security.get('certificate_expires', '')}")
    if security.get("tls"):
        return f"TLS 1.3, cluster key {security.get('key', '')}"
    if security.get("loopback"):
        return "plain TCP, loopback only"
    return ("NOT ENCRYPTED between machines (--insecure-no-tls): whoever reads the network "
            "reads every argument, result and object")


# A name from user code shown in a table or in status is cut to this many characters.
MAX_CELL = 64
# Control characters (C0, DEL, C1) and the line and paragraph separators: as escapes.
_CONTROL = dict.fromkeys([*range(0x20), *range(0x7F, 0xA0), 0x2028, 0x2029])


def printable(value: object, limit: int = MAX_CELL) -> str:
    """Text from user code (an actor's, a task's or a resource's name) made safe for a
    terminal: control characters escaped as Python writes them (ESC -> \\x1b, a newline
    -> \\n), so that a name can neither move the cursor, retitle the window nor break a
    row; cut to ``limit`` characters with "..." (a 100 kB name padded every row)."""
    text = str(value)
    if not text.isprintable():
        text = "".join(repr(ch)[1:-1] if ord(ch) in _CONTROL else ch for ch in text)
    return text if len(text) <= limit else text[:limit - 3] + "..."


def _status_order(res: dict[str, float]) -> list[str]:
    """Resource names as status prints them: by name, memory (in bytes) last, and no
    placement group's bundle names (CPU_group_..., shown by placement_group_table()) nor
    the nodes' own ``node:<address>`` (the node's line names its address), as Ray's."""
    names = sorted(k for k in res if "_group_" not in k and not k.startswith("node:"))
    return [k for k in names if k != "memory"] + (["memory"] if "memory" in res else [])


def _fmt_bytes(n: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(n) < 1024 or unit == "TiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n:.1f} TiB"


def _fmt_amount(x: float) -> str:
    return f"{x:g}"


def format_status(nodes: list[dict[str, Any]], total: dict[str, float],
                  available: dict[str, float]) -> str:
    """The text of ``orchestra status``: one block per node, then the cluster's totals.

    Per node: NodeID, Alive, NodeManagerAddress, Resources (total), and in use where the
    node's dict says what is free ("AvailableResources"), object store used/capacity."""
    lines = [f"{len(nodes)} node(s), {sum(1 for n in nodes if n.get('Alive'))} alive"]
    for n in nodes:
        alive = "alive" if n.get("Alive") else "dead"
        res = n.get("Resources") or {}
        head = "  (head)" if "node:__internal_head__" in res else ""
        lines.append(f"node {printable(n.get('NodeID', '?'))}  "
                     f"{printable(n.get('NodeManagerAddress', '?'))}  {alive}{head}")
        free = n.get("AvailableResources")
        parts = []
        for k in _status_order(res):
            fmt = _fmt_bytes if k == "memory" else _fmt_amount
            if free is not None:
                parts.append(f"{printable(k)} {fmt(res[k] - free.get(k, 0.0))}/{fmt(res[k])}")
            else:
                parts.append(f"{printable(k)} {fmt(res[k])}")
        label = "resources (in use/total)" if free is not None else "resources"
        lines.append(f"  {label}: {', '.join(parts) or ('none (runs no work)' if head else 'none')}")
        if "ObjectStoreCapacity" in n:
            lines.append(f"  object store: {_fmt_bytes(n.get('ObjectStoreUsed', 0))} used of "
                         f"{_fmt_bytes(n['ObjectStoreCapacity'])}")
    parts = [f"{printable(k)} {_fmt_amount(total[k] - available.get(k, 0.0))}/{_fmt_amount(total[k])}"
             if k != "memory" else
             f"{k} {_fmt_bytes(total[k] - available.get(k, 0.0))}/{_fmt_bytes(total[k])}"
             for k in _status_order(total)]
    lines.append(f"cluster resources (in use/total): {', '.join(parts) or 'none'}")
    return "\n".join(lines)
