"""The head's dashboard on a real cluster: the page in headless Chromium (from the
system's packages; skipped with the reason where it is absent), the JSON summary and
/metrics over HTTP, and the cluster token where the cluster listens beyond loopback
(a head bound to 0.0.0.0, reached over 127.0.0.1)."""
from __future__ import annotations

import base64
import hashlib
import http.client
import json
import os
import re
import shutil
import socket
import ssl
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import pytest

import orchestra
from orchestra._cluster import launch as _launch
from orchestra._protocol import tls
from orchestra.cluster_utils import Cluster

pytestmark = pytest.mark.timeout(120)

REPO = str(Path(__file__).resolve().parents[2])
METRIC_LINE = re.compile(r'^[a-zA-Z_:][a-zA-Z0-9_:]*(\{([a-zA-Z_][a-zA-Z0-9_]*="([^"\\]|\\.)*",?)*\})? '
                         r'(-?[0-9.e+]+|NaN|[+-]Inf)$')
TASKS = 20
NODE: list[str] = []   # the busy cluster's node id (0, or 1 when the node has a process)


def _chromium() -> str | None:
    for name in ("chromium", "chromium-browser", "google-chrome"):
        path = shutil.which(name)
        if path:
            return path
    return None


def fetch(url: str, headers: dict[str, str] | None = None) -> tuple[int, dict[str, str], bytes]:
    """GET url with http.client (no redirect followed): status, headers, body."""
    u = urlsplit(url)
    if u.scheme == "https":   # a TLS cluster's: its certificate is checked by the tests
        conn: http.client.HTTPConnection = http.client.HTTPSConnection(
            u.hostname, u.port, timeout=10, context=ssl._create_unverified_context())
    else:
        conn = http.client.HTTPConnection(u.hostname, u.port, timeout=10)
    try:
        conn.request("GET", u.path + (f"?{u.query}" if u.query else ""), headers=headers or {})
        r = conn.getresponse()
        return r.status, {k.lower(): v for k, v in r.getheaders()}, r.read()
    finally:
        conn.close()


def summary(url: str, headers: dict[str, str] | None = None) -> dict[str, Any]:
    status, _, body = fetch(url + "api/summary", headers)
    assert status == 200, body
    return json.loads(body)


def wait_summary(url: str, ready: Any, timeout: float = 30.0,
                 headers: dict[str, str] | None = None) -> dict[str, Any]:
    """The summary once ``ready(summary)`` holds (the head hears of a task's end
    after its caller may have its result)."""
    deadline = time.monotonic() + timeout
    while True:
        s = summary(url, headers)
        if ready(s):
            return s
        if time.monotonic() > deadline:
            raise AssertionError(f"the summary did not get there within {timeout:g} s: {s}")
        time.sleep(0.1)


@orchestra.remote
def square(x: int) -> int:
    return x * x


@orchestra.remote
class Counter:
    def __init__(self) -> None:
        self.n = 0

    def add(self) -> int:
        self.n += 1
        return self.n


@pytest.fixture
def busy_cluster(start_cluster: Any) -> Iterator[str]:
    """A private cluster that ran TASKS tasks and holds one live actor; its dashboard URL
    (its node's id: NODE[0]). Loans on: most tasks are direct calls the head never sees,
    counted from their workers' task events."""
    c = start_cluster(num_cpus=2, dashboard_port=0)
    assert orchestra.get([square.remote(i) for i in range(TASKS)]) == [i * i for i in range(TASKS)]
    counter = Counter.remote()
    assert orchestra.get(counter.add.remote()) == 1
    url = c.info["dashboard_url"]
    NODE[:] = [c.info["node_id"]]
    wait_summary(url, lambda s: s["tasks"]["FINISHED"] >= TASKS and s["actors"]["ALIVE"] == 1)
    yield url
    del counter


# ---------------------------------------------------------------------------- the browser

def _dom(url: str, profile: Path, accept: str = "") -> str:
    """The page's DOM as Chromium renders it; ``accept``: the token of a cluster whose
    certificate it takes (by its key, as a user accepts it once)."""
    chromium = _chromium()
    assert chromium is not None
    pin = []
    if accept:
        spki = hashlib.sha256(tls.identity(accept)[2]).digest()
        pin = [f"--ignore-certificate-errors-spki-list={base64.b64encode(spki).decode()}"]
    r = subprocess.run([chromium, "--headless", "--no-sandbox", "--disable-gpu", *pin,
                        "--no-first-run", f"--user-data-dir={profile}",
                        "--virtual-time-budget=5000", "--dump-dom", url],
                       capture_output=True, text=True, timeout=90)
    assert r.returncode == 0, r.stderr[-2000:]
    return r.stdout


def _count(dom: str, state: str) -> int:
    m = re.search(rf'<tr data-state="{state}"[^>]*>.*?<td class="num count">(\d+)</td>', dom)
    assert m is not None, f"no {state} row in the page:\n{dom[:3000]}"
    return int(m.group(1))


@pytest.mark.skipif(_chromium() is None, reason="Chromium is not installed here "
                    "(Debian: apt-get install chromium); .ci/run installs it as root")
def test_the_page_in_chromium_shows_the_node_the_finished_tasks_and_the_live_actor(
        busy_cluster: str, tmp_path: Path) -> None:
    dom = _dom(busy_cluster, tmp_path / "profile")
    assert 'data-loaded="1"' in dom, f"the page never rendered a summary:\n{dom[:3000]}"
    assert re.search(r'id="nodes-alive">1<', dom)
    assert re.search(r'id="live" class="ok">live<', dom)
    finished = _count(dom, "FINISHED")
    assert finished >= TASKS
    assert finished == summary(busy_cluster)["tasks"]["FINISHED"]   # the page shows the head's figure
    assert _count(dom, "ALIVE") == 1
    assert _count(dom, "FAILED") == 0
    assert re.search(rf'<tr data-node="{NODE[0]}">.*?ALIVE', dom)
    assert re.search(r'<tr data-resource="CPU"><td>CPU</td>', dom)


# ---------------------------------------------------------------------------- HTTP

def test_the_summary_has_the_shape_of_the_cluster_summary(busy_cluster: str) -> None:
    s = summary(busy_cluster)
    assert set(s) >= {"session", "nodes", "resources_total", "resources_available", "store",
                      "tasks", "actors", "workers", "drivers", "time"}
    (node,) = s["nodes"]
    assert node["alive"] is True and node["node_id"] == NODE[0]
    assert node["resources_total"]["CPU"] == 2.0 and node["store_capacity"] > 0
    assert {"store_used", "spilled_bytes", "address", "resources_available"} <= set(node)
    assert set(s["store"]) == {"used", "capacity", "pooled", "spilled_bytes", "spilled_objects"}
    assert set(s["tasks"]) >= {"PENDING_ARGS_AVAIL", "PENDING_NODE_ASSIGNMENT", "RUNNING",
                               "FINISHED", "FAILED"}
    assert set(s["actors"]) >= {"DEPENDENCIES_UNREADY", "PENDING_CREATION", "ALIVE",
                                "RESTARTING", "DEAD"}
    assert s["workers"] >= 3 and s["drivers"] == 1   # two task workers and the actor's
    assert abs(s["time"] - time.time()) < 60


def test_metrics_parse_and_carry_the_figures(busy_cluster: str) -> None:
    status, headers, body = fetch(busy_cluster + "metrics")
    assert status == 200 and headers["content-type"].startswith("text/plain; version=0.0.4")
    text = body.decode()
    for line in text.splitlines():
        assert line.startswith("#") or METRIC_LINE.match(line), line
    assert 'orchestra_nodes{state="ALIVE"} 1.0' in text
    assert 'orchestra_actors{state="ALIVE"} 1.0' in text
    assert re.search(r'orchestra_tasks\{state="FINISHED"\} (\d+)', text)
    assert f'orchestra_resources_total{{node="{NODE[0]}",resource="CPU"}} 2.0' in text
    assert "orchestra_object_store_capacity_bytes{node=" in text


def test_unknown_paths_are_404_and_the_page_is_html(busy_cluster: str) -> None:
    assert fetch(busy_cluster + "nope")[0] == 404
    assert fetch(busy_cluster + "api/summary/../../x")[0] == 404
    status, headers, body = fetch(busy_cluster)
    assert status == 200 and headers["content-type"].startswith("text/html")
    assert "content-security-policy" in headers and b"api/summary" in body


def test_a_request_that_is_not_http_closes_its_connection_and_serves_on(busy_cluster: str) -> None:
    u = urlsplit(busy_cluster)
    with socket.create_connection((u.hostname, u.port), timeout=10) as s:
        s.sendall(b"\x16\x03\x01\x02\x00garbage\r\n\r\n")
        assert s.recv(100).startswith(b"HTTP/1.1 400")
    with socket.create_connection((u.hostname, u.port), timeout=10) as s:
        s.sendall(b"GET /" + b"a" * 40000)   # more than a request head may hold
        assert s.recv(100).startswith(b"HTTP/1.1 431")
    assert summary(busy_cluster)["nodes"]


def test_without_the_dashboard_init_says_so(start_cluster: Any) -> None:
    c = start_cluster(num_cpus=1, include_dashboard=False)
    assert c.info["dashboard_url"] == ""
    assert not os.path.exists(os.path.join(c.session_dir, "dashboard"))


def test_the_default_port_taken_the_dashboard_takes_a_free_one() -> None:
    from orchestra._observe.dashboard_bind import DEFAULT_PORT, listen
    holder = socket.socket()
    # As listen() does: a connection of an earlier dashboard on the port, in TIME_WAIT,
    # must not keep this holder from taking it (and listen() from taking it after).
    holder.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        holder.bind(("127.0.0.1", DEFAULT_PORT))
        holder.listen()
    except OSError:
        pass   # someone else holds it: as good
    try:
        sock = listen("127.0.0.1", None)
        assert sock.getsockname()[1] not in (DEFAULT_PORT, 0)
        sock.close()
    finally:
        holder.close()


def test_a_dashboard_port_that_is_taken_fails_init_saying_which(no_cluster: None,
                                                                capfd: Any) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        with pytest.raises(orchestra.exceptions.OrchestraError, match="head process exited"):
            orchestra.init(num_cpus=1, dashboard_port=port)
    assert f"the dashboard cannot listen on 127.0.0.1:{port}" in capfd.readouterr().err


# ---------------------------------------------------------------------------- the token

@pytest.fixture(scope="module")
def open_cluster() -> Iterator[Cluster]:
    """A cluster head bound to 0.0.0.0 (beyond loopback: its dashboard asks for the
    token), with a token the test knows."""
    c = Cluster(initialize_head=True, host="0.0.0.0", token="dash-test-token-0123456789",
                head_node_args={"num_cpus": 1, "object_store_memory": 64 << 20,
                                "dashboard_port": 0})
    try:
        yield c
    finally:
        c.shutdown()


def _loopback(c: Cluster) -> str:
    """The dashboard's URL over 127.0.0.1 (it binds 0.0.0.0; its URL names this
    machine's address)."""
    assert c.head_node is not None
    url = _launch.dashboard_url(c.head_node._started)
    return f"{urlsplit(url).scheme}://127.0.0.1:{urlsplit(url).port}/"


@pytest.mark.parametrize("path", ["", "api/summary", "metrics", "nope"])
def test_beyond_loopback_every_path_needs_the_token(open_cluster: Cluster, path: str) -> None:
    status, headers, body = fetch(_loopback(open_cluster) + path)
    assert status == 401 and "www-authenticate" in headers
    assert b"orchestra_" not in body and b"resources" not in body


@pytest.mark.parametrize("how", ["query", "bearer", "cookie"])
def test_beyond_loopback_a_wrong_token_is_403(open_cluster: Cluster, how: str) -> None:
    url = _loopback(open_cluster)
    bad = "BAD-TOKEN-must-not-be-logged"
    if how == "query":
        status = fetch(url + f"api/summary?token={bad}")[0]
    elif how == "bearer":
        status = fetch(url + "metrics", {"Authorization": f"Bearer {bad}"})[0]
    else:
        from orchestra._observe.dashboard import cookie_name
        status = fetch(url + "api/summary",
                       {"Cookie": f"{cookie_name(open_cluster.token)}={bad}"})[0]
    assert status == 403


def test_the_token_once_in_the_address_becomes_a_cookie(open_cluster: Cluster) -> None:
    url = _loopback(open_cluster)
    status, headers, _ = fetch(url + f"?token={open_cluster.token}")
    assert status == 303 and headers["location"] == "/"
    cookie = headers["set-cookie"]
    assert "HttpOnly" in cookie and "SameSite=Strict" in cookie and "Secure" in cookie
    assert open_cluster.token not in cookie
    jar = cookie.split(";")[0]
    assert fetch(url, {"Cookie": jar})[0] == 200
    assert summary(url, {"Cookie": jar})["nodes"][0]["alive"] is True
    status, _, body = fetch(url + "metrics", {"Authorization": f"Bearer {open_cluster.token}"})
    assert status == 200 and b'orchestra_nodes{state="ALIVE"} 1.0' in body


def test_a_tls_clusters_dashboard_is_https_with_the_clusters_certificate(
        open_cluster: Cluster) -> None:
    # Beyond loopback on a TLS cluster the token may be in a request: never in the clear.
    url = _loopback(open_cluster)
    assert url.startswith("https://") and tls.enabled(open_cluster.token)
    u = urlsplit(url)
    with socket.create_connection((u.hostname, u.port), timeout=10) as raw:
        ctx = ssl._create_unverified_context()
        with ctx.wrap_socket(raw) as s:
            der = s.getpeercert(binary_form=True)
            assert s.version() == "TLSv1.3"
    tls.check_peer(open_cluster.token, der, "dashboard")   # the cluster's key
    seen = hashlib.sha256(der).hexdigest().upper()
    assert tls.certificate_fingerprint(open_cluster.token).replace(":", "") == seen
    # Plain HTTP gets no page.
    conn = http.client.HTTPConnection(u.hostname, u.port, timeout=10)
    with pytest.raises((ConnectionError, http.client.HTTPException, OSError)):
        conn.request("GET", "/api/summary")
        conn.getresponse().read()
    conn.close()


def test_silent_peers_cannot_pile_up_on_the_https_dashboard(open_cluster: Cluster) -> None:
    """TLS handshakes under way count against a cap, as on the head's port: beyond 32
    silent peers the oldest is cut off at once (not when its 5 s are up), and a real
    client is served meanwhile. Before, every silent peer held its socket for 5 s with
    no limit on how many."""
    url = _loopback(open_cluster)
    u = urlsplit(url)
    silent = [socket.create_connection((u.hostname, u.port), timeout=10) for _ in range(40)]
    try:
        silent[0].settimeout(3)
        assert silent[0].recv(64) == b""   # cut off by the 33rd, well within 3 s
        status, _, _ = fetch(url + "metrics", {"Authorization": f"Bearer {open_cluster.token}"})
        assert status == 200
    finally:
        for s in silent:
            s.close()


@pytest.mark.skipif(_chromium() is None, reason="Chromium is not installed here")
def test_the_page_with_the_token_in_chromium_renders(open_cluster: Cluster, tmp_path: Path) -> None:
    dom = _dom(_loopback(open_cluster) + f"?token={open_cluster.token}", tmp_path / "profile",
               accept=open_cluster.token)
    assert 'data-loaded="1"' in dom and re.search(r'id="nodes-alive">1<', dom)


def test_bad_tokens_lose_nothing_and_are_logged_nowhere(open_cluster: Cluster, no_cluster: None) -> None:
    url = _loopback(open_cluster)
    bad = "BAD-TOKEN-must-not-be-logged"
    for _ in range(20):
        assert fetch(url + f"?token={bad}")[0] == 403
        assert fetch(url + "metrics", {"Authorization": f"Bearer {bad}"})[0] == 403
    # The cluster still runs work, and the dashboard still answers with the token.
    info = orchestra.init(address=open_cluster.address, token=open_cluster.token)
    assert info["dashboard_url"] == _launch.dashboard_url(open_cluster.head_node._started)  # type: ignore[union-attr]
    assert orchestra.get(square.remote(7)) == 49
    orchestra.shutdown()
    auth = {"Authorization": f"Bearer {open_cluster.token}"}
    wait_summary(url, lambda s: s["drivers"] == 0, headers=auth)
    started = open_cluster.head_node._started   # type: ignore[union-attr]
    for root in (started.run_dir, started.session_dir):
        for dirpath, _, files in os.walk(root):
            for name in files:
                try:
                    data = Path(dirpath, name).read_bytes()
                except OSError:
                    continue
                assert bad.encode() not in data, f"{name} holds the refused token"
    # The head's own cfg and its record (0600) hold the real token; its log does not.
    log = Path(started.run_dir, "stderr.log").read_text()
    assert open_cluster.token not in log
    assert "the dashboard refused" in log and "no cluster token, a wrong one" in log


# ---------------------------------------------------------------------------- the CLI

def test_start_and_status_print_the_dashboard_url(tmp_path: Path) -> None:
    env = dict(os.environ, PYTHONPATH=REPO, ORCHESTRA_STATE_DIR=str(tmp_path / "state"))
    env.pop("ORCHESTRA_ADDRESS", None)

    def cli(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([sys.executable, "-m", "orchestra._cli", *args], capture_output=True,
                              text=True, timeout=60, env=env)
    try:
        r = cli("start", "--head", "--port", "0", "--dashboard-port", "0", "--num-cpus", "1",
                "--object-store-memory", str(64 << 20))
        assert r.returncode == 0, r.stderr
        m = re.search(r"Dashboard: (http://127\.0\.0\.1:\d+/)\n", r.stdout)
        assert m, r.stdout
        assert summary(m.group(1))["nodes"][0]["alive"] is True
        r = cli("status")
        assert r.returncode == 0, r.stderr
        assert f"dashboard: {m.group(1)}" in r.stdout
    finally:
        cli("stop", "--timeout", "5")


def test_urllib_reads_the_summary_as_a_script_would(busy_cluster: str) -> None:
    with urllib.request.urlopen(busy_cluster + "api/summary", timeout=10) as r:
        assert json.load(r)["actors"]["ALIVE"] == 1
