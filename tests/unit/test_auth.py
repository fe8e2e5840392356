"""Cluster authentication (orchestra/_auth.py): a challenge-response over real sockets,
both the blocking server (threads) and the asyncio gate (the head's TCP listener)."""
from __future__ import annotations

import asyncio
import os
import socket
import subprocess
import sys
import threading

import pytest

from orchestra import _auth
from orchestra._connection import Connection
from orchestra.exceptions import AuthenticationError

TOKEN = "s3cret-token"


def _serve_once(token: str, results: list) -> tuple[socket.socket, threading.Thread]:
    lsock = socket.socket()
    lsock.bind(("127.0.0.1", 0))
    lsock.listen(1)

    def run() -> None:
        conn, _ = lsock.accept()
        try:
            _auth.server_handshake(conn, token, timeout_s=5)
            results.append(("ok", conn.recv(5)))
        except AuthenticationError as exc:
            results.append(("refused", str(exc)))
        finally:
            conn.close()
    t = threading.Thread(target=run, daemon=True)
    t.start()
    return lsock, t


def test_new_tokens_are_192_random_bits_that_parse_as_a_command_line_value():
    from orchestra._cli_cluster import parse_start
    tokens = {_auth.new_token() for _ in range(200)}
    assert len(tokens) == 200
    for token in tokens:
        assert len(token) == 48 and int(token, 16) >= 0
        args = parse_start(["--address", "127.0.0.1:6380", "--token", token])
        assert args.token == token


def test_the_right_token_is_accepted_and_the_bytes_after_it_arrive_whole():
    results: list = []
    lsock, t = _serve_once(TOKEN, results)
    c = socket.create_connection(lsock.getsockname())
    _auth.client_handshake(c, TOKEN)
    c.sendall(b"hello")
    t.join(5)
    assert results == [("ok", b"hello")]
    c.close()
    lsock.close()


def test_a_wrong_token_is_refused_on_both_sides_with_the_cause_named():
    results: list = []
    lsock, t = _serve_once(TOKEN, results)
    c = socket.create_connection(lsock.getsockname())
    with pytest.raises(AuthenticationError, match="wrong cluster token.*ORCHESTRA_TOKEN"):
        _auth.client_handshake(c, "not-the-token", peer="here")
    t.join(5)
    assert results[0][0] == "refused" and "wrong token" in results[0][1]
    lsock.close()


def test_the_token_never_crosses_the_wire():
    a, b = socket.socketpair()
    seen = bytearray()

    def server() -> None:
        try:
            _auth.server_handshake(b, TOKEN, timeout_s=5)
        except AuthenticationError:
            pass
    t = threading.Thread(target=server, daemon=True)
    t.start()
    # A client that records what it sends: the handshake, through a recording socket.
    real_sendall = a.sendall

    class Recording:
        def __getattr__(self, name):
            return getattr(a, name)

        def sendall(self, data):
            seen.extend(data)
            return real_sendall(data)
    _auth.client_handshake(Recording(), TOKEN)   # type: ignore[arg-type]
    t.join(5)
    assert seen and TOKEN.encode() not in bytes(seen)
    a.close()
    b.close()


def test_a_missing_token_is_refused_before_connecting_a_byte():
    a, b = socket.socketpair()
    with pytest.raises(AuthenticationError, match="needs its token"):
        _auth.client_handshake(a, "")
    a.close()
    b.close()


def test_another_version_is_refused_naming_both(monkeypatch):
    # The server in a process of its own, so that only this side's version changes.
    code = ("import socket, sys; from orchestra import _auth\n"
            "l = socket.socket(); l.bind(('127.0.0.1', 0)); l.listen(1)\n"
            "print(l.getsockname()[1], flush=True)\n"
            "c, _ = l.accept()\n"
            "try:\n    _auth.server_handshake(c, sys.argv[1], timeout_s=5)\n"
            "except Exception as e:\n    print(e, flush=True)\n")
    proc = subprocess.Popen([sys.executable, "-c", code, TOKEN], stdout=subprocess.PIPE,
                            text=True, env={**os.environ, "PYTHONPATH": os.getcwd()})
    try:
        port = int(proc.stdout.readline())
        c = socket.create_connection(("127.0.0.1", port))
        monkeypatch.setattr(_auth, "VERSION", "9.9.9")
        with pytest.raises(AuthenticationError, match=r"orchestra 0\.1\.0, this process orchestra 9\.9\.9"):
            _auth.client_handshake(c, TOKEN)
        c.close()
    finally:
        proc.kill()
        proc.wait()


def test_the_server_refuses_another_version_itself():
    # A client that skips its own check: the server still refuses, naming both versions.
    a, b = socket.socketpair()
    nonce_c = b"n" * 32
    results: list = []

    def server() -> None:
        try:
            _auth.server_handshake(b, TOKEN, timeout_s=5)
        except AuthenticationError as exc:
            results.append(str(exc))
    t = threading.Thread(target=server, daemon=True)
    t.start()
    head = a.recv(_auth._SERVER_HELLO.size)
    _, nonce_s, vlen = _auth._SERVER_HELLO.unpack(head)
    a.recv(vlen)
    v = b"8.8.8"
    a.sendall(_auth._CLIENT_ANSWER.pack(_auth._MAGIC, nonce_c,
                                        _auth._mac(TOKEN, b"client", nonce_s, nonce_c, v), len(v)) + v)
    reply = a.recv(4096)
    t.join(5)
    assert reply[:1] == b"V" and b"8.8.8" in reply and _auth.VERSION.encode() in reply
    assert results and "8.8.8" in results[0]
    a.close()
    b.close()


def test_a_server_without_the_token_cannot_pose_as_the_cluster():
    results: list = []
    lsock, t = _serve_once("another-clusters-token", results)
    c = socket.create_connection(lsock.getsockname())
    with pytest.raises(AuthenticationError):
        _auth.client_handshake(c, TOKEN)
    t.join(5)
    c.close()
    lsock.close()


def test_a_silent_peer_times_out_instead_of_hanging():
    lsock = socket.socket()
    lsock.bind(("127.0.0.1", 0))
    lsock.listen(1)
    c = socket.create_connection(lsock.getsockname())
    with pytest.raises(AuthenticationError, match="did not complete authentication"):
        _auth.client_handshake(c, TOKEN, timeout_s=0.3)
    c.close()
    lsock.close()


class _Echo(asyncio.Protocol):
    def __init__(self, got: list) -> None:
        self.got = got
        self.transport = None

    def connection_made(self, transport):
        self.transport = transport

    def data_received(self, data):
        self.got.append(data)
        self.transport.write(data.upper())


def test_the_gate_hands_the_connection_on_only_after_the_handshake():
    loop = asyncio.new_event_loop()
    got: list = []
    server = loop.run_until_complete(loop.create_server(
        lambda: _auth.AuthGate(TOKEN, loop, lambda tr: _Echo(got)), "127.0.0.1", 0))
    port = server.sockets[0].getsockname()[1]
    stop = threading.Event()
    th = threading.Thread(target=lambda: loop.run_until_complete(
        loop.run_in_executor(None, stop.wait)), daemon=True)
    th.start()
    try:
        conn = Connection.connect(f"127.0.0.1:{port}", 5, token=TOKEN)
        conn.sock.sendall(b"abc")
        assert conn.sock.recv(3) == b"ABC"
        conn.close()
        with pytest.raises(AuthenticationError, match="wrong cluster token"):
            Connection.connect(f"127.0.0.1:{port}", 5, token="wrong")
        assert got == [b"abc"]
    finally:
        stop.set()
        th.join(5)
        server.close()
        loop.close()
