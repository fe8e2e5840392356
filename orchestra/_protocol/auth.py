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

The client opens with the magic and a version byte (so that a TLS server refuses a plain
client at once, instead of both waiting for the other). The token never crosses the wire; a recorded
exchange cannot be replayed (fresh nonces on both sides). Over TLS (a token starting
with "tls-", _protocol/tls.py) the exchange runs inside the encrypted channel, and both
MACs also cover the channel's binding, so a proof made for one TLS connection is worth
nothing on another: connect_secure()/accept_secure() do both steps.

Two forms of the server side: server_handshake() for blocking sockets (threads), and
AuthGate, an asyncio Protocol that hands the transport to the real protocol once the
client is proven (the head's TCP listener).
"""
from __future__ import annotations

import asyncio
import hashlib
import hmac
import random
import secrets
import socket
import ssl
import struct
import sys
import threading
import time
from collections.abc import Callable
from typing import Any

from ..exceptions import AuthenticationError

VERSION = "0.1.0"   # orchestra.__version__ (kept here: the head loads the package bare)
_MAGIC = b"ORCA"
# A client's first bytes: 5, a whole TLS record header's worth, so that a TLS server
# refuses a plain client at once instead of waiting for the header's last byte.
_OPENING = _MAGIC + b"\x01"
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


def _judge(token: str, nonce_s: bytes, answer: bytes, binding: bytes = b"") -> tuple[bytes, str]:
    """The server's reply to a client's answer (after its opening magic), and why it
    refused ("" when accepted)."""
    magic, nonce_c, mac, vlen = _CLIENT_ANSWER.unpack_from(answer)
    version = answer[_CLIENT_ANSWER.size:_CLIENT_ANSWER.size + vlen]
    if magic != _MAGIC:
        return b"", "not an orchestra client"
    good = hmac.compare_digest(mac, _mac(token, b"client", nonce_s, nonce_c, version, binding))
    if not good:
        text = ("wrong cluster token: pass the token that `orchestra start --head` printed "
                "(token= or the ORCHESTRA_TOKEN environment variable)")
        return _BAD_TOKEN + text.encode(), "wrong token"
    theirs = version.decode(errors="replace")
    if theirs != VERSION:
        text = (f"version mismatch: the cluster runs orchestra {VERSION}, this process "
                f"orchestra {theirs}; install the same version on every machine")
        return _BAD_VERSION + text.encode(), f"orchestra {theirs} (this is {VERSION})"
    return _OK + _mac(token, b"server", nonce_c, nonce_s, binding), ""


def _recv_exact(sock: Any, n: int, deadline: float | None = None) -> bytes:
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


def _hello_size(head: bytes, where: str) -> int:
    """The whole server hello's size, from its fixed part ``head``."""
    magic, _, vlen = _SERVER_HELLO.unpack_from(head)
    if magic != _MAGIC:
        raise AuthenticationError(f"the server{where} is not an orchestra cluster")
    return _SERVER_HELLO.size + vlen


def _answer(token: str, hello: bytes, where: str,
            binding: bytes) -> tuple[bytes, tuple[bytes, bytes]]:
    """The client's answer to a whole server hello, and the (client, server) nonces."""
    _, nonce_s, _ = _SERVER_HELLO.unpack_from(hello)
    server_version = hello[_SERVER_HELLO.size:].decode(errors="replace")
    if server_version != VERSION:
        raise AuthenticationError(
            f"version mismatch: the cluster{where} runs orchestra {server_version}, "
            f"this process orchestra {VERSION}; install the same version on every machine")
    nonce_c = secrets.token_bytes(_NONCE)
    v = VERSION.encode()
    answer = _CLIENT_ANSWER.pack(_MAGIC, nonce_c,
                                 _mac(token, b"client", nonce_s, nonce_c, v, binding), len(v)) + v
    return answer, (nonce_c, nonce_s)


def _check_server(token: str, mac: bytes, nonces: tuple[bytes, bytes], binding: bytes,
                  where: str) -> None:
    if not hmac.compare_digest(mac, _mac(token, b"server", *nonces, binding)):
        raise AuthenticationError(f"the server{where} does not know the cluster token: "
                                  "it is not the cluster you meant to reach")


def client_handshake(sock: Any, token: str, *, timeout_s: float = DEFAULT_TIMEOUT_S,
                     peer: str = "", binding: bytes = b"") -> None:
    """Prove the token to the server at the other end of ``sock`` (blocking; a socket
    or a TLS stream whose ``binding`` is given), and check the server knows it too.
    AuthenticationError names why it was refused."""
    where = f" at {peer}" if peer else ""
    if not token:
        raise AuthenticationError(
            f"the cluster{where} needs its token: pass token=... to orchestra.init() or set "
            "ORCHESTRA_TOKEN (`orchestra start --head` printed it)")
    old = sock.gettimeout()
    sock.settimeout(timeout_s)
    try:
        sock.sendall(_OPENING)
        try:
            first = sock.recv(1)
        except ConnectionResetError:
            first = b""
        if not first and not binding:
            # Every orchestra server that is not TLS says hello first: this one closed
            # without a word, as a TLS server does when spoken to in the clear.
            raise NoHello(f"the server{where} closed the connection without a word: it "
                          "speaks TLS, or it is going away")
        head = first + _recv_exact(sock, _SERVER_HELLO.size - len(first))
        head += _recv_exact(sock, _hello_size(head, where) - len(head))
        answer, nonces = _answer(token, head, where, binding)
        sock.sendall(answer)
        verdict = sock.recv(1)
        if verdict == _OK:
            _check_server(token, _recv_exact(sock, _MAC), nonces, binding, where)
            return
        text = b""
        while verdict:
            text += verdict
            verdict = sock.recv(4096)
        if not text:
            raise HandshakeCut(f"the cluster{where} closed this connection before its "
                               "verdict (too many handshakes at once there, or going away)")
        reason = text[1:].decode(errors="replace")
        raise AuthenticationError(f"the cluster{where} refused this connection: {reason}")
    except TimeoutError as exc:
        raise AuthenticationError(f"the server{where} did not complete authentication within "
                                  f"{timeout_s:g} s: is it an orchestra cluster?") from exc
    except ConnectionError as exc:
        raise HandshakeCut(f"the server{where} closed the connection during "
                           f"authentication: {exc}") from exc
    finally:
        try:
            sock.settimeout(old)
        except OSError:
            pass


class NoHello(AuthenticationError):
    """A server closed the connection before its hello (connect_secure then tries TLS)."""


class HandshakeCut(AuthenticationError):
    """The server closed the connection after its hello and before its verdict. A
    server that has more handshakes going than MAX_UNAUTHENTICATED cuts its oldest off,
    so a burst of callers (a cluster's nodes and workers starting together) sees this:
    the caller may try again (Connection.connect does, until its deadline)."""


def cut_pause(cuts: int) -> float:
    """Seconds to wait before trying again a handshake cut off ``cuts`` times in a row:
    up to 10 ms doubled per cut (at most 2 s), drawn at random, so that a burst of
    callers larger than the server's cap thins out below it instead of cutting each
    other off for good."""
    # (A jitter, not a secret: the random module's generator, reseeded in a forked child.)
    return random.uniform(0.0, min(2.0, 0.01 * 2 ** min(cuts, 10)))


# Tokens without the "tls-" mark whose cluster was found to speak TLS (a token chosen by
# its user, which the head marked): connections with them go to TLS at once. Any thread
# adds and reads (one set operation each).
_TLS_CLUSTERS: set[str] = set()


def speaks_tls(token: str | None) -> bool:
    """Whether the cluster of ``token`` speaks TLS (marked, or found to by a connection)."""
    from . import tls
    return tls.enabled(token) or token in _TLS_CLUSTERS


def server_handshake(sock: Any, token: str, *, timeout_s: float = HANDSHAKE_S,
                     binding: bytes = b"", deadline: float | None = None) -> None:
    """Check the client at the other end of ``sock`` knows the token (blocking), all of
    it within ``timeout_s`` (or by ``deadline``); AuthenticationError (the client was
    told why, and should be closed) otherwise."""
    old = sock.gettimeout()
    if deadline is None:
        deadline = time.monotonic() + timeout_s
    sock.settimeout(max(0.001, deadline - time.monotonic()))
    try:
        nonce_s = secrets.token_bytes(_NONCE)
        sock.sendall(_server_hello(nonce_s))
        if _recv_exact(sock, len(_OPENING), deadline) != _OPENING:
            raise AuthenticationError("refused a connection: not an orchestra client (or one "
                                      "that speaks TLS to a cluster that does not)")
        answer = _recv_exact(sock, _CLIENT_ANSWER.size, deadline)
        vlen = answer[-1]
        answer += _recv_exact(sock, vlen, deadline)
        reply, why = _judge(token, nonce_s, answer, binding)
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


class AuthClient(asyncio.Protocol):
    """The client's side of the handshake on an asyncio connection (a node joining the
    head over TLS): checks the server's key, proves the token with the channel's
    binding, then hands the transport to ``then``. ``done``: None, or the
    AuthenticationError that ended it (the transport is then closed)."""

    def __init__(self, token: str, peer: str, then: asyncio.Protocol,
                 loop: asyncio.AbstractEventLoop) -> None:
        self.token = token
        self.where = f" at {peer}"
        self.peer = peer
        self.then = then
        self.done: asyncio.Future[None] = loop.create_future()
        self.transport: Any = None
        self.binding = b""
        self.buf = b""
        self.nonces: tuple[bytes, bytes] | None = None

    def _fail(self, exc: AuthenticationError) -> None:
        if not self.done.done():
            self.done.set_exception(exc)
        if self.transport is not None:
            self.transport.abort()

    def connection_made(self, transport: Any) -> None:
        from . import tls
        self.transport = transport
        obj = transport.get_extra_info("ssl_object")
        try:
            if obj is not None:
                tls.check_peer(self.token, obj.getpeercert(binary_form=True), self.peer)
                self.binding = tls.binding(obj)
        except AuthenticationError as exc:
            self._fail(exc)
            return
        transport.write(_OPENING)

    def data_received(self, data: bytes) -> None:
        if self.done.done():
            return
        self.buf += data
        try:
            if self.nonces is None:
                if len(self.buf) < _SERVER_HELLO.size or \
                        len(self.buf) < _hello_size(self.buf, self.where):
                    return
                size = _hello_size(self.buf, self.where)
                answer, self.nonces = _answer(self.token, self.buf[:size], self.where,
                                              self.binding)
                self.buf = self.buf[size:]
                self.transport.write(answer)
            if not self.buf or self.buf[:1] == _OK and len(self.buf) < 1 + _MAC:
                return
            if self.buf[:1] != _OK:
                return   # a refusal: its text comes until the server closes
            _check_server(self.token, self.buf[1:1 + _MAC], self.nonces, self.binding,
                          self.where)
        except AuthenticationError as exc:
            self._fail(exc)
            return
        rest, self.buf = self.buf[1 + _MAC:], b""
        self.done.set_result(None)
        self.transport.set_protocol(self.then)
        self.then.connection_made(self.transport)
        if rest:
            self.then.data_received(rest)

    def eof_received(self) -> bool:
        return False

    def connection_lost(self, exc: BaseException | None) -> None:
        if not self.done.done():
            if not self.buf:   # no verdict: cut off (a burst there), or going away
                self.done.set_exception(HandshakeCut(
                    f"the cluster{self.where} closed this connection before its verdict "
                    f"({exc or 'by the server'})"))
                return
            reason = self.buf[1:].decode(errors="replace")
            self.done.set_exception(AuthenticationError(
                f"the cluster{self.where} refused this connection: {reason}"))


async def join_async(loop: asyncio.AbstractEventLoop, sock: socket.socket, token: str,
                     peer: str, then: asyncio.Protocol, timeout_s: float = 10.0) -> None:
    """Over ``sock`` (connected, non-blocking): TLS, the server's key checked, the
    token proven inside the channel, then the connection is ``then``'s.
    AuthenticationError names why it failed, within ``timeout_s``."""
    from . import tls
    gate = AuthClient(token, peer, then, loop)
    try:
        await asyncio.wait_for(loop.create_connection(
            lambda: gate, sock=sock, ssl=tls.client_context(token), server_hostname=tls.SERVER_NAME,
            ssl_handshake_timeout=timeout_s), timeout_s)
        await asyncio.wait_for(gate.done, timeout_s)
    except ssl.SSLEOFError as exc:   # the server closed it within the TLS handshake
        raise HandshakeCut(f"the head at {peer} closed the connection during the TLS "
                           f"handshake: {exc}") from exc
    except ssl.SSLError as exc:
        raise tls.tls_error(exc, peer, False) from exc
    except ConnectionError as exc:
        raise HandshakeCut(f"the head at {peer} closed the connection during the TLS "
                           f"handshake: {exc}") from exc
    except asyncio.TimeoutError:
        raise AuthenticationError(f"the head at {peer} did not complete the TLS handshake "
                                  f"and authentication within {timeout_s:g} s") from None


def server_tls(token: str, host: str = "") -> dict[str, Any]:
    """loop.create_server()'s arguments for an AuthGate listener on ``host``: none (an
    AuthGate starts TLS itself when the token says so, its handshake counted against
    the listener's cap); a cluster without TLS beyond loopback is said on stderr."""
    from .tls import enabled, is_loopback
    if not enabled(token) and host and not is_loopback(host):
        print(f"orchestra: WARNING: {host} is reached by other machines and this cluster "
              "does not encrypt its connections (--insecure-no-tls)", file=sys.stderr)
    return {}


def _step(coro: Any, done: Callable[[Any, BaseException | None], None]) -> None:
    """Run ``coro`` to its end as a Task would, its first step now: ``done(result,
    error)`` once it ended. (start_tls swaps the connection's protocol in its first
    step; run as a Task, that step comes a turn of the loop later, and uvloop may read
    the ClientHello into the old protocol first.)"""
    try:
        waiting = coro.send(None)
    except StopIteration as end:
        done(end.value, None)
        return
    except BaseException as exc:  # noqa: BLE001 - handed to done
        done(None, exc)
        return
    waiting.add_done_callback(lambda _: _step(coro, done))


class AuthGate(asyncio.Protocol):
    """An asyncio Protocol that authenticates a connection, then hands its transport to
    ``make_protocol(transport)`` (a Protocol to which the bytes that followed the
    handshake are fed). A client that fails, or is silent for ``timeout_s``, is closed
    and nothing it sent is decoded. ``prove=False`` (the dashboard's HTTPS: its
    requests carry the token): the TLS handshake alone, under the same cap and time
    limit, no client certificate asked for."""

    def __init__(self, token: str, loop: asyncio.AbstractEventLoop,
                 make_protocol: Callable[[Any], Any],
                 timeout_s: float = HANDSHAKE_S, what: str = "orchestra",
                 pending: dict[AuthGate, None] | None = None, prove: bool = True) -> None:
        self.token = token
        self.prove = prove
        # Shared by a listener's gates: those handshaking, oldest first; a new one
        # beyond MAX_UNAUTHENTICATED cuts the oldest off (as Gatekeeper does).
        self.pending: dict[AuthGate, None] = pending if pending is not None else {}
        self.loop = loop
        self.make_protocol = make_protocol
        self.timeout_s = timeout_s
        self.what = what
        self.transport: Any = None
        self.binding = b""
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
        # One time limit and one cap for all of it: the TLS handshake, then the token's.
        self._timer = self.loop.call_later(self.timeout_s, self._too_slow)
        from . import tls
        if not tls.enabled(self.token):
            transport.write(_server_hello(self.nonce))
            return
        _step(self.loop.start_tls(transport, self, tls.server_context(self.token, self.prove),
                                  server_side=True, ssl_handshake_timeout=self.timeout_s),
              self._tls_started)

    def _tls_started(self, secure: Any, error: BaseException | None) -> None:
        """The TLS handshake ended: the server's hello inside it, or the end."""
        if error is not None or secure is None or self.done:   # failed, or cut off
            if secure is not None:
                secure.abort()
            self._too_slow()
            return
        from . import tls
        self.transport = secure
        if not self.prove:
            self._hand_over(b"")
            return
        self.binding = tls.binding(secure.get_extra_info("ssl_object"))
        secure.write(_server_hello(self.nonce))

    def _hand_over(self, rest: bytes) -> None:
        """The connection is ``make_protocol``'s from here on (``rest``: what followed)."""
        self._settled()
        if self._timer is not None:
            self._timer.cancel()
        proto = self.make_protocol(self.transport)
        self.transport.set_protocol(proto)
        proto.connection_made(self.transport)
        if rest:
            proto.data_received(rest)

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
        opening = len(_OPENING)
        if len(self.buf) < opening + _CLIENT_ANSWER.size:
            if self.buf[:opening] != _OPENING[:len(self.buf)]:
                self._too_slow()   # not an orchestra client: drop it now
            return
        need = opening + _CLIENT_ANSWER.size + self.buf[opening + _CLIENT_ANSWER.size - 1]
        if len(self.buf) < need:
            return
        answer, rest = self.buf[opening:need], self.buf[need:]
        self.buf = b""
        self._settled()
        if self._timer is not None:
            self._timer.cancel()
        reply, why = _judge(self.token, self.nonce, answer, self.binding)
        if why:
            peer = self.transport.get_extra_info("peername")
            print(f"{self.what}: refused a connection from {peer}: {why}", file=sys.stderr)
            if reply:
                self.transport.write(reply)
            self.transport.close()
            return
        self.transport.write(reply)
        self._hand_over(rest)

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

    def __init__(self, token: str, on_ready: Callable[[Any], None], *,
                 timeout_s: float = HANDSHAKE_S, limit: int = MAX_UNAUTHENTICATED,
                 name: str = "orchestra-auth", bulk: bool = False) -> None:
        self.token = token
        self.bulk = bulk   # accept_secure's: the stream a proven peer is handed as
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
            stream = accept_secure(sock, self.token, timeout_s=self.timeout_s, bulk=self.bulk)
        except (AuthenticationError, OSError):
            sock.close()
            return
        finally:
            self._done(sock)
        self.on_ready(stream)


def _no_delay(sock: socket.socket) -> None:
    """TCP_NODELAY from the first byte: a handshake is several small writes in turn,
    which Nagle's algorithm and delayed ACKs held ~40 ms each (a TLS connection took
    44 ms to set up on loopback instead of 3)."""
    if sock.family in (socket.AF_INET, socket.AF_INET6):
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)


def connect_secure(sock: socket.socket, token: str, *, timeout_s: float = DEFAULT_TIMEOUT_S,
                   peer: str = "", bulk: bool = False) -> Any:
    """The client's side of a connection between machines (``sock`` connected,
    blocking): TLS when ``token`` says so, the server's key checked, then the token
    handshake. The stream to use from then on: ``sock`` itself without TLS, else a
    TlsChannel (frames; one reader and many writers) or, with ``bulk``, an SSLSocket
    (one request at a time). AuthenticationError names why it failed; the caller
    closes ``sock``."""
    from . import tls
    _no_delay(sock)
    if token in _TLS_CLUSTERS:
        token = tls.tls_token(token)
    if not tls.enabled(token):
        try:
            target = sock.getpeername()[:2]
        except OSError as exc:   # reset already: a server going away as it accepted
            raise HandshakeCut(f"the server at {peer} went away as it accepted ({exc})") from exc
        try:
            client_handshake(sock, token, timeout_s=timeout_s, peer=peer)
            return sock
        except NoHello as silent:
            # A head reached by other machines speaks TLS, its key made from the token
            # it was given with the mark added: the same key is found here, and pinned.
            again = socket.create_connection(target, timeout=timeout_s)
            try:
                stream = connect_secure(again, tls.tls_token(token), timeout_s=timeout_s,
                                        peer=peer, bulk=bulk)
            except tls.NotTls as exc:
                again.close()
                # Not TLS either: the server was going away (a head killed, started
                # again in the clear): the caller tries again (HandshakeCut).
                raise HandshakeCut(f"{silent}; and it does not speak TLS") from exc
            except BaseException:
                again.close()
                raise
            _TLS_CLUSTERS.add(token)
            sock.close()
            return stream
    try:
        if bulk:
            stream = tls.client_socket(sock, token, timeout_s, peer)
            bound = tls.binding(stream)
        else:
            stream = tls.client_channel(sock, token, time.monotonic() + timeout_s, peer)
            bound = tls.binding(stream.obj)
    except TimeoutError as exc:
        raise AuthenticationError(f"the server at {peer} did not complete the TLS handshake "
                                  f"within {timeout_s:g} s: is it an orchestra cluster?") from exc
    except ConnectionError as exc:
        raise HandshakeCut(f"the server at {peer} closed the connection during the TLS "
                           f"handshake: {exc}") from exc
    client_handshake(stream, token, timeout_s=timeout_s, peer=peer, binding=bound)
    return stream


def accept_secure(sock: socket.socket, token: str, *, timeout_s: float = HANDSHAKE_S,
                  bulk: bool = False) -> Any:
    """The server's side (``sock`` accepted, blocking): TLS when ``token`` says so,
    then the token handshake, all within ``timeout_s``. The stream to use, as
    connect_secure's; AuthenticationError (close ``sock``) otherwise."""
    from . import tls
    _no_delay(sock)
    deadline = time.monotonic() + timeout_s
    if token in _TLS_CLUSTERS:
        # This process found its cluster speaks TLS (connect_secure): it serves TLS too.
        # A joined node's workers, given the token without the mark, took the token
        # without TLS, and every caller of theirs from another node was refused.
        token = tls.tls_token(token)
    if not tls.enabled(token):
        server_handshake(sock, token, deadline=deadline)
        return sock
    try:
        if bulk:
            stream: Any = tls.server_socket(sock, token, timeout_s)
            bound = tls.binding(stream)
        else:
            stream = tls.server_channel(sock, token, deadline)
            bound = tls.binding(stream.obj)
    except (TimeoutError, ConnectionError, OSError) as exc:
        if isinstance(exc, AuthenticationError):
            raise
        raise AuthenticationError(f"a connection did not complete the TLS handshake: "
                                  f"{exc}") from exc
    server_handshake(stream, token, binding=bound, deadline=deadline)
    return stream
