"""TLS between machines (_protocol/tls.py, _protocol/auth.py connect_secure/accept_secure):
the cluster's key from its token, the server's key pinned by the client, the token
proven inside the channel and bound to it, and the frame channel read and written from
several threads at once. Real sockets and real TLS throughout."""
from __future__ import annotations

import socket
import threading
import time

import pytest

from orchestra._protocol import auth as _auth
from orchestra._protocol import tls
from orchestra._protocol.connection import Connection
from orchestra.exceptions import AuthenticationError

TOKEN = tls.tls_token("ab" * 24)
OTHER = tls.tls_token("cd" * 24)


def _serve(sock: socket.socket, token: str, bulk: bool = False, timeout_s: float = 5) -> dict:
    out: dict = {}

    def run() -> None:
        try:
            out["stream"] = _auth.accept_secure(sock, token, timeout_s=timeout_s, bulk=bulk)
        except Exception as exc:   # noqa: BLE001 - the test reads it
            out["error"] = exc
            sock.close()   # as a listener does
    t = threading.Thread(target=run, daemon=True)
    t.start()
    out["thread"] = t
    return out


def test_the_clusters_key_comes_from_its_token_alone():
    cert, key, public = tls.identity(TOKEN)
    tls.identity.cache_clear()
    assert tls.identity(TOKEN) == (cert, key, public)   # the same on every machine
    assert tls.identity(OTHER)[2] != public
    assert tls.cluster_fingerprint(TOKEN).startswith("sha256:")
    assert tls.enabled(TOKEN) and not tls.enabled("ab" * 24) and not tls.enabled("")
    assert tls.tls_token(TOKEN) == TOKEN


@pytest.mark.parametrize("bulk", [False, True])
def test_a_client_and_server_of_one_token_talk_encrypted(bulk):
    a, b = socket.socketpair()
    server = _serve(b, TOKEN, bulk)
    stream = _auth.connect_secure(a, TOKEN, timeout_s=5, peer="test", bulk=bulk)
    server["thread"].join(5)
    assert "error" not in server, server.get("error")
    peer = server["stream"]
    stream.sendall(b"hello over tls")
    buf = bytearray(64)
    n = peer.recv_into(buf)
    assert bytes(buf[:n]) == b"hello over tls"
    # What crossed the socket was not the plaintext: the raw bytes are records.
    raw_a, raw_b = socket.socketpair()
    server = _serve(raw_b, TOKEN, bulk)
    spy_a, spy_b = socket.socketpair()   # a relay that records what it carries
    seen = bytearray()

    def relay(src: socket.socket, dst: socket.socket) -> None:
        while True:
            try:
                data = src.recv(65536)
            except OSError:
                return
            if not data:
                return
            seen.extend(data)
            dst.sendall(data)
    threading.Thread(target=relay, args=(spy_b, raw_a), daemon=True).start()
    threading.Thread(target=relay, args=(raw_a, spy_b), daemon=True).start()
    client = _auth.connect_secure(spy_a, TOKEN, timeout_s=5, peer="test", bulk=bulk)
    server["thread"].join(5)
    client.sendall(b"MARKER-" * 1000)
    got = bytearray()
    while len(got) < 7000:
        buf = bytearray(8192)
        n = server["stream"].recv_into(buf)
        got += buf[:n]
    assert bytes(got) == b"MARKER-" * 1000
    assert b"MARKER" not in seen and len(seen) > 7000


def test_a_server_of_another_cluster_is_refused_naming_both_keys_before_a_byte_is_sent():
    a, b = socket.socketpair()
    server = _serve(b, OTHER)
    with pytest.raises(AuthenticationError) as info:
        _auth.connect_secure(a, TOKEN, timeout_s=5, peer="10.0.0.9:6380")
    text = str(info.value)
    assert tls.cluster_fingerprint(TOKEN) in text and tls.cluster_fingerprint(OTHER) in text
    assert "10.0.0.9:6380" in text and "nothing was sent" in text
    a.close()
    server["thread"].join(5)
    assert isinstance(server.get("error"), AuthenticationError)   # it got no token proof


def test_a_token_without_the_mark_finds_its_tls_cluster_and_pins_its_key():
    # A token chosen by its user, given to a head reached by other machines, is marked
    # there ("tls-" + it); its clients, given it as it was, are refused in the clear
    # at once (the server says nothing) and speak TLS to it instead, pinning the key
    # made from the marked token; later connections go to TLS at once.
    plain = "ef" * 24
    listener = socket.create_server(("127.0.0.1", 0))
    port = listener.getsockname()[1]
    served: list[dict] = []

    def serve() -> None:
        for _ in range(3):
            conn, _addr = listener.accept()
            served.append(_serve(conn, tls.tls_token(plain), timeout_s=60))
    threading.Thread(target=serve, daemon=True).start()
    t0 = time.monotonic()
    stream = _auth.connect_secure(socket.create_connection(("127.0.0.1", port)), plain,
                                  timeout_s=60, peer="head")
    assert time.monotonic() - t0 < 30   # refused in the clear at once, not after a timeout
    assert isinstance(stream, tls.TlsChannel)
    assert len(served) == 2
    served[0]["thread"].join(5)
    assert isinstance(served[0].get("error"), AuthenticationError)   # the clear attempt
    served[1]["thread"].join(5)
    stream.sendall(b"over tls")
    buf = bytearray(16)
    assert bytes(buf[:served[1]["stream"].recv_into(buf)]) == b"over tls"
    again = _auth.connect_secure(socket.create_connection(("127.0.0.1", port)), plain,
                                 timeout_s=60, peer="head")
    assert isinstance(again, tls.TlsChannel) and len(served) == 3
    served[2]["thread"].join(5)
    assert "error" not in served[2]
    for s in (stream, again):
        s.close()
    listener.close()


def test_a_tls_client_of_a_plain_server_is_told_the_server_does_not_speak_tls():
    a, b = socket.socketpair()
    plain = TOKEN.removeprefix(tls.PREFIX)
    _serve(b, plain)
    with pytest.raises(AuthenticationError, match="does not speak TLS"):
        _auth.connect_secure(a, TOKEN, timeout_s=5, peer="head")


def test_the_token_proof_is_bound_to_its_tls_connection():
    """A relay holding the cluster's key (terminating TLS on both sides) passes the
    client's proof on to the server: the server refuses it, since the two TLS
    connections' bindings differ. Without the binding in the MAC it would pass."""
    client_sock, relay_in = socket.socketpair()
    relay_out, server_sock = socket.socketpair()
    server = _serve(server_sock, TOKEN)

    def relay() -> None:
        inner = tls.server_channel(relay_in, TOKEN, time.monotonic() + 5)
        outer = tls.client_channel(relay_out, TOKEN, time.monotonic() + 5, "server")

        def pump(src, dst) -> None:
            buf = bytearray(65536)
            while True:
                try:
                    n = src.recv_into(buf)
                except OSError:
                    n = 0
                if not n:
                    try:   # wakes the other pump too (a close alone would not)
                        dst.shutdown(socket.SHUT_RDWR)
                    except OSError:
                        pass
                    return
                dst.sendall(buf[:n])
        threading.Thread(target=pump, args=(inner, outer), daemon=True).start()
        pump(outer, inner)
    threading.Thread(target=relay, daemon=True).start()
    with pytest.raises(AuthenticationError, match="wrong cluster token|refused"):
        _auth.connect_secure(client_sock, TOKEN, timeout_s=5, peer="relay")
    server["thread"].join(5)
    assert "wrong token" in str(server.get("error"))


def test_bytes_changed_on_the_wire_end_the_connection_and_nothing_is_decoded():
    a, b = socket.socketpair()
    mid_a, mid_b = socket.socketpair()
    server = _serve(b, TOKEN)
    flip = threading.Event()

    def forward(src: socket.socket, dst: socket.socket, tamper: bool) -> None:
        while True:
            try:
                data = bytearray(src.recv(65536))
            except OSError:
                return
            if not data:
                dst.close()
                return
            if tamper and flip.is_set():
                data[-1] ^= 0x01   # inside a record: its tag no longer matches
            dst.sendall(data)
    threading.Thread(target=forward, args=(mid_b, a, True), daemon=True).start()
    threading.Thread(target=forward, args=(a, mid_b, False), daemon=True).start()
    client = Connection(_auth.connect_secure(mid_a, TOKEN, timeout_s=5, peer="t"), "t")
    server["thread"].join(5)
    conn = Connection(server["stream"], "s")
    buf = bytearray(65536)
    assert client.send(b"first")
    n = conn.recv_into(buf)
    assert bytes(buf[:n]) == b"first"
    flip.set()
    client.send(b"second")
    assert conn.recv_into(buf) == 0   # dropped (TLS integrity), no byte handed on


def test_one_thread_reads_while_others_write_on_one_channel():
    a, b = socket.socketpair()
    server = _serve(b, TOKEN)
    client = Connection(_auth.connect_secure(a, TOKEN, timeout_s=5, peer="t"), "t")
    server["thread"].join(5)
    conn = Connection(server["stream"], "s")
    count, size = 2000, 300
    echoed = bytearray()

    def echo() -> None:   # the server echoes what it reads, from its own thread
        buf = bytearray(65536)
        while True:
            n = conn.recv_into(buf)
            if not n:
                return
            conn.send(bytes(buf[:n]))
    threading.Thread(target=echo, daemon=True).start()

    def reader() -> None:
        buf = bytearray(65536)
        while len(echoed) < 4 * count * size:
            n = client.recv_into(buf)
            if not n:
                return
            echoed.extend(buf[:n])
    r = threading.Thread(target=reader)
    r.start()
    writers = [threading.Thread(target=lambda k=k: [client.send(bytes([65 + k]) * size)
                                                   for _ in range(count)]) for k in range(4)]
    for w in writers:
        w.start()
    for w in writers:
        w.join(30)
    r.join(30)
    assert len(echoed) == 4 * count * size
    # Each send arrived whole: runs of one letter, 300 long.
    for i in range(0, len(echoed), size):
        assert len(set(echoed[i:i + size])) == 1


@pytest.mark.parametrize("token", [TOKEN, "ab" * 24], ids=["tls", "plain"])
def test_both_ends_of_a_tcp_handshake_send_at_once(token):
    # A handshake is several small writes in turn: with Nagle's algorithm on, each
    # waited for a delayed ACK (a TLS connection took 44 ms to set up on loopback).
    listener = socket.create_server(("127.0.0.1", 0))
    client = socket.create_connection(listener.getsockname())
    conn, _ = listener.accept()
    server = _serve(conn, token)
    stream = _auth.connect_secure(client, token, timeout_s=5, peer="test")
    server["thread"].join(5)
    assert "error" not in server, server.get("error")
    for s in (client, conn):
        assert s.getsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY) != 0
    stream.close()
    listener.close()
