"""Connections that carry frames (_protocol/wire.py) between two processes: a unix socket on one
machine, a TCP socket between machines.

    Connection.connect(address) --socket--> send(frames) / recv_into(buffer) -> feed()
        -> [(kind, message), ...]
    Connection.greet(address, hello) -> the connection and the head's HelloReply (a head
        going away mid-handshake, killed and started again, is tried again)
    Listener(address).accept() -> Connection          (an actor's worker takes calls)

An address is a filesystem path or ``unix:PATH`` for a unix socket, ``tcp:HOST:PORT`` or
``HOST:PORT`` for TCP. Everything above this module sees only Connection: which kind of
socket carries the bytes is decided here. A unix socket is made readable and writable by
its owner only (cloudpickle is code execution); TCP sets TCP_NODELAY, since frames are
small and latency-bound.
"""
from __future__ import annotations

import errno
import ipaddress
import os
import socket
import ssl
import threading
import time
from typing import TYPE_CHECKING, Any

from ..exceptions import ClusterLostError, OrchestraError
from . import wire as _wire
from .auth import HandshakeCut, cut_pause

if TYPE_CHECKING:
    from .auth import Gatekeeper


def parse_address(address: str) -> tuple[int, Any]:
    """(address family, socket address) of an address string; ValueError naming the
    forms accepted when it is none of them."""
    if address.startswith("unix:"):
        return socket.AF_UNIX, address[5:]
    if address.startswith("tcp:"):
        address = address[4:]
    elif address.startswith("/") or address.startswith(".") or ":" not in address:
        return socket.AF_UNIX, address
    host, sep, port = address.rpartition(":")
    if not sep or not port.isdigit() or not host:
        raise ValueError(f"bad address {address!r}: use a socket path, unix:PATH, "
                         "tcp:HOST:PORT or HOST:PORT")
    host = host.strip("[]")   # [::1]:6380
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    return family, (host, int(port))


def is_tcp(address: str | None) -> bool:
    """An address other machines may reach (TCP), not a unix socket's."""
    try:
        return parse_address(address or "")[0] != socket.AF_UNIX
    except ValueError:
        return False


def _authenticate(sock: socket.socket, address: str, token: str | None) -> Any:
    """The stream frames go over once ``sock`` has proven the token: itself, or a
    TlsChannel when the cluster speaks TLS (_protocol/tls.py)."""
    from .auth import connect_secure
    return connect_secure(sock, os.environ.get("ORCHESTRA_TOKEN", "") if token is None
                          else token, peer=address)


def parse_host(address: str) -> str:
    """The host part of a TCP address (HOST:PORT)."""
    family, target = parse_address(address)
    return target[0] if family != socket.AF_UNIX else "localhost"


def going_away(exc: BaseException) -> bool:
    """Whether ``exc`` is a peer going away mid-connection (reset, closed, no longer
    connected), as a head killed in the middle of a handshake is: worth trying again.
    A TLS stream cut short says so with ssl's own errors."""
    if isinstance(exc, OrchestraError):   # said already what it is (refused, out of time)
        return False
    return isinstance(exc, (ConnectionError, ssl.SSLEOFError, ssl.SSLZeroReturnError)) \
        or isinstance(exc, OSError) and exc.errno in (errno.ENOTCONN, errno.EPIPE)


def refuse_self_connect(s: socket.socket) -> None:
    """A TCP connect to a port of this machine where nothing listens may, when the kernel
    picks that very port as the socket's own, connect the socket to itself (TCP's
    simultaneous open): retried every 0.2 s while a head restarts, it then holds the
    head's port, and the head cannot listen there again. Such a socket is refused as
    the port's closed listener would have been (ConnectionRefusedError)."""
    if s.family in (socket.AF_INET, socket.AF_INET6) and s.getsockname() == s.getpeername():
        raise ConnectionRefusedError(111, "connected to itself: nothing listens there")


class Connection:
    """One stream socket, its frame decoder, and a lock that keeps writes whole."""

    __slots__ = ("sock", "fd", "decoder", "lock", "address")

    def __init__(self, sock: Any, address: str = "") -> None:
        self.sock = sock   # a socket, or a TlsChannel over one (same surface, same fd)
        self.fd = sock.fileno()
        self.decoder = _wire.FrameDecoder()
        self.lock = threading.Lock()
        self.address = address
        raw = getattr(sock, "sock", sock)
        if raw.family in (socket.AF_INET, socket.AF_INET6):
            raw.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)

    @classmethod
    def connect(cls, address: str, timeout_s: float, token: str | None = None) -> Connection:
        """Connect, retrying while the listener is not there yet (a process starting);
        ClusterLostError after ``timeout_s``. PermissionError (another user's socket)
        is raised as it is. Over TCP, authenticate first with ``token`` (default: the
        ORCHESTRA_TOKEN environment variable): AuthenticationError when refused; a
        handshake the server cut off before its verdict, or a connection reset as it
        was accepted (going_away), is tried again until then."""
        family, target = parse_address(address)
        deadline = time.monotonic() + timeout_s
        delay = 0.002
        cuts = 0
        while True:
            s = socket.socket(family, socket.SOCK_STREAM)
            try:
                s.connect(target)
                refuse_self_connect(s)
                return cls(s if family == socket.AF_UNIX else _authenticate(s, address, token),
                           address)
            except (FileNotFoundError, ConnectionRefusedError) as exc:
                s.close()
                if time.monotonic() > deadline:
                    raise ClusterLostError(
                        f"could not connect to {address} within {timeout_s:g} s: {exc}") from exc
            except HandshakeCut:
                # Cut off among too many handshakes at once (many processes starting
                # together): again, after a pause that grows with each cut (cut_pause).
                s.close()
                if time.monotonic() > deadline:
                    raise
                cuts += 1
                time.sleep(cut_pause(cuts))
                continue
            except OSError as exc:
                s.close()
                # Reset or gone before a word (ENOTCONN): a head going away as it
                # accepted (killed; its supervisor starts it again). Tried again.
                if not going_away(exc) or time.monotonic() > deadline:
                    raise
            except BaseException:
                s.close()
                raise
            time.sleep(delay)
            delay = min(delay * 2, 0.05)

    @classmethod
    def greet(cls, address: str, hello: bytes, timeout_s: float,
              token: str | None = None) -> tuple[Connection, Any, list[tuple[int, Any]]]:
        """Connect (as connect) and send ``hello`` (a HELLO frame): the connection, the
        head's HelloReply and the frames that came right after it. A head that closes
        the connection before its reply (going away: killed, and started again by its
        supervisor) is tried again until ``timeout_s``, as one not listening yet is.
        OrchestraError when the head refused (its reason); ClusterLostError when out of
        time or when the head says nothing within it."""
        deadline = time.monotonic() + timeout_s
        pause = 0.05   # doubled up to 0.5 s: many workers of a node wait for a head so
        while True:
            conn = cls.connect(address, max(deadline - time.monotonic(), 0.0), token)
            try:
                conn.sock.sendall(hello)
                reply, early = conn.hello_reply(max(deadline - time.monotonic(), 0.1))
                return conn, reply, early
            except BaseException as exc:
                conn.close()
                if not going_away(exc):   # refused, or silent past the deadline: said so
                    raise
                if time.monotonic() > deadline:
                    raise ClusterLostError("the head closed the connection during the "
                                           f"handshake ({exc})") from exc
            time.sleep(pause)
            pause = min(pause * 2, 0.5)

    def hello_reply(self, timeout_s: float) -> tuple[Any, list[tuple[int, Any]]]:
        """The head's answer to this side's Hello, and the frames it sent right after."""
        sock = self.sock
        sock.settimeout(timeout_s)
        try:
            while True:
                data = sock.recv(65536)
                if not data:   # (going_away: Connection.greet tries again)
                    raise ConnectionResetError("the head closed the connection")
                frames = self.feed(data)
                for i, (kind, msg) in enumerate(frames):
                    if kind == _wire.HELLO_REPLY:
                        sock.settimeout(None)
                        return msg, frames[i + 1:]
                    if kind == _wire.CLOSING:   # refused, and why
                        raise OrchestraError(f"the cluster refused this connection: {msg.reason}")
        except TimeoutError as exc:
            raise ClusterLostError(f"the head did not answer within {timeout_s:g} s") from exc

    @classmethod
    def connect_once(cls, address: str, token: str | None = None) -> Connection:
        """Connect without retrying (the peer listens already, or is gone): OSError."""
        family, target = parse_address(address)
        s = socket.socket(family, socket.SOCK_STREAM)
        try:
            s.connect(target)
            stream = s if family == socket.AF_UNIX else _authenticate(s, address, token)
        except BaseException:
            s.close()
            raise
        return cls(stream, address)

    def send(self, data: bytes) -> bool:
        """Write ``data`` whole; False when the connection is gone (its reader finds
        out and cleans up)."""
        with self.lock:
            try:
                self.sock.sendall(data)
                return True
            except OSError:
                return False

    def send_locked(self, data: bytes) -> None:
        """Write ``data`` whole, the caller holding ``lock``; OSError when gone."""
        self.sock.sendall(data)

    def recv_into(self, buf: bytearray) -> int:
        """Read what is there into ``buf``: the byte count, 0 when the peer closed."""
        try:
            return self.sock.recv_into(buf)
        except OSError:
            return 0

    def feed(self, data: bytes | bytearray | memoryview) -> list[tuple[int, Any]]:
        """The complete frames received so far (ProtocolError: not orchestra's)."""
        return self.decoder.feed(data)

    def shutdown(self) -> None:
        """End both directions now: a thread blocked reading wakes up to EOF."""
        try:
            self.sock.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass

    def close(self) -> None:
        try:
            self.sock.close()
        except OSError:
            pass


class Listener:
    """A listening socket whose connections carry frames (non-blocking accept).

    Over TCP each connection proves the cluster token before it is handed out, on a
    handshake thread of its own (_auth.Gatekeeper: bounded, at most a few at once), so
    the loop that polls ``fds`` never waits for a peer; proven connections are queued
    and the wake socket (one of ``fds``) becomes readable."""

    __slots__ = ("sock", "address", "token", "fds", "_gate", "_ready", "_wake_r", "_wake_w")

    def __init__(self, address: str, backlog: int = 128, token: str | None = None) -> None:
        family, target = parse_address(address)
        sock = socket.socket(family, socket.SOCK_STREAM)
        try:
            if family == socket.AF_UNIX:
                sock.bind(target)
                os.chmod(target, 0o600)   # this user only (cloudpickle is code execution)
            else:
                if not token and not ipaddress.ip_address(
                        socket.gethostbyname(target[0]) if family == socket.AF_INET
                        else target[0]).is_loopback:
                    # cloudpickle is code execution: a port reachable from other machines
                    # must authenticate every connection first, which this listener does not.
                    raise ValueError(f"refusing to listen on {address} without a cluster token: "
                                     "frames carry pickled code, so only loopback or a unix "
                                     "socket is allowed here")
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
                sock.bind(target)
            sock.listen(backlog)
        except BaseException:
            sock.close()
            raise
        sock.setblocking(False)
        self.sock = sock
        if family != socket.AF_UNIX and target[1] == 0:   # an ephemeral port: say which
            host = target[0]
            port = sock.getsockname()[1]
            address = f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
        self.address = address
        self.token = (os.environ.get("ORCHESTRA_TOKEN", "") if token is None else token) \
            if family != socket.AF_UNIX else None
        self._gate: Gatekeeper | None = None
        self._ready: list[socket.socket] = []
        self.fds: tuple[int, ...] = (sock.fileno(),)
        if self.token is not None:
            from .auth import Gatekeeper
            self._wake_r, self._wake_w = socket.socketpair()
            self._wake_r.setblocking(False)
            self._wake_w.setblocking(False)
            self._gate = Gatekeeper(self.token, self._proven, name="orchestra-direct-auth")
            self.fds = (sock.fileno(), self._wake_r.fileno())

    def fileno(self) -> int:
        return self.sock.fileno()

    def _proven(self, sock: socket.socket) -> None:
        """On a handshake thread: ``sock`` knows the token; queue it, wake the poller."""
        self._ready.append(sock)
        try:
            self._wake_w.send(b"x")
        except OSError:   # full (the poller has not drained it yet) or closed
            pass

    def accept(self) -> Connection | None:
        """A connection ready to carry frames, else None. Over TCP, one that has proven
        the token (the rest are handed to handshake threads as they come)."""
        if self._gate is None:
            try:
                sock, _ = self.sock.accept()
            except OSError:
                return None
            sock.setblocking(True)
            return Connection(sock, self.address)
        while True:
            try:
                sock, _ = self.sock.accept()
            except OSError:
                break
            self._gate.admit(sock)
        try:
            while self._wake_r.recv(4096):
                pass
        except OSError:
            pass
        if not self._ready:
            return None
        sock = self._ready.pop(0)   # (the caller takes them all: until None)
        sock.setblocking(True)
        return Connection(sock, self.address)

    def close(self) -> None:
        self.sock.close()
        if self._gate is not None:
            self._wake_r.close()
            self._wake_w.close()
            for sock in self._ready:
                sock.close()
            self._ready.clear()
