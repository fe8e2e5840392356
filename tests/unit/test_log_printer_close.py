"""The driver's log connection (orchestra/_observe/log_printer.py) closed after its head
went away: close() does not wait for a flush nobody will answer. A TCP listener that
proves the token stands in for the head (over TCP the flush's send still succeeds after
the peer closed: the bytes go to the kernel); no cluster."""
from __future__ import annotations

import socket
import threading

import pytest

from orchestra._observe import log_printer
from orchestra._protocol import pb, wire
from orchestra._protocol.auth import server_handshake

pytestmark = pytest.mark.timeout(20)

TOKEN = "t" * 32


def test_closing_after_the_head_closed_the_connection_does_not_wait_for_a_flush(
        monkeypatch) -> None:
    monkeypatch.setattr(log_printer, "_CLOSE_WAIT_S", 3600.0)   # a wait would hang the test
    server = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    server.bind(("127.0.0.1", 0))
    server.listen(1)
    accepted: list[socket.socket] = []

    def head() -> None:
        sock, _ = server.accept()
        server_handshake(sock, TOKEN)
        sock.recv(4096)          # the printer's Hello (a close with it unread sends RST)
        sock.sendall(wire.encode(wire.HELLO_REPLY, pb.HelloReply(conn_id=1)))   # as a head does
        accepted.append(sock)
    t = threading.Thread(target=head)
    t.start()
    printer = log_printer.LogPrinter(f"127.0.0.1:{server.getsockname()[1]}", job=1, token=TOKEN)
    t.join(10)
    accepted[0].close()          # the head is gone
    printer._thread.join(10)     # its reader saw the end
    assert not printer._thread.is_alive()
    printer.close()              # returns at once (it waited _CLOSE_WAIT_S for no answer)
    server.close()
