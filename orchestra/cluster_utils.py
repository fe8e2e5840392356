"""A cluster of several nodes on one machine, for tests and benchmarks (as Ray's
``ray.cluster_utils.Cluster``).

    c = Cluster(initialize_head=True, head_node_args={"num_cpus": 2})
    n = c.add_node(num_cpus=2, resources={"widget": 1})   # a node process joining it
    orchestra.init(address=c.address, token=c.token)
    ...
    c.remove_node(n)          # SIGTERM (or allow_graceful=False: SIGKILL)
    c.shutdown()              # every process, directory and segment gone

It uses the launch functions of ``orchestra start`` (_cluster/launch.py) with a state directory
of its own, so it neither sees nor touches what ``orchestra start`` recorded, and its
head listens on a free port of 127.0.0.1 (never 6380, the default of a real cluster).
Every node shares this machine's network and /dev/shm; each has its own store, fork
server and workers, as on a machine of its own. The head and the nodes live as long as
the process that made the Cluster: a script that dies before shutdown() leaves nothing
running (they watch its pid).
"""
from __future__ import annotations

import os
import shutil
import tempfile
from typing import Any

from ._cluster import launch as _launch
from ._cluster.launch import Started
from ._ids import node_hex
from ._runtime import cluster_file as cf

__all__ = ["Cluster", "NodeHandle"]


class NodeHandle:
    """A node of a Cluster: ``node_id`` (hex, as nodes() and get_node_id() say), ``pid``
    (its process), ``session_dir``."""

    def __init__(self, started: Started) -> None:
        self._started = started

    @property
    def node_id(self) -> str:
        return self._started.node_hex

    @property
    def pid(self) -> int:
        return self._started.pid

    @property
    def session_dir(self) -> str:
        return self._started.session_dir

    @property
    def is_head(self) -> bool:
        return self._started.kind == "head"

    def alive(self) -> bool:
        proc = self._started.proc
        return proc is not None and proc.poll() is None

    def __repr__(self) -> str:
        kind = "head" if self.is_head else "node"
        return f"NodeHandle({kind} {self.node_id}, pid={self.pid})"


class Cluster:
    """A head and nodes on this machine; ``address`` and ``token`` connect a driver."""

    def __init__(self, initialize_head: bool = False,
                 head_node_args: dict[str, Any] | None = None, *, token: str | None = None,
                 host: str = _launch.DEFAULT_HOST, tls: bool | None = None) -> None:
        # (init(address=c.address) finds the token here: cluster_file.token_for)
        self._state = tempfile.mkdtemp(prefix=cf.CLUSTER_PREFIX)
        self._host = host
        self._token = token
        self._tls = tls   # start_head's: None = TLS when host is not loopback
        self.head_node: NodeHandle | None = None
        self._nodes: list[NodeHandle] = []
        if initialize_head:
            self.add_node(**(head_node_args or {}))

    @property
    def address(self) -> str:
        """The head's IP:PORT (for init(address=...) and add_node)."""
        if self.head_node is None:
            raise RuntimeError("the cluster has no head yet: add_node() starts it first")
        return self.head_node._started.address

    @property
    def token(self) -> str:
        if self.head_node is None:
            raise RuntimeError("the cluster has no head yet: add_node() starts it first")
        return self.head_node._started.token

    def add_node(self, *, num_cpus: int | None = None, num_gpus: int | None = None,
                 resources: dict[str, float] | None = None,
                 object_store_memory: int | None = None, **system_config: Any) -> NodeHandle:
        """Start the head (the first call) or a node joining it; return once it is ready.
        Keywords other than the resources go to the head's cfg (e.g. grpc=False)."""
        if self.head_node is None:
            started = _launch.start_head(
                self._state, host=self._host, port=0, token=self._token, num_cpus=num_cpus,
                num_gpus=num_gpus, resources=resources,
                object_store_memory=object_store_memory, system_config=system_config or None,
                owner_pid=os.getpid(), tls=self._tls)
            started.node_hex = node_hex(0)   # the head's own node
            self.head_node = NodeHandle(started)
            return self.head_node
        if system_config:
            raise TypeError(f"add_node() of a joining node takes num_cpus, num_gpus, resources "
                            f"and object_store_memory; not {sorted(system_config)}")
        started = _launch.start_node(
            self._state, head_address=self.address, token=self.token, host=self._host,
            num_cpus=num_cpus, num_gpus=num_gpus, resources=resources,
            object_store_memory=object_store_memory, owner_pid=os.getpid())
        node = NodeHandle(started)
        self._nodes.append(node)
        return node

    def add_nodes(self, count: int, *, num_cpus: int | None = None,
                  num_gpus: int | None = None, resources: dict[str, float] | None = None,
                  object_store_memory: int | None = None) -> list[NodeHandle]:
        """Start ``count`` joining nodes side by side (all started, then all waited for:
        their imports overlap); return once every one joined."""
        pending: list[Started] = []   # started, not yet joined: stopped on a failure
        try:
            for _ in range(count):
                pending.append(_launch.spawn_node(
                    self._state, head_address=self.address, token=self.token,
                    host=self._host, num_cpus=num_cpus, num_gpus=num_gpus,
                    resources=resources, object_store_memory=object_store_memory,
                    owner_pid=os.getpid()))
            while pending:
                _launch.wait_joined(pending[0])
                self._nodes.append(NodeHandle(pending.pop(0)))
        finally:
            for started in pending:
                _launch.stop(started)
        return self._nodes[-count:] if count else []

    def list_all_nodes(self) -> list[NodeHandle]:
        """The head, then the nodes still in the cluster, in the order they joined."""
        return ([self.head_node] if self.head_node is not None else []) + list(self._nodes)

    def remove_node(self, node: NodeHandle, allow_graceful: bool = True) -> None:
        """Stop a node: SIGTERM (it removes what it made), or with allow_graceful=False
        SIGKILL, as a machine that dies (the head notices it by its silence)."""
        if node is self.head_node:
            raise ValueError("remove_node() takes a joined node; shutdown() stops the head")
        if node not in self._nodes:
            raise ValueError(f"{node!r} is not a node of this cluster")
        self._nodes.remove(node)
        if allow_graceful:
            _launch.stop(node._started)
        else:
            _launch.kill(node._started)
            _launch.stop(node._started)   # reaps, removes its directories and segments

    def shutdown(self) -> None:
        """Stop every node, then the head; remove the cluster's directories."""
        for node in reversed(self._nodes):
            _launch.stop(node._started)
        self._nodes = []
        if self.head_node is not None:
            _launch.stop(self.head_node._started)
            self.head_node = None
        shutil.rmtree(self._state, ignore_errors=True)

    def __enter__(self) -> Cluster:
        return self

    def __exit__(self, *exc: object) -> None:
        self.shutdown()
