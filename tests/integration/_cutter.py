"""A TCP relay in front of a real head that cuts connections as a head going away does:
connection i (counted from 0 as they arrive) is closed both ways when its caller's
``cuts[i]``-th write arrives (0: at once, before the head's first byte); the others
are relayed whole. It
counts each connection's writes from its caller, so a test can find how many a
handshake takes (tests/integration/test_connect_cuts.py)."""
from __future__ import annotations

import contextlib
import socket
import threading


class Cutter:
    def __init__(self, target: tuple[str, int], cuts: dict[int, int] | None = None) -> None:
        self.target, self.cuts = target, dict(cuts or {})
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.address = f"127.0.0.1:{self.listener.getsockname()[1]}"
        self.writes: list[int] = []   # each connection's writes from its caller so far
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
            threading.Thread(target=self._up, args=(n, caller, head, cut_at), daemon=True).start()
            threading.Thread(target=self._down, args=(head, caller), daemon=True).start()

    def _up(self, n: int, caller: socket.socket, head: socket.socket, cut_at: int) -> None:
        """The caller's writes to the head, counted; the ``cut_at``-th closes both."""
        try:
            while data := caller.recv(1 << 16):
                with self.lock:
                    self.writes[n] += 1
                    count = self.writes[n]
                if count == cut_at:
                    break
                head.sendall(data)
        except OSError:
            pass
        for s in (caller, head):
            with contextlib.suppress(OSError):
                s.shutdown(socket.SHUT_RDWR)
            s.close()

    @staticmethod
    def _down(head: socket.socket, caller: socket.socket) -> None:
        try:
            while data := head.recv(1 << 16):
                caller.sendall(data)
        except OSError:
            pass
        with contextlib.suppress(OSError):
            caller.shutdown(socket.SHUT_RDWR)
