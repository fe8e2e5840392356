"""Cluster authentication: every TCP connection proves it knows the cluster token before
any frame is read (frames carry pickled code), and both ends check they run the same
orchestra version.

    server (head, a node's data server) --accept--> sends HELLO: magic, its version,
        a fresh 32-byte nonce (nonce_s)
    client --> magic, its version, its own nonce (nonce_c),
        HMAC-SHA256(token, "client" | nonce_s | nonce_c | version)
    server: version differs -> "V" + a message naming both versions, close
            MAC differs (hmac.compare_digest: constant time) -> "T" + message, close
            else "K" + HMAC-SHA256(token, "server" | nonce_c | nonce_s)
    client: checks the server's MAC (a listener without the token cannot pose as the
        cluster and be sent pickled calls), then the connection carries frames.

The token never crosses the wire; a recorded exchange cannot be replayed (fresh nonces
on both sides). What it does not do: encrypt. Traffic between nodes is readable by
whoever can see the network, as Ray's and Dask's default is; keep the cluster on a
private network (docs/cluster.md).

Two forms of the server side: server_handshake() for blocking sockets (threads), and
AuthGate, an asyncio Protocol that hands the transport to the real protocol once the
client is proven (the head's TCP listener).
"""
from __future__ import annotations

import asyncio
import hashlib
import hmac
import secrets
import socket
import struct
import sys
import threading
import time
from collections.abc import Callable
from typing import Any

from ..exceptions import AuthenticationError

VERSION = "0.1.0"   # orchestra.__version__ (kept here: the head loads the package bare)
_MAGIC = b"ORCA"
_NONCE = 32
_MAC = 32
# server hello: magic, nonce, version length (u8), version
_SERVER_HELLO = struct.Struct("!4s32sB")
# client answer: magic, nonce, mac, version length (u8), version
_CLIENT_ANSWER = struct.Struct("!4s32s32sB")
_OK, _BAD_TOKEN, _BAD_VERSION = b"K", b"T", b"V"
DEFAULT_TIMEOUT_S = 10.0
# A server gives a client this long for its whole handshake (two short messages on
# one round trip), however slowly it trickles bytes in: a bound per recv let a client
# sending a byte a second hold a listener for minutes.
HANDSHAKE_S = 5.0
# Connections a listener authenticates at once; more are closed as they come, so
# silent peers without the token cannot pile up threads or buffers.
MAX_UNAUTHENTICATED = 32


def new_token() -> str:
    """A fresh cluster token: 192 random bits as 48 hex digits (never starting with
    "-", which a command line would read as an option: ``--token TOKEN``)."""
    return secrets.token_hex(24)


def _mac(token: str, label: bytes, *parts: bytes) -> bytes:
    return hmac.new(token.encode(), label + b"".join(parts), hashlib.sha256).digest()


def _server_hello(nonce: bytes) -> bytes:
    v = VERSION.encode()
    return _SERVER_HELLO.pack(_MAGIC, nonce, len(v)) + v


def _judge(token: str, nonce_s: bytes, answer: bytes) -> tuple[bytes, str]:
    """The server's reply to a client's answer, and why it refused ("" when accepted)."""
    magic, nonce_c, mac, vlen = _CLIENT_ANSWER.unpack_from(answer)
    version = answer[_CLIENT_ANSWER.size:_CLIENT_ANSWER.size + vlen]
    if magic != _MAGIC:
        return b"", "not an orchestra client"
    good = hmac.compare_digest(mac, _mac(token, b"client", nonce_s, nonce_c, version))
    if not good:
        text = ("wrong cluster token: pass the token that `orchestra start --head` printed "
                "(token= or the ORCHESTRA_TOKEN environment variable)")
        return _BAD_TOKEN + text.encode(), "wrong token"
    theirs = version.decode(errors="replace")
    if theirs != VERSION:
        text = (f"version mismatch: the cluster runs orchestra {VERSION}, this process "
                f"orchestra {theirs}; install the same version on every machine")
        return _BAD_VERSION + text.encode(), f"orchestra {theirs} (this is {VERSION})"
    return _OK + _mac(token, b"server", nonce_c, nonce_s), ""


def _recv_exact(sock: socket.socket, n: int, deadline: float | None = None) -> bytes:
    """``n`` bytes; with ``deadline`` (time.monotonic()), all of them by then."""
    buf = bytearray()
    while len(buf) < n:
        if deadline is not None:
            left = deadline - time.monotonic()
            if left <= 0:
                raise TimeoutError("the handshake took too long")
            sock.settimeout(left)
        chunk = sock.recv(n - len(buf))
        if not chunk:
            raise ConnectionError("the peer closed the connection during authentication")
        buf += chunk
    return bytes(buf)


def client_handshake(sock: socket.socket, token: str, *, timeout_s: float = DEFAULT_TIMEOUT_S,
                     peer: str = "") -> None:
    """Prove the token to the server at the other end of ``sock`` (blocking), and check
    the server knows it too. AuthenticationError names why it was refused."""
    where = f" at {peer}" if peer else ""
    if not token:
        raise AuthenticationError(
            f"the cluster{where} needs its token: pass token=... to orchestra.init() or set "
            "ORCHESTRA_TOKEN (`orchestra start --head` printed it)")
    old = sock.gettimeout()
    sock.settimeout(timeout_s)
    try:
        head = _recv_exact(sock, _SERVER_HELLO.size)
        magic, nonce_s, vlen = _SERVER_HELLO.unpack(head)
        if magic != _MAGIC:
            raise AuthenticationError(f"the server{where} is not an orchestra cluster")
        server_version = _recv_exact(sock, vlen).decode(errors="replace")
        if server_version != VERSION:
            raise AuthenticationError(
                f"version mismatch: the cluster{where} runs orchestra {server_version}, "
                f"this process orchestra {VERSION}; install the same version on every machine")
        nonce_c = secrets.token_bytes(_NONCE)
        v = VERSION.encode()
        sock.sendall(_CLIENT_ANSWER.pack(_MAGIC, nonce_c, _mac(token, b"client", nonce_s, nonce_c, v),
                                         len(v)) + v)
        verdict = sock.recv(1)
        if verdict == _OK:
            mac = _recv_exact(sock, _MAC)
            if not hmac.compare_digest(mac, _mac(token, b"server", nonce_c, nonce_s)):
                raise AuthenticationError(f"the server{where} does not know the cluster token: "
                                          "it is not the cluster you meant to reach")
            return
        text = b""
        while verdict:
            text += verdict
            verdict = sock.recv(4096)
        reason = text[1:].decode(errors="replace") if text else "the connection closed"
        raise AuthenticationError(f"the cluster{where} refused this connection: {reason}")
    except TimeoutError as exc:
        raise AuthenticationError(f"the server{where} did not complete authentication within "
                                  f"{timeout_s:g} s: is it an orchestra cluster?") from exc
    except ConnectionError as exc:
        raise AuthenticationError(f"the server{where} closed the connection during "
                                  f"authentication: {exc}") from exc
    finally:
        try:
            sock.settimeout(old)
        except OSError:
            pass


def server_handshake(sock: socket.socket, token: str, *,
                     timeout_s: float = HANDSHAKE_S) -> None:
    """Check the client at the other end of ``sock`` knows the token (blocking), all of
    it within ``timeout_s``; AuthenticationError (the client was told why, and should
    be closed) otherwise."""
    old = sock.gettimeout()
    deadline = time.monotonic() + timeout_s
    sock.settimeout(timeout_s)
    try:
        nonce_s = secrets.token_bytes(_NONCE)
        sock.sendall(_server_hello(nonce_s))
        answer = _recv_exact(sock, _CLIENT_ANSWER.size, deadline)
        vlen = answer[-1]
        answer += _recv_exact(sock, vlen, deadline)
        reply, why = _judge(token, nonce_s, answer)
        if reply:
            sock.sendall(reply)
        if why:
            raise AuthenticationError(f"refused a connection: {why}")
    except (TimeoutError, ConnectionError, OSError) as exc:
        if isinstance(exc, AuthenticationError):
            raise
        raise AuthenticationError(f"a connection did not authenticate: {exc}") from exc
    finally:
        try:
            sock.settimeout(old)
        except OSError:
            pass


class AuthGate(asyncio.Protocol):
    """An asyncio Protocol that authenticates a connection, then hands its transport to
    ``make_protocol(transport)`` (a Protocol to which the bytes that followed the
    handshake are fed). A client that fails, or is silent for ``timeout_s``, is closed
    and nothing it sent is decoded."""

    def __init__(self, token: str, loop: asyncio.AbstractEventLoop,
                 make_protocol: Callable[[Any], Any],
                 timeout_s: float = HANDSHAKE_S, what: str = "orchestra",
                 pending: dict[AuthGate, None] | None = None) -> None:
        self.token = token
        # Shared by a listener's gates: those handshaking, oldest first; a new one
        # beyond MAX_UNAUTHENTICATED cuts the oldest off (as Gatekeeper does).
        self.pending: dict[AuthGate, None] = pending if pending is not None else {}
        self.loop = loop
        self.make_protocol = make_protocol
        self.timeout_s = timeout_s
        self.what = what
        self.transport: Any = None
        self.buf = b""
        self.nonce = secrets.token_bytes(_NONCE)
        self.done = False
        self._timer: asyncio.TimerHandle | None = None

    def connection_made(self, transport: Any) -> None:
        self.transport = transport
        pending = self.pending
        if len(pending) >= MAX_UNAUTHENTICATED:
            oldest = next(iter(pending))
            oldest._too_slow()
        pending[self] = None
        transport.write(_server_hello(self.nonce))
        self._timer = self.loop.call_later(self.timeout_s, self._too_slow)

    def _settled(self) -> None:
        """The handshake ended (either way): it no longer counts against the cap."""
        self.done = True
        self.pending.pop(self, None)

    def _too_slow(self) -> None:
        if not self.done:
            self._settled()
            if self._timer is not None:
                self._timer.cancel()
            self.transport.abort()

    def data_received(self, data: bytes) -> None:
        if self.done:
            return
        self.buf += data
        if len(self.buf) < _CLIENT_ANSWER.size:
            return
        need = _CLIENT_ANSWER.size + self.buf[_CLIENT_ANSWER.size - 1]
        if len(self.buf) < need:
            return
        answer, rest = self.buf[:need], self.buf[need:]
        self.buf = b""
        self._settled()
        if self._timer is not None:
            self._timer.cancel()
        reply, why = _judge(self.token, self.nonce, answer)
        if why:
            peer = self.transport.get_extra_info("peername")
            print(f"{self.what}: refused a connection from {peer}: {why}", file=sys.stderr)
            if reply:
                self.transport.write(reply)
            self.transport.close()
            return
        self.transport.write(reply)
        proto = self.make_protocol(self.transport)
        self.transport.set_protocol(proto)
        proto.connection_made(self.transport)
        if rest:
            proto.data_received(rest)

    def eof_received(self) -> bool:
        return False

    def connection_lost(self, exc: BaseException | None) -> None:
        self._settled()
        if self._timer is not None:
            self._timer.cancel()

    def pause_writing(self) -> None:
        pass

    def resume_writing(self) -> None:
        pass


class Gatekeeper:
    """Authenticates a blocking listener's connections off the thread that serves it:
    each handshake on a thread of its own, bounded as a whole by ``timeout_s``. At most
    ``limit`` handshakes at once: a new connection beyond that cuts off the oldest one
    still handshaking (a real client proves itself in one round trip, so silent peers,
    however many, cannot keep it out, nor pile up threads). A proven socket goes to
    ``on_ready``, on the handshake's thread; a refused one is closed.

    Why: a worker's direct-call port ran the handshake inside the worker's poll loop,
    so one peer without the token, sending a byte a second, stalled the tasks of the
    process that served it."""

    def __init__(self, token: str, on_ready: Callable[[socket.socket], None], *,
                 timeout_s: float = HANDSHAKE_S, limit: int = MAX_UNAUTHENTICATED,
                 name: str = "orchestra-auth") -> None:
        self.token = token
        self.on_ready = on_ready
        self.timeout_s = timeout_s
        self.limit = limit
        self.name = name
        self.lock = threading.Lock()
        self.pending: dict[socket.socket, None] = {}   # handshaking, oldest first
        self.cut_off = 0   # handshakes ended early to make room for newer ones

    def admit(self, sock: socket.socket) -> None:
        """Authenticate ``sock`` (just accepted) in the background; never blocks."""
        oldest = None
        with self.lock:
            if len(self.pending) >= self.limit:
                oldest = next(iter(self.pending))
                del self.pending[oldest]
                self.cut_off += 1
            self.pending[sock] = None
        if oldest is not None:
            try:   # its thread's recv returns at once; that thread closes it
                oldest.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
        try:
            threading.Thread(target=self._run, args=(sock,), name=self.name, daemon=True).start()
        except RuntimeError:   # no thread to be had (interpreter exiting)
            self._done(sock)
            sock.close()

    def _done(self, sock: socket.socket) -> None:
        with self.lock:
            self.pending.pop(sock, None)

    def _run(self, sock: socket.socket) -> None:
        try:
            sock.setblocking(True)
            server_handshake(sock, self.token, timeout_s=self.timeout_s)
        except (AuthenticationError, OSError):
            sock.close()
            return
        finally:
            self._done(sock)
        self.on_ready(sock)
