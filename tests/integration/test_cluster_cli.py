"""``orchestra start``/``stop``/``status``, ``init(address="auto")``, Cluster, and a
cluster of three hosts in network namespaces (conftest.netns_cluster).

Each test that starts processes from the shell points ORCHESTRA_STATE_DIR at a
directory of its own and uses port 0 (the head picks a free port), so that it never
meets a cluster someone started on this machine. What a stop must leave: none of the
processes it started (the head, the nodes, their fork servers and workers: their
process groups), no session directory, no segment directory of theirs in /dev/shm.
"""
from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import pytest

import orchestra
from _cli import REPO, SMALL, T, cli, records, shm_of, start_head, store_pid
from _netns import Hosts, kept_under_tmp, skip_reason
from _probes import pid_gone, wait_until
from orchestra._platform.procutil import group_members
from orchestra._runtime import cluster_file as cf
from orchestra.cluster_utils import Cluster

pytestmark = pytest.mark.timeout(90)

def listening(port: int) -> list[str]:
    """The local addresses ("127.0.0.1", "0.0.0.0", ...) with a TCP listener on ``port``."""
    found = []
    for line in Path("/proc/net/tcp").read_text().splitlines()[1:]:
        local, state = line.split()[1], line.split()[3]
        addr, hexport = local.split(":")
        if state == "0A" and int(hexport, 16) == port:
            found.append(socket.inet_ntoa(bytes.fromhex(addr)[::-1]))
    return found


# ---------------------------------------------------------------------------- start/stop

@pytest.mark.shared_machine
def test_start_then_stop_leaves_no_process_socket_or_segment(state: str) -> None:
    head = start_head(state, beside=True)   # the head, and the node beside it
    r = cli("start", "--address", head["address"], "--token", head["token"], *SMALL)
    assert r.returncode == 0, r.stderr
    assert "joined" in r.stdout
    recs = sorted(records(state), key=lambda rec: rec["kind"])
    assert [rec["kind"] for rec in recs] == ["head", "node", "node"]
    procs = {p for rec in recs for p in group_members(rec["pid"])}
    assert {rec["pid"] for rec in recs} <= procs
    stores = [store_pid(rec) for rec in recs]
    assert stores[0] in procs, "the head runs in its supervisor's process group"
    assert all(shm_of(pid) for pid in stores), "each store has its segment directory"
    port = int(head["address"].rsplit(":", 1)[1])

    r = cli("stop")
    assert r.returncode == 0, r.stderr
    assert "stopped the head" in r.stdout and r.stdout.count("stopped the node") == 2
    wait_until(lambda: all(pid_gone(p) for p in procs), T, "every started process gone")
    for rec, pid in zip(recs, stores, strict=True):
        assert not os.path.exists(rec["session_dir"]), rec
        assert shm_of(pid) == [], rec
    assert listening(port) == []
    assert os.listdir(state) == []
    assert "nothing to stop" in cli("stop").stdout


def test_the_head_listens_on_loopback_unless_told_otherwise(state: str) -> None:
    head = start_head(state)
    assert head["address"].startswith("127.0.0.1:")
    assert listening(int(head["address"].rsplit(":", 1)[1])) == ["127.0.0.1"]


def test_a_head_on_every_interface_prints_a_routable_address(state: str) -> None:
    head = start_head(state, "--host", "0.0.0.0")
    port = int(head["address"].rsplit(":", 1)[1])
    assert listening(port) == ["0.0.0.0"]
    assert not head["address"].startswith("0.0.0.0")


def test_a_wrong_token_is_refused_at_join_and_the_head_carries_on(state: str) -> None:
    head = start_head(state)
    r = cli("start", "--address", head["address"], "--token", "not-the-token", *SMALL)
    assert r.returncode == 1
    assert "refused the token" in r.stderr, r.stderr
    assert [rec["kind"] for rec in records(state)] == ["head"]
    assert not pid_gone(head["pid"])
    r = cli("start", "--address", head["address"], *SMALL, env={"ORCHESTRA_TOKEN": head["token"]})
    assert r.returncode == 0, r.stderr


def test_an_unreachable_head_is_named_at_join(state: str) -> None:
    with socket.socket() as s:   # a port nothing listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    r = cli("start", "--address", f"127.0.0.1:{port}", "--token", "t", *SMALL)
    assert r.returncode == 1
    assert "unreachable" in r.stderr, r.stderr
    assert os.listdir(state) == []


def test_a_taken_port_is_a_clear_error(state: str) -> None:
    head = start_head(state)
    port = head["address"].rsplit(":", 1)[1]
    r = cli("start", "--head", "--port", port, *SMALL)
    assert r.returncode == 1
    assert "port" in r.stderr and "taken" in r.stderr, r.stderr
    assert [rec["pid"] for rec in records(state)] == [head["pid"]]


def test_status_prints_nodes_resources_and_store(state: str) -> None:
    head = start_head(state, "--resources", '{"widget": 2}', beside=True)
    r = cli("start", "--address", head["address"], "--token", head["token"], *SMALL)
    assert r.returncode == 0, r.stderr
    r = cli("status")
    assert r.returncode == 0, r.stderr
    out = r.stdout
    assert "3 node(s), 3 alive" in out   # the head, the node beside it, the joined one
    assert "node 0000000000000000  127.0.0.1  alive  (head)\n" \
           "  resources (in use/total): none (runs no work)" in out, out
    assert out.count("alive") == 4
    assert "widget 0/2" in out   # the head's resources are the node's beside it
    assert "object store: 0 B used of 64.0 MiB" in out
    assert "cluster resources (in use/total): CPU 0/2, widget 0/2" in out
    # From elsewhere: by address and token
    r = cli("status", "--address", head["address"], "--token", head["token"],
            env={cf.STATE_DIR_ENV: state + "-elsewhere"})
    assert r.returncode == 0 and "3 node(s)" in r.stdout, r.stderr


@pytest.mark.shared_machine
def test_status_without_a_cluster_says_how_to_start_one(state: str, tmp_path: Path) -> None:
    # A temp directory of its own: another session's init() cluster (this user's, in
    # the machine's /tmp) would be found and read (test_shared_machine.py).
    r = cli("status", env={"TMPDIR": str(tmp_path)})
    assert r.returncode == 1, r.stdout
    assert "orchestra start --head" in r.stderr


def _catches(pid: int, sig: int) -> bool:
    """Whether process ``pid`` has a handler for ``sig`` now (SigCgt in /proc)."""
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith("SigCgt:"):
                    return bool(int(line.split()[1], 16) >> (sig - 1) & 1)
    except OSError:
        pass
    return False


def _start_blocking(out_path: Path) -> subprocess.Popen[bytes]:
    """`orchestra start --head --block`, its output to ``out_path``."""
    with open(out_path, "wb") as out:
        return subprocess.Popen([sys.executable, "-m", "orchestra._cli", "start", "--head",
                                 "--port", "0", "--block", *SMALL], stdout=out, stderr=out,
                                env=dict(os.environ, PYTHONPATH=REPO))


def test_block_stops_what_it_starts_on_a_sigterm_that_comes_while_it_starts(
        state: str, tmp_path: Path) -> None:
    # The signal is taken from the start on: before, one that came before the head was
    # up (a batch system stopping the job at once) killed this process outright and left
    # the head running.
    proc = _start_blocking(tmp_path / "out")
    try:
        wait_until(lambda: _catches(proc.pid, signal.SIGTERM) or proc.poll() is not None, T,
                   "the command takes SIGTERM")
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(T) == 0, (tmp_path / "out").read_text()
        assert "stopped the head and node (SIGTERM)" in (tmp_path / "out").read_text()
        assert records(state) == []
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def test_block_stops_what_it_started_on_sigterm(state: str, tmp_path: Path) -> None:
    proc = _start_blocking(tmp_path / "out")
    try:
        wait_until(lambda: len(records(state)) == 2, T, "the head and its node recorded")
        [head] = [rec for rec in records(state) if rec["kind"] == "head"]
        members = {p for rec in records(state) for p in group_members(rec["pid"])}
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(T) == 0, (tmp_path / "out").read_text()
        wait_until(lambda: all(pid_gone(p) for p in members), T, "the head's processes gone")
        assert not os.path.exists(head["session_dir"])
        assert shm_of(head["pid"]) == []
        assert records(state) == []
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def test_stop_kills_what_ignores_sigterm(state: str) -> None:
    """A process stuck in its shutdown is killed after --timeout, its directories gone."""
    os.makedirs(state, mode=0o700, exist_ok=True)
    stuck = subprocess.Popen(
        [sys.executable, "-c", "import signal, time; signal.signal(signal.SIGTERM, "
         "signal.SIG_IGN); print('ready', flush=True); time.sleep(60)  # orchestra"],
        stdout=subprocess.PIPE, start_new_session=True)
    try:
        assert stuck.stdout is not None and stuck.stdout.readline() == b"ready\n"
        run_dir = cf.new_run_dir(state, "node")
        session_dir = os.path.join(run_dir, "session")
        os.mkdir(session_dir)
        cf.write_record(run_dir, {"kind": "node", "pid": stuck.pid, "session_dir": session_dir,
                                  "address": "127.0.0.1:1", "token": "t"})
        r = cli("stop", "--timeout", "0.5")
        assert r.returncode == 0, r.stderr
        assert stuck.wait(T) == -signal.SIGKILL
        assert not os.path.exists(run_dir)
    finally:
        if stuck.poll() is None:
            stuck.kill()
            stuck.wait()


def test_stop_does_not_signal_a_recorded_pid_that_is_not_orchestra(state: str) -> None:
    """A record outlives its process (a reboot, a kill -9): its pid may be reused."""
    os.makedirs(state, mode=0o700, exist_ok=True)
    other = subprocess.Popen(["sleep", "60"])
    try:
        run_dir = cf.new_run_dir(state, "head")
        cf.write_record(run_dir, {"kind": "head", "pid": other.pid, "session_dir": "",
                                  "address": "127.0.0.1:1", "token": "t"})
        assert cli("stop", "--timeout", "0.5").returncode == 0
        assert other.poll() is None
        assert not os.path.exists(run_dir)
    finally:
        other.kill()
        other.wait()


# ---------------------------------------------------------------------------- drivers

def test_init_auto_connects_to_the_cluster_started_here(state: str) -> None:
    head = start_head(state)
    orchestra.init(address="auto")
    try:
        @orchestra.remote
        def node() -> str:
            return orchestra.get_runtime_context().get_node_id()

        assert orchestra.get(node.remote(), timeout=T) == "0" * 16
        assert [n["NodeID"] for n in orchestra.nodes()] == ["0" * 16]
    finally:
        orchestra.shutdown()
    assert not pid_gone(head["pid"]), "a driver's disconnect leaves the cluster running"


def test_orchestra_address_auto_in_the_environment(state: str,
                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    start_head(state)
    monkeypatch.setenv("ORCHESTRA_ADDRESS", "auto")
    orchestra.init()
    try:
        assert len(orchestra.nodes()) == 1
    finally:
        orchestra.shutdown()


def test_init_auto_without_a_cluster_names_orchestra_start(state: str) -> None:
    with pytest.raises(ConnectionError, match="orchestra start --head"):
        orchestra.init(address="auto")


_PRIVATE = """
import sys, orchestra
info = orchestra.init(num_cpus=1, resources={"private-marker": 1}, log_to_driver=False)
print(info["session_dir"], flush=True)
sys.stdin.readline()
"""


@pytest.mark.shared_machine
def test_status_and_list_find_this_users_init_cluster(state: str) -> None:
    """With no `orchestra start` cluster here, status and list read this user's running
    init() cluster (they said there was none); with several, they list their session
    directories and take one with --address."""
    driver = subprocess.Popen([sys.executable, "-c", _PRIVATE], stdin=subprocess.PIPE,
                              stdout=subprocess.PIPE, text=True,
                              env=dict(os.environ, PYTHONPATH=REPO))
    try:
        assert driver.stdout is not None and driver.stdin is not None
        session = driver.stdout.readline().strip()
        r = cli("status")
        if r.returncode == 2:   # other init() clusters of this user run here too
            assert session in r.stderr and "--address SESSION_DIR" in r.stderr, r.stderr
        else:
            assert r.returncode == 0 and "private-marker" in r.stdout, r.stdout + r.stderr
        r = cli("status", "--address", session)
        assert r.returncode == 0 and "private-marker" in r.stdout, r.stdout + r.stderr
        r = cli("list", "nodes", "--address", session)
        assert r.returncode == 0 and "0000000000000000" in r.stdout, r.stdout + r.stderr
        driver.stdin.write("\n")
        driver.stdin.flush()
        assert driver.wait(T) == 0
    finally:
        if driver.poll() is None:
            driver.kill()
            driver.wait()


# ---------------------------------------------------------------------------- Cluster

def test_cluster_runs_tasks_on_each_node_and_shutdown_leaves_nothing() -> None:
    c = Cluster(initialize_head=True, head_node_args={"num_cpus": 1,
                                                      "object_store_memory": 64 << 20})
    try:
        assert not c.address.endswith(":6380")
        nodes = [c.add_node(num_cpus=1, object_store_memory=64 << 20, resources={f"n{i}": 1})
                 for i in range(2)]
        assert [n.node_id for n in nodes] == ["0000000000000002", "0000000000000003"]
        orchestra.init(address=c.address, token=c.token)

        @orchestra.remote
        def where() -> str:
            return orchestra.get_runtime_context().get_node_id()

        placed = orchestra.get([where.options(resources={f"n{i}": 1}).remote()
                                for i in range(2)], timeout=T)
        assert placed == [n.node_id for n in nodes]
        assert {n["NodeID"] for n in orchestra.nodes() if n["Alive"]} == \
            {"0" * 16, *placed}
        orchestra.shutdown()
        pids = {p for n in c.list_all_nodes() for p in group_members(n.pid)}
        dirs = [n.session_dir for n in c.list_all_nodes()]
        c.remove_node(nodes[0], allow_graceful=False)
        assert pid_gone(nodes[0].pid)
    finally:
        if orchestra.is_initialized():
            orchestra.shutdown()
        c.shutdown()
    wait_until(lambda: all(pid_gone(p) for p in pids), T, "every cluster process gone")
    assert not any(os.path.exists(d) for d in dirs)
    assert all(shm_of(n.pid) == [] for n in nodes)


def test_a_driver_reaches_a_cluster_by_its_address_alone(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """As Ray's scripts write `ray.init(address=cluster.address)`: the token of a head
    this user started on this machine comes from its record (the Cluster's state
    directory is this user's, mode 0700), as address="auto" finds it. Before, init()
    raised AuthenticationError asking for the token."""
    monkeypatch.delenv("ORCHESTRA_TOKEN", raising=False)
    with Cluster(initialize_head=True, head_node_args={"num_cpus": 1,
                                                       "object_store_memory": 64 << 20}) as c:
        orchestra.init(address=c.address)
        try:
            assert orchestra.get(orchestra.put(41), timeout=T) == 41
        finally:
            orchestra.shutdown()


def test_a_connected_drivers_exit_grace_stops_its_work_not_the_cluster(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """The warning said 'stopping the cluster' for a driver of a cluster it had not
    started, which goes on."""
    monkeypatch.delenv("ORCHESTRA_TOKEN", raising=False)
    script = ("import sys, time, orchestra\n"
              "orchestra.init(address=sys.argv[1], exit_grace_s=0.3)\n"
              "@orchestra.remote\n"
              "def slow():\n"
              "    time.sleep(30)\n"
              "slow.remote()\n")
    with Cluster(initialize_head=True, head_node_args={"num_cpus": 1,
                                                       "object_store_memory": 64 << 20}) as c:
        r = subprocess.run([sys.executable, "-c", script, c.address], capture_output=True,
                           text=True, timeout=T, env=dict(os.environ, PYTHONPATH=REPO))
        assert r.returncode == 0, r.stderr
        assert "still pending" in r.stderr and "stopping this job's work" in r.stderr, r.stderr
        orchestra.init(address=c.address)   # the cluster goes on
        try:
            assert orchestra.get(orchestra.put(7), timeout=T) == 7
        finally:
            orchestra.shutdown()


@pytest.mark.parametrize("tls", [None, True])
def test_cluster_add_nodes_starts_them_side_by_side(tls: bool | None) -> None:
    """(With tls=True the nodes and the driver speak TLS on loopback, as between
    machines: microbenchmark --nodes N --tls.)"""
    with Cluster(initialize_head=True, head_node_args={"num_cpus": 1,
                                                       "object_store_memory": 64 << 20},
                 tls=tls) as c:
        assert c.token.startswith("tls-") == bool(tls)
        nodes = c.add_nodes(2, num_cpus=1, object_store_memory=64 << 20)
        assert len({n.node_id for n in nodes}) == 2 and all(n.alive() for n in nodes)
        assert c.list_all_nodes() == [c.head_node, *nodes]
        orchestra.init(address=c.address, token=c.token)
        try:
            assert sorted(n["NodeID"] for n in orchestra.nodes() if n["Alive"]) == \
                sorted(["0" * 16, *(n.node_id for n in nodes)])
        finally:
            orchestra.shutdown()
    wait_until(lambda: all(pid_gone(n.pid) for n in nodes), T, "the nodes gone")


# ---------------------------------------------------------------------------- netns

@pytest.mark.timeout(180)
def test_a_driver_runs_tasks_and_actors_on_both_namespaced_nodes(netns_cluster: Any) -> None:
    """Three hosts that share nothing but a network: tasks and an actor placed by
    resource run on the node of each host, and an array put by the driver arrives whole."""
    code = textwrap.dedent("""
        import numpy as np

        @orchestra.remote
        def where(a):
            return orchestra.get_runtime_context().get_node_id(), float(a.sum())

        @orchestra.remote
        class Where:
            def node(self):
                return orchestra.get_runtime_context().get_node_id()

        a = np.arange(4 << 20, dtype=np.float64)   # 32 MiB, through the stores
        ref = orchestra.put(a)
        out = orchestra.get([where.options(resources={f"host{i}": 1}).remote(ref)
                             for i in (1, 2)], timeout=60)
        actor = Where.options(resources={"host2": 1}).remote()
        nodes = sorted(n["NodeID"] for n in orchestra.nodes() if n["Alive"])
        print(json.dumps({"placed": [o[0] for o in out], "sums": [o[1] for o in out],
                          "expected": float(a.sum()), "nodes": nodes,
                          "actor": orchestra.get(actor.node.remote(), timeout=60)}))
    """)
    result: Any = netns_cluster.driver(code, timeout=120)
    assert result["placed"] == netns_cluster.node_ids
    assert result["sums"] == [result["expected"]] * 2
    assert result["nodes"] == sorted(["0" * 16, netns_cluster.beside, *netns_cluster.node_ids])
    assert result["actor"] == netns_cluster.node_ids[1]


@pytest.mark.timeout(120)
def test_a_namespaced_host_with_a_wrong_token_is_refused_and_status_shows_the_rest(
        netns_cluster: Any) -> None:
    hosts = netns_cluster.hosts
    # The head is reached by other machines: it speaks TLS, its key made from its token.
    # A token of another cluster (marked for TLS or not) is refused before anything is
    # sent: the head's key is not the one it names.
    for token in ("tls-wrong", "wrong"):
        r = hosts.run(1, [sys.executable, "-m", "orchestra._cli", "start", "--address",
                          netns_cluster.address, "--token", token, *SMALL],
                      private_mounts=True, timeout=T)
        assert r.returncode == 1
        assert "another cluster" in r.stderr, r.stderr
    r = hosts.run(0, [sys.executable, "-m", "orchestra._cli", "status", "--address",
                      netns_cluster.address], timeout=T,
                  env=hosts.env(ORCHESTRA_TOKEN=netns_cluster.token))
    assert r.returncode == 0, r.stderr
    assert "4 node(s), 4 alive" in r.stdout   # the head, the node beside it, two hosts
    for i, node_id in enumerate(netns_cluster.node_ids, start=1):
        assert f"node {node_id}  {hosts.ip(i)}  alive" in r.stdout, r.stdout


def test_namespaced_hosts_share_the_network_and_nothing_else() -> None:
    """The fixture's plumbing: host 1 reaches host 0 over the bridge, sees an empty
    /dev/shm and /tmp of its own, and teardown leaves no namespace or process."""
    reason = skip_reason()
    if reason:
        pytest.skip(reason)
    hosts = Hosts(2, tag="p")
    try:
        hosts.setup()
        listener = hosts.spawn(0, [sys.executable, "-c", textwrap.dedent(f"""
            import socket
            s = socket.create_server(("{hosts.ip(0)}", 7777))
            print("listening", flush=True)
            c, peer = s.accept()
            c.sendall(peer[0].encode())
        """)], private_mounts=False, log="listener.log")
        hosts.wait_output(listener, "listener.log", "listening", timeout=T)
        probe = hosts.spawn(1, [sys.executable, "-c", textwrap.dedent(f"""
            import os, socket
            shm, tmp = os.listdir("/dev/shm"), os.listdir("/tmp")
            open("/dev/shm/netns-probe-{os.getpid()}", "w").close()
            with socket.create_connection(("{hosts.ip(0)}", 7777), timeout=10) as c:
                print("peer", c.recv(100).decode(), "shm", len(shm), "tmp", ",".join(sorted(tmp)),
                      "end", flush=True)
        """)], private_mounts=True, log="probe.log")
        m = hosts.wait_output(probe, "probe.log", r"peer (\S+) shm (\d+) tmp (\S*) end", timeout=T)
        # /tmp of its own: empty, but for what this run needs from the machine's /tmp
        # (a checkout there, bound back in: _netns.kept_under_tmp).
        kept = sorted({p.split("/")[2] for p in kept_under_tmp().split()})
        assert m.groups() == (hosts.ip(1), "0", ",".join(kept))
        assert probe.wait(T) == 0
        assert not os.path.exists(f"/dev/shm/netns-probe-{os.getpid()}")
        pids = hosts.pids_in(hosts.ns(0))
        assert pids == [] or listener.pid in pids
    finally:
        hosts.teardown()
    assert hosts.namespaces_left() == []
    assert listener.poll() is not None and probe.poll() is not None


@pytest.mark.timeout(120)
def test_a_namespaced_host_that_dies_is_seen_dead_and_the_others_carry_on(
        netns_cluster: Any) -> None:
    """Every process of host 2 SIGKILLed, as a machine losing power. Last in the module:
    the cluster keeps one node less."""
    hosts = netns_cluster.hosts
    for pid in hosts.pids_in(hosts.ns(2)):
        os.kill(pid, signal.SIGKILL)
    code = textwrap.dedent("""
        import time

        @orchestra.remote
        def where():
            return orchestra.get_runtime_context().get_node_id()

        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            dead = [n["NodeID"] for n in orchestra.nodes() if not n["Alive"]]
            if dead:
                break
            time.sleep(0.2)
        print(json.dumps({"dead": dead, "placed": orchestra.get(
            where.options(resources={"host1": 1}).remote(), timeout=30)}))
    """)
    result: Any = netns_cluster.driver(code, timeout=90)
    assert result["dead"] == [netns_cluster.node_ids[1]]
    assert result["placed"] == netns_cluster.node_ids[0]


@pytest.mark.parametrize("kind", ["sqlite", "redis"])
def test_a_head_started_again_on_its_state_store_serves_the_same_cluster(
        state: str, tmp_path: Path, kind: str) -> None:
    from _redis import RedisServer, skip_reason
    server = None
    if kind == "redis":
        if skip_reason():
            pytest.skip(skip_reason())
        server = RedisServer(tmp_path / "redis")
        server.start()
    try:
        store = server.url if server else "sqlite://" + str(tmp_path / "store" / "head.db")
        head = start_head(state, "--state-store", store)
        # A second head on the same store refuses: never two heads serving one cluster.
        second = cli("start", "--head", "--port", "0", *SMALL, "--state-store", store)
        assert second.returncode == 1
        assert "another head" in second.stderr and store in second.stderr, second.stderr
        assert [rec["pid"] for rec in records(state)] == [head["pid"]]
        assert cli("stop", "--timeout", "5").returncode == 0
        # Started again on the store: the same cluster, with the same token.
        again = start_head(state, "--state-store", store)
        assert again["token"] == head["token"] and again["pid"] != head["pid"]
    finally:
        cli("stop", "--timeout", "5")
        if server is not None:
            server.stop()


def test_an_unreachable_state_store_is_named_at_start(state: str) -> None:
    from _redis import free_port
    url = f"redis://127.0.0.1:{free_port()}/0"
    r = cli("start", "--head", "--port", "0", *SMALL, "--state-store", url)
    assert r.returncode == 1
    assert url in r.stderr and ("cannot reach" in r.stderr or "redis package" in r.stderr), r.stderr
    assert records(state) == []
