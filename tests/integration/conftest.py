"""Fixtures of the integration tests that need more than one machine's worth of set-up.

``state``: a state directory of the test's own for the ``orchestra`` command it runs
(_cli.py), stopped at teardown.

``netns_cluster``: a head and two nodes, each node on a host of its own (_netns.py: a
network namespace, and a mount namespace with private /dev/shm and /tmp), started and
joined with ``orchestra start ... --block`` as on real machines. Skips (with the
reason) without root, ``ip`` or ``unshare``. Everything is removed at teardown, even
when the set-up fails half-way.
"""
from __future__ import annotations

import json
import os
import sys
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from _cli import cli
from _netns import Hosts, skip_reason
from _redis import RedisServer
from _redis import skip_reason as redis_skip_reason
from orchestra._runtime import cluster_file as cf


@pytest.fixture
def redis_server(tmp_path: Path) -> Iterator[RedisServer]:
    """A redis-server of the test's own on a free loopback port (skips without one)."""
    reason = redis_skip_reason()
    if reason:
        pytest.skip(reason)
    server = RedisServer(tmp_path / "redis")
    server.start()
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture
def state(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    """A state directory of the test's own (for the CLI it runs and for this process's
    init(address="auto")); whatever is recorded there is stopped at teardown."""
    path = str(tmp_path / "state")
    monkeypatch.setenv(cf.STATE_DIR_ENV, path)
    monkeypatch.delenv("ORCHESTRA_ADDRESS", raising=False)
    monkeypatch.delenv("ORCHESTRA_TOKEN", raising=False)
    yield path
    cli("stop", "--timeout", "5")


PORT = 6380   # inside the head's namespace: no other cluster can hold it
# Each node's store: 128 MiB, or ORCHESTRA_NETNS_STORE_MIB (bench_netns.py moves 200 MiB).
NODE_ARGS = ["--num-cpus", "1", "--object-store-memory",
             str(int(os.environ.get("ORCHESTRA_NETNS_STORE_MIB", "128")) << 20)]


@dataclass
class NetnsCluster:
    """What a test needs: the head's address and token, the id of the node beside the
    head on its host (which runs that host's work), the joined nodes' ids (hex, in host
    order h1, h2) and the hosts, to run a driver on the head's host."""
    hosts: Hosts
    address: str
    token: str
    beside: str = ""
    node_ids: list[str] = field(default_factory=list)
    node_pids: list[int] = field(default_factory=list)   # in the node hosts' namespaces

    def driver(self, code: str, timeout: float = 60) -> object:
        """Run ``code`` in a driver on the head's host (connected with init() by
        address and token); what it prints last, as JSON, is returned."""
        prelude = ("import json, os, orchestra\n"
                   "orchestra.init(address=os.environ['ORCHESTRA_ADDRESS'])\n")
        r = self.hosts.run(0, [sys.executable, "-c", prelude + code], timeout=timeout,
                           env=self.hosts.env(ORCHESTRA_ADDRESS=self.address,
                                              ORCHESTRA_TOKEN=self.token))
        if r.returncode != 0:
            raise AssertionError(f"the driver failed (code {r.returncode}):\n{r.stdout}\n{r.stderr}")
        return json.loads(r.stdout.strip().splitlines()[-1])


@pytest.fixture(scope="module")
def netns_cluster() -> Iterator[NetnsCluster]:
    reason = skip_reason()
    if reason:
        pytest.skip(reason)
    hosts = Hosts(3)
    try:
        hosts.setup()
        token = "netns-test-token"
        head_ip = hosts.ip(0)
        state = os.path.join(hosts.tmp, "state")
        head = hosts.spawn(
            0, [sys.executable, "-m", "orchestra._cli", "start", "--head", "--host", head_ip,
                "--port", str(PORT), "--token", token, "--block", *NODE_ARGS,
                # bench_netns.py's figures without TLS, to compare: ORCHESTRA_NETNS_TLS=0
                *(["--insecure-no-tls"] if os.environ.get("ORCHESTRA_NETNS_TLS") == "0" else [])],
            private_mounts=False, log="head.log", env=hosts.env(ORCHESTRA_STATE_DIR=state))
        # Beyond loopback the cluster speaks TLS: its token is the one the head prints.
        token = hosts.wait_output(head, "head.log", r"--token (\S+)", timeout=60).group(1)
        beside = hosts.wait_output(head, "head.log", r"run on node ([0-9a-f]{16})",
                                   timeout=60).group(1)
        cluster = NetnsCluster(hosts, f"{head_ip}:{PORT}", token, beside)
        for i in (1, 2):
            node = hosts.spawn(
                i, [sys.executable, "-m", "orchestra._cli", "start", "--address",
                    cluster.address, "--block", "--resources", json.dumps({f"host{i}": 1}),
                    *NODE_ARGS],
                private_mounts=True, log=f"node{i}.log", env=hosts.env(ORCHESTRA_TOKEN=token))
            m = hosts.wait_output(node, f"node{i}.log", r"node ([0-9a-f]{16}) .*joined",
                                  timeout=60)
            cluster.node_ids.append(m.group(1))
            cluster.node_pids.append(node.pid)
        yield cluster
    finally:
        hosts.teardown()
