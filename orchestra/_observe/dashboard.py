"""The head's web dashboard and Prometheus endpoint, served from the head's own loop
on the socket _observe/dashboard_bind.py bound.

    browser --GET /--> the page (_observe/dashboard_page.py: dashboard_assets/, CSS and JS inlined)
    the page --GET api/summary every 1 s--> summary() -> JSON; the view it shows --GET
        api/NAME?...--> views[NAME](query) -> JSON (_head/dashboard_views.py)
    Prometheus --GET /metrics--> summary() and the user metrics -> text format 0.0.4
    summary: a callable the head hands over (head_summary() below: the cluster summary
        of the head, task events included), cached for SUMMARY_MAX_AGE_S, so that many open
        pages and a scraper cost the head as much as one

Who may read it (respond() decides, without I/O):
- Bound to loopback (a private cluster, or a cluster listening on loopback): any local
  request whose Host header is an IP address or ``localhost``; a web page of another
  site cannot read it by pointing its own name at 127.0.0.1 (DNS rebinding).
- Bound beyond loopback (where the cluster listens: ``orchestra start --head --host
  IP``): every request proves the cluster token, by ``?token=TOKEN`` once (answered
  with an HttpOnly, SameSite=Strict cookie that holds a MAC of the token, never the
  token, and a redirect that takes the token out of the address bar) or by an
  ``Authorization: Bearer TOKEN`` header (a Prometheus scraper). Compared in constant
  time. A refused request is answered 401 (no token) or 403 (a wrong one) and counted;
  the head's log says how many were refused, at most once a minute, never with what
  they sent. A cluster that speaks TLS serves it over HTTPS with the cluster's key (a
  certificate no browser knows: the fingerprint ``orchestra status`` prints is the one
  to accept), the cookie marked Secure.

Nothing here runs code or changes the cluster: GET and HEAD of read-only paths.
"""
from __future__ import annotations

import asyncio
import hashlib
import hmac
import ipaddress
import json
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from .._protocol.tls import enabled as tls_enabled

if TYPE_CHECKING:
    import socket

# Many pages open at once (and a scraper) build the summary once per this long.
SUMMARY_MAX_AGE_S = 0.5
# A request's head (request line and headers) larger than this is refused (431).
MAX_HEAD_BYTES = 16 * 1024
# An open connection with no request for this long is closed (a browser keeps one
# alive between polls: 1 s apart).
IDLE_S = 30.0
# Connections held at once; more are closed at once (a client that opens hundreds).
MAX_CONNECTIONS = 64
# Refused requests are logged at most once per this long, as a count.
_REFUSAL_LOG_S = 60.0

TASK_STATES = ("PENDING_ARGS_AVAIL", "PENDING_NODE_ASSIGNMENT", "RUNNING", "FINISHED", "FAILED")
ACTOR_STATES = ("DEPENDENCIES_UNREADY", "PENDING_CREATION", "ALIVE", "RESTARTING", "DEAD")


# ---------------------------------------------------------------------------- the data

def head_summary(head: Any) -> dict[str, Any]:
    """The cluster summary (a JSON-able dict): ``head.events.cluster_summary()`` (nodes, their
    stores, resources, workers, drivers, tasks by state from every worker's task events,
    actors by state), with every task and actor state present (0 when none), so the page
    and /metrics show each."""
    s: dict[str, Any] = head.events.cluster_summary()
    s["tasks"] = {**dict.fromkeys(TASK_STATES, 0), **s["tasks"]}
    s["actors"] = {**dict.fromkeys(ACTOR_STATES, 0), **s["actors"]}
    return s


def shown_resources(res: dict[str, float]) -> list[str]:
    """The resource names a reader sees: by name, memory last, without the names a
    placement group's bundles hold (CPU_group_..., one per group)."""
    names = sorted(k for k in res if "_group_" not in k)
    return [k for k in names if k != "memory"] + (["memory"] if "memory" in res else [])


# ---------------------------------------------------------------------------- /metrics

# name -> (kind, help, label names); every one a gauge of the summary.
_HELP = {
    "orchestra_nodes": ("gauge", "Nodes of the cluster, by state (ALIVE, DEAD).", ("state",)),
    "orchestra_workers": ("gauge", "Worker processes alive, on every node.", ()),
    "orchestra_drivers": ("gauge", "Drivers connected.", ()),
    "orchestra_tasks": ("gauge", "Tasks by state: pending and running now; FINISHED and "
                                 "FAILED since the cluster started.", ("state",)),
    "orchestra_actors": ("gauge", "Actors by state.", ("state",)),
    "orchestra_resources_total": ("gauge", "A node's total of a resource.", ("resource", "node")),
    "orchestra_resources_available": ("gauge", "What a node has free of a resource.",
                                      ("resource", "node")),
    "orchestra_object_store_used_bytes": ("gauge", "Bytes in a node's object store.", ("node",)),
    "orchestra_object_store_capacity_bytes": ("gauge", "A node's object store capacity.", ("node",)),
    "orchestra_object_store_spilled_bytes": ("gauge", "Bytes a node's store spilled to disk.",
                                             ("node",)),
}


def metrics_text(s: dict[str, Any]) -> str:
    """The cluster summary in Prometheus's text exposition format (version 0.0.4,
    written by prometheus_client: _observe/exposition.py)."""
    from . import exposition
    rows: dict[str, list[tuple[tuple[str, ...], float]]] = {name: [] for name in _HELP}
    nodes = s.get("nodes", [])
    alive = sum(1 for n in nodes if n.get("alive"))
    rows["orchestra_nodes"] = [(("ALIVE",), alive), (("DEAD",), len(nodes) - alive)]
    rows["orchestra_workers"] = [((), s.get("workers", 0))]
    rows["orchestra_drivers"] = [((), s.get("drivers", 0))]
    tasks, actors = s.get("tasks", {}), s.get("actors", {})
    rows["orchestra_tasks"] = [((k,), tasks.get(k, 0)) for k in dict.fromkeys([*TASK_STATES, *tasks])]
    rows["orchestra_actors"] = [((k,), actors.get(k, 0))
                                for k in dict.fromkeys([*ACTOR_STATES, *actors])]
    for n in nodes:
        if not n.get("alive"):
            continue
        node = str(n["node_id"])
        total, free = n.get("resources_total", {}), n.get("resources_available", {})
        for k in shown_resources(total):
            rows["orchestra_resources_total"].append(((k, node), total[k]))
            rows["orchestra_resources_available"].append(((k, node), free.get(k, 0.0)))
        rows["orchestra_object_store_used_bytes"].append(((node,), n.get("store_used", 0)))
        rows["orchestra_object_store_capacity_bytes"].append(((node,), n.get("store_capacity", 0)))
        rows["orchestra_object_store_spilled_bytes"].append(((node,), n.get("spilled_bytes", 0)))
    return exposition.text(
        exposition.family(kind, name, text, labels, rows[name])
        for name, (kind, text, labels) in _HELP.items())


# ---------------------------------------------------------------------------- requests

@dataclass
class Request:
    """One parsed request head: method, path (no query), query, headers (lower-case)."""
    method: str
    path: str
    query: str = ""
    headers: dict[str, str] = field(default_factory=dict)


@dataclass
class Response:
    """What respond() decided: status, headers, body; ``refused`` for the refusal count."""
    status: int
    headers: list[tuple[str, str]]
    body: bytes = b""
    refused: bool = False


_REASONS = {200: "OK", 303: "See Other", 400: "Bad Request", 401: "Unauthorized",
            403: "Forbidden", 404: "Not Found", 405: "Method Not Allowed",
            431: "Request Header Fields Too Large", 500: "Internal Server Error"}
_COMMON = [("Cache-Control", "no-store"), ("X-Content-Type-Options", "nosniff"),
           ("Referrer-Policy", "no-referrer"), ("X-Frame-Options", "DENY")]


def parse_request(head: bytes) -> Request | None:
    """The request line and headers of an HTTP/1.1 request head (up to the blank line);
    None when it is not one."""
    try:
        text = head.decode("latin-1")
    except UnicodeDecodeError:   # latin-1 decodes any byte; kept for the type checker
        return None
    lines = text.split("\r\n")
    parts = lines[0].split(" ")
    if len(parts) != 3 or not parts[2].startswith("HTTP/1.") or not parts[1].startswith("/"):
        return None
    path, _, query = parts[1].partition("?")
    headers: dict[str, str] = {}
    for line in lines[1:]:
        if not line:
            continue
        name, sep, value = line.partition(":")
        if not sep or not name or name != name.strip():
            return None
        headers[name.lower()] = value.strip()
    return Request(parts[0], path, query, headers)


def _query_token(query: str) -> str | None:
    """The value of ``token`` in a query string (None when absent)."""
    if "token=" not in query:
        return None
    from urllib.parse import parse_qsl
    for k, v in parse_qsl(query, keep_blank_values=True):
        if k == "token":
            return v
    return None


def cookie_value(token: str) -> str:
    """What the dashboard's cookie holds: a MAC of the token (a stolen cookie reads the
    dashboard, and joins no cluster)."""
    return hmac.new(token.encode(), b"orchestra dashboard cookie", hashlib.sha256).hexdigest()


def cookie_name(token: str) -> str:
    """The cookie's name, one per cluster: browsers send a host's cookies to all its
    ports, and two clusters' dashboards on one machine must not overwrite each other's."""
    return "orchestra_" + hmac.new(token.encode(), b"orchestra dashboard cookie name",
                                   hashlib.sha256).hexdigest()[:12]


def _same(given: str, expected: str) -> bool:
    return hmac.compare_digest(given.encode("utf-8", "surrogateescape"),
                               expected.encode("utf-8", "surrogateescape"))


def _cookie(headers: dict[str, str], wanted: str) -> str | None:
    for part in headers.get("cookie", "").split(";"):
        name, sep, value = part.strip().partition("=")
        if sep and name == wanted:
            return value
    return None


def credentials(req: Request, token: str) -> str:
    """How the request proves the token: "query", "bearer" or "cookie" when it does;
    "" when it sends none; "wrong" when what it sends is not the token."""
    given = _query_token(req.query)
    if given is not None:
        return "query" if _same(given, token) else "wrong"
    auth = req.headers.get("authorization")
    if auth is not None:
        scheme, _, value = auth.partition(" ")
        return "bearer" if scheme.lower() == "bearer" and _same(value.strip(), token) else "wrong"
    cookie = _cookie(req.headers, cookie_name(token))
    if cookie is not None:
        return "cookie" if _same(cookie, cookie_value(token)) else "wrong"
    return ""


def _local_host(host_header: str) -> bool:
    """True when a Host header names this machine by an IP address or ``localhost``."""
    host = host_header.strip()
    if host.startswith("["):
        host = host[1:host.find("]")] if "]" in host else ""
    elif host.count(":") == 1:
        host = host.partition(":")[0]
    if host.lower() == "localhost":
        return True
    try:
        ipaddress.ip_address(host)
    except ValueError:
        return False
    return True


def _text(status: int, text: str, extra: list[tuple[str, str]] | None = None,
          refused: bool = False) -> Response:
    return Response(status, [("Content-Type", "text/plain; charset=utf-8"), *(extra or [])],
                    text.encode(), refused)


def respond(req: Request, token: str, summary: Callable[[], dict[str, Any]],
            views: dict[str, Callable[[dict[str, str]], Any]] | None = None,
            user_metrics: Callable[[], str] | None = None) -> Response:
    """The answer to one request (no I/O). ``token``: the cluster token every request
    must prove ("" on loopback: then the Host must be local). ``summary``: the cluster
    summary; ``views``: the other /api/NAME answers (given the query's pairs);
    ``user_metrics``: the user metrics' exposition text, appended to /metrics."""
    if req.method not in ("GET", "HEAD"):
        return _text(405, "the dashboard answers GET and HEAD only\n", [("Allow", "GET, HEAD")])
    proof = ""
    if token:
        proof = credentials(req, token)
        if proof == "":
            return _text(401, "this dashboard needs the cluster token: open it once as "
                              "URL/?token=TOKEN (the token `orchestra start --head` printed), "
                              "or send the header Authorization: Bearer TOKEN\n",
                         [("WWW-Authenticate", 'Bearer realm="orchestra"')], refused=True)
        if proof == "wrong":
            return _text(403, "wrong cluster token\n", refused=True)
    elif not _local_host(req.headers.get("host", "")):
        return _text(403, "open the dashboard by this machine's address (127.0.0.1 or "
                          "localhost), not by a host name\n", refused=True)
    if proof == "query" and req.path in ("/", "/index.html"):
        # Into a cookie, and out of the address bar (and the browser's history of it).
        cookie = f"{cookie_name(token)}={cookie_value(token)}; Path=/; HttpOnly; SameSite=Strict"
        if tls_enabled(token):   # served over HTTPS: the browser sends it over HTTPS only
            cookie += "; Secure"
        return Response(303, [("Location", "/"), ("Set-Cookie", cookie)])
    if req.path in ("/", "/index.html"):
        from .dashboard_page import CSP, PAGE
        return Response(200, [("Content-Type", "text/html; charset=utf-8"),
                              ("Content-Security-Policy", CSP)], PAGE)
    if req.path == "/api/summary":
        return _json(summary())
    if req.path.startswith("/api/") and views and req.path[5:] in views:
        from urllib.parse import parse_qsl
        query = {k: v for k, v in parse_qsl(req.query, keep_blank_values=True) if k != "token"}
        return _json(views[req.path[5:]](query))
    if req.path == "/metrics":
        text = metrics_text(summary()) + (user_metrics() if user_metrics is not None else "")
        return Response(200, [("Content-Type", "text/plain; version=0.0.4; charset=utf-8")],
                        text.encode())
    return _text(404, "not found: the dashboard serves /, /api/summary, /api/NAME for the "
                      "page's views, and /metrics\n")


def _json(data: Any) -> Response:
    body = json.dumps(data, separators=(",", ":")).encode()
    return Response(200, [("Content-Type", "application/json")], body)


def encode_response(resp: Response, head_only: bool, keep_alive: bool) -> bytes:
    """The bytes of an HTTP/1.1 response."""
    lines = [f"HTTP/1.1 {resp.status} {_REASONS.get(resp.status, '')}"]
    lines += [f"{k}: {v}" for k, v in (*_COMMON, *resp.headers)]
    lines.append(f"Content-Length: {len(resp.body)}")
    lines.append("Connection: keep-alive" if keep_alive else "Connection: close")
    head = ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1")
    return head if head_only else head + resp.body


# ---------------------------------------------------------------------------- the server

class Dashboard:
    """The HTTP server: one asyncio server on the head's loop; each connection reads
    request heads (keep-alive) and writes respond()'s answers."""

    def __init__(self, summary: Callable[[], dict[str, Any]], token: str = "",
                 views: dict[str, Callable[[dict[str, str]], Any]] | None = None,
                 user_metrics: Callable[[], str] | None = None) -> None:
        self.summary = summary
        self.token = token
        self.views = views
        self.user_metrics = user_metrics
        self.on_close: Callable[[], None] | None = None
        self.server: asyncio.Server | None = None
        self._cached: tuple[float, dict[str, Any]] | None = None
        self._conns: set[asyncio.StreamWriter] = set()
        self._refused = 0
        self._refusal_logged: float | None = None
        self._last_refused_from = ""

    async def serve_socket(self, sock: socket.socket) -> None:
        """Serve the listening socket ``sock`` (bound by _dashboard_bind.listen): over
        HTTPS with the cluster's key when its token says it speaks TLS."""
        from .._protocol import tls
        if not tls.enabled(self.token):
            self.server = await asyncio.start_server(self.serve, sock=sock,
                                                     limit=MAX_HEAD_BYTES)
            return
        # HTTPS: the gate drives each TLS handshake, so that those under way count
        # against a cap (the oldest cut off beyond it) and a time limit, as on the
        # head's port: silent peers cannot pile up (descriptors are the head's too).
        from .._protocol.auth import AuthGate
        loop = asyncio.get_running_loop()
        pending: dict[AuthGate, None] = {}

        def stream(_transport: Any) -> asyncio.StreamReaderProtocol:
            return asyncio.StreamReaderProtocol(
                asyncio.StreamReader(limit=MAX_HEAD_BYTES, loop=loop), self.serve, loop=loop)

        self.server = await loop.create_server(
            lambda: AuthGate(self.token, loop, stream, what="orchestra dashboard",
                             pending=pending, prove=False), sock=sock)

    def close(self) -> None:
        if self.on_close is not None:
            self.on_close()
        if self.server is not None:
            self.server.close()
        for w in list(self._conns):
            w.transport.abort()

    def cached_summary(self) -> dict[str, Any]:
        now = time.monotonic()
        if self._cached is None or now - self._cached[0] > SUMMARY_MAX_AGE_S:
            self._cached = (now, self.summary())
        return self._cached[1]

    async def serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        """One connection: request after request until the client closes, sends what
        is not a request, or stays idle for IDLE_S."""
        if len(self._conns) >= MAX_CONNECTIONS:
            writer.transport.abort()
            return
        self._conns.add(writer)
        try:
            while True:
                try:
                    head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), IDLE_S)
                except asyncio.LimitOverrunError:
                    writer.write(encode_response(_text(431, "request head too large\n"),
                                                 False, False))
                    return
                except (asyncio.IncompleteReadError, asyncio.TimeoutError, ConnectionError):
                    return
                req = parse_request(head)
                if req is None:
                    writer.write(encode_response(_text(400, "not an HTTP/1.1 request\n"),
                                                 False, False))
                    return
                resp = self._answer(req, writer)
                keep = (req.method in ("GET", "HEAD") and "content-length" not in req.headers
                        and req.headers.get("connection", "").lower() != "close")
                writer.write(encode_response(resp, req.method == "HEAD", keep))
                await writer.drain()
                if not keep:
                    return
        except ConnectionError:
            return
        finally:
            self._conns.discard(writer)
            writer.close()

    def _answer(self, req: Request, writer: asyncio.StreamWriter) -> Response:
        try:
            resp = respond(req, self.token, self.cached_summary, self.views, self.user_metrics)
        except Exception as exc:  # noqa: BLE001 - a bug here must not take the head down
            print(f"orchestra head: the dashboard failed to answer {req.path}: {exc!r}",
                  file=sys.stderr)
            return _text(500, "the dashboard failed; the head's log says why\n")
        if resp.refused:
            self._note_refusal(writer)
        return resp

    def _note_refusal(self, writer: asyncio.StreamWriter) -> None:
        """Count a refused request; say how many in the log at most once a minute (the
        peer's address only: never the path, the query or the headers it sent)."""
        self._refused += 1
        peer = writer.get_extra_info("peername")
        self._last_refused_from = str(peer[0]) if peer else "?"
        now = time.monotonic()
        if self._refusal_logged is None or now - self._refusal_logged >= _REFUSAL_LOG_S:
            self._refusal_logged = now
            print(f"orchestra head: the dashboard refused {self._refused} request(s): no "
                  f"cluster token, a wrong one, or a host name on loopback (the last from "
                  f"{self._last_refused_from})", file=sys.stderr, flush=True)
            self._refused = 0


async def serve_head(head: Any, sock: socket.socket, token: str) -> None:
    """Serve the dashboard of a _head.Head on its bound socket: requests prove ``token``
    ("" on loopback); the data is head_summary(head) and the head's dashboard views
    (_head/dashboard_views.py, whose sampler this starts)."""
    views = head.events.dashboard_views()
    dash = Dashboard(lambda: head_summary(head), token, views.routes(),
                     head.events.metrics.exposition)
    dash.on_close = views.stop
    await dash.serve_socket(sock)
    if head.stopping:
        dash.close()
    else:
        head.dashboard = dash
