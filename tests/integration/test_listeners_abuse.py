"""Every TCP listener of a two-node cluster (the head's port, each node's data server,
each worker's direct-call port) met by peers without the token: random bytes, a huge
length prefix, a handshake trickled a byte at a time, and many silent connections. The
tasks, actor calls and cross-node reads of the cluster keep working meanwhile, and the
listeners still take a real client afterwards.

    peer                              what the listener does
    --------------------------------  ----------------------------------------------
    silent, or a byte a second        closed when its whole handshake is due (5 s),
                                      on a thread or the loop's timer: never in the
                                      poll loop that serves tasks
    more than 32 handshaking at once  the next ones closed at once, unheard
    random bytes / a huge length      refused as not an orchestra client; nothing
                                      decoded, nothing allocated for the length
"""
from __future__ import annotations

import os
import socket
import struct
import threading
import time
from collections.abc import Iterator

import numpy as np
import pytest

import orchestra
from _helpers import joined_cluster
from orchestra._platform.procutil import process_tree

pytestmark = pytest.mark.timeout(120)


def listening_ports(pids: set[int]) -> set[int]:
    """The TCP ports these processes listen on (their own sockets only)."""
    listening: dict[str, int] = {}   # socket inode -> port
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            with open(table) as f:
                next(f)
                for line in f:
                    fields = line.split()
                    if fields[3] == "0A":   # LISTEN
                        listening[fields[9]] = int(fields[1].rsplit(":", 1)[1], 16)
        except FileNotFoundError:
            continue
    ports = set()
    for pid in pids:
        try:
            fds = os.listdir(f"/proc/{pid}/fd")
        except OSError:
            continue
        for fd in fds:
            try:
                target = os.readlink(f"/proc/{pid}/fd/{fd}")
            except OSError:
                continue
            if target.startswith("socket:["):
                port = listening.get(target[8:-1])
                if port is not None:
                    ports.add(port)
    return ports


@orchestra.remote
def make(i: int) -> np.ndarray:
    return np.full(25600, i, dtype=np.int64)   # 200 KiB: in a store


@orchestra.remote
def first(a: np.ndarray) -> int:
    return int(a[0])


@orchestra.remote
class Counter:
    def __init__(self) -> None:
        self.n = 0

    def add(self) -> int:
        self.n += 1
        return self.n


def _abuse(port: int, stop: threading.Event, socks: list[socket.socket]) -> None:
    """Open silent connections, trickle a handshake, send garbage and a huge length."""
    for _ in range(40):   # more than the listener authenticates at once
        try:
            socks.append(socket.create_connection(("127.0.0.1", port), timeout=2))
        except OSError:
            pass
    for payload in (os.urandom(4096), struct.pack("!I", 0xFFFFFFF0) + b"x" * 64):
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=2) as s:
                s.sendall(payload)
        except OSError:
            pass
    try:
        s = socket.create_connection(("127.0.0.1", port), timeout=2)
    except OSError:
        return
    socks.append(s)
    while not stop.is_set():   # a byte a second: never a whole handshake
        try:
            s.sendall(b"O")
        except OSError:
            return
        stop.wait(1.0)


@pytest.fixture(scope="module")
def two_nodes() -> Iterator[tuple]:
    with joined_cluster({"num_cpus": 2}, {"num_cpus": 2, "resources": {"far": 2}}) as nodes:
        yield nodes


def test_peers_without_the_token_stall_no_listener_and_no_task(two_nodes) -> None:
    cluster, far = two_nodes
    # Warm up: the workers' direct-call ports exist once they served a caller.
    c = Counter.options(resources={"far": 1}).remote()
    assert orchestra.get(c.add.remote(), timeout=30) == 1
    assert orchestra.get([first.remote(make.remote(i)) for i in range(4)], timeout=30) == [0, 1, 2, 3]
    pids = process_tree(cluster.head_node.pid) | process_tree(far.pid)
    ports = listening_ports(pids) - {0}
    # The head's port, two data servers, and direct-call ports of workers.
    assert len(ports) >= 4, ports
    stop = threading.Event()
    socks: list[socket.socket] = []
    abusers = [threading.Thread(target=_abuse, args=(p, stop, socks), daemon=True) for p in ports]
    for t in abusers:
        t.start()
    try:
        time.sleep(1.0)   # every listener is full of silent peers
        start = time.monotonic()
        for i in range(30):
            a = make.options(resources={"far": 1}).remote(i)   # made on the joined node
            assert orchestra.get(first.remote(a), timeout=10) == i   # read anywhere at once
            assert orchestra.get(c.add.remote(), timeout=10) == i + 2
        took = time.monotonic() - start
        # Well within one handshake bound (5 s) per round: nothing waited for a peer.
        assert took < 30, f"30 rounds took {took:.1f} s with the listeners abused"
        # A new driver still authenticates on the head's port while it is abused.
        assert orchestra.get(c.add.remote(), timeout=10) == 32
    finally:
        stop.set()
        for s in socks:
            s.close()
        for t in abusers:
            t.join(5)
