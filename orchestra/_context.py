"""The connection of this process to its cluster, set by init() or by the worker main.

Nothing is set at import; ``current_client`` raises a clear error before ``init``, and
ClusterLostError once the cluster's head is gone.
"""
from __future__ import annotations

from typing import Any

_client: Any = None


def set_client(client: Any) -> None:
    global _client
    _client = client


def current_client() -> Any:
    client = _client
    if client is None or client.lost is not None:
        if client is None:
            raise RuntimeError("orchestra is not initialized: call orchestra.init() first")
        # The head died: every later call fails at once with the same error, also
        # those that would otherwise go straight to a (dying) worker.
        from .exceptions import ClusterLostError
        raise ClusterLostError(client.lost)
    return client


def client_or_none() -> Any:
    return _client


_gpu_ids: list[int] = []


def set_gpu_ids(ids: list[int]) -> None:
    global _gpu_ids
    _gpu_ids = ids


def gpu_ids() -> list[int]:
    return list(_gpu_ids)


class RuntimeContext:
    """What this process is within its cluster (``orchestra.get_runtime_context()``)."""

    def get_node_id(self) -> str:
        """The id of the node this process runs on (as ``orchestra.nodes()`` names it)."""
        from ._ids import node_hex
        return node_hex(current_client().info.node_id)

    @property
    def node_id(self) -> str:
        return self.get_node_id()


def get_runtime_context() -> RuntimeContext:
    """The runtime context of this process (a driver, a task's or an actor's worker)."""
    return RuntimeContext()
