"""Connections carry frames alike over a unix socket and over TCP (orchestra/_protocol/connection.py)."""
from __future__ import annotations

import os
import socket
import stat
import threading
import time

import pytest

from orchestra._protocol import pb
from orchestra._protocol import wire as _wire
from orchestra._protocol.connection import Connection, Listener, parse_address
from orchestra.exceptions import ClusterLostError

pytestmark = pytest.mark.timeout(10)


@pytest.mark.parametrize(("address", "family", "target"), [
    ("/tmp/x.sock", socket.AF_UNIX, "/tmp/x.sock"),
    ("unix:relative.sock", socket.AF_UNIX, "relative.sock"),
    ("127.0.0.1:6380", socket.AF_INET, ("127.0.0.1", 6380)),
    ("tcp:localhost:1", socket.AF_INET, ("localhost", 1)),
    ("tcp:[::1]:6380", socket.AF_INET6, ("::1", 6380)),
])
def test_an_address_names_its_kind_of_socket(address: str, family: int, target: object) -> None:
    assert parse_address(address) == (family, target)


@pytest.mark.parametrize("bad", ["tcp:host:port", "tcp::80", "tcp:host:"])
def test_a_bad_address_names_the_forms_accepted(bad: str) -> None:
    with pytest.raises(ValueError, match="HOST:PORT"):
        parse_address(bad)


def _listen(kind: str, tmp_path) -> Listener:
    if kind == "unix":
        return Listener(str(tmp_path / "s.sock"))
    return _listen_tcp()


def _listen_tcp() -> Listener:
    probe = socket.socket()
    probe.bind(("127.0.0.1", 0))
    port = probe.getsockname()[1]
    probe.close()
    return Listener(f"127.0.0.1:{port}", token="t")


def _address(listener: Listener) -> str:
    return listener.address


@pytest.mark.parametrize("kind", ["unix", "tcp"])
def test_frames_cross_a_connection_whole_and_in_order(kind: str, tmp_path) -> None:
    listener = _listen(kind, tmp_path)
    got: list = []
    # Over TCP the connect waits for the listener's side of the handshake (accept).
    th = threading.Thread(target=lambda: got.append(
        Connection.connect(_address(listener), timeout_s=5, token="t")))
    th.start()
    server = None
    for _ in range(1000):
        server = listener.accept()
        if server is not None:
            break
        time.sleep(0.005)
    th.join(10)
    client = got[0]
    assert server is not None
    msgs = [pb.Subscribe(ids=[bytes([i]) * 16 for i in range(n)]) for n in range(1, 50)]
    big = pb.Subscribe(ids=[b"x" * 16] * 100_000)   # ~1.8 MB: many reads
    data = b"".join(_wire.encode(_wire.SUBSCRIBE, m) for m in [*msgs, big])
    threading.Thread(target=client.send, args=(data,), daemon=True).start()
    got: list = []
    buf = bytearray(1 << 16)
    while len(got) < len(msgs) + 1:
        n = server.recv_into(buf)
        assert n, "the connection closed early"
        got.extend(server.feed(memoryview(buf)[:n]))
    assert [m for _, m in got] == [*msgs, big]
    assert {k for k, _ in got} == {_wire.SUBSCRIBE}
    client.close()
    assert server.recv_into(buf) == 0   # the peer closed: end of stream
    server.close()
    listener.close()


def test_a_unix_listener_is_for_its_owner_only(tmp_path) -> None:
    listener = Listener(str(tmp_path / "s.sock"))
    assert stat.S_IMODE(os.stat(tmp_path / "s.sock").st_mode) == 0o600
    listener.close()


def test_a_tcp_listener_beyond_loopback_is_refused() -> None:
    with pytest.raises(ValueError, match="only loopback"):
        Listener("0.0.0.0:0")


def test_a_connect_to_nothing_gives_up_after_its_timeout(tmp_path) -> None:
    with pytest.raises(ClusterLostError, match="could not connect"):
        Connection.connect(str(tmp_path / "nobody.sock"), timeout_s=0.2)


def test_sending_on_a_closed_connection_says_so(tmp_path) -> None:
    listener = Listener(str(tmp_path / "s.sock"))
    client = Connection.connect(listener.address, timeout_s=5)
    server = None
    while server is None:
        server = listener.accept()
    server.close()
    listener.close()
    sent = [client.send(b"x" * 65536) for _ in range(64)]
    assert sent[-1] is False
    client.close()
