"""TLS between machines, with nothing to set up: the cluster's key comes from its token.

    token "tls-<48 hex>"  (printed by `orchestra start --head` for a cluster other
        machines reach; the prefix is what tells every process to speak TLS)
      -> seed = HKDF-SHA256(token, "orchestra cluster tls key")       (32 bytes)
      -> an ECDSA P-256 key and a self-signed certificate for it, signed
         deterministically (identity(): the same bytes on every machine; P-256 because
         browsers take it, for the dashboard's HTTPS)
    every server (the head's port, each node's data server, the workers' direct-call
        ports) presents that certificate; every client pins its public key: the peer's
        certificate must carry the key the token derives, else the connection is refused
        naming both fingerprints, before one byte of the client's is sent.

So the token alone joins a machine to the cluster (no certificate to copy, no CA), and
a server without the token cannot pose as the cluster: it cannot sign the handshake with
the derived key. Then the token handshake (_protocol/auth.py) runs inside the encrypted
channel with the channel's binding (tls-unique: the first Finished message, different
for every connection) in both MACs, so a relay that terminates TLS on each side cannot
pass one side's proof on to the other. Everyone who holds the token holds the key: the
same trust as before (the token already lets its holder run code on every node), and
TLS 1.3's ephemeral key exchange keeps recorded traffic unreadable even to a later
holder of the key.

A process given certificates of the user's own CA (_protocol/pki.py: --tls-cert,
--tls-key, --tls-ca) uses them instead of the derived key, both ways (mutual TLS, the
chain checked by OpenSSL in place of the pin); the token is proven in the channel all
the same. Contexts are made per call from what the environment names then (cached).

A token without the prefix (a cluster bound to loopback, or started with
``--insecure-no-tls``) keeps plain TCP: unix sockets and loopback-only clusters stay as
they were.

Three forms of a TLS connection, by who uses it:
  - TlsChannel: frames between processes (a driver's or worker's connection, direct
    calls). TLS driven through memory BIOs under a short lock of its own, so one thread
    may read while others write (an SSLSocket may not be read and written at once from
    two threads), and the socket's fd stays the one a poll loop watches.
  - an SSLSocket (server_socket/client_socket): bulk transfers between data servers,
    one request at a time on each connection.
  - asyncio's own TLS (server_context/client_context): the head's listener and a node's
    connection to the head.
"""
from __future__ import annotations

import functools
import hashlib
import hmac
import os
import socket
import ssl
import threading
import time
from typing import Any, cast

from ..exceptions import AuthenticationError
from . import pki
from .pki import fingerprint

PREFIX = "tls-"
# TLS records are at most 16 KiB of plaintext; a send is encrypted in pieces this large
# (bounded memory, large enough that the per-call cost vanishes).
_PIECE = 256 << 10
_HEADER = 5   # a TLS record's header: type, version, length (u16)
_TYPES = frozenset(range(20, 25))   # its content types (change_cipher_spec .. heartbeat)


def enabled(token: str | None) -> bool:
    """Whether the cluster of ``token`` speaks TLS."""
    return bool(token) and token.startswith(PREFIX)   # type: ignore[union-attr]


def is_loopback(host: str) -> bool:
    """Whether HOST (an address or "localhost") is this machine's loopback only."""
    import ipaddress
    try:
        return host == "localhost" or ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


def tls_token(token: str) -> str:
    """``token`` marked for TLS (kept as it is if marked already)."""
    return token if token.startswith(PREFIX) else PREFIX + token


def _seed(token: str) -> bytes:
    from cryptography.hazmat.primitives import hashes
    from cryptography.hazmat.primitives.kdf.hkdf import HKDF
    return HKDF(algorithm=hashes.SHA256(), length=32, salt=b"orchestra",
                info=b"orchestra cluster tls key").derive(token.encode())


# The name every client expects in the certificate (the key is what is pinned; gRPC
# checks a name as well).
SERVER_NAME = "orchestra"
# The order of P-256's group: the key is the seed taken into [1, n - 1].
_P256_N = 0xFFFFFFFF00000000FFFFFFFFFFFFFFFFBCE6FAADA7179E84F3B9CAC2FC632551


@functools.lru_cache(maxsize=8)
def identity(token: str) -> tuple[bytes, bytes, bytes]:
    """(certificate PEM, private key PEM, public key DER) of the cluster of ``token``."""
    import datetime

    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID
    scalar = int.from_bytes(_seed(token), "big") % (_P256_N - 1) + 1
    key = ec.derive_private_key(scalar, ec.SECP256R1())
    public = key.public_key().public_bytes(serialization.Encoding.DER,
                                           serialization.PublicFormat.SubjectPublicKeyInfo)
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "orchestra cluster")])
    cert = (x509.CertificateBuilder().subject_name(name).issuer_name(name)
            .public_key(key.public_key()).serial_number(int.from_bytes(public[-8:], "big") | 1)
            .not_valid_before(datetime.datetime(2000, 1, 1, tzinfo=datetime.timezone.utc))
            .not_valid_after(datetime.datetime(9999, 12, 31, tzinfo=datetime.timezone.utc))
            .add_extension(x509.SubjectAlternativeName([x509.DNSName(SERVER_NAME)]),
                           critical=False)
            .sign(key, hashes.SHA256(), ecdsa_deterministic=True))
    key_pem = key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                serialization.NoEncryption())
    return cert.public_bytes(serialization.Encoding.PEM), key_pem, public


def grpc_server_credentials(token: str) -> Any:
    """gRPC server credentials with the key of ``token`` (a gang's coordinator)."""
    import grpc
    cert, key, _ = identity(token)
    return grpc.ssl_server_credentials([(key, cert)])


def grpc_channel(address: str, token: str, options: list[tuple[str, Any]]) -> Any:
    """A gRPC channel to ``address`` that trusts only the key of ``token``."""
    import grpc
    creds = grpc.ssl_channel_credentials(root_certificates=identity(token)[0])
    return grpc.secure_channel(address, creds,
                               [*options, ("grpc.ssl_target_name_override", SERVER_NAME)])


def certificate_fingerprint(token: str) -> str:
    """The SHA-256 of the cluster's certificate as browsers show it (AB:CD:...): what
    to check before accepting the dashboard's certificate (this process's own on the
    user's certificates)."""
    own = pki.current()
    digest = own.cert_sha256 if own is not None else hashlib.sha256(
        ssl.PEM_cert_to_DER_cert(identity(token)[0].decode())).hexdigest()
    return ":".join(digest[i:i + 2] for i in range(0, len(digest), 2)).upper()


def cluster_fingerprint(token: str) -> str:
    return fingerprint(identity(token)[2])


def _memfile(data: bytes) -> int:
    fd = os.memfd_create("orchestra-tls", os.MFD_CLOEXEC)
    os.write(fd, data)
    return fd


def server_context(token: str, clients: bool = True) -> ssl.SSLContext:
    """A server's context: TLS 1.3 only, the cluster's certificate, no client
    certificate (a client proves the token in the channel instead), no session
    tickets (nothing but frames ever follows the handshake). On certificates of the
    user's own (_protocol/pki.py): theirs, and a client's of the CA required unless
    ``clients`` is False (the dashboard's browsers)."""
    own = pki.current()
    if own is not None:
        return _pki_server(own, clients)
    return _token_server(token)


@functools.lru_cache(maxsize=8)
def _pki_server(own: pki.Pki, clients: bool) -> ssl.SSLContext:
    return pki.server_context(own, clients)


@functools.lru_cache(maxsize=8)
def _pki_client(own: pki.Pki) -> ssl.SSLContext:
    return pki.client_context(own)


@functools.lru_cache(maxsize=8)
def _token_server(token: str) -> ssl.SSLContext:
    cert, key, _ = identity(token)
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    ctx.minimum_version = ssl.TLSVersion.TLSv1_3
    ctx.num_tickets = 0
    # The key never touches a disk: the context reads it from memory files.
    cert_fd, key_fd = _memfile(cert), _memfile(key)
    try:
        ctx.load_cert_chain(f"/proc/self/fd/{cert_fd}", f"/proc/self/fd/{key_fd}")
    finally:
        os.close(cert_fd)
        os.close(key_fd)
    return ctx


def client_context(token: str) -> ssl.SSLContext:
    """A client's context: TLS 1.3 only; the server's key is checked against the
    token's by check_peer() (a chain check would have nothing to add: one key is
    trusted, and TLS 1.3 makes the server sign the handshake with it). On the user's
    own certificates: the server's chained to their CA, this process's presented."""
    own = pki.current()
    if own is not None:
        return _pki_client(own)
    return _token_client(token)


@functools.lru_cache(maxsize=8)
def _token_client(token: str) -> ssl.SSLContext:
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    ctx.minimum_version = ssl.TLSVersion.TLSv1_3
    ctx.check_hostname = False
    ctx.verify_mode = ssl.CERT_NONE
    return ctx


def server_kwargs(token: str, handshake_s: float = 5.0,
                  clients: bool = True) -> dict[str, Any]:
    """loop.create_server()'s TLS arguments for the cluster of ``token`` ({} without
    TLS): a handshake not done in ``handshake_s`` is dropped (``clients``: as
    server_context's)."""
    if not enabled(token):
        return {}
    return {"ssl": server_context(token, clients), "ssl_handshake_timeout": handshake_s}


def check_peer(token: str, der: bytes | None, peer: str) -> None:
    """The server's certificate ``der`` carries the cluster's key; AuthenticationError
    naming both fingerprints otherwise."""
    if pki.current() is not None:
        return   # the chain to the user's CA was checked in the handshake
    from cryptography import x509
    from cryptography.hazmat.primitives import serialization
    want = identity(token)[2]
    got = b""
    if der:
        try:
            got = x509.load_der_x509_certificate(der).public_key().public_bytes(
                serialization.Encoding.DER, serialization.PublicFormat.SubjectPublicKeyInfo)
        except (ValueError, TypeError):
            got = hashlib.sha256(der).digest()   # not a key of ours: name the certificate
    if not hmac.compare_digest(got, want):
        theirs = fingerprint(got) if got else "none"
        raise AuthenticationError(
            f"the server at {peer} is not the cluster of this token: it presents the key "
            f"{theirs}, the token's cluster has {fingerprint(want)}. Check the address, or "
            "pass the token that `orchestra start --head` printed for that cluster (if that "
            "cluster runs on certificates of its own, give this process them too: "
            "--tls-cert/--tls-key/--tls-ca or ORCHESTRA_TLS_CERT/_KEY/_CA); nothing was sent "
            "to it")


def binding(obj: ssl.SSLObject | ssl.SSLSocket | None) -> bytes:
    """The channel binding both ends of a TLS connection share (b"" without TLS)."""
    if obj is None:
        return b""
    return obj.get_channel_binding("tls-unique") or b""


class NotTls(AuthenticationError):
    """The server answered TLS in the clear (auth.connect_secure: after a server that
    closed without a word, that one was going away)."""


def tls_error(exc: BaseException, peer: str, server_side: bool) -> AuthenticationError:
    text = str(exc)
    if not server_side and ("WRONG_VERSION_NUMBER" in text or "record layer failure" in text
                            or "packet length too long" in text):
        return NotTls(
            f"the server at {peer} does not speak TLS, and this token says the cluster does "
            "(it starts with 'tls-'): the cluster was started on loopback or with "
            "--insecure-no-tls; pass the token it printed")
    if isinstance(exc, ssl.SSLCertVerificationError) or "CERTIFICATE_VERIFY_FAILED" in text:
        own = pki.current()
        where = f"the server at {peer}" if not server_side else "a client"
        if own is not None:
            reason = getattr(exc, "verify_message", "") or text
            return AuthenticationError(
                f"{where} presents a certificate that does not chain to this process's CA "
                f"(--tls-ca {own.ca}, {own.ca_subject}): {reason}. Every machine of the "
                "cluster needs a certificate signed by the same CA; nothing was sent to it")
    if "CERTIFICATE_REQUIRED" in text or "certificate required" in text:
        return AuthenticationError(
            f"{peer or 'the server'} asks for a client certificate: that cluster runs on "
            "certificates of its own; give this process one of its CA with --tls-cert/"
            "--tls-key/--tls-ca (or ORCHESTRA_TLS_CERT/_KEY/_CA)")
    return AuthenticationError(f"the TLS handshake with {peer or 'a peer'} failed: {exc}")


class TlsChannel:
    """TLS over a blocking socket through memory BIOs (module docstring). Rule: the
    SSL object and its BIOs are touched only under ``_lock``, held for encrypting or
    decrypting, never across socket I/O. Writers are kept in order by the caller (a
    Connection's write lock): the bytes one sendall() encrypts are sent before another
    sendall() encrypts, since both run under that lock."""

    __slots__ = ("sock", "obj", "_in", "_out", "_lock", "_eof", "_raw")

    def __init__(self, sock: socket.socket, ctx: ssl.SSLContext, server_side: bool) -> None:
        self.sock = sock
        self._in = ssl.MemoryBIO()
        self._out = ssl.MemoryBIO()
        self.obj = ctx.wrap_bio(self._in, self._out, server_side=server_side)
        self._lock = threading.Lock()
        self._eof = False
        self._raw = bytearray()   # a record read in part (a timeout came first)

    def handshake(self, deadline: float, peer: str = "") -> None:
        server_side = self.obj.server_side
        old = self.sock.gettimeout()
        try:
            while True:
                try:
                    self.obj.do_handshake()
                    self._flush()
                    return
                except ssl.SSLWantReadError:
                    self._flush()
                left = deadline - time.monotonic()
                if left <= 0:
                    raise TimeoutError("the TLS handshake took too long")
                self.sock.settimeout(left)
                if not self._read_record():
                    raise ConnectionError("the peer closed the connection during the TLS "
                                          "handshake")
        except ssl.SSLError as exc:
            raise tls_error(exc, peer, server_side) from exc
        finally:
            self.sock.settimeout(old)

    def _read_record(self) -> bool:
        """Move one whole TLS record from the socket into the SSL object (False: the
        peer closed). Never more than one: what follows stays in the socket, where a
        poll loop watching the fd sees it (bytes held in a BIO would wait unseen). A
        timeout keeps the part read for the next call."""
        raw = self._raw
        while len(raw) < _HEADER or len(raw) < _HEADER + int.from_bytes(raw[3:_HEADER], "big"):
            if len(raw) >= _HEADER and (raw[0] not in _TYPES or raw[1] != 3):
                break   # no TLS record: the SSL object says so (a plain server's hello)
            need = _HEADER if len(raw) < _HEADER else \
                _HEADER + int.from_bytes(raw[3:_HEADER], "big")
            data = self.sock.recv(need - len(raw))
            if not data:
                return False
            raw += data
        with self._lock:
            self._in.write(bytes(raw))
        raw.clear()
        return True

    def _flush(self) -> None:
        data = self._out.read()
        if data:
            self.sock.sendall(data)

    def peer_der(self) -> bytes | None:
        return self.obj.getpeercert(binary_form=True)

    # -- the socket-like surface Connection and the handshakes use

    def fileno(self) -> int:
        return self.sock.fileno()

    def settimeout(self, t: float | None) -> None:
        self.sock.settimeout(t)

    def gettimeout(self) -> float | None:
        return self.sock.gettimeout()

    def setblocking(self, flag: bool) -> None:
        self.sock.setblocking(flag)

    def sendall(self, data: bytes | bytearray | memoryview, flags: int = 0) -> None:
        view = memoryview(data).cast("B")
        for start in range(0, len(view), _PIECE):
            with self._lock:
                self.obj.write(view[start:start + _PIECE])
                raw = self._out.read()
            self.sock.sendall(raw)

    def recv_into(self, buf: Any, nbytes: int = 0) -> int:
        """Plaintext into ``buf``: at least one byte, 0 at the end of the stream. Waits
        for the rest of a record whose start has come (its sender wrote it whole)."""
        size = nbytes or len(buf)
        while True:
            with self._lock:
                try:
                    return cast(int, self.obj.read(size, buf))   # with a buffer: a count
                except ssl.SSLWantReadError:
                    pass
                except (ssl.SSLZeroReturnError, ssl.SSLEOFError):
                    return 0
            if self._eof:
                return 0
            if not self._read_record():
                self._eof = True
                with self._lock:
                    self._in.write_eof()

    def recv(self, n: int) -> bytes:
        buf = bytearray(n)
        got = self.recv_into(buf, n)
        return bytes(buf[:got])

    def shutdown(self, how: int) -> None:
        self.sock.shutdown(how)

    def close(self) -> None:
        self.sock.close()


def client_channel(sock: socket.socket, token: str, deadline: float, peer: str) -> TlsChannel:
    """``sock`` (connected) as a TLS channel to the cluster's server, its key checked."""
    ch = TlsChannel(sock, client_context(token), server_side=False)
    ch.handshake(deadline, peer)
    check_peer(token, ch.peer_der(), peer)
    return ch


def server_channel(sock: socket.socket, token: str, deadline: float) -> TlsChannel:
    ch = TlsChannel(sock, server_context(token), server_side=True)
    ch.handshake(deadline)
    return ch


def client_socket(sock: socket.socket, token: str, timeout_s: float, peer: str) -> ssl.SSLSocket:
    """``sock`` (connected, blocking) wrapped for one-request-at-a-time use, the server's
    key checked."""
    sock.settimeout(timeout_s)
    try:
        wrapped = client_context(token).wrap_socket(sock)
    except ssl.SSLError as exc:
        raise tls_error(exc, peer, False) from exc
    try:
        check_peer(token, wrapped.getpeercert(binary_form=True), peer)
    except BaseException:
        wrapped.close()
        raise
    return wrapped


def server_socket(sock: socket.socket, token: str, timeout_s: float) -> ssl.SSLSocket:
    sock.settimeout(timeout_s)
    try:
        return server_context(token).wrap_socket(sock, server_side=True)
    except ssl.SSLError as exc:
        raise tls_error(exc, "", True) from None
