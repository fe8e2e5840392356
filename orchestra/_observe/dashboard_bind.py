"""Where the head's dashboard listens, bound on init()'s path without its server.

    Head.start -> start_dashboard(head): bind_address(cfg listen) -> a listening socket
        (cfg dashboard_port; 8265 by default, else any free port) -> its URL (in every
        HelloReply, and in the session's ``dashboard`` file for ``orchestra start``)
    SERVE_DELAY_S later -> _dashboard.serve_head(head, socket): the HTTP server
        (imported only then) serves it; a request that came sooner waited in the
        socket's backlog

so that init() pays a bind, not the server's import. A dashboard bound beyond loopback
asks every request for the cluster token (_observe/dashboard.py says how), over HTTPS
when the cluster speaks TLS (its key: _protocol/tls.py).
"""
from __future__ import annotations

import ipaddress
import os
import socket
from typing import TYPE_CHECKING, Any

from .._protocol import tls as _tls
from .._protocol.connection import parse_host

if TYPE_CHECKING:
    import asyncio

# Ray's dashboard port: what a bookmark finds. Taken (another cluster on this machine),
# the dashboard takes any free port instead, unless the port was asked for by number.
DEFAULT_PORT = 8265
# The server starts this long after the head (as the gRPC control plane does): after
# init() returned, off the first task's path.
SERVE_DELAY_S = 0.5


def bind_address(listen: str) -> tuple[str, bool]:
    """Where the dashboard binds for a head listening on ``listen`` ("": a private
    cluster), and whether its requests must prove the token (beyond loopback)."""
    if not listen:
        return "127.0.0.1", False
    host = parse_host(listen)
    if host in ("", "0.0.0.0", "::"):
        return host or "0.0.0.0", True
    if host == "localhost":
        return "127.0.0.1", False
    try:
        return host, not ipaddress.ip_address(host).is_loopback
    except ValueError:   # a name: not known to be loopback
        return host, True


def _this_machine_ip() -> str:
    """This machine's address on its default route (no packet is sent), as
    ``orchestra start`` shows a head bound to a wildcard address."""
    try:
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
            s.connect(("10.255.255.255", 9))
            return str(s.getsockname()[0])
    except OSError:
        return "127.0.0.1"


def url_for(host: str, port: int, secure: bool = False) -> str:
    """The dashboard's URL as users open it (a wildcard bind: this machine's address;
    ``secure``: HTTPS)."""
    if host in ("0.0.0.0", "::"):
        host = _this_machine_ip()
    scheme = "https" if secure else "http"
    return f"{scheme}://[{host}]:{port}/" if ":" in host else f"{scheme}://{host}:{port}/"


def _bound(host: str, port: int) -> socket.socket:
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((host, port))
        sock.listen(64)
        sock.setblocking(False)
    except BaseException:
        sock.close()
        raise
    return sock


def listen(host: str, port: int | None) -> socket.socket:
    """A listening socket on host:port (None: DEFAULT_PORT, else any free one; 0: any
    free one). OSError naming the port and the remedy when a port asked for is taken."""
    try:
        return _bound(host, DEFAULT_PORT if port is None else port)
    except OSError as exc:
        if port is not None:
            raise OSError(exc.errno, f"the dashboard cannot listen on {host}:{port}: "
                                     f"{exc.strerror}; pass dashboard_port=0 (or "
                                     "--dashboard-port 0) for any free port, or "
                                     "include_dashboard=False") from None
        return _bound(host, 0)


def start_dashboard(head: Any) -> str:
    """Bind the dashboard of a _head.Head (cfg listen, dashboard_port), have it served
    SERVE_DELAY_S later, and return its URL (also written to the session's
    ``dashboard`` file)."""
    host, needs_token = bind_address(head.cfg.get("listen", ""))
    if needs_token and not head.token:
        raise RuntimeError("a dashboard beyond loopback needs the cluster token (cfg token)")
    sock = listen(host, head.cfg.get("dashboard_port"))
    # A cluster that speaks TLS serves its dashboard over HTTPS with the cluster's key
    # (the token, which a request may carry, never crosses the network in the clear).
    url = url_for(host, sock.getsockname()[1], needs_token and _tls.enabled(head.token))
    with open(os.path.join(head.session_dir, "dashboard"), "w") as f:
        f.write(url)
    head.loop.call_later(SERVE_DELAY_S, _serve, head, sock, head.token if needs_token else "")
    return url


_starting: set[asyncio.Task[None]] = set()   # serve_head tasks running (each needs a ref)


def _serve(head: Any, sock: socket.socket, token: str) -> None:
    if head.stopping:
        sock.close()
        return
    from .dashboard import serve_head
    task = head.loop.create_task(serve_head(head, sock, token))
    _starting.add(task)
    task.add_done_callback(_starting.discard)
