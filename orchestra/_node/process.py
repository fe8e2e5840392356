"""A node in a process of its own: ``python -m orchestra._node_process <config> <head
socket> <node socket> <node id>`` (started by the head, orchestra/_head/remote_node.py; with
a fork server through _bootstrap.NODE_BOOTSTRAP).

    head --NodeCommand frames--> NodeProcess.data_received -> command() -> Node
        (seal, pin, unpin, free_segment, create_segment, start_worker, ...) in order
    Node --NodeHost calls--> NodeProcess: send / worker_exited / worker_failed_to_start /
        relocate / pulled -> NodeEvent frames, written once per read of commands, or on the
        loop's next turn for events of the node's own timers and threads
    store figures -> a store_info event when they changed: after each read of commands,
        and every _INFO_S for what the node's threads changed

The node runs on its own uvloop, as it would in the head (orchestra/_node/node.py); its
workers connect to the head's socket, and the head tells the node about them.
relocate() cannot wait for the head's answer: it says yes, and the head answers an
object gone meanwhile with a free_segment of the spill file. is_idle() reads what the
head said last (cluster_idle) and this process's own view: no command for 0.3 s (so
busy again at the first command, before the head's next look).

Fate-shares with the head: the head's connection closing (shutdown, crash, SIGKILL),
a close command, the head process exiting (a pidfd watch) or SIGTERM close the node
(kill its workers and fork server, remove its segments and spill files) and end this
process.
"""
from __future__ import annotations

import asyncio
import json
import os
import shutil
import signal
import socket
import sys
import time
from collections.abc import Callable
from typing import Any

from .._ids import machine_id
from .._platform.procutil import watch_parent, watch_pid
from .._protocol import pb
from .._protocol import wire as _wire
from .node import Node, NodeHost, node_from_cfg
from .worker_pool import ZygoteStart

# The head answers ObjStoreDebugInfo from the figures last sent; a spill or the warm
# reserve changes them off the command path, and is sent within this long.
_INFO_S = 0.1
# As the head's is_idle(): no command for this long. The head says the cluster went
# idle within _remote_node._IDLE_CHECK_S of its own is_idle(), which waits as long.
_QUIET_S = 0.3
# A joining node says it joined once its first worker connected, or after this long.
_READY_WAIT_S = 5.0


def command(node: Node, cmd: pb.NodeCommand, token: str = "") -> bool:
    """Carry out one NodeCommand on ``node``; False for close. ``token``: the
    cluster's, for pulls from other nodes' data servers."""
    which = cmd.WhichOneof("command")
    if which == "seal_object":
        node.seal(cmd.seal_object.segment.name, cmd.seal_object.object_id,
                  cmd.seal_object.segment.size)
    elif which == "seal":
        node.seal(cmd.seal, b"", 0)
    elif which == "pin":
        node.pin(cmd.pin.conn_id, cmd.pin.names)
    elif which == "unpin":
        node.unpin(cmd.unpin.conn_id, cmd.unpin.names)
    elif which == "free_segment":
        node.free_segment(cmd.free_segment)
    elif which == "create_segment":
        node.create_segment(cmd.create_segment.conn_id, cmd.create_segment.request)
    elif which == "abort_segment":
        node.abort_segment(cmd.abort_segment.conn_id, cmd.abort_segment.names[0])
    elif which == "drop_conn":
        node.drop_conn(cmd.drop_conn)
    elif which == "start_worker":
        node.start_worker(cmd.start_worker)
    elif which == "kill_worker":
        node.kill_worker(cmd.kill_worker.worker_id, cmd.kill_worker.reason)
    elif which == "stop_worker":
        node.stop_worker(cmd.stop_worker)
    elif which == "worker_connected":
        node.worker_connected(cmd.worker_connected)
    elif which == "worker_disconnected":
        node.worker_disconnected(cmd.worker_disconnected)
    elif which == "set_driver":
        node.set_driver(cmd.set_driver)
    elif which == "pull":
        p = cmd.pull
        node.pull(p.object_id, p.address, p.key, p.size, token)
    elif which == "close":
        return False
    return True


class NodeProcess(asyncio.Protocol):
    """The connection to the head, and the NodeHost of the node it carries."""

    def __init__(self, loop: asyncio.AbstractEventLoop, cfg: dict[str, Any],
                 make_node: Callable[[NodeHost], Node], join: bool = False,
                 kept: Node | None = None) -> None:
        self.loop = loop
        self.cfg = cfg
        self.token = str(cfg.get("token", ""))
        self.make_node = make_node
        # A node joining a cluster over TCP gets its id from the head (welcome) first;
        # a node the head launched knows it from its command line.
        self.join = join
        self.node: Node = None if join else make_node(self)  # type: ignore[assignment]
        self.last_heard = time.monotonic()
        self.timeout_s = 10.0
        self._joined: dict[str, Any] | None = None   # node.json, until it is written
        self.transport: Any = None
        self.decoder = _wire.FrameDecoder()
        self.wbuf: list[bytes] = []
        self._flush_due = False
        self._cluster_idle = False
        self._last_command = time.monotonic()
        self._figures: tuple[int, ...] = ()
        self.done: asyncio.Future[None] = loop.create_future()
        # A joined node that lost the head (its connection closed or went silent, with
        # no close command): it may join the head again (join_main).
        self.lost_head = False
        # A joined node that may join again keeps its workers and store when it loses
        # the head: a worker serving a detached actor, or running a task, waits for the
        # head too, and the node joining again asks for its id of before (NodeJoin.node_id)
        # and takes them over (Node.take_workers). ``kept``: that node, closed.
        self.keep_workers = join and float(cfg.get("reconnect_timeout_s", 0.0)) > 0
        self.kept = kept

    # ------------------------------------------------------------------ connection
    def connection_made(self, transport: Any) -> None:
        self.transport = transport
        if self.join:
            res = {k: float(v) for k, v in self.cfg["resources"].items()}
            self._event(pb.NodeEvent(join=pb.NodeJoin(
                resources=res, machine=machine_id(), host=self.cfg.get("host", "127.0.0.1"),
                pid=os.getpid(), num_workers=int(self.cfg.get("num_workers", 0)),
                node_id=self.kept.node_id if self.kept is not None else 0)))
            return
        node = self.node
        res = {k: float(v) for k, v in self.cfg["resources"].items()}
        self._event(pb.NodeEvent(register=pb.NodeRegister(
            node_id=node.node_id, resources=res, capacity=node.capacity,
            shm_dir=node.shm_dir, pid=os.getpid())))
        node.start()
        self.loop.call_later(_INFO_S, self._report_store)

    def data_received(self, data: bytes) -> None:
        try:
            frames = self.decoder.feed(data)
        except _wire.ProtocolError as exc:
            print(f"orchestra node: the head sent a bad frame: {exc}", file=sys.stderr)
            self.close()
            return
        self.last_heard = time.monotonic()
        for kind, cmd in frames:
            if kind != _wire.NODE_COMMAND:
                continue
            which = cmd.WhichOneof("command")
            if which == "heartbeat":
                continue
            if which == "welcome":
                self._welcomed(cmd.welcome)
                continue
            node = self.node
            if node is None:
                continue
            if which == "worker_connected" and self._joined is not None:
                self.loop.call_soon(self._say_joined)
            if which == "cluster_idle":
                self._cluster_idle = cmd.cluster_idle
                continue
            if which == "sync":   # after the events of the commands before it
                self._store_changed()
                self._event(pb.NodeEvent(synced=cmd.sync))
                continue
            # Busy at once, before the head's next look says so.
            self._last_command = time.monotonic()
            if not command(node, cmd, self.token):
                self.close()
                return
        # With the replies they caused: a put's bytes are counted in the head's figures
        # (gRPC ObjStoreDebugInfo) before its writer hears where to write them.
        self._store_changed()
        self.flush()

    def connection_lost(self, exc: BaseException | None) -> None:
        self.transport = None
        if self.join and not self.done.done():
            print("orchestra node: lost the head: stopping this node's workers",
                  file=sys.stderr)
            self.lost_head = True
        self.close()

    # ------------------------------------------------------------------ joining over TCP
    def _welcomed(self, w: pb.NodeWelcome) -> None:
        """The head gave this node its id: start the store, the data server and the
        workers' pool, and tell the head what this node is."""
        if self.node is not None:
            return
        cfg = self.cfg
        cfg["session_id"] = w.session_id
        self.timeout_s = w.timeout_s or 10.0
        cfg["_node_id"] = w.node_id
        node = self.node = self.make_node(self)
        self.kept = None   # its workers are this node's now, or killed
        data_address = node.serve_data(cfg.get("host", "127.0.0.1"), cfg.get("token", ""))
        data_address = routable(data_address, self.transport.get_extra_info("sockname"))
        res = {k: float(v) for k, v in cfg["resources"].items()}
        self._event(pb.NodeEvent(register=pb.NodeRegister(
            node_id=node.node_id, resources=res, capacity=node.capacity,
            shm_dir=node.shm_dir, pid=os.getpid(), data_address=data_address,
            node_dir=cfg["session_dir"], machine=machine_id(),
            num_workers=int(cfg.get("num_workers", 0)), kept=node.kept_objects,
            # (those of the node before: a detached actor's, or one that runs a task)
            kept_workers=[wid for wid, p in node.pool.snapshot() if p.poll() is None])))
        node.start()
        self.loop.call_later(_INFO_S, self._report_store)
        self.loop.call_later(w.heartbeat_s or 1.0, self._heartbeat, w.heartbeat_s or 1.0)
        from .._ids import node_hex
        self._joined = {"node_id": w.node_id, "node_hex": node_hex(w.node_id),
                        "head_address": cfg["head_address"], "pid": os.getpid(),
                        "data_address": data_address}
        # Joined once a task can start here at once: its first worker connected (as
        # init() returns), or after _READY_WAIT_S all the same.
        self.loop.call_later(_READY_WAIT_S, self._say_joined)

    def _say_joined(self) -> None:
        """Write node.json (what `orchestra start --address` waits for), once."""
        info, self._joined = self._joined, None
        if info is None or self.done.done():
            return
        path = os.path.join(self.cfg["session_dir"], "node.json")
        with open(path + ".tmp", "w") as f:
            json.dump(info, f)
        os.replace(path + ".tmp", path)
        print(f"orchestra node: joined the cluster at {info['head_address']} as node "
              f"{info['node_id']}", file=sys.stderr)

    def _heartbeat(self, every: float) -> None:
        if self.transport is None or self.done.done():
            return
        if time.monotonic() - self.last_heard > self.timeout_s:
            print(f"orchestra node: the head said nothing for {self.timeout_s:g} s: "
                  "stopping this node's workers", file=sys.stderr)
            self.lost_head = True
            self.close()
            return
        self._event(pb.NodeEvent(heartbeat=True))
        self.loop.call_later(every, self._heartbeat, every)

    def close(self) -> None:
        """Kill the workers and remove the segments (both kept when the head was lost
        and they may outlive it), end the process. Ends the join even when closing the
        node fails (the error is logged; the node joins again or stops, never waits)."""
        try:
            if self.node is not None:
                if self.lost_head and self.keep_workers:
                    self.kept = self.node
                    self.node.close(kill_workers=False, keep_store=True)
                else:
                    self.node.close()
        finally:
            if self.transport is not None:
                self.transport.abort()
                self.transport = None
            if not self.done.done():
                self.done.set_result(None)

    # ------------------------------------------------------------------ NodeHost
    def _event(self, ev: pb.NodeEvent) -> None:
        self.wbuf.append(_wire.encode(_wire.NODE_EVENT, ev))
        if not self._flush_due:
            self._flush_due = True
            self.loop.call_soon(self.flush)

    def send(self, conn_id: int, kind: int, msg: Any) -> None:
        self._event(pb.NodeEvent(send=pb.NodeSend(
            conn_id=conn_id, kind=kind, body=msg.SerializeToString())))

    def flush(self) -> None:
        self._flush_due = False
        if self.wbuf and self.transport is not None:
            self.transport.write(b"".join(self.wbuf))
        self.wbuf = []

    def worker_failed_to_start(self, worker_id: int, reason: str) -> None:
        self._event(pb.NodeEvent(worker_failed_to_start=pb.NodeWorkerExit(
            worker_id=worker_id, reason=reason)))

    def worker_exited(self, worker_id: int, reason: str, *, connected: bool) -> None:
        self._event(pb.NodeEvent(worker_exited=pb.NodeWorkerExit(
            worker_id=worker_id, reason=reason, connected=connected)))

    def memory_pressure(self, node_id: int, pressure: pb.NodeMemoryPressure) -> None:
        self._event(pb.NodeEvent(memory_pressure=pressure))

    def relocate(self, object_id: bytes, segment: pb.Segment) -> bool:
        self._event(pb.NodeEvent(relocate=pb.NodeRelocate(object_id=object_id,
                                                          segment=segment)))
        return True

    def pulled(self, object_id: bytes, segment: pb.Segment | None, error: str) -> None:
        ev = pb.NodePulled(object_id=object_id, error=error)
        if segment is not None:
            ev.segment.CopyFrom(segment)
        self._event(pb.NodeEvent(pulled=ev))

    def is_idle(self) -> bool:
        """Asked from threads: two reads of plain attributes."""
        return self._cluster_idle and time.monotonic() - self._last_command > _QUIET_S

    def _store_changed(self) -> None:
        """Send the store's figures if they changed (a tuple compare when not)."""
        s = self.node.store
        figures = (s.used, s.pooled, s.spilled_bytes, len(s.files))
        if figures != self._figures:
            self._figures = figures
            self._event(pb.NodeEvent(store_info=self.node.store_info()))

    def _report_store(self) -> None:
        """What the node's threads changed (a spill, the warm reserve) is sent here."""
        if self.node is None or self.node.closed:
            return
        self._store_changed()
        self.loop.call_later(_INFO_S, self._report_store)


async def _run(loop: asyncio.AbstractEventLoop, cfg: dict[str, Any], node_sock: str, node_id: int,
               zygote: ZygoteStart | None) -> None:
    proto = NodeProcess(loop, cfg, lambda host: node_from_cfg(node_id, host, loop, cfg, zygote))
    for sig in (signal.SIGTERM, signal.SIGHUP):
        loop.add_signal_handler(sig, proto.close)
    # The head's connection closing is the usual sign it is gone; this covers a head
    # that dies before the node connected.
    watch_parent(loop, proto.close)
    if cfg.get("owner_pid"):   # a cluster_utils.Cluster's: it lives as long as its script
        watch_pid(loop, int(cfg["owner_pid"]), proto.close)
    try:
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        sock.connect(node_sock)
        await loop.create_unix_connection(lambda: proto, sock=sock)
    except OSError as exc:
        print(f"orchestra node: cannot reach the head at {node_sock}: {exc}", file=sys.stderr)
        proto.close()
        raise
    await proto.done


def routable(address: str, sockname: tuple[str, int] | str | None) -> str:
    """``address`` (HOST:PORT of a listener), with a wildcard host (0.0.0.0, ::) replaced
    by ``sockname``'s: this machine's address on the route to the head, which other
    nodes reach too."""
    host, _, port = address.rpartition(":")
    if host.strip("[]") in ("0.0.0.0", "::", "") and sockname:
        ip = sockname[0]
        return f"[{ip}]:{port}" if ":" in ip else f"{ip}:{port}"
    return address


def _start_zygote(head_address: str) -> ZygoteStart | None:
    """The fork server of a joining node (_platform/bootstrap.py starts the others')."""
    import subprocess
    req_r, req_w = os.pipe()
    rep_r, rep_w = os.pipe()
    try:
        proc = subprocess.Popen(
            [sys.executable, "-m", "orchestra._worker.zygote", head_address, str(req_r), str(rep_w)],
            stdin=subprocess.DEVNULL, pass_fds=(req_r, rep_w))
    except OSError:
        proc = None
    os.close(req_r)
    os.close(rep_w)
    return (proc, req_w, rep_r) if proc is not None else None


class _Stopped:
    """A stop signal came (SIGTERM, SIGHUP, SIGINT): no joining again."""

    def __init__(self) -> None:
        self.asked = False
        self.proto: NodeProcess | None = None

    def __call__(self) -> None:
        self.asked = True
        if self.proto is not None:
            self.proto.close()


async def _run_joined(loop: asyncio.AbstractEventLoop, cfg: dict[str, Any],
                      zygote: Callable[[], ZygoteStart | None], stopped: _Stopped,
                      quiet: bool = False, kept: Node | None = None) -> tuple[bool, Node | None]:
    """Join the head at cfg head_address and serve until the node ends: (whether it
    ended because it lost the head, the node whose workers it kept then). ``kept``:
    the node of before, whose workers this one takes over if it gets the same id.
    OSError when the head cannot be reached or refuses (an AuthenticationError; said
    unless ``quiet``: tries while the head is away)."""
    from .._protocol import auth, tls
    from .._protocol.auth import client_handshake
    from .._protocol.connection import parse_address, refuse_self_connect
    def make_node(host: NodeHost) -> Node:
        node_id = int(cfg["_node_id"])
        if kept is not None and kept.node_id == node_id:
            # Its workers and store (with the objects it kept) are this one's.
            node = node_from_cfg(node_id, host, loop, cfg, store=kept.store)
            node.take_workers(kept)
            return node
        if kept is not None:   # another id: its workers and objects cannot be taken back
            kept.end_kept()
        return node_from_cfg(node_id, host, loop, cfg, zygote())
    proto = NodeProcess(loop, cfg, make_node, join=True, kept=kept)
    address = cfg["head_address"]
    family, target = parse_address(address)
    sock = socket.socket(family, socket.SOCK_STREAM)
    token = cfg.get("token", "")
    try:
        sock.settimeout(10)
        sock.connect(target)
        refuse_self_connect(sock)
        if not tls.enabled(token):
            try:
                client_handshake(sock, token, peer=address)
            except auth.NoHello:   # the head speaks TLS: its token is this one, marked
                sock.close()
                sock = socket.socket(family, socket.SOCK_STREAM)
                sock.settimeout(10)
                sock.connect(target)
                token = cfg["token"] = tls.tls_token(token)
                os.environ["ORCHESTRA_TOKEN"] = proto.token = token   # its workers' too
        sock.setblocking(False)
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        stopped.proto = proto
        if tls.enabled(token):   # TLS, then the token inside it (asyncio's own TLS)
            await auth.join_async(loop, sock, token, address, proto)
        else:
            await loop.create_connection(lambda: proto, sock=sock)
    except OSError as exc:   # AuthenticationError too
        sock.close()
        if not quiet and not isinstance(exc, auth.HandshakeCut):   # (tried again)
            print(f"orchestra node: cannot join the cluster at {address}: {exc}",
                  file=sys.stderr)
        proto.close()
        raise
    await proto.done
    if stopped.asked and proto.kept is not None:
        proto.kept.end_kept()
        proto.kept = None
    return proto.lost_head and not stopped.asked, proto.kept


# Between two tries to join a head that is away (its supervisor starts it again).
_REJOIN_PAUSE_S = 0.2
# How long a node tries to join a head that keeps cutting its handshake off (too many at
# once there: auth.MAX_UNAUTHENTICATED) before it gives up.
_JOIN_CUT_S = 60.0


def _join_until_stopped(loop: asyncio.AbstractEventLoop, cfg: dict[str, Any],
                        zygote: Callable[[], ZygoteStart | None]) -> None:
    """Join, and join again each time the head is lost, for up to cfg
    reconnect_timeout_s after each loss (0: stop at the first); each time asking for its
    id of before, which keeps the workers of its detached actors and the objects of its
    store (else they go). SystemExit(3) when the first join fails or the head stays
    away too long."""
    from .._protocol.auth import AuthenticationError, HandshakeCut, cut_pause
    stopped = _Stopped()
    for sig in (signal.SIGTERM, signal.SIGHUP, signal.SIGINT):
        loop.add_signal_handler(sig, stopped)
    wait_s = float(cfg.get("reconnect_timeout_s", 0.0))
    away_since = 0.0   # 0: never joined, or joined now
    cut_since, cuts = 0.0, 0   # the first of the joins in a row the head cut off, how many
    kept: Node | None = None   # lost the head: its workers, until it joins again
    try:
        while not stopped.asked:
            try:
                lost, kept = loop.run_until_complete(_run_joined(
                    loop, cfg, zygote, stopped, quiet=bool(away_since), kept=kept))
            except HandshakeCut as exc:
                # Cut off among more handshakes than the head takes at once (many nodes
                # and workers starting together): again, spread out, for a while.
                cut_since = cut_since or time.monotonic()
                cuts += 1
                if time.monotonic() - cut_since > _JOIN_CUT_S:
                    print(f"orchestra node: cannot join the cluster at {cfg['head_address']}: "
                          f"{exc}", file=sys.stderr, flush=True)
                    raise SystemExit(3) from None
                loop.run_until_complete(asyncio.sleep(cut_pause(cuts)))
                continue
            except AuthenticationError:
                raise SystemExit(3) from None
            except OSError:
                if not away_since or time.monotonic() - away_since > wait_s:
                    if away_since:
                        print(f"orchestra node: the head stayed away for more than {wait_s:g} s "
                              "(reconnect_timeout_s): stopping", file=sys.stderr, flush=True)
                    raise SystemExit(3) from None
                loop.run_until_complete(asyncio.sleep(_REJOIN_PAUSE_S))
                continue
            cut_since, cuts = 0.0, 0
            if not lost or wait_s <= 0:
                return
            away_since = time.monotonic()
            print(f"orchestra node: joining the head again for up to {wait_s:g} s (its "
                  "objects and the workers of detached actors wait)", file=sys.stderr, flush=True)
            loop.run_until_complete(asyncio.sleep(_REJOIN_PAUSE_S))
    finally:
        if kept is not None:   # it never joined again: nothing waits for them
            kept.end_kept()


def join_main(cfg_path: str) -> None:
    """``python -m orchestra._node_process --join CFG``: a node of another machine
    joins the cluster at cfg head_address (orchestra start --address)."""
    with open(cfg_path) as f:
        cfg = json.load(f)
    from .._platform.proctitle import set_title
    set_title("orchestra::node")
    os.umask(0o077)
    session_dir = cfg["session_dir"]
    os.makedirs(session_dir, mode=0o700, exist_ok=True)
    cfg.setdefault("spill_dir", os.path.join(session_dir, "spill"))
    cfg.setdefault("sys_path", [p for p in sys.path if p])
    cfg.setdefault("session_id", "")
    # Its workers connect to the head over TCP too, with the same token.
    os.environ["ORCHESTRA_TOKEN"] = cfg.get("token", "")
    # A worker of a detached actor waits this long for a head that is lost (_worker/rejoin.py).
    os.environ["ORCHESTRA_RECONNECT_S"] = str(float(cfg.get("reconnect_timeout_s", 0.0)))
    # The first node's fork server starts now, warm by the time its workers start; a
    # node joined again gets its own (a closed node stops its fork server).
    first = [_start_zygote(cfg["head_address"])] if cfg.get("zygote", True) else []

    def zygote() -> ZygoteStart | None:
        if first:
            return first.pop()
        return _start_zygote(cfg["head_address"]) if cfg.get("zygote", True) else None
    import uvloop
    loop = uvloop.new_event_loop()
    asyncio.set_event_loop(loop)
    try:
        _join_until_stopped(loop, cfg, zygote)
    finally:
        # Its whole directory: nobody else removes it when the node ends by itself (a
        # SIGTERM sent here, its cluster_utils script gone); orchestra stop does too.
        shutil.rmtree(session_dir, ignore_errors=True)
        loop.close()


def main(argv: list[str] | None = None, zygote: ZygoteStart | None = None) -> None:
    argv = sys.argv[1:] if argv is None else argv
    if argv and argv[0] == "--join":
        join_main(argv[1])
        return
    cfg_path, node_sock, node_id = argv[0], argv[2], int(argv[3])
    from .._platform.proctitle import set_title
    set_title("orchestra::node")
    with open(cfg_path) as f:
        cfg = json.load(f)
    # Segments and sockets for this user only, as in the head.
    os.umask(0o077)
    signal.signal(signal.SIGINT, signal.SIG_IGN)   # Ctrl-C belongs to the driver
    import uvloop
    loop = uvloop.new_event_loop()
    asyncio.set_event_loop(loop)
    try:
        loop.run_until_complete(_run(loop, cfg, node_sock, node_id, zygote))
    except OSError:
        raise SystemExit(1) from None
    finally:
        loop.close()


if __name__ == "__main__":
    main()
