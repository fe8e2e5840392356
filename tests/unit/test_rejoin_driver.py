"""The driver's reconnection to a restarted head (orchestra/_runtime/reconnect.py): who
starts it. The lost client's reader thread (on_lost) and a call that found the client
lost (wait) both ask; whichever comes second, or comes once the new client is there,
starts nothing. Stand-in clients: this is Rejoin's decision, not the client's I/O (the
whole path runs in tests/integration/test_head_restart.py)."""
from __future__ import annotations

import threading
from typing import Any

import pytest

from orchestra._protocol import pb
from orchestra._runtime import reconnect

pytestmark = pytest.mark.timeout(30)


class Client:
    def __init__(self, lost: str | None) -> None:
        self.lost = lost
        self.closing = False
        self.on_lost: Any = None
        self.runtime_env = None
        self.info = pb.HelloReply(reconnect_s=5.0)

    def close(self) -> None:
        self.closing = True


def test_a_late_on_lost_of_a_replaced_client_starts_no_second_reconnection(monkeypatch) -> None:
    made: list[Client] = []
    go = threading.Event()

    def connect(*args: Any, **kwargs: Any) -> Client:
        go.wait(10)
        made.append(Client(lost=None))
        return made[-1]
    monkeypatch.setattr(reconnect, "CoreClient", connect)
    monkeypatch.setattr(reconnect, "_PAUSE_S", 0.0)
    # What the clients carry over is the replay's (tests/unit/test_replay_book.py).
    monkeypatch.setattr(reconnect, "keep_calls", lambda client, book=None: None)
    monkeypatch.setattr(reconnect, "carry_over", lambda old, new: None)
    old = Client(lost="the head closed the connection")
    swaps: list[tuple[Any, Any]] = []
    r = reconnect.Rejoin("127.0.0.1:1", "t", lambda: pb.Hello(kind="driver"), old,  # type: ignore[arg-type]
                         lambda a, b: swaps.append((a, b)), lambda: None)
    late_on_lost = old.on_lost
    r.begin()                 # a call found the client lost first
    first = r.thread
    assert first is not None
    go.set()
    assert r.wait(old) is made[0]          # connected again
    late_on_lost()            # the old reader thread's on_lost, after that
    r.begin()
    assert r.thread is None and len(made) == 1 and swaps == [(old, made[0])]
    first.join(10)
    assert old.closing and old in reconnect.replaced


def test_large_values_are_copied_when_a_ref_goes_while_they_are_listed() -> None:
    # copy_large lists the values in shared memory held here under the ref lock, which
    # the garbage collector re-enters in the same thread when it runs an ObjectRef's
    # __del__: a ref gone meanwhile changed the dict being listed (RuntimeError, the
    # rejoin thread died and the driver never rejoined: the soak with head kills).
    from orchestra._objects.refs import RefCounts

    class Objects:
        def __init__(self, refs: RefCounts) -> None:
            self.maps: dict[bytes, Any] = {}
            self.refs = refs

        def own_view(self, segment: pb.Segment) -> memoryview:
            self.refs.remove(b"gone")   # as a __del__ run by the collector here
            return memoryview(segment.name.encode())

        def copy_object(self, oid: bytes, view: memoryview, contained: list[bytes]) -> pb.ObjectData:
            return pb.ObjectData(object_id=oid, segment=pb.Segment(name="new-" + bytes(view).decode()))

    class Old:
        def __init__(self) -> None:
            self.refs = RefCounts(lambda oid: False)
            self.objects = Objects(self.refs)
            self.results = {oid: pb.ObjectData(object_id=oid, segment=pb.Segment(name=oid.decode()))
                            for oid in (b"a", b"b")}

    old, new = Old(), Old()
    for oid in (b"a", b"gone", b"b"):
        old.refs.add(oid, counted=True)
    copied = reconnect.copy_large(old, new)   # type: ignore[arg-type]
    assert {oid: d.segment.name for oid, d in copied.items()} == {b"a": "new-a", b"b": "new-b"}
