"""The connection of this process to its cluster, set by init() or by the worker main.

Nothing is set at import; ``current_client`` raises a clear error before ``init``.
"""
from __future__ import annotations

from typing import Any

_client: Any = None


def set_client(client: Any) -> None:
    global _client
    _client = client


def current_client() -> Any:
    if _client is None:
        raise RuntimeError("orchestra is not initialized: call orchestra.init() first")
    return _client


def client_or_none() -> Any:
    return _client


_gpu_ids: list[int] = []


def set_gpu_ids(ids: list[int]) -> None:
    global _gpu_ids
    _gpu_ids = ids


def gpu_ids() -> list[int]:
    return list(_gpu_ids)
