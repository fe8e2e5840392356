"""TLS on a real cluster (``orchestra start --head --tls`` and a joined node on this
machine's loopback; tests/integration/test_cluster_netns.py runs the same between network
namespaces, where TLS is the default): what crosses the wire is unreadable, bad
clients are refused at once while the head serves on, and the choice is announced."""
from __future__ import annotations

import json
import os
import socket
import struct
import subprocess
import sys
import threading
import time

import pytest

from _cli import SMALL, cli, records, start_head
from orchestra._protocol import tls

MARKER = "secret-marker-7c1f0e"

_DRIVER = """
import json, sys, orchestra
orchestra.init(address=sys.argv[1], token=sys.argv[2])
marker = sys.argv[3]

@orchestra.remote(resources={"far": 1})
def echo(text):
    return text + "!"

@orchestra.remote(resources={"far": 1})
def make(n):
    return (marker * (n // len(marker))).encode()

@orchestra.remote(resources={"far": 1})
class Keeper:
    def keep(self, text):
        return text.upper()

out = {"echo": orchestra.get(echo.remote(marker))}
big = orchestra.get(make.remote(8 << 20))   # made on the node, read here over the wire
out["big"] = len(big) if big.startswith(marker.encode()) else -1
k = Keeper.remote()
out["actor"] = orchestra.get(k.keep.remote(marker))
print(json.dumps(out))
"""


class _Sniffer:
    """Every frame on the loopback interface (AF_PACKET), searched for ``needle``."""

    def __init__(self, needle: bytes) -> None:
        self.needle = needle
        self.sock = socket.socket(socket.AF_PACKET, socket.SOCK_RAW, socket.htons(0x0003))
        # Room for every frame of the run (as root: past rmem_max), and the kernel's
        # count of those it dropped all the same (read at close: none may be).
        self.sock.setsockopt(socket.SOL_SOCKET, 33, 1 << 30)   # SO_RCVBUFFORCE
        self.sock.bind(("lo", 0))
        self.sock.settimeout(0.2)
        self.frames = self.hits = self.bytes = self.dropped = 0
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _run(self) -> None:
        tail = b""
        while not self.stop.is_set():
            try:
                frame = self.sock.recv(1 << 17)
            except (TimeoutError, OSError):
                continue
            self.frames += 1
            self.bytes += len(frame)
            if self.needle in frame or self.needle in tail + frame[:len(self.needle)]:
                self.hits += 1
            tail = frame[-len(self.needle):]

    def close(self) -> None:
        time.sleep(0.5)   # the last frames read
        self.stop.set()
        self.thread.join(5)
        # PACKET_STATISTICS (SOL_PACKET 263, 6): frames seen and dropped
        _, self.dropped = struct.unpack("II", self.sock.getsockopt(263, 6, 8))
        self.sock.close()


def _run_driver(head: dict) -> dict:
    r = subprocess.run([sys.executable, "-c", _DRIVER, head["address"], head["token"], MARKER],
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    return json.loads(r.stdout.strip().splitlines()[-1])


def _cluster(state: str, *head_args: str, unmarked: bool = False) -> dict:
    """A head and a node joined to it (``unmarked``: given the token without "tls-")."""
    head = start_head(state, *head_args)
    token = head["token"].removeprefix(tls.PREFIX) if unmarked else head["token"]
    r = cli("start", "--address", head["address"], "--token", token, *SMALL,
            "--resources", '{"far": 4}')
    assert r.returncode == 0, r.stderr
    return head


def _sniffed(head: dict) -> tuple[dict, _Sniffer]:
    sniffer = _Sniffer(MARKER.encode())
    try:
        got = _run_driver(head)
    finally:
        sniffer.close()
    assert got == {"echo": MARKER + "!", "big": (8 << 20) // len(MARKER) * len(MARKER),
                   "actor": MARKER.upper()}
    return got, sniffer


@pytest.mark.skipif(os.geteuid() != 0, reason="sniffing the loopback (AF_PACKET) needs root")
def test_nothing_readable_crosses_the_wire_of_a_tls_cluster_and_plain_tcp_shows_it(state):
    head = _cluster(state, "--tls", unmarked=True)   # the node finds the TLS itself
    assert head["token"].startswith("tls-")
    _, sniffer = _sniffed(head)
    # Arguments, results, an actor's call and 8 MiB moved between the nodes: all went
    # over the loopback, and the marker was in none of it.
    assert sniffer.bytes > 8 << 20 and sniffer.dropped == 0, vars(sniffer)
    assert sniffer.hits == 0, f"the marker crossed the wire in {sniffer.hits} frame(s)"
    assert cli("stop").returncode == 0
    # The same work on a plain cluster: the sniffer sees the marker (it looks where the
    # bytes go).
    head = _cluster(state)
    assert not head["token"].startswith("tls-")
    _, sniffer = _sniffed(head)
    assert sniffer.hits > 0


def test_a_tls_cluster_serves_on_after_a_plain_client_and_a_wrong_key_are_refused(state):
    head = _cluster(state, "--tls")
    host, port = head["address"].rsplit(":", 1)
    # A client speaking in the clear is refused at once: the head closes without a word.
    with socket.create_connection((host, int(port)), timeout=10) as s:
        s.sendall(b"ORCA\x01")
        assert s.recv(64) == b""
    # A node given the token without its mark (one a user chose, which the head marked)
    # finds the TLS and joins, its data server and workers speaking TLS too.
    plain = head["token"].removeprefix(tls.PREFIX)
    t0 = time.monotonic()
    r = cli("start", "--address", head["address"], "--token", plain, *SMALL)
    assert r.returncode == 0, r.stderr
    assert time.monotonic() - t0 < 25
    status = cli("status", "--address", head["address"], "--token", plain)
    assert status.returncode == 0 and "3 node(s), 3 alive" in status.stdout, status.stdout
    # Another cluster's token: the head's key is not the one it names; both are named.
    other = tls.tls_token("0f" * 24)
    r = cli("start", "--address", head["address"], "--token", other, *SMALL)
    assert r.returncode == 1
    assert tls.cluster_fingerprint(other) in r.stderr
    assert tls.cluster_fingerprint(head["token"]) in r.stderr
    # Silent and garbage peers hold nothing: the head still serves a real driver. Those
    # that never send a ClientHello count against the cap on handshakes: beyond 32, the
    # oldest is cut off at once, not when its 5 s are up.
    silent = [socket.create_connection((host, int(port))) for _ in range(40)]
    with socket.create_connection((host, int(port))) as junk:
        junk.sendall(b"GET / HTTP/1.1\r\n\r\n" * 10)
    try:
        silent[0].settimeout(3)
        assert silent[0].recv(64) == b""
        assert _run_driver(head)["echo"] == MARKER + "!"
    finally:
        for s in silent:
            s.close()
    assert [rec["kind"] for rec in records(state)].count("node") == 2


_LENDING_DRIVER = """
import json, sys, orchestra
from orchestra._runtime import context
orchestra.init(address=sys.argv[1], token=sys.argv[2])

@orchestra.remote(resources={"far": 1})
def far(i):
    return i

# Tasks only the joined node can run, one at a time: the head lends its worker to this
# driver (nothing else waits for it), which then calls it straight, over TLS, from
# another node.
remote = 0
for i in range(50):
    assert orchestra.get(far.remote(i), timeout=60) == i
    loans = context.current_client().direct.lent.loans
    remote = sum(1 for ls in loans.values() for le in ls if le.peer is not None and le.peer.remote)
    if remote:
        break
print(json.dumps({"remote_loans": remote}))
"""


def test_the_workers_of_a_node_given_the_unmarked_token_take_direct_calls_over_tls(state):
    """A node joined with the token its user chose (the head marked it "tls-": the Slurm
    example does so) found the TLS for itself, and so must its workers for the calls
    other nodes send them: they listened in the clear, every driver on another node was
    refused ("does not speak TLS"), gave the lent worker back at once, and its tasks
    waited for the one worker it could borrow while the joined node's sat idle."""
    head = _cluster(state, "--tls", unmarked=True)
    r = subprocess.run([sys.executable, "-c", _LENDING_DRIVER, head["address"], head["token"]],
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    assert "does not speak TLS" not in r.stderr, r.stderr
    assert json.loads(r.stdout.strip().splitlines()[-1])["remote_loans"] >= 1, r.stderr


def test_tls_is_announced_and_its_absence_beyond_loopback_is_warned(state):
    head_out = cli("start", "--head", "--port", "0", "--tls", *SMALL)
    assert head_out.returncode == 0, head_out.stderr
    [head] = [rec for rec in records(state) if rec["kind"] == "head"]
    assert "use TLS" in head_out.stdout and tls.cluster_fingerprint(head["token"]) in head_out.stdout
    status = cli("status", "--address", head["address"], "--token", head["token"])
    assert status.returncode == 0, status.stderr
    assert f"connections: TLS 1.3, cluster key {tls.cluster_fingerprint(head['token'])}" \
        in status.stdout
    assert cli("stop").returncode == 0
    insecure = cli("start", "--head", "--port", "0", "--host", "0.0.0.0", "--insecure-no-tls",
                   *SMALL)
    assert insecure.returncode == 0, insecure.stderr
    assert "NOT encrypted" in insecure.stdout
    [head] = [rec for rec in records(state) if rec["kind"] == "head"]
    assert not head["token"].startswith("tls-")
    status = cli("status", "--address", head["address"], "--token", head["token"])
    assert "NOT ENCRYPTED between machines" in status.stdout, status.stdout


def _pki_env(files, ca_path: str) -> dict[str, str]:
    return {"ORCHESTRA_TLS_CERT": files.cert, "ORCHESTRA_TLS_KEY": files.key,
            "ORCHESTRA_TLS_CA": ca_path}


@pytest.mark.skipif(os.geteuid() != 0, reason="sniffing the loopback (AF_PACKET) needs root")
def test_a_cluster_on_certificates_of_its_own_takes_only_their_holders(state, tmp_path):
    """--tls-cert/--tls-key/--tls-ca: every machine presents a certificate of the CA (the
    head, a node, a driver: three of their own), nothing readable crosses the wire, and
    a node without one, or with another CA's, is refused naming why."""
    from _pki import CA
    ca = CA(str(tmp_path))
    h, n, d = ca.issue("head-host"), ca.issue("node-host"), ca.issue("driver-host")
    # Beyond loopback (this machine's address), where the dashboard is HTTPS too.
    head = start_head(state, "--host", "0.0.0.0", "--tls-cert", h.cert, "--tls-key", h.key,
                      "--tls-ca", ca.cert)
    assert head["token"].startswith("tls-")
    assert head["tls_files"] == [h.cert, h.key, ca.cert]
    r = cli("start", "--address", head["address"], "--token", head["token"], *SMALL,
            "--resources", '{"far": 4}', "--tls-cert", n.cert, "--tls-key", n.key,
            "--tls-ca", ca.cert)
    assert r.returncode == 0, r.stderr
    sniffer = _Sniffer(MARKER.encode())
    try:
        p = subprocess.run([sys.executable, "-c", _DRIVER, head["address"], head["token"],
                            MARKER], capture_output=True, text=True, timeout=120,
                           env=dict(os.environ, **_pki_env(d, ca.cert)))
    finally:
        sniffer.close()
    assert p.returncode == 0, p.stderr
    assert json.loads(p.stdout.strip().splitlines()[-1]) == {
        "echo": MARKER + "!", "big": (8 << 20) // len(MARKER) * len(MARKER),
        "actor": MARKER.upper()}
    assert sniffer.bytes > 8 << 20 and sniffer.dropped == 0, vars(sniffer)
    assert sniffer.hits == 0, f"the marker crossed the wire in {sniffer.hits} frame(s)"
    status = cli("status", "--address", head["address"], "--token", head["token"],
                 env=_pki_env(d, ca.cert))
    assert status.returncode == 0, status.stderr
    assert "connections: TLS 1.3, certificates of the CA CN=test-ca" in status.stdout, \
        status.stdout
    # The dashboard serves HTTPS with the head's certificate and asks browsers for none.
    with open(os.path.join(head["session_dir"], "dashboard")) as f:
        url = f.read().strip()
    assert url.startswith("https://"), url
    import ssl
    import urllib.parse
    browser = ssl.create_default_context(cafile=ca.cert)
    browser.check_hostname = False
    parts = urllib.parse.urlsplit(url)
    with socket.create_connection((parts.hostname, parts.port), timeout=10) as raw, \
            browser.wrap_socket(raw) as page:
        assert b"head-host" in page.getpeercert(binary_form=True)
        page.sendall(b"GET /api/summary HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
        assert page.recv(64).startswith(b"HTTP/1.")
    # The token alone no longer joins: the head's certificate is not the token's key.
    r = cli("start", "--address", head["address"], "--token", head["token"], *SMALL)
    assert r.returncode == 1 and "--tls-cert/--tls-key/--tls-ca" in r.stderr, r.stderr
    # Nor does a certificate of another CA, with the right token.
    other = CA(str(tmp_path), "other-ca")
    o = other.issue("intruder")
    r = cli("start", "--address", head["address"], "--token", head["token"], *SMALL,
            "--tls-cert", o.cert, "--tls-key", o.key, "--tls-ca", other.cert)
    assert r.returncode == 1 and "does not chain to this process's CA" in r.stderr, r.stderr
    # An expired certificate is refused before anything starts.
    old = ca.issue("old-host", start_days=-9, days=-2)
    r = cli("start", "--address", head["address"], "--token", head["token"], *SMALL,
            "--tls-cert", old.cert, "--tls-key", old.key, "--tls-ca", ca.cert)
    assert r.returncode == 1 and "expired on" in r.stderr and old.cert in r.stderr, r.stderr
    assert [rec["kind"] for rec in records(state)].count("node") == 1
