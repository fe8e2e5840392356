"""Probes of a running cluster: its processes, objects and shared-memory segments.

Used by tests/conftest.py and by tests that check what a cluster leaves behind.
"""
from __future__ import annotations

import contextlib
import os
import site
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

import orchestra
from orchestra._api import session as _session
from orchestra._objects.segments import DIR_PREFIX, SHM_DIR, session_dir_prefix
from orchestra._platform.procutil import pid_alive


def child_env() -> dict[str, str]:
    """This environment, plus the orchestra this process imported when it came from the cwd
    (``python -m pytest`` in a checkout) rather than site-packages or PYTHONPATH: a child
    Python started with it imports the same orchestra."""
    env = dict(os.environ)
    home = str(Path(orchestra.__file__).resolve().parents[1])
    if home not in site.getsitepackages():
        env["PYTHONPATH"] = os.pathsep.join(
            [home] + [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p])
    return env


def shm_dirs_of(head_pid: int) -> list[str]:
    """The private segment directories of the session whose head is ``head_pid``
    (``/dev/shm/orchestra-<uid>-<head pid>-...``; one while it runs, none after)."""
    prefix = session_dir_prefix(head_pid)
    return sorted(os.path.join(SHM_DIR, n) for n in os.listdir(SHM_DIR) if n.startswith(prefix))


def shm_entries_of(head_pid: int) -> list[str]:
    """Everything of that session under /dev/shm: its directories and their segments."""
    entries = []
    for d in shm_dirs_of(head_pid):
        entries.append(d)
        try:
            entries += [os.path.join(d, n) for n in os.listdir(d)]
        except FileNotFoundError:
            pass
    return sorted(entries)


def mapped_file(address: int, pid: int | str = "self") -> str | None:
    """The file whose map in process ``pid`` holds ``address`` (from /proc/PID/maps),
    None for anonymous memory: a value read "zero-copy" from a segment must lie in the
    segment's file under /dev/shm/orchestra-..., not in the heap."""
    with open(f"/proc/{pid}/maps") as f:
        for line in f:
            fields = line.split(maxsplit=5)
            start, end = (int(x, 16) for x in fields[0].split("-"))
            if start <= address < end:
                return fields[5].strip() if len(fields) == 6 and fields[5].strip() else None
    return None


def in_segment(address: int, pid: int | str = "self") -> bool:
    path = mapped_file(address, pid)
    return path is not None and path.startswith(f"{SHM_DIR}/{DIR_PREFIX}")


def pid_gone(pid: int) -> bool:
    """True when the process no longer runs. A zombie counts as gone: PID 1 in this
    sandbox need not reap orphans, and a zombie holds no memory and no segment."""
    return not pid_alive(pid)


def wait_until(predicate: Callable[[], bool], timeout: float, what: str,
               explain: Callable[[], str] | None = None) -> None:
    """Poll ``predicate`` until it holds; fail naming ``what`` after ``timeout`` s (and
    what ``explain`` says of the state then)."""
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            detail = f"; {explain()}" if explain is not None else ""
            pytest.fail(f"{what}: not true within {timeout:g} s{detail}")
        time.sleep(0.01)


class Cluster:
    """Probes of the running cluster: its processes, objects and segments."""

    def __init__(self, info: dict[str, Any]) -> None:
        self.info = info
        self.session_dir: str = info["session_dir"]
        with open(os.path.join(self.session_dir, "head.pid")) as f:
            self.head_pid = int(f.read().strip())

    def segments(self) -> list[str]:
        """Paths of this cluster's segment files (in its private directory)."""
        return [p for p in shm_entries_of(self.head_pid) if p not in shm_dirs_of(self.head_pid)]

    def segment_bytes(self) -> int:
        """Bytes of shared memory this cluster's segments hold (live and pooled)."""
        total = 0
        for path in self.segments():
            try:
                total += os.stat(path).st_blocks * 512
            except FileNotFoundError:
                pass
        return total

    def debug(self) -> Any:
        return _session.debug_info()

    def store(self) -> Any:
        """The object store's figures (ObjStoreDebugInfoReply), asked over gRPC."""
        import grpc

        from orchestra._proto import orchestra_pb2_grpc as rpc
        from orchestra._protocol import pb
        path = os.path.join(self.session_dir, "grpc.sock")
        wait_until(lambda: os.path.exists(path), 20, "the head serves gRPC")   # started after init
        with grpc.insecure_channel(f"unix:{path}") as ch:
            # wait_for_ready: the socket's file is there a moment before the server
            # listens on it (a call then was refused, UNAVAILABLE).
            return rpc.ObjStoreStub(ch).ObjStoreDebugInfo(pb.ObjStoreDebugInfoRequest(), timeout=10,
                                                          wait_for_ready=True)

    def spill_files(self) -> list[str]:
        spill = os.path.join(self.session_dir, "spill")
        return sorted(os.listdir(spill)) if os.path.isdir(spill) else []

    def worker_pids(self) -> list[int]:
        return [w.pid for w in self.debug().workers if w.pid]

    def objects(self) -> dict[bytes, Any]:
        return {o.objref: o for o in self.debug().objects}

    def wait_idle_workers(self, n: int, timeout: float = 30.0) -> None:
        def ready() -> bool:
            return sum(1 for w in self.debug().workers if w.state == "idle") >= n
        wait_until(ready, timeout, f"{n} idle workers")

    def wait_freed(self, oid: bytes, timeout: float = 10.0) -> None:
        wait_until(lambda: oid not in self.objects(), timeout, f"object {oid.hex()} freed")

    def wait_quiescent(self, timeout: float = 10.0) -> None:
        """Every resource free again: no task of the last test still runs."""
        total = orchestra.cluster_resources()
        wait_until(lambda: orchestra.available_resources() == total, timeout,
                   "all resources free (a task of the test still runs)")




def segment_file(ref: Any) -> str:
    """The file in /dev/shm holding a large object this driver knows the location of
    (a medium object's: its slab, where it lies at segment_span's offset)."""
    return segment_span(ref)[0]


def segment_span(ref: Any) -> tuple[str, int]:
    """(file, offset) of a large object's bytes in /dev/shm (a slot's place in its slab)."""
    from orchestra._objects.segments import segment_file as file_of
    from orchestra._runtime import context as _context
    client = _context._client
    orchestra.wait([ref], timeout=30)
    data = client.results[ref.binary()]
    assert data.WhichOneof("data") == "segment", f"{ref} is not in shared memory"
    return file_of(client.shm_dir, data.segment.name)


def store_used() -> int:
    """Bytes the store of this driver's cluster counts used (objects and spares)."""
    from orchestra.util import state
    return int(state.cluster_summary()["store"]["used"])


def wait_store_empty(client: Any, timeout: float = 15) -> None:
    """Until the store counts nothing used: the objects freed, and ``client``'s spares
    given back (they go back after 2 s unused)."""
    wait_until(lambda: store_used() == 0, timeout, "the objects freed and the spares given back",
               lambda: f"{store_used()} bytes still counted; the driver holds "
                       f"{client.objects.spare_bytes} bytes of spares")
    assert client.objects.spare_bytes == 0


@contextlib.contextmanager
def counting_creates(client: Any) -> Iterator[tuple[list[int], list[int]]]:
    """While inside: the spares each create_segment of ``client`` asked for, as (those
    it waited for, those asked without waiting: refills)."""
    creates: list[int] = []
    refills: list[int] = []
    request, request_later = client.request, client.request_later

    def counting(req: Any, *args: Any, **kwargs: Any) -> Any:
        if req.WhichOneof("body") == "create_segment":
            creates.append(req.create_segment.spares)
        return request(req, *args, **kwargs)

    def counting_later(req: Any, on_reply: Any) -> None:
        refills.append(req.create_segment.spares)
        request_later(req, on_reply)
    client.request, client.request_later = counting, counting_later
    try:
        yield creates, refills
    finally:
        client.request, client.request_later = request, request_later
