"""Simulated nodes against a real head: how the head holds up at 100 to 1,000 nodes.

    python tools/sim_nodes.py [--nodes 100,200,500,1000] [--workers 2] [--tasks 20000]
                              [--idle-s 5] [--processes 1] [--json FILE]

For each node count N: a real head (orchestra.cluster_utils.Cluster, no CPU of its own,
TLS and the token as on a real cluster) and N nodes that speak the node protocol
(_node/process.py's side of it) without a store or a worker process: each node joins
over TCP (TLS, then the token), registers W CPUs, answers the head's heartbeats with
its own, and for each worker the head asks it to start opens that worker's connection
(a Hello as a worker's), which answers every Execute at once with a TaskDone holding
None. So one machine holds hundreds of them; the head does all it does for real nodes
(join, register, heartbeats, placement, frames, TLS), the nodes nothing but answer.

    join     N nodes join at once; until every node and worker is in the
             head's resources ........................... seconds, head RSS after
    idle     the head with N nodes and nothing to do for --idle-s: its CPU (heartbeats
             in and out), and how late its heartbeats reach the nodes (the largest gap
             between two, less the head's period) ................ CPU %, lag (ms)
    tasks    a driver submits T no-op tasks and gets them (each placed on a simulated
             worker and answered there): tasks/s, the head's CPU while they run, the
             heartbeat lag meanwhile, head RSS after

The simulated nodes run in --processes processes of their own (asyncio, one loop each),
the driver in this one, the head in its own: on a small machine the three share its
cores, so the figures are the head's under that load, a floor. Numbers only: nothing
here asserts a speed. The scheduler's core alone, without sockets: tools/sim_core.py.
"""
from __future__ import annotations

import argparse
import asyncio
import json
import os
import socket
import subprocess
import sys
import time
from typing import Any

if __name__ == "__main__" and "--serve" not in sys.argv:
    # run by path from a checkout: the package beside it (a process of simulated nodes
    # imports the orchestra its parent did: Sims sets its PYTHONPATH)
    sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

from orchestra import _ids  # noqa: E402
from orchestra._objects.serialization import serialize  # noqa: E402
from orchestra._protocol import auth, pb, tls  # noqa: E402
from orchestra._protocol import wire as _wire  # noqa: E402
from orchestra._protocol.connection import parse_address  # noqa: E402

_NONE = serialize(None).to_bytes()   # every task's answer: None, inline


# ------------------------------------------------------------------ the simulated side
class Stats:
    """What the simulated nodes of one process saw (reported as JSON on request)."""

    def __init__(self) -> None:
        self.gaps: list[float] = []       # between two heartbeats of the head, per node
        self.executed = 0
        self.registered = 0
        self.workers = 0
        self.lost = 0
        self.cut = 0                      # handshakes the head cut off (tried again)


class SimWorker(asyncio.Protocol):
    """One worker's connection: a Hello, then every Execute answered with None."""

    def __init__(self, node: SimNode, worker_id: int) -> None:
        self.node, self.worker_id = node, worker_id
        self.decoder = _wire.FrameDecoder()
        self.transport: Any = None

    def connection_made(self, transport: Any) -> None:
        self.transport = transport
        transport.write(_wire.encode(_wire.HELLO, pb.Hello(
            kind="worker", pid=os.getpid(), workerid=self.worker_id,
            node_id=self.node.node_id, machine=self.node.machine)))
        self.node.stats.workers += 1

    def data_received(self, data: bytes) -> None:
        out = []
        for kind, msg in self.decoder.feed(data):
            if kind in (_wire.EXECUTE, _wire.EXECUTE_NESTED):
                call = msg.invoke.call
                done = pb.TaskDone(task_id=call.task_id)
                for i in range(max(call.num_returns, 1)):
                    done.returns.add(object_id=_ids.object_id(call.task_id, i), inline=_NONE)
                out.append(_wire.encode(_wire.TASK_DONE, done))
                self.node.stats.executed += 1
        if out:
            self.transport.write(b"".join(out))

    def connection_lost(self, exc: BaseException | None) -> None:
        self.transport = None
        self.node.stats.workers -= 1


class SimNode(asyncio.Protocol):
    """A node's connection: join, register, heartbeats, workers started on command."""

    def __init__(self, index: int, loop: asyncio.AbstractEventLoop, address: str, token: str,
                 cpus: int, stats: Stats) -> None:
        self.loop, self.address, self.token, self.cpus = loop, address, token, cpus
        self.machine = f"simulated-{os.getpid()}-{index}"
        self.stats = stats
        self.node_id = 0
        self.decoder = _wire.FrameDecoder()
        self.transport: Any = None
        self.workers: dict[int, SimWorker] = {}
        self.last_beat = 0.0
        self.period = 1.0

    def _event(self, ev: pb.NodeEvent) -> None:
        if self.transport is not None:
            self.transport.write(_wire.encode(_wire.NODE_EVENT, ev))

    def connection_made(self, transport: Any) -> None:
        self.transport = transport
        self._event(pb.NodeEvent(join=pb.NodeJoin(
            resources={"CPU": float(self.cpus)}, machine=self.machine, host="127.0.0.1",
            pid=os.getpid(), num_workers=self.cpus)))

    def data_received(self, data: bytes) -> None:
        for kind, cmd in self.decoder.feed(data):
            if kind != _wire.NODE_COMMAND:
                continue
            which = cmd.WhichOneof("command")
            if which == "heartbeat":
                now = time.monotonic()
                if self.last_beat:
                    self.stats.gaps.append(now - self.last_beat - self.period)
                self.last_beat = now
            elif which == "welcome":
                w = cmd.welcome
                self.node_id, self.period = w.node_id, w.heartbeat_s or 1.0
                self._event(pb.NodeEvent(register=pb.NodeRegister(
                    node_id=w.node_id, resources={"CPU": float(self.cpus)}, capacity=1 << 30,
                    shm_dir="/nonexistent", pid=os.getpid(), data_address="127.0.0.1:9",
                    node_dir="/nonexistent", machine=self.machine, num_workers=self.cpus)))
                self.stats.registered += 1
                self.loop.call_later(self.period, self._heartbeat)
            elif which == "start_worker":
                self.loop.create_task(self._start_worker(cmd.start_worker))
            elif which in ("kill_worker", "stop_worker"):
                wid = cmd.kill_worker.worker_id if which == "kill_worker" else cmd.stop_worker
                w = self.workers.pop(wid, None)
                if w is not None and w.transport is not None:
                    w.transport.close()
                self._event(pb.NodeEvent(worker_exited=pb.NodeWorkerExit(
                    worker_id=wid, reason="stopped", connected=w is not None)))
            elif which == "sync":
                self._event(pb.NodeEvent(synced=cmd.sync))
            elif which == "close":
                self.transport.close()

    def _heartbeat(self) -> None:
        if self.transport is not None:
            self._event(pb.NodeEvent(heartbeat=True))
            self.loop.call_later(self.period, self._heartbeat)

    async def _start_worker(self, worker_id: int) -> None:
        worker = SimWorker(self, worker_id)
        try:
            await connect(self.loop, self.address, self.token, worker, self.stats)
        except OSError as exc:
            self._event(pb.NodeEvent(worker_failed_to_start=pb.NodeWorkerExit(
                worker_id=worker_id, reason=str(exc))))
            return
        self.workers[worker_id] = worker

    def connection_lost(self, exc: BaseException | None) -> None:
        self.transport = None
        self.stats.lost += 1
        for w in self.workers.values():
            if w.transport is not None:
                w.transport.close()


async def connect(loop: asyncio.AbstractEventLoop, address: str, token: str,
                  proto: asyncio.Protocol, stats: Stats) -> str:
    """connect_once, tried again when the head cuts the handshake off (as a node's join
    and a worker's connection do: too many handshakes at once there), counted."""
    cuts = 0
    while True:
        try:
            return await connect_once(loop, address, token, proto)
        except auth.HandshakeCut:
            stats.cut += 1
            cuts += 1
            await asyncio.sleep(auth.cut_pause(cuts))


async def connect_once(loop: asyncio.AbstractEventLoop, address: str, token: str,
                       proto: asyncio.Protocol) -> str:
    """As a joining node connects (_node/process.py): TCP, then TLS with the cluster's
    key and the token inside it, or the token's handshake where the head speaks no TLS.
    Returns the token that worked (a head speaking TLS marks it: tls.tls_token)."""
    family, target = parse_address(address)
    sock = socket.socket(family, socket.SOCK_STREAM)
    try:
        if not tls.enabled(token):
            sock.settimeout(60)
            await loop.run_in_executor(None, sock.connect, target)
            try:
                await loop.run_in_executor(None, lambda: auth.client_handshake(
                    sock, token, peer=address))
            except auth.NoHello:   # the head speaks TLS
                sock.close()
                return await connect_once(loop, address, tls.tls_token(token), proto)
            sock.setblocking(False)
            await loop.create_connection(lambda: proto, sock=sock)
            return token
        sock.setblocking(False)
        await loop.sock_connect(sock, target)
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        await auth.join_async(loop, sock, token, address, proto, timeout_s=60.0)
        return token
    except BaseException:
        sock.close()
        raise


async def serve(first: int, count: int, address: str, token: str, cpus: int) -> None:
    """``count`` simulated nodes; stdin's lines ask for the stats (one JSON line back)."""
    loop = asyncio.get_running_loop()
    stats = Stats()
    nodes = [SimNode(first + i, loop, address, token, cpus, stats) for i in range(count)]
    # Nodes joining at once (ORCHESTRA_SIM_JOINING, 64 unless set): past the head's cap
    # on handshakes (_protocol/auth.py MAX_UNAUTHENTICATED) it cuts the oldest off, and
    # they try again, as real nodes and workers do.
    sem = asyncio.Semaphore(int(os.environ.get("ORCHESTRA_SIM_JOINING", "64")))

    async def join(node: SimNode) -> None:
        async with sem:
            node.token = await connect(loop, address, node.token, node, stats)
    if nodes:   # the first learns which token the head takes, the others use it
        await join(nodes[0])
        for n in nodes[1:]:
            n.token = nodes[0].token
    await asyncio.gather(*(join(n) for n in nodes[1:]))
    reader = asyncio.StreamReader()
    await loop.connect_read_pipe(lambda: asyncio.StreamReaderProtocol(reader), sys.stdin)
    while True:
        line = await reader.readline()
        if not line or line.strip() == b"quit":
            break
        gaps, stats.gaps = stats.gaps, []
        t = os.times()
        print(json.dumps({"registered": stats.registered, "workers": stats.workers,
                          "executed": stats.executed, "lost": stats.lost, "cut": stats.cut,
                          "lag_max_ms": 1000 * max(gaps, default=0.0),
                          "lag_p99_ms": 1000 * _pct(gaps, 0.99),
                          "beats": len(gaps), "cpu_s": t.user + t.system}), flush=True)
    for n in nodes:
        if n.transport is not None:
            n.transport.close()


def _pct(xs: list[float], q: float) -> float:
    if not xs:
        return 0.0
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(q * len(xs)))]


# ------------------------------------------------------------------ the driver's side
def _cpu_s(pid: int) -> float:
    """CPU seconds (user + system) of a process so far."""
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _rss_mb(pid: int) -> float:
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    return 0.0


def _package_root() -> str:
    """The directory holding the orchestra this process imported."""
    import orchestra
    return os.path.dirname(os.path.dirname(os.path.abspath(orchestra.__file__)))


class Sims:
    """The processes of simulated nodes."""

    def __init__(self, nodes: int, processes: int, address: str, token: str, cpus: int) -> None:
        per = -(-nodes // processes)
        self.procs = []
        for p in range(processes):
            first, count = p * per, min(per, nodes - p * per)
            if count <= 0:
                break
            self.procs.append(subprocess.Popen(
                [sys.executable, os.path.abspath(__file__), "--serve", str(first), str(count),
                 address, str(cpus)],
                stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
                env={**os.environ, "ORCHESTRA_SIM_TOKEN": token, "PYTHONPATH": _package_root()}))

    def stats(self) -> dict[str, Any]:
        rows = []
        for p in self.procs:
            assert p.stdin is not None and p.stdout is not None
            p.stdin.write("stats\n")
            p.stdin.flush()
        for p in self.procs:
            assert p.stdout is not None
            rows.append(json.loads(p.stdout.readline()))
        total = {k: sum(r[k] for r in rows) for k in ("registered", "workers", "executed",
                                                        "lost", "cut", "beats", "cpu_s")}
        total["lag_max_ms"] = max(r["lag_max_ms"] for r in rows)
        total["lag_p99_ms"] = max(r["lag_p99_ms"] for r in rows)
        return total

    def close(self) -> None:
        for p in self.procs:
            try:
                assert p.stdin is not None
                p.stdin.write("quit\n")
                p.stdin.flush()
            except OSError:
                pass
        for p in self.procs:
            try:
                p.wait(10)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()


def measure(nodes: int, workers: int, tasks: int, idle_s: float, processes: int,
            join_timeout_s: float = 300.0) -> dict[str, Any]:
    import orchestra
    from orchestra.cluster_utils import Cluster

    row: dict[str, Any] = {"nodes": nodes, "workers per node": workers}
    c = Cluster(initialize_head=True, head_node_args={"num_cpus": 0})
    assert c.head_node is not None
    head = c.head_node.pid
    sims = None
    try:
        orchestra.init(address=c.address, token=c.token)
        rss0 = _rss_mb(head)
        t0 = time.monotonic()
        sims = Sims(nodes, processes, c.address, c.token, workers)
        want = nodes * workers
        while orchestra.cluster_resources().get("CPU", 0) < want:
            if time.monotonic() - t0 > join_timeout_s:
                s = sims.stats()
                raise RuntimeError(f"{s['registered']} of {nodes} nodes registered and "
                                   f"{s['workers']} of {want} workers connected after "
                                   f"{join_timeout_s:g} s")
            time.sleep(0.05)
        while sims.stats()["workers"] < want and time.monotonic() - t0 < join_timeout_s:
            time.sleep(0.1)
        row["join (s)"] = time.monotonic() - t0
        row["handshakes cut off in the join (tried again)"] = sims.stats()["cut"]
        time.sleep(2.0)   # the last joins' work done
        row["head RSS before (MB)"] = rss0
        row["head RSS, nodes joined (MB)"] = _rss_mb(head)
        row["head RSS per node (KB)"] = 1024 * (row["head RSS, nodes joined (MB)"] - rss0) / nodes

        sims.stats()   # the gaps so far (the join) are dropped
        cpu0, t0 = _cpu_s(head), time.monotonic()
        time.sleep(idle_s)
        idle = sims.stats()
        row["idle: head CPU (%)"] = 100 * (_cpu_s(head) - cpu0) / (time.monotonic() - t0)
        row["idle: heartbeat lag max (ms)"] = idle["lag_max_ms"]
        row["idle: heartbeats seen"] = idle["beats"]

        @orchestra.remote
        def noop() -> None:
            return None

        orchestra.get([noop.remote() for _ in range(min(1000, tasks))])   # warm
        sims.stats()
        cpu0, sim_cpu0, t0 = _cpu_s(head), sims.stats()["cpu_s"], time.monotonic()
        orchestra.get([noop.remote() for _ in range(tasks)], timeout=600)
        took = time.monotonic() - t0
        busy = sims.stats()
        row["tasks/s"] = tasks / took
        row["tasks: head CPU (%)"] = 100 * (_cpu_s(head) - cpu0) / took
        row["tasks: simulated nodes' CPU (%)"] = 100 * (busy["cpu_s"] - sim_cpu0) / took
        row["tasks: heartbeat lag max (ms)"] = busy["lag_max_ms"]
        row["head RSS after tasks (MB)"] = _rss_mb(head)
        row["tasks answered by simulated workers"] = busy["executed"]   # the warm-up too
        row["nodes lost"] = busy["lost"]
    finally:
        if sims is not None:
            sims.close()
        orchestra.shutdown()
        c.shutdown()
    return row


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if args and args[0] == "--serve":   # a process of simulated nodes
        first, count, address, cpus = int(args[1]), int(args[2]), args[3], int(args[4])
        try:
            import uvloop
            uvloop.install()
        except ImportError:
            pass
        asyncio.run(serve(first, count, address, os.environ["ORCHESTRA_SIM_TOKEN"], cpus))
        return 0
    p = argparse.ArgumentParser(prog="python tools/sim_nodes.py", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--nodes", default="100,200,500,1000",
                   help="node counts, comma-separated (default: 100,200,500,1000)")
    p.add_argument("--workers", type=int, default=2, help="CPUs and workers per node")
    p.add_argument("--tasks", type=int, default=20000, help="no-op tasks per node count")
    p.add_argument("--idle-s", type=float, default=5.0, help="seconds measured idle")
    p.add_argument("--processes", type=int, default=1,
                   help="processes of simulated nodes (default 1)")
    p.add_argument("--json", help="write the rows here (after each node count)")
    ns = p.parse_args(args)
    rows = []
    for n in (int(x) for x in ns.nodes.split(",")):
        row = measure(n, ns.workers, ns.tasks, ns.idle_s, ns.processes)
        rows.append(row)
        print(json.dumps(row), flush=True)
        if ns.json:
            with open(ns.json, "w") as f:
                json.dump(rows, f, indent=1)
    keys = list(rows[0])
    width = max(len(k) for k in keys)
    for k in keys[1:]:
        cells = [f"{r[k]:,.1f}" if isinstance(r[k], float) else f"{r[k]:,}" for r in rows]
        print(f"{k:<{width}}  " + "  ".join(f"{c:>10}" for c in cells))
    return 0


if __name__ == "__main__":
    sys.exit(main())
