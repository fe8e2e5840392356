"""Moving an object's bytes from one node's store to another's, over TCP.

    puller (Node.pull, on a worker thread)           source node (DataServer threads)
    Fetcher.fetch(address, token, key, size, dest)   accept thread -> one thread per connection
      a pooled connection to ``address``,              server_handshake(token) before any
      authenticated once (client_handshake)            other byte is read, then keep-alive:
      REQUEST: key length, offset, size, key  ---->    resolve(key) -> (file, size, start) | None
                                              <----    REPLY: status, length
      recv_into(dest) straight into the map            OK: ``length`` bytes of the file, sent
      (no intermediate bytes object)                   by os.sendfile (tmpfs / page cache ->
                                                       socket in the kernel, no copy through
                                                       Python); ERROR: ``length`` bytes of text,
                                                       the connection stays usable

Who owns what: the DataServer owns its listening socket, its connections and their
threads (close() shuts them down, a transfer in flight then fails at the fetcher with
a short read). A Fetcher owns its idle connections (close() closes them); a connection
is lent to one fetch at a time and goes back to the pool only after a complete reply.

What may be read: only what ``resolve`` names. The node's resolve answers segment names
of its own store and paths of its own spill files, nothing else, so a request for any
other path (``/etc/passwd``, ``../x``) gets an error reply. The source must keep the
object alive while a pull reads it (the scheduler holds its reference until the puller
answers): the server reads the file as it is.

Never a hang: connecting, the handshake and every send or receive have a timeout (a
stall of ``timeout_s`` fails the fetch with ObjectLostError naming the node); the
server's idle connections wait for their next request with TCP keep-alive on.

Measured on 2 cores (tools/transfer_bench.py, 200 MiB from a tmpfs file into a mapped
segment): see "Between nodes" in docs/objects.md. One stream per object,
two streams for a large object from another host (see _STREAMS below).
"""
from __future__ import annotations

import errno
import mmap
import os
import socket
import ssl
import stat
import struct
import threading
from collections.abc import Callable

from ..exceptions import AuthenticationError, ObjectLostError
from .pages import map_length

# Request: key length (u16), offset (u64), size (u64), then the key (utf-8).
_REQUEST = struct.Struct("!HQQ")
# Reply: status (u8), length (u64), then ``length`` bytes of data or of error text.
_REPLY = struct.Struct("!BQ")
_OK, _ERROR = 0, 1
_MAX_KEY = 4096
_SENDFILE_CHUNK = 1 << 30
_TLS_PIECE = 4 << 20   # one write of a TLS send: many records, few calls
_CONNECT_TIMEOUT_S = 10.0
# A transfer that makes no progress for this long fails (the peer froze, or the network
# between the nodes broke without a FIN).
_STALL_TIMEOUT_S = 30.0
_BUFFER = 4 << 20    # socket buffers: a 200 MiB object at full speed needs no more
# Objects this large are fetched as 2 ranges over 2 connections at once, unless the
# source is on loopback. 200 MiB, 2 cores (tools/transfer_bench.py, medians of 7): between
# two network namespaces (veth) 1 stream 2.6 GB/s, 2 streams 2.8-3.3, 4 streams 3.2 (the
# receive path of one veth stream is bound to one core's softirq); over loopback
# 1 stream 3.6-4.0 GB/s, 2 streams 3.2-3.4 (both ends already use both cores).
_PARALLEL_MIN = 64 << 20
_STREAMS = 2
# Over TLS a stream costs a core at each end (AES-GCM by OpenSSL, which drops the GIL:
# 1 GB/s a stream over loopback on 2 cores, where encrypting on 2 threads at once ran
# 2.4x one), so a large object comes over as many streams as there are cores, up to 4.
_TLS_STREAMS = max(_STREAMS, min(4, os.cpu_count() or 1))


def parse_address(address: str) -> tuple[str, int]:
    """'HOST:PORT' (or '[V6]:PORT') -> (host, port); ValueError naming the address."""
    host, sep, port = address.rpartition(":")
    if not sep or not host or not port.isdigit():
        raise ValueError(f"bad data server address {address!r}: expected HOST:PORT")
    return host.strip("[]"), int(port)


def _is_loopback(address: str) -> bool:
    host = address.rpartition(":")[0].strip("[]")
    return host in ("localhost", "::1") or host.startswith("127.")


def _set_timeouts(sock: socket.socket, timeout_s: float) -> None:
    """Blocking socket with the kernel's own send and receive timeouts: a receive with
    MSG_WAITALL then fills a whole buffer in one call, and a stall still ends."""
    sock.settimeout(None)
    tv = struct.pack("ll", int(timeout_s), int((timeout_s % 1) * 1e6))
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVTIMEO, tv)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDTIMEO, tv)


def _tune(sock: socket.socket) -> None:
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE, 1)


def _recv_exact(sock: socket.socket, view: memoryview) -> int:
    """Fill ``view`` from the socket; the bytes received (fewer: the peer closed).
    BlockingIOError: nothing came for the socket's receive timeout."""
    n, got = len(view), 0
    # TLS: a record at a time (an SSLSocket takes no flags; its records are decrypted
    # straight into ``view``).
    flags = 0 if isinstance(sock, ssl.SSLSocket) else socket.MSG_WAITALL
    while got < n:
        k = sock.recv_into(view[got:], n - got, flags)
        if k == 0:
            break
        got += k
    return got


def _send_mapped(sock: socket.socket, fd: int, offset: int, size: int) -> bool:
    """Send ``size`` bytes of the file from ``offset`` from a map of it, in large
    writes: over TLS (sendfile cannot encrypt), or from a hugetlbfs file (sendfile
    cannot read one; mapped from its start, as its maps begin on a huge page)."""
    if not size:
        return True
    start = offset - offset % mmap.ALLOCATIONGRANULARITY
    if not isinstance(sock, ssl.SSLSocket):
        start = 0
    with mmap.mmap(fd, map_length(fd, offset + size - start), prot=mmap.PROT_READ,
                   offset=start) as m:
        view = memoryview(m)
        try:
            for at in range(offset - start, offset - start + size, _TLS_PIECE):
                sock.sendall(view[at:min(at + _TLS_PIECE, offset - start + size)])
        finally:
            view.release()
    return True


# ---------------------------------------------------------------- server


class DataServer:
    """Serves files that ``resolve`` names to authenticated peers (module docstring)."""

    def __init__(self, host: str, token: str,
                 resolve: Callable[[str], tuple[str, int, int] | None], *, port: int = 0,
                 timeout_s: float = _STALL_TIMEOUT_S) -> None:
        self.token = token
        self.resolve = resolve
        self.timeout_s = timeout_s
        family = socket.AF_INET6 if ":" in host.strip("[]") else socket.AF_INET
        self.listener = socket.socket(family, socket.SOCK_STREAM)
        self.listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self.listener.bind((host.strip("[]"), port))
        self.listener.listen(64)
        bound_host, bound_port = self.listener.getsockname()[:2]
        self.address = (f"[{bound_host}]:{bound_port}" if family == socket.AF_INET6
                        else f"{bound_host}:{bound_port}")
        self.closed = False
        self._lock = threading.Lock()
        self._conns: set[socket.socket] = set()
        # Each peer proves the token on a thread of its own, bounded as a whole; silent
        # peers cannot crowd out a real one (_auth.Gatekeeper).
        from .._protocol.auth import Gatekeeper
        self._gate = Gatekeeper(token, self._serve, name="orchestra-data-conn", bulk=True)
        self._thread = threading.Thread(target=self._accept_loop, name="orchestra-data-accept",
                                        daemon=True)
        self._thread.start()

    def _accept_loop(self) -> None:
        while not self.closed:
            try:
                sock, _ = self.listener.accept()
            except OSError:
                return   # close() shut the listener down
            if self.closed:
                sock.close()
                return
            self._gate.admit(sock)

    def _serve(self, sock: socket.socket) -> None:
        """One peer, proven (on its handshake's thread): answer its requests until it
        closes."""
        with self._lock:
            if self.closed:
                sock.close()
                return
            self._conns.add(sock)
        try:
            _tune(sock)
            _set_timeouts(sock, self.timeout_s)
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, _BUFFER)
            # An idle connection waits for its next request as long as the peer lives.
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVTIMEO, struct.pack("ll", 0, 0))
            head = bytearray(_REQUEST.size)
            while not self.closed:
                if _recv_exact(sock, memoryview(head)) < len(head):
                    return   # the peer closed between requests: the usual end
                klen, offset, size = _REQUEST.unpack(head)
                if klen > _MAX_KEY:
                    return   # not our peer's protocol: drop it
                key = bytearray(klen)
                if _recv_exact(sock, memoryview(key)) < klen:
                    return
                if not self._answer(sock, key.decode("utf-8", "replace"), offset, size):
                    return
        except Exception:   # noqa: BLE001 - a refused or broken peer ends its connection only
            return
        finally:
            with self._lock:
                self._conns.discard(sock)
            sock.close()

    def _answer(self, sock: socket.socket, key: str, offset: int, size: int) -> bool:
        """Send the bytes asked for, or an error reply; False when the connection must
        close (the file shrank mid-send, the peer went)."""
        found = self.resolve(key)
        if found is None:
            return self._error(sock, f"no object stored under {key!r} here (freed, moved, "
                                     "or not a key of this node)")
        # The object is ``have`` bytes from ``start`` of the file (a slot's place in its
        # slab, else 0); ``offset`` counts from there.
        path, have, start = found
        if offset + size > have:
            return self._error(sock, f"asked for bytes {offset}..{offset + size} of {key!r}, "
                                     f"which has {have}")
        offset += start
        try:
            fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
        except OSError as exc:
            return self._error(sock, f"cannot open {key!r} ({exc.strerror}): the object "
                                     "was freed or moved")
        try:
            st = os.fstat(fd)
            if not stat.S_ISREG(st.st_mode) or st.st_size < offset + size:
                return self._error(sock, f"{key!r} is not a complete file here "
                                         f"({st.st_size} bytes)")
            if isinstance(sock, ssl.SSLSocket):
                sock.sendall(_REPLY.pack(_OK, size))
                return _send_mapped(sock, fd, offset, size)
            sock.sendall(_REPLY.pack(_OK, size), socket.MSG_MORE if size else 0)
            sent = 0
            while sent < size:
                try:
                    n = os.sendfile(sock.fileno(), fd, offset + sent,
                                    min(size - sent, _SENDFILE_CHUNK))
                except OSError as exc:
                    if exc.errno != errno.EINVAL or sent:
                        raise
                    return _send_mapped(sock, fd, offset, size)   # a hugetlbfs file
                if n <= 0:
                    return False   # the file shrank: the peer sees a short read
                sent += n
            return True
        finally:
            os.close(fd)

    def _error(self, sock: socket.socket, text: str) -> bool:
        body = text.encode()
        sock.sendall(_REPLY.pack(_ERROR, len(body)) + body)
        return True

    def close(self) -> None:
        """Stop accepting and end every connection (a transfer in flight fails)."""
        with self._lock:
            if self.closed:
                return
            self.closed = True
            conns = list(self._conns)
        try:
            self.listener.shutdown(socket.SHUT_RDWR)   # wakes the accept() thread
        except OSError:
            pass
        self.listener.close()
        for sock in conns:
            try:
                sock.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
        if self._thread is not threading.current_thread():
            self._thread.join(timeout=5)


# ---------------------------------------------------------------- client


class _Stale(Exception):
    """A pooled connection the server closed while it was idle: try a fresh one."""


class Fetcher:
    """Fetches objects from data servers over pooled, authenticated connections
    (one pool per address and token; thread-safe, a connection serves one fetch at a time)."""

    def __init__(self, *, timeout_s: float = _STALL_TIMEOUT_S,
                 connect_timeout_s: float = _CONNECT_TIMEOUT_S) -> None:
        self.timeout_s = timeout_s
        self.connect_timeout_s = connect_timeout_s
        self._idle: dict[tuple[str, str], list[socket.socket]] = {}
        self._lock = threading.Lock()
        self.closed = False

    def fetch(self, address: str, token: str, key: str, size: int, dest: memoryview,
              *, offset: int = 0, streams: int | None = None) -> None:
        """Fill ``dest`` (``size`` bytes) with bytes ``offset``.. of ``key`` at the data
        server ``address``. ObjectLostError naming the node and the cause when the
        server is gone, refuses, has no such key, or stops mid-transfer;
        AuthenticationError when the token does not match. ``streams``: connections
        to use at once (default: for a large object from another host, _STREAMS, or
        _TLS_STREAMS over TLS)."""
        if len(dest) < size:
            raise ValueError(f"destination of {len(dest)} bytes for an object of {size}")
        view = dest[:size]
        if streams is None:
            from .._protocol.auth import speaks_tls
            streams = 1 if size < _PARALLEL_MIN or _is_loopback(address) else \
                _TLS_STREAMS if speaks_tls(token) else _STREAMS
        if streams <= 1:
            self._fetch_range(address, token, key, offset, size, view)
            return
        step = (size + streams - 1) // streams
        errors: list[BaseException] = []

        def part(lo: int) -> None:
            hi = min(size, lo + step)
            try:
                self._fetch_range(address, token, key, offset + lo, hi - lo, view[lo:hi])
            except BaseException as exc:  # noqa: BLE001 - raised by the caller's thread
                errors.append(exc)
        helpers = [threading.Thread(target=part, args=(lo,), name="orchestra-fetch",
                                    daemon=True) for lo in range(step, size, step)]
        for t in helpers:
            t.start()
        part(0)
        for t in helpers:
            t.join()
        if errors:
            raise errors[0]

    def _fetch_range(self, address: str, token: str, key: str, offset: int, size: int,
                     view: memoryview) -> None:
        """One request on a pooled connection (a fresh one if the pooled one had
        closed); the connection goes back to the pool after a complete reply."""
        pool_key = (address, token)
        sock = self._take(pool_key)
        if sock is not None:
            try:
                self._request(sock, address, key, offset, size, view, pooled=True)
                self._give_back(pool_key, sock)
                return
            except _Stale:
                sock.close()
            except BaseException:
                sock.close()
                raise
        sock = self._connect(address, token)
        try:
            self._request(sock, address, key, offset, size, view, pooled=False)
        except BaseException:
            sock.close()
            raise
        self._give_back(pool_key, sock)

    def _take(self, pool_key: tuple[str, str]) -> socket.socket | None:
        with self._lock:
            idle = self._idle.get(pool_key)
            return idle.pop() if idle else None

    def _give_back(self, pool_key: tuple[str, str], sock: socket.socket) -> None:
        with self._lock:
            if not self.closed:
                self._idle.setdefault(pool_key, []).append(sock)
                return
        sock.close()

    def _connect(self, address: str, token: str) -> socket.socket:
        from .._protocol.auth import connect_secure
        try:
            host, port = parse_address(address)
        except ValueError as exc:
            raise ObjectLostError(str(exc)) from None
        try:
            sock = socket.create_connection((host, port), timeout=self.connect_timeout_s)
        except OSError as exc:
            raise ObjectLostError(
                f"cannot reach the data server of the node at {address} "
                f"({exc.strerror or exc}): that node is gone or unreachable from here, "
                "so the copy of the object it held is lost") from exc
        try:
            _tune(sock)
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, _BUFFER)
            sock = connect_secure(sock, token, timeout_s=self.connect_timeout_s,
                                  peer=f"data server {address}", bulk=True)
            _set_timeouts(sock, self.timeout_s)
        except AuthenticationError:
            sock.close()
            raise
        except OSError as exc:
            sock.close()
            raise ObjectLostError(
                f"the data server at {address} closed the connection during the handshake "
                f"({exc.strerror or exc}): that node is shutting down or gone") from exc
        except BaseException:
            sock.close()
            raise
        return sock

    def _request(self, sock: socket.socket, address: str, key: str, offset: int, size: int,
                 view: memoryview, *, pooled: bool) -> None:
        """One request on ``sock``; _Stale when a pooled connection turns out closed
        before any byte of the reply."""
        raw = key.encode()
        head = bytearray(_REPLY.size)
        try:
            sock.sendall(_REQUEST.pack(len(raw), offset, size) + raw)
            got = _recv_exact(sock, memoryview(head))
        except BlockingIOError:
            raise self._stalled(address, key, 0, size) from None
        except OSError as exc:
            if pooled:
                raise _Stale() from exc
            raise self._lost(address, key, 0, size, exc) from exc
        if got < len(head):
            if pooled and got == 0:
                raise _Stale()
            raise self._lost(address, key, 0, size, None)
        status, length = _REPLY.unpack(head)
        if status == _ERROR:
            text = bytearray(length)
            if _recv_exact(sock, memoryview(text)) < length:
                raise self._lost(address, key, 0, size, None)
            raise ObjectLostError(f"the node at {address} cannot send {key!r}: "
                                  f"{text.decode(errors='replace')}")
        if status != _OK or length != size:
            raise ObjectLostError(f"the data server at {address} answered {key!r} with "
                                  f"status {status} and {length} bytes ({size} asked): not "
                                  "an orchestra data server of this version")
        try:
            got = _recv_exact(sock, view)
        except BlockingIOError:
            raise self._stalled(address, key, -1, size) from None
        except OSError as exc:
            raise self._lost(address, key, -1, size, exc) from exc
        if got < size:
            raise self._lost(address, key, got, size, None)

    def _lost(self, address: str, key: str, got: int, size: int,
              exc: OSError | None) -> ObjectLostError:
        why = f" ({exc.strerror or exc})" if exc is not None else ""
        part = "" if got < 0 else f" after {got} of {size} bytes"
        return ObjectLostError(
            f"the data server at {address} closed the connection{part} while sending "
            f"{key!r}{why}: that node stopped or is gone, so its copy of the object is lost")

    def _stalled(self, address: str, key: str, got: int, size: int) -> ObjectLostError:
        return ObjectLostError(
            f"the data server at {address} sent nothing for {self.timeout_s:.0f} s while "
            f"sending {key!r} ({size} bytes): that node is frozen or the network between "
            "the nodes is down")

    def close(self) -> None:
        """Close the idle connections; fetches in flight finish, then close theirs."""
        with self._lock:
            self.closed = True
            socks = [s for idle in self._idle.values() for s in idle]
            self._idle.clear()
        for s in socks:
            s.close()


_default: Fetcher | None = None
_default_lock = threading.Lock()


def fetch(address: str, token: str, key: str, size: int, dest: memoryview) -> None:
    """Fetcher.fetch on a process-wide pool of connections, made at the first call."""
    global _default
    with _default_lock:
        if _default is None:
            _default = Fetcher()
        fetcher = _default
    fetcher.fetch(address, token, key, size, dest)
