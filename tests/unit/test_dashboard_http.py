"""The dashboard's decisions without sockets: who may read (respond()), what /metrics
says of a summary, tasks and actors by Ray's state names, where it binds, and the
arguments that turn it on and off."""
from __future__ import annotations

import json
import re
from typing import Any

import pytest
from prometheus_client.parser import text_string_to_metric_families

from orchestra._api.local_head import build_cfg
from orchestra._cli.cluster import parse_start
from orchestra._observe import dashboard as d
from orchestra._observe import dashboard_bind as bind

pytestmark = pytest.mark.timeout(10)

TOKEN = "s3cret-token_value"
# One sample line of the text exposition format: name, optional {labels}, a value.
METRIC_LINE = re.compile(r'^[a-zA-Z_:][a-zA-Z0-9_:]*(\{([a-zA-Z_][a-zA-Z0-9_]*="([^"\\]|\\.)*",?)*\})? '
                         r'(-?[0-9.e+]+|NaN|[+-]Inf)$')


def summary() -> dict[str, Any]:
    return {
        "session": "abc", "time": 1.0, "workers": 3, "drivers": 1,
        "nodes": [
            {"node_id": "0000000000000000", "address": "127.0.0.1", "alive": True,
             "resources_total": {"CPU": 2.0, "memory": 1e9, "CPU_group_ab12": 1.0,
                                 'odd"name\\': 1.0},
             "resources_available": {"CPU": 0.5, "memory": 1e9},
             "store_used": 100, "store_capacity": 1000, "spilled_bytes": 7},
            {"node_id": "0000000000000002", "address": "10.0.0.2", "alive": False,
             "resources_total": {"CPU": 4.0}, "resources_available": {},
             "store_used": 0, "store_capacity": 0, "spilled_bytes": 0}],
        "resources_total": {"CPU": 2.0}, "resources_available": {"CPU": 0.5},
        "store": {"used": 100, "capacity": 1000, "spilled_bytes": 7, "spilled_objects": 1},
        "tasks": {"RUNNING": 2, "FINISHED": 40, "FAILED": 1},
        "actors": {"ALIVE": 1, "DEAD": 2},
    }


def get(path: str, headers: dict[str, str] | None = None, token: str = "",
        method: str = "GET") -> d.Response:
    path, _, query = path.partition("?")
    h = {"host": "127.0.0.1:8265", **(headers or {})}
    return d.respond(d.Request(method, path, query, h), token, summary)


def header(resp: d.Response, name: str) -> str:
    return next((v for k, v in resp.headers if k.lower() == name.lower()), "")


# ---------------------------------------------------------------------------- /metrics

def test_every_metrics_line_is_a_comment_or_a_sample() -> None:
    text = d.metrics_text(summary())
    assert text.endswith("\n")
    for line in text.splitlines():
        assert line.startswith("# HELP ") or line.startswith("# TYPE ") or METRIC_LINE.match(line), line


def test_metrics_carry_the_summary_figures() -> None:
    text = d.metrics_text(summary())
    assert 'orchestra_tasks{state="FINISHED"} 40.0' in text
    assert 'orchestra_tasks{state="PENDING_ARGS_AVAIL"} 0.0' in text   # every state, 0 included
    assert 'orchestra_actors{state="ALIVE"} 1.0' in text
    assert 'orchestra_nodes{state="ALIVE"} 1.0' in text and 'orchestra_nodes{state="DEAD"} 1.0' in text
    assert "orchestra_workers 3.0" in text
    assert 'orchestra_resources_total{node="0000000000000000",resource="CPU"} 2.0' in text
    assert 'orchestra_resources_available{node="0000000000000000",resource="CPU"} 0.5' in text
    assert 'orchestra_object_store_used_bytes{node="0000000000000000"} 100.0' in text
    assert 'orchestra_object_store_capacity_bytes{node="0000000000000000"} 1000.0' in text
    assert 'orchestra_object_store_spilled_bytes{node="0000000000000000"} 7.0' in text
    # Prometheus's own parser reads every family back, all gauges, with their help.
    fams = {f.name: f for f in text_string_to_metric_families(text)}
    assert set(fams) == set(d._HELP) and {f.type for f in fams.values()} == {"gauge"}
    assert {(s.labels["resource"], s.value) for s in fams["orchestra_resources_total"].samples} \
        == {("CPU", 2.0), ("memory", 1e9), ('odd"name\\', 1.0)}


def test_metrics_leave_out_dead_nodes_and_placement_group_bundles_and_escape_labels() -> None:
    text = d.metrics_text(summary())
    assert "0000000000000002" not in text
    assert "_group_" not in text
    assert 'resource="odd\\"name\\\\"' in text


# ---------------------------------------------------------------------------- states

# ---------------------------------------------------------------------------- routes

def test_the_page_json_and_metrics_are_served_on_loopback() -> None:
    page = get("/")
    assert page.status == 200 and b"<script>" in page.body
    assert "script-src 'sha256-" in header(page, "Content-Security-Policy")
    api = get("/api/summary")
    assert api.status == 200 and json.loads(api.body)["tasks"]["FINISHED"] == 40
    metrics = get("/metrics")
    assert metrics.status == 200 and header(metrics, "Content-Type").startswith("text/plain; version=0.0.4")


@pytest.mark.parametrize("path", ["/nope", "/api", "/api/summary/x", "/../etc/passwd"])
def test_unknown_paths_are_404(path: str) -> None:
    assert get(path).status == 404


@pytest.mark.parametrize("method", ["POST", "PUT", "DELETE", "OPTIONS"])
def test_only_get_and_head_are_answered(method: str) -> None:
    resp = get("/api/summary", method=method)
    assert resp.status == 405 and header(resp, "Allow") == "GET, HEAD"


def test_a_head_request_is_answered_without_a_body() -> None:
    resp = get("/metrics", method="HEAD")
    raw = d.encode_response(resp, head_only=True, keep_alive=False)
    assert raw.endswith(b"\r\n\r\n") and f"Content-Length: {len(resp.body)}".encode() in raw


@pytest.mark.parametrize("host", ["127.0.0.1:8265", "localhost:8265", "[::1]:8265", "10.1.2.3"])
def test_loopback_answers_requests_naming_an_address(host: str) -> None:
    assert get("/api/summary", {"host": host}).status == 200


@pytest.mark.parametrize("host", ["evil.example:8265", "evil.example", ""])
def test_loopback_refuses_a_host_name_a_rebinding_page_would_send(host: str) -> None:
    resp = get("/api/summary", {"host": host})
    assert resp.status == 403 and resp.refused


# ---------------------------------------------------------------------------- the token

@pytest.mark.parametrize("path", ["/", "/api/summary", "/metrics", "/nope"])
def test_without_the_token_every_path_is_401(path: str) -> None:
    resp = get(path, token=TOKEN)
    assert resp.status == 401 and resp.refused and header(resp, "WWW-Authenticate")
    assert b"{" not in resp.body   # no figure leaks


@pytest.mark.parametrize("proof", [
    {"query": "token=wrong"}, {"query": "token="}, {"query": f"token={TOKEN}x"},
    {"authorization": "Bearer wrong"}, {"authorization": f"Basic {TOKEN}"},
    {"cookie": f"{d.cookie_name(TOKEN)}={d.cookie_value('wrong')}"},
    {"cookie": f"{d.cookie_name(TOKEN)}={TOKEN}"},   # the token itself is not the cookie
])
def test_a_wrong_token_is_403(proof: dict[str, str]) -> None:
    query = proof.pop("query", "")
    resp = get("/api/summary" + (f"?{query}" if query else ""), proof, token=TOKEN)
    assert resp.status == 403 and resp.refused
    assert TOKEN.encode() not in resp.body


def test_the_token_in_the_query_becomes_a_cookie_and_leaves_the_address_bar() -> None:
    resp = get(f"/?token={TOKEN}", token=TOKEN)
    assert resp.status == 303 and header(resp, "Location") == "/"
    cookie = header(resp, "Set-Cookie")
    assert "HttpOnly" in cookie and "SameSite=Strict" in cookie and TOKEN not in cookie
    value = cookie.split(";")[0]
    assert get("/", {"cookie": f"other=1; {value}"}, token=TOKEN).status == 200
    assert get("/api/summary", {"cookie": value}, token=TOKEN).status == 200


def test_another_clusters_cookie_is_not_this_ones() -> None:
    other = "another-token"
    jar = f"{d.cookie_name(other)}={d.cookie_value(other)}"
    assert d.cookie_name(other) != d.cookie_name(TOKEN)
    assert get("/api/summary", {"cookie": jar}, token=TOKEN).status == 401


def test_a_bearer_token_or_a_query_token_reads_the_endpoints() -> None:
    assert get("/metrics", {"authorization": f"Bearer {TOKEN}"}, token=TOKEN).status == 200
    assert get(f"/api/summary?token={TOKEN}", token=TOKEN).status == 200


def test_with_the_token_any_host_header_is_fine() -> None:
    resp = get("/api/summary", {"host": "head.cluster.example", "authorization": f"Bearer {TOKEN}"},
               token=TOKEN)
    assert resp.status == 200


# ---------------------------------------------------------------------------- parsing

def test_a_request_head_is_parsed() -> None:
    req = d.parse_request(b"GET /api/summary?x=1 HTTP/1.1\r\nHost: a:1\r\nX-Y:  z \r\n\r\n")
    assert req == d.Request("GET", "/api/summary", "x=1", {"host": "a:1", "x-y": "z"})


@pytest.mark.parametrize("raw", [b"hello\r\n\r\n", b"GET / HTTP/2\r\n\r\n", b"GET x HTTP/1.1\r\n\r\n",
                                 b"GET / HTTP/1.1\r\nno colon\r\n\r\n", b"\x16\x03\x01\r\n\r\n"])
def test_what_is_not_an_http_request_is_none(raw: bytes) -> None:
    assert d.parse_request(raw) is None


# ---------------------------------------------------------------------------- binding

@pytest.mark.parametrize("listen, expected", [
    ("", ("127.0.0.1", False)),
    ("127.0.0.1:6380", ("127.0.0.1", False)),
    ("[::1]:6380", ("::1", False)),
    ("0.0.0.0:6380", ("0.0.0.0", True)),
    ("10.0.0.5:6380", ("10.0.0.5", True)),
])
def test_the_dashboard_binds_where_the_cluster_listens_and_asks_the_token_beyond_loopback(
        listen: str, expected: tuple[str, bool]) -> None:
    assert bind.bind_address(listen) == expected


def test_urls_name_an_address_to_open() -> None:
    assert bind.url_for("127.0.0.1", 8265) == "http://127.0.0.1:8265/"
    assert bind.url_for("::1", 9) == "http://[::1]:9/"
    assert not bind.url_for("0.0.0.0", 9).startswith("http://0.0.0.0")


# ---------------------------------------------------------------------------- arguments

def test_init_arguments_reach_the_head_cfg() -> None:
    _, cfg = build_cfg(num_cpus=1, include_dashboard=False, dashboard_port=0)
    assert cfg["include_dashboard"] is False and cfg["dashboard_port"] == 0


@pytest.mark.parametrize("kwargs, error", [
    ({"dashboard_port": -1}, ValueError), ({"dashboard_port": 70000}, ValueError),
    ({"dashboard_port": "8265"}, ValueError), ({"dashboard_port": True}, ValueError),
    ({"include_dashboard": "yes"}, TypeError),
])
def test_bad_dashboard_arguments_are_refused_with_what_to_pass(kwargs: dict[str, Any],
                                                               error: type[Exception]) -> None:
    with pytest.raises(error, match="dashboard"):
        build_cfg(num_cpus=1, **kwargs)


def test_start_takes_the_dashboard_options_for_a_head_only() -> None:
    args = parse_start(["--head", "--dashboard-port", "0", "--include-dashboard", "false"])
    assert args.dashboard_port == 0 and args.include_dashboard is False
    assert parse_start(["--head"]).include_dashboard is True
    with pytest.raises(SystemExit):
        parse_start(["--address", "10.0.0.5:6380", "--token", "t", "--dashboard-port", "1"])


def test_no_function_in_the_task_stream_is_coloured_as_a_failure() -> None:
    """A failed task is drawn red; the first function was red too (hue 0). The page's
    own colorOf, run by Node.js, for the first 1,000 functions."""
    import shutil
    import subprocess

    from orchestra._observe.dashboard_page import SCRIPT
    node = shutil.which("node")
    if node is None:
        pytest.skip("Node.js is not installed here")
    m = re.search(r"function colorOf\(i\) \{.*?\}\n", SCRIPT)
    assert m, "colorOf is gone from the page"
    js = m.group(0) + "for (let i = 0; i < 1000; i++) console.log(colorOf(i));"
    out = subprocess.run([node, "-e", js], capture_output=True, text=True, timeout=30).stdout
    hues = [int(line[4:].split(",")[0]) for line in out.splitlines()]
    assert len(hues) == 1000 and all(30 <= h <= 330 for h in hues), sorted(hues)[:5]
    assert len(set(hues)) > 200   # still spread over the rest of the circle
