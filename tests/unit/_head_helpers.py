"""Helpers of the unit tests of the head: a Head built but never started (no loop, no
sockets), and a transport that records what the head writes to a connection."""
from __future__ import annotations

from pathlib import Path

from orchestra._head.head import Head


def unstarted_head(tmp_path: Path) -> Head:
    """A Head of one node (its own, in ``tmp_path``), never started: no loop needed.
    Close ``head.local`` at the end."""
    cfg = {"session_dir": str(tmp_path), "session_id": "unit", "object_store_memory": 1 << 20,
           "resources": {"CPU": 1}, "num_workers": 0, "warm_bytes": 0}
    return Head(cfg, loop=None)  # type: ignore[arg-type]


class RecordingTransport:
    """What a connection's transport was given: ``writes``, one item per write."""

    def __init__(self) -> None:
        self.writes: list[bytes] = []

    @property
    def written(self) -> bytes:
        return b"".join(self.writes)

    def write(self, data: bytes) -> None:
        self.writes.append(data)

    def close(self) -> None:
        pass
