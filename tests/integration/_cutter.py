"""A TCP relay in front of a real head that cuts connections as a head going away does:
connection i (counted from 0 as they arrive) is closed both ways when the head's
``cuts[i]``-th write to its caller arrives, instead of passing it on (0: at once, before
the head's first byte); the others are relayed whole. It counts each connection's writes
from the head, so a test can find how many a handshake takes
(tests/integration/test_connect_cuts.py).

The head's writes are counted, not the caller's: the head speaks first (its hello, on
accept), so the caller's first two writes (its opening, its answer to that hello) may
reach the relay as one; each write of the head after its hello answers one of the
caller's, and arrives alone."""
from __future__ import annotations

import contextlib
import socket
import threading


class Cutter:
    def __init__(self, target: tuple[str, int], cuts: dict[int, int] | None = None) -> None:
        self.target, self.cuts = target, dict(cuts or {})
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.address = f"127.0.0.1:{self.listener.getsockname()[1]}"
        self.writes: list[int] = []   # each connection's writes from the head so far
        self.lock = threading.Lock()
        self.open: list[socket.socket] = []
        threading.Thread(target=self._accept, daemon=True).start()

    def close(self) -> None:
        self.listener.close()
        with self.lock:
            for s in self.open:
                with contextlib.suppress(OSError):
                    s.close()

    def _accept(self) -> None:
        while True:
            try:
                caller, _ = self.listener.accept()
            except OSError:
                return
            with self.lock:
                n = len(self.writes)
                self.writes.append(0)
            cut_at = self.cuts.get(n, -1)
            if cut_at == 0:
                caller.close()
                continue
            head = socket.create_connection(self.target)
            with self.lock:
                self.open += [caller, head]
            threading.Thread(target=self._up, args=(caller, head), daemon=True).start()
            threading.Thread(target=self._down, args=(n, head, caller, cut_at),
                             daemon=True).start()

    @staticmethod
    def _up(caller: socket.socket, head: socket.socket) -> None:
        try:
            while data := caller.recv(1 << 16):
                head.sendall(data)
        except OSError:
            pass
        with contextlib.suppress(OSError):
            head.shutdown(socket.SHUT_RDWR)

    def _down(self, n: int, head: socket.socket, caller: socket.socket, cut_at: int) -> None:
        """The head's writes to the caller, counted; the ``cut_at``-th closes both."""
        try:
            while data := head.recv(1 << 16):
                with self.lock:
                    self.writes[n] += 1
                    count = self.writes[n]
                if count == cut_at:
                    break
                caller.sendall(data)
        except OSError:
            pass
        for s in (caller, head):
            with contextlib.suppress(OSError):
                s.shutdown(socket.SHUT_RDWR)
            s.close()
