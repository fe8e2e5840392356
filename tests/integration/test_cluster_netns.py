"""A cluster whose nodes share nothing but the network: the head on one namespaced host,
two nodes on two others, each node in a mount namespace of its own with private
/dev/shm and /tmp (conftest.netns_cluster). A driver on a joined node uses that node's
store; a torch gloo all_reduce runs over gang members on the three hosts."""
from __future__ import annotations

import json
import os
import sys
from typing import Any

import pytest


def _driver_on_node(c: Any, i: int, code: str, timeout: float = 120) -> Any:
    """Run ``code`` in a driver on node host i (in that node's network and mount
    namespaces: it sees the node's /dev/shm), connected by address and token."""
    prelude = ("import json, os, orchestra\n"
               "orchestra.init(address=os.environ['ORCHESTRA_ADDRESS'])\n")
    argv = ["nsenter", "-t", str(c.node_pids[i]), "-m", "-n",
            sys.executable, "-c", prelude + code]
    import subprocess
    r = subprocess.run(argv, capture_output=True, text=True, timeout=timeout,
                       env=c.hosts.env(ORCHESTRA_ADDRESS=c.address, ORCHESTRA_TOKEN=c.token))
    if r.returncode != 0:
        raise AssertionError(f"the driver failed (code {r.returncode}):\n{r.stdout}\n{r.stderr}")
    return json.loads(r.stdout.strip().splitlines()[-1])


def test_a_driver_on_a_joined_node_uses_its_store_and_moves_objects_both_ways(netns_cluster):
    c = netns_cluster
    got = _driver_on_node(c, 0, """
import hashlib, numpy as np
from orchestra.util.scheduling_strategies import NodeAffinitySchedulingStrategy as A
me = orchestra.get_runtime_context().get_node_id()
others = [n["NodeID"] for n in orchestra.nodes() if n["NodeID"] != me and n["Resources"].get("CPU")]

@orchestra.remote
def digest(x):
    return hashlib.sha256(x.tobytes()).hexdigest(), orchestra.get_runtime_context().get_node_id()

@orchestra.remote
def make(n):
    return np.arange(n, dtype=np.int64)

x = np.random.default_rng(3).integers(0, 255, 24 << 20, dtype=np.uint8)
ref = orchestra.put(x)
far = [orchestra.get(digest.options(scheduling_strategy=A(o)).remote(ref)) for o in others]
made = orchestra.get(make.options(scheduling_strategy=A(others[0])).remote(3 << 20))
print(json.dumps({"me": me, "want": hashlib.sha256(x.tobytes()).hexdigest(), "far": far,
                  "sum": int(made.sum()), "n": 3 << 20}))
""")
    assert got["me"] == c.node_ids[0]
    assert {h for h, _ in got["far"]} == {got["want"]}
    assert len({w for _, w in got["far"]}) == 2 and got["me"] not in {w for _, w in got["far"]}
    n = got["n"]
    assert got["sum"] == n * (n - 1) // 2


def test_each_node_advertises_its_address_and_work_pins_to_it(netns_cluster):
    # As Ray's nodes: node:<address> = 1 on each (the head's node also
    # node:__internal_head__), so resources={"node:<ip>": 0.01} runs work on that host:
    # on the head's host, on the node beside the head (the head runs no work).
    c = netns_cluster
    got = _driver_on_node(c, 0, """
@orchestra.remote
def where():
    return orchestra.get_runtime_context().get_node_id()

nodes = [n for n in orchestra.nodes() if n["Alive"]]
out = {}
for n in nodes:
    key = "node:" + n["NodeManagerAddress"]
    out[n["NodeID"]] = {"has": n["Resources"].get(key),
                        "head": n["Resources"].get("node:__internal_head__"),
                        "ran": orchestra.get(where.options(num_cpus=0, resources={key: 0.01}).remote())}
print(json.dumps(out))
""")
    assert len(got) == 4
    for node_id, row in got.items():
        assert row["has"] == 1.0 and row["ran"] == (c.beside if row["head"] else node_id)
    assert sorted(row["head"] for row in got.values() if row["head"]) == [1.0]


def test_wait_with_fetch_local_copies_ready_objects_to_the_callers_node(netns_cluster):
    # As Ray: wait(fetch_local=True), the default, starts moving the ready values to the
    # caller's node, so the get() that follows is local; fetch_local=False leaves them.
    c = netns_cluster
    got = _driver_on_node(c, 0, """
import time, numpy as np
from orchestra.util.scheduling_strategies import NodeAffinitySchedulingStrategy as A
from orchestra.util.state import list_objects
me = orchestra.get_runtime_context().get_node_id()
other = [n["NodeID"] for n in orchestra.nodes()
         if n["NodeID"] != me and n["Alive"] and n["Resources"].get("CPU")][0]

@orchestra.remote
def make(seed):
    return np.full(4 << 20, seed, dtype=np.uint8)

def copies(ref):
    rows = [o for o in list_objects() if o["object_id"] == ref.hex()]
    return rows[0]["copies"] if rows else None

out = {}
for fetch in (False, True):
    ref = make.options(scheduling_strategy=A(other)).remote(int(fetch))
    ready, _ = orchestra.wait([ref], timeout=60, fetch_local=fetch)
    assert ready == [ref]
    deadline = time.monotonic() + (2 if not fetch else 20)
    while time.monotonic() < deadline and me not in (copies(ref) or []):
        time.sleep(0.05)
    out[str(fetch)] = {"copies": copies(ref), "value": int(orchestra.get(ref)[0])}
print(json.dumps({"me": me, "out": out}))
""")
    me = got["me"]
    assert me not in got["out"]["False"]["copies"], got
    assert me in got["out"]["True"]["copies"], got
    assert [got["out"][k]["value"] for k in ("False", "True")] == [0, 1]


_GANG = """
import subprocess
from datetime import timedelta

class Reducer:
    def reduce(self, value):
        import torch
        import torch.distributed as dist
        from orchestra._gang.member import local_address_towards
        ctx = orchestra.gang_context()
        env = ctx.torch_env()
        # gloo picks its interface from the host name, which these hosts share: torch_env()
        # names the one on the route to rank 0 (else all_reduce hangs here).
        os.environ.update(env)
        me = local_address_towards(env["MASTER_ADDR"])
        ifname = None
        for line in subprocess.run(["ip", "-o", "-4", "addr"], capture_output=True,
                                   text=True).stdout.splitlines():
            f = line.split()
            if f[3].split("/")[0] == me:
                ifname = f[1].split("@")[0]
        assert env["GLOO_SOCKET_IFNAME"] == env["NCCL_SOCKET_IFNAME"] == ifname, (env, ifname)
        dist.init_process_group("gloo", timeout=timedelta(seconds=60))
        t = torch.tensor([float(value)], dtype=torch.float64)
        dist.all_reduce(t)
        dist.destroy_process_group()
        return {"sum": float(t[0]), "rank": ctx.rank, "node_rank": ctx.node_rank,
                "num_nodes": ctx.num_nodes, "local_rank": ctx.local_rank,
                "node": orchestra.get_runtime_context().get_node_id(),
                "master": env["MASTER_ADDR"], "me": me}

g = orchestra.gang(Reducer, 3, num_cpus=1, num_gpus=0, timeout_s=90)
res = orchestra.get([a.reduce.remote(i + 1) for i, a in enumerate(g.actors)], timeout=120)
g.shutdown()
print(json.dumps(res))
"""


def test_a_torch_all_reduce_runs_over_gang_members_on_three_hosts(netns_cluster):
    pytest.importorskip("torch")
    c = netns_cluster
    res = c.driver(_GANG, timeout=180)
    assert [r["sum"] for r in res] == [6.0, 6.0, 6.0]
    assert len({r["node"] for r in res}) == 3
    assert [r["node_rank"] for r in res] == [0, 1, 2] and {r["num_nodes"] for r in res} == {3}
    assert {r["local_rank"] for r in res} == {0}
    head_ip = c.address.rsplit(":", 1)[0]
    assert {r["master"] for r in res} == {head_ip}      # rank 0's routable address
    assert not any(r["me"].startswith("127.") for r in res)


# A sniffer in the bridge's namespace: every frame on the veths and the bridge
# (AF_PACKET, all interfaces), searched for the marker until its stdin closes and its
# socket is empty (on a busy machine it lags behind the transfer: frames it left unread
# counted neither as seen nor as dropped, and CI saw 86 MiB of 96).
_SNIFF = """
import json, socket, struct, sys, threading
needle = sys.argv[1].encode()
s = socket.socket(socket.AF_PACKET, socket.SOCK_RAW, socket.htons(3))
s.setsockopt(socket.SOL_SOCKET, 33, 1 << 30)   # SO_RCVBUFFORCE: room for every frame
s.settimeout(0.2)
stop = threading.Event()
threading.Thread(target=lambda: (sys.stdin.read(), stop.set()), daemon=True).start()
print("ready", flush=True)
frames = hits = size = 0
tail = b""
while True:   # after stdin closes, what the socket still holds is read too
    try:
        f = s.recv(1 << 17)
    except (TimeoutError, OSError):
        if stop.is_set():
            break
        continue
    frames += 1
    size += len(f)
    if needle in f or needle in tail + f[:len(needle)]:
        hits += 1
    tail = f[-len(needle):]
_, dropped = struct.unpack("II", s.getsockopt(263, 6, 8))   # PACKET_STATISTICS
print(json.dumps({"frames": frames, "bytes": size, "hits": hits, "dropped": dropped}))
"""

_MARKED_WORK = """
from orchestra.util.scheduling_strategies import NodeAffinitySchedulingStrategy as A
marker = os.environ["MARKER"]
nodes = {("host1" if n["Resources"].get("host1") else "host2"): n["NodeID"]
         for n in orchestra.nodes() if n["Resources"].get("host1") or n["Resources"].get("host2")}

@orchestra.remote
def echo(text):
    return text + "!"

@orchestra.remote
def make(n):
    return (marker * (n // len(marker))).encode()

@orchestra.remote
def check(data):
    return len(data), data[-len(marker):].decode() == marker

out = {"echo": orchestra.get(echo.options(scheduling_strategy=A(nodes["host1"])).remote(marker))}
big = make.options(scheduling_strategy=A(nodes["host1"])).remote(96 << 20)   # on host 1
out["moved"] = orchestra.get(check.options(scheduling_strategy=A(nodes["host2"])).remote(big))
print(json.dumps(out))
"""

# From the head's host: a TLS client handshake (no certificate check) with each port.
_HANDSHAKES = """
import json, socket, ssl, sys
ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
ctx.check_hostname = False
ctx.verify_mode = ssl.CERT_NONE
got = {}
for target in sys.argv[1:]:
    host, port = target.rsplit(":", 1)
    try:
        with socket.create_connection((host, int(port)), timeout=10) as raw, \\
                ctx.wrap_socket(raw) as s:
            got[target] = s.version()
    except Exception as exc:
        got[target] = f"{type(exc).__name__}: {exc}"
print(json.dumps(got))
"""


def _listening(c: Any, i: int) -> list[str]:
    """The TCP ports host i listens on beyond loopback (its /proc/net/tcp)."""
    import subprocess
    r = subprocess.run(["ip", "netns", "exec", c.hosts.ns(i), "cat", "/proc/net/tcp"],
                       capture_output=True, text=True, timeout=30)
    ports = []
    for line in r.stdout.splitlines()[1:]:
        local, state = line.split()[1], line.split()[3]
        addr, port = local.split(":")
        if state == "0A" and not addr.endswith("7F"):   # LISTEN, not 127.x
            ports.append(f"{c.hosts.ip(i)}:{int(port, 16)}")
    return ports


def test_nothing_readable_crosses_the_veths_and_every_port_speaks_tls(netns_cluster):
    """The cluster between namespaced hosts speaks TLS by default: a sniffer on the
    bridge sees none of a task's argument, its result, or 96 MiB moved from host 1 to
    host 2, and every port a host listens on beyond loopback (the head's, the data
    servers', the workers' direct-call ports, the dashboard) completes a TLS 1.3
    handshake."""
    import subprocess
    c = netns_cluster
    # ORCHESTRA_NETNS_TLS=0 (the fixture's plain cluster) is the control: there the
    # sniffer must see the marker.
    plain = os.environ.get("ORCHESTRA_NETNS_TLS") == "0"
    assert c.token.startswith("tls-") != plain
    marker = "veth-secret-5d2e91"
    sniffer = subprocess.Popen(["ip", "netns", "exec", c.hosts.bridge, sys.executable, "-c",
                                _SNIFF, marker], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                               text=True)
    try:
        assert sniffer.stdout.readline().strip() == "ready"
        prelude = ("import json, os, orchestra\n"
                   "orchestra.init(address=os.environ['ORCHESTRA_ADDRESS'])\n")
        r = c.hosts.run(0, [sys.executable, "-c", prelude + _MARKED_WORK], timeout=180,
                        env=c.hosts.env(ORCHESTRA_ADDRESS=c.address, ORCHESTRA_TOKEN=c.token,
                                        MARKER=marker))
        assert r.returncode == 0, r.stdout + r.stderr
        got = json.loads(r.stdout.strip().splitlines()[-1])
    finally:
        out, _ = sniffer.communicate(timeout=30)
    seen = json.loads(out.strip().splitlines()[-1])
    assert got == {"echo": marker + "!",
                   "moved": [(96 << 20) // len(marker) * len(marker), True]}
    assert seen["bytes"] > 96 << 20 and seen["dropped"] == 0, seen
    if plain:
        assert seen["hits"] > 0, seen
        return
    assert seen["hits"] == 0, f"the marker crossed the wire in {seen['hits']} frame(s)"
    ports = [p for i in range(3) for p in _listening(c, i)]
    assert c.address in ports and len(ports) >= 4, ports   # the head's, 2 data servers, ...
    r = c.hosts.run(0, [sys.executable, "-c", _HANDSHAKES, *ports], timeout=120)
    assert r.returncode == 0, r.stderr
    versions = json.loads(r.stdout.strip().splitlines()[-1])
    assert versions == dict.fromkeys(ports, "TLSv1.3"), versions
    print(f"sniffed {seen}; TLS 1.3 on {sorted(ports)}")
