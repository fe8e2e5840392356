"""``orchestra start --head`` supervises its head (orchestra/_cluster/supervisor.py): a head
that dies (SIGKILL) is started again at once on the same address, port and token, and
``orchestra status`` counts the restart; one that dies too often stays down and status
says why; a SIGTERM sent to the head stops it for good; the supervisor's own death takes
the head along. Nothing is left behind after a stop. A joined node that loses the head
joins it again once it is back (under its id of before, the processes of its detached
actors kept and taken back with their state), or stops after --reconnect-timeout; a
driver connects to the restarted head by itself and its work goes on (its tasks sent
again, its refs carried over; a large put of before lost, and said so), or stops after
the head's --reconnect-timeout."""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import urllib.request
from pathlib import Path
from typing import Any

import pytest

from _cli import REPO, SMALL, T, cli, cluster_logs, records, shm_of, start_head
from _probes import pid_gone, wait_until
from orchestra._cluster.supervisor import MAX_RESTARTS, head_pid
from orchestra._platform.procutil import group_members, pid_alive
from orchestra._protocol import pb

pytestmark = [pytest.mark.alone, pytest.mark.timeout(120)]

DRIVER = """
import orchestra
orchestra.init(address="auto")

@orchestra.remote
def inc(x):
    return x + 1

print(orchestra.get(inc.remote(41), timeout=30))
orchestra.shutdown()
"""


def run_driver() -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-c", DRIVER], capture_output=True, text=True,
                          timeout=T, env=dict(os.environ, PYTHONPATH=REPO))


def serving_head(rec: dict[str, Any], other_than: int = 0) -> int:
    """The pid of the head the supervisor runs, once it serves (and is not ``other_than``)."""
    session = Path(rec["session_dir"])

    def up() -> bool:
        pid = head_pid(rec["run_dir"])
        return pid not in (0, other_than) and (session / "address").exists()
    wait_until(up, T, "the head to serve", lambda: "its supervisor said: " + "\n".join(
        Path(rec["run_dir"], "stderr.log").read_text(errors="replace").splitlines()[-15:]))
    return head_pid(rec["run_dir"])


def start_driver(script: str, *argv: str) -> subprocess.Popen[str]:
    """A driver running ``script`` (its stdin, stdout and stderr piped)."""
    return subprocess.Popen([sys.executable, "-c", script, *argv], stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env=dict(os.environ, PYTHONPATH=REPO))


def kill_head(rec: dict[str, Any]) -> int:
    """SIGKILL the serving head and wait until its supervisor's next one serves: the
    killed head's pid."""
    head = serving_head(rec)
    os.kill(head, signal.SIGKILL)
    serving_head(rec, other_than=head)
    return head


def test_a_killed_head_comes_back_on_its_address_and_status_counts_it(state: str) -> None:
    rec = start_head(state)
    first = serving_head(rec)
    assert first != rec["pid"] and first in group_members(rec["pid"])
    assert run_driver().stdout.strip() == "42"
    t0 = time.monotonic()
    os.kill(first, signal.SIGKILL)
    second = serving_head(rec, other_than=first)
    print(f"serving again {time.monotonic() - t0:.2f} s after the SIGKILL")
    done = run_driver()
    assert done.stdout.strip() == "42", done.stderr
    status = cli("status")
    assert status.returncode == 0, status.stderr
    assert "head: restarted 1 time(s)" in status.stdout and "SIGKILL" in status.stdout
    dashboard = Path(rec["session_dir"], "dashboard").read_text().strip().rstrip("/")
    with urllib.request.urlopen(dashboard + "/api/summary", timeout=10) as page:
        summary = json.loads(page.read())
    assert summary["head_restarts"] == 1 and "SIGKILL" in summary["head_last_restart"]["reason"]
    log = Path(rec["run_dir"], "stderr.log").read_text()
    assert f"the head died (killed by SIGKILL) (pid {first}); starting it again" in log
    assert records(state)[0]["address"] == rec["address"]   # the same record
    procs = group_members(rec["pid"])
    assert cli("stop").returncode == 0
    wait_until(lambda: all(pid_gone(p) for p in procs), T, "the cluster's processes gone")
    assert shm_of(first) == [] and shm_of(second) == []   # the dead head's swept too


def test_a_head_that_keeps_dying_stays_down_and_status_says_why(state: str) -> None:
    rec = start_head(state)
    pid = 0
    for _ in range(MAX_RESTARTS + 1):
        pid = serving_head(rec, other_than=pid)
        os.kill(pid, signal.SIGKILL)
    wait_until(lambda: pid_gone(rec["pid"]), T, "the supervisor to give up")
    status = cli("status")
    assert status.returncode == 1
    assert f"died {MAX_RESTARTS + 1} times within 60 s" in status.stderr, status.stderr
    assert "is down since" in status.stderr


def test_a_head_whose_port_is_held_a_moment_comes_back_once_it_is_free(state: str) -> None:
    """Another socket takes the dead head's port as its own for a moment (on loopback, a
    client that connects there while nothing listens may get it): the restart fails to
    listen, the supervisor tries again later and later (0.5 s, 1 s, ...) and the head
    comes back once the port is free, its session directory intact (a failed start
    removed it, and the next start crashed the supervisor)."""
    import socket
    rec = start_head(state)
    first = serving_head(rec)
    port = int(rec["address"].rpartition(":")[2])
    with socket.create_server(("127.0.0.1", 0)) as elsewhere:
        os.kill(first, signal.SIGKILL)
        holder = socket.socket()
        deadline = time.monotonic() + T
        while True:   # the port, once the head's listener is closed
            try:
                holder.bind(("127.0.0.1", port))
                break
            except OSError:
                assert time.monotonic() < deadline, "the dead head's port never came free"
                time.sleep(0.002)
        holder.connect(elsewhere.getsockname())
        time.sleep(1.2)   # two failed starts at least
        holder.close()
    serving_head(rec, other_than=first)
    log = Path(rec["run_dir"], "stderr.log").read_text()
    assert "address already in use" in log and "starting it again in 0.5 s" in log, log
    assert run_driver().stdout.strip() == "42"
    assert cli("stop").returncode == 0


# A counter of the driver's machine (no resource of a joined node): its count, its pid.
HERE_COUNTER = '''
@orchestra.remote
class Counter:
    def __init__(self):
        self.n = 0
    def inc(self):
        self.n += 1
        return [self.n, os.getpid()]
'''

STAYS = """
import json, os, sys, orchestra
from orchestra.util.state import list_actors
orchestra.init(address="auto", namespace="stays")
{counter}
c = Counter.options(name="c", lifetime="detached").remote()
for _ in range(5):
    n, pid = orchestra.get(c.inc.remote(), timeout=30)
print("ready", flush=True)
sys.stdin.readline()   # the head is killed twice, and is back
print(json.dumps([n, orchestra.get(c.inc.remote(), timeout=60) == [6, pid],
                  [a["num_restarts"] for a in list_actors() if a["name"] == "c"]]), flush=True)
orchestra.shutdown()
""".replace("{counter}", HERE_COUNTER)


def test_a_head_killed_again_before_an_actors_process_came_back_leaves_it_waiting(
        state: str) -> None:
    """The restarted head is killed as soon as it serves, before the detached actor's
    process (on the node beside it) came back to it: the next head still knows where
    that process runs and waits for it (the restore's own figures, no node and a restart
    counted, are not written while it waits), and the counter goes on at 6 in it, no
    restart counted."""
    rec = start_head(state, "--state-store", "sqlite://" + str(Path(state, "s.db")),
                     beside=True)
    driver = start_driver(STAYS)
    try:
        assert driver.stdout is not None and driver.stdin is not None
        assert driver.stdout.readline().strip() == "ready", driver.communicate(timeout=T)[1]
        first = kill_head(rec)
        os.kill(serving_head(rec, other_than=first), signal.SIGKILL)
        driver.stdin.write("go\n")
        driver.stdin.flush()
        out, err = driver.communicate(timeout=2 * T)
        assert driver.returncode == 0, err + cluster_logs(state)
        assert json.loads(out.strip().splitlines()[-1]) == [5, True, [0]], err + cluster_logs(state)
    finally:
        driver.kill()


def test_a_sigterm_sent_to_the_head_stops_it_for_good(state: str) -> None:
    rec = start_head(state)
    head = serving_head(rec)
    procs = group_members(rec["pid"])
    os.kill(head, signal.SIGTERM)
    wait_until(lambda: all(pid_gone(p) for p in procs), T, "the head and its supervisor gone")
    assert "starting it again" not in Path(rec["run_dir"], "stderr.log").read_text()


def test_a_killed_supervisor_takes_its_head_along(state: str) -> None:
    rec = start_head(state)
    head = serving_head(rec)
    os.kill(rec["pid"], signal.SIGKILL)
    wait_until(lambda: pid_gone(head), T, "the head to stop with its supervisor")


WHERE = """
import json, orchestra
orchestra.init(address="auto")

@orchestra.remote(resources={"far": 1})
def where():
    return orchestra.get_runtime_context().get_node_id()

print(json.dumps([orchestra.get(where.remote(), timeout=30),
                  sorted(n["NodeID"] for n in orchestra.nodes() if n["Alive"])]))
orchestra.shutdown()
"""


def join(rec: dict[str, Any], *args: str) -> dict[str, Any]:
    r = cli("start", "--address", rec["address"], "--token", rec["token"], *SMALL,
            "--resources", '{"far": 1}', *args)
    assert r.returncode == 0, r.stderr
    [node] = [n for n in records(rec_state(rec)) if n["kind"] == "node"]
    return node


def rec_state(rec: dict[str, Any]) -> str:
    return str(Path(rec["run_dir"]).parent)


def where() -> list[Any]:
    r = subprocess.run([sys.executable, "-c", WHERE], capture_output=True, text=True,
                       timeout=T, env=dict(os.environ, PYTHONPATH=REPO))
    assert r.returncode == 0, r.stderr
    return list(json.loads(r.stdout.strip().splitlines()[-1]))


def test_a_node_that_loses_the_head_joins_it_again_once_it_is_back(state: str) -> None:
    rec = start_head(state)
    node = join(rec)
    on, alive = where()
    assert len(alive) == 2 and on in alive
    kill_head(rec)
    log = Path(node["run_dir"], "stderr.log")
    wait_until(lambda: log.read_text().count("joined the cluster") == 2, T,
               "the node to join the restarted head")
    on, alive = where()   # the node's resource is there again: a task runs on it
    assert len(alive) == 2 and on in alive
    assert "joining the head again for up to 60 s" in log.read_text()
    assert pid_alive(node["pid"])


def test_a_node_whose_head_stays_away_stops_after_its_reconnect_timeout(state: str) -> None:
    rec = start_head(state)
    node = join(rec, "--reconnect-timeout", "1.5")
    head = serving_head(rec)
    os.kill(rec["pid"], signal.SIGSTOP)   # nothing starts the head again
    try:
        os.kill(head, signal.SIGKILL)     # and it sends its nodes no close
        wait_until(lambda: pid_gone(node["pid"]), T, "the node to give up")
    finally:
        os.kill(rec["pid"], signal.SIGKILL)
    text = Path(node["run_dir"], "stderr.log").read_text()
    assert "stayed away for more than 1.5 s (reconnect_timeout_s): stopping" in text


MAKE_DETACHED = """
import json, orchestra
from orchestra.util.placement_group import placement_group
orchestra.init(address="auto", namespace="app")

@orchestra.remote
class Counter:
    def __init__(self, start):
        self.n = start
    def inc(self):
        self.n += 1
        return self.n
    def restarted(self):
        return orchestra.get_runtime_context().was_current_actor_reconstructed()

keeper = Counter.options(name="keeper", lifetime="detached").remote(100)
for _ in range(5):
    n = orchestra.get(keeper.inc.remote(), timeout=30)
gone = Counter.options(name="gone", lifetime="detached").remote(0)
orchestra.get(gone.inc.remote(), timeout=30)
orchestra.kill(gone)
pg = placement_group([{"CPU": 1}], name="pg", lifetime="detached")
orchestra.get(pg.ready(), timeout=30)
print(json.dumps([n, orchestra.get(keeper.restarted.remote(), timeout=30)]))
"""

USE_DETACHED = """
import json, orchestra
from orchestra.util.placement_group import get_placement_group
from orchestra.util.scheduling_strategies import PlacementGroupSchedulingStrategy
orchestra.init(address="auto", namespace="app")
keeper = orchestra.get_actor("keeper")
out = [orchestra.get(keeper.inc.remote(), timeout=60),
       orchestra.get(keeper.restarted.remote(), timeout=30)]
try:
    orchestra.get_actor("gone")
    out.append("gone found")
except ValueError as exc:
    out.append("no live actor" in str(exc))
pg = get_placement_group("pg")
orchestra.get(pg.ready(), timeout=60)

@orchestra.remote(num_cpus=1)
def inside():
    return "ran in it"

strategy = PlacementGroupSchedulingStrategy(placement_group=pg)
out.append(orchestra.get(inside.options(scheduling_strategy=strategy).remote(), timeout=60))
from orchestra.util.state import list_actors
out.append([a["num_restarts"] for a in list_actors()
            if a["name"] == "keeper" and a["state"] == "ALIVE"])
print(json.dumps(out))
"""


def run_script(code: str, rec: dict[str, Any]) -> list[Any]:
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                       timeout=T, env=dict(os.environ, PYTHONPATH=REPO))
    log = Path(rec["run_dir"], "stderr.log")
    assert r.returncode == 0, r.stderr + "\n--- the head's log:\n" + log.read_text()
    return list(json.loads(r.stdout.strip().splitlines()[-1]))


@pytest.mark.parametrize("store", ["sqlite", "redis"])
def test_detached_actors_and_groups_are_made_again_by_a_restarted_head(
        state: str, tmp_path: Path, store: str, request: pytest.FixtureRequest) -> None:
    """The records a head keeps (orchestra/_scheduler/durable.py) bring back a detached
    named actor (a new instance: its constructor runs again, restart counted) and a
    detached named placement group; a killed one stays gone."""
    if store == "redis":
        url = request.getfixturevalue("redis_server").url
    else:
        url = "sqlite://" + str(tmp_path / "store" / "head.db")
    rec = start_head(state, "--state-store", url)
    assert run_script(MAKE_DETACHED, rec) == [105, False]
    kill_head(rec)
    assert run_script(USE_DETACHED, rec) == [101, True, True, "ran in it", [1]]
    status = cli("status")
    assert status.returncode == 0, status.stderr
    assert (f"state store: {url}: 1 actor(s), 1 detached placement group(s), "
            "0 joined node(s), 2 job(s) kept" in status.stdout), status.stdout   # 2 drivers


ON_NODE = """
import json, orchestra
from orchestra.util.placement_group import placement_group
orchestra.init(address="auto", namespace="far")

@orchestra.remote(resources={"far": 0.5})
class Where:
    def node(self):
        return orchestra.get_runtime_context().get_node_id()

w = Where.options(name="far-away", lifetime="detached").remote()
pg = placement_group([{"far": 0.5}], name="far-pg", lifetime="detached")
orchestra.get(pg.ready(), timeout=30)
print(json.dumps([orchestra.get(w.node.remote(), timeout=30)]))
"""

FIND_ON_NODE = """
import json, orchestra
from orchestra.util.placement_group import get_placement_group
orchestra.init(address="auto", namespace="far")
w = orchestra.get_actor("far-away")
pg = get_placement_group("far-pg")
orchestra.get(pg.ready(), timeout=60)
alive = sorted(n["NodeID"] for n in orchestra.nodes() if n["Alive"])
print(json.dumps([orchestra.get(w.node.remote(), timeout=60), alive]))
"""


def test_a_detached_actor_that_needs_a_joined_node_waits_for_it_to_join_again(state: str) -> None:
    """Made again before its node joined the restarted head, the actor (and the group
    whose bundle only that node holds) waits for the node, and lands on it."""
    rec = start_head(state, "--state-store", "sqlite://" + str(Path(state, "s.db")))
    node = join(rec)
    [before] = run_script(ON_NODE, rec)
    kill_head(rec)
    log = Path(node["run_dir"], "stderr.log")
    on, alive = run_script(FIND_ON_NODE, rec)   # may start before the node is back
    wait_until(lambda: log.read_text().count("joined the cluster") == 2, T, "the node's log")
    head_node = "0" * 16
    assert len(alive) == 2 and on in alive and on != head_node and before != head_node


# A detached counter's class on the joined node ("far"), for the scripts below: its
# answer says the count, its process and its node.
COUNTER = """
@orchestra.remote(resources={"far": 0.5})
class Counter:
    def __init__(self):
        self.n = 0
    def inc(self):
        self.n += 1
        return [self.n, os.getpid(), orchestra.get_runtime_context().get_node_id()]
"""

KEEP_COUNTING = """
import json, os, orchestra
orchestra.init(address="auto", namespace="far")

{counter}
c = Counter.options(name="counter", lifetime="detached").remote()
for _ in range(5):
    out = orchestra.get(c.inc.remote(), timeout=30)
print(json.dumps(out))
""".replace("{counter}", COUNTER)

COUNT_ON = """
import json, orchestra
from orchestra.util.state import list_actors
orchestra.init(address="auto", namespace="far")
out = orchestra.get(orchestra.get_actor("counter").inc.remote(), timeout=60)
out.append([a["num_restarts"] for a in list_actors()
            if a["name"] == "counter" and a["state"] == "ALIVE"])
alive = sorted(n["NodeID"] for n in orchestra.nodes() if n["Alive"])
print(json.dumps(out + [alive]))
"""


def test_a_detached_actor_on_a_joined_node_outlives_the_head_with_its_state(state: str) -> None:
    """Its process lives on while the head is away; the node joins again under its id
    of before and the restarted head takes the process back (_head/rejoin.py): the
    counter goes on at 6, in the same process, with no restart counted."""
    rec = start_head(state, "--state-store", "sqlite://" + str(Path(state, "s.db")))
    node = join(rec)
    n, pid, on = run_script(KEEP_COUNTING, rec)
    assert n == 5 and on != "0" * 16
    kill_head(rec)
    n, pid_after, on_after, restarts, alive = run_script(COUNT_ON, rec)
    assert (n, pid_after, on_after, restarts) == (6, pid, on, [0])
    assert on in alive
    log = Path(node["run_dir"], "stderr.log").read_text()
    assert log.count("joined the cluster") == 2 and log.count(f"as node {int(on, 16)}") == 2, log


LIVES_ON = """
import json, os, sys, orchestra
from orchestra.exceptions import ObjectLostError
orchestra.init(address="auto", namespace="far")

{counter}
@orchestra.remote
def inc(x):
    return x + 1

@orchestra.remote
def wrap():   # a ref made by another process, its value never read here
    return [orchestra.put(b"w" * (1 << 20))]

c = Counter.options(name="counter", lifetime="detached").remote()
for _ in range(5):
    n, pid, _ = orchestra.get(c.inc.remote(), timeout=30)
held = orchestra.put(b"x" * (1 << 20))
(theirs,) = orchestra.get(wrap.remote(), timeout=30)
print("ready", flush=True)
sys.stdin.readline()   # the head is killed, and back
out = [n, orchestra.get(c.inc.remote(), timeout=60)[:2] == [6, pid],
       orchestra.get(inc.remote(41), timeout=60), orchestra.get(held) == b"x" * (1 << 20)]
try:
    orchestra.get(theirs, timeout=10)
    out.append("a ref another process made was found")
except ObjectLostError as exc:
    out.append("lost with the cluster's head" in str(exc))
print(json.dumps(out), flush=True)
orchestra.shutdown()
""".replace("{counter}", COUNTER)


def through_a_kill(rec: dict[str, Any], script: str, *argv: str,
                   pause_s: float = 0.0) -> tuple[Any, str]:
    """Run the driver ``script`` until it prints "ready", SIGKILL the head ``pause_s``
    later, let the driver go on once the head is back: (the JSON of its last line, its
    stderr); it must exit 0."""
    driver = start_driver(script, *argv)
    try:
        assert driver.stdout is not None and driver.stdin is not None
        ready = driver.stdout.readline().strip()
        assert ready == "ready", driver.communicate(timeout=T)[1]
        time.sleep(pause_s)
        kill_head(rec)
        driver.stdin.write("go\n")
        driver.stdin.flush()
        out, err = driver.communicate(timeout=2 * T)
        log = Path(rec["run_dir"], "stderr.log").read_text()
        assert driver.returncode == 0, err + "\n--- the head's log:\n" + log
        return json.loads(out.strip().splitlines()[-1]), err
    finally:
        driver.kill()


ASKS = """
import json, os, signal, sys, time, orchestra
from orchestra._cluster.supervisor import head_pid
from orchestra.util import placement_group
from orchestra.util.state import list_actors
orchestra.init(address="auto", namespace="asks")
{counter}
run_dir, killed = sys.argv[1], []

def kill_head():
    # The head its supervisor runs now (a new one since the last kill), killed: what
    # the driver asks right after goes to a head that is going away.
    while not (pid := head_pid(run_dir)) or pid in killed:
        time.sleep(0.02)
    killed.append(pid)
    os.kill(pid, signal.SIGKILL)

a = Counter.options(name="a", lifetime="detached").remote()
orchestra.get(a.inc.remote(), timeout=30)
kill_head()
orchestra.kill(a)
kill_head()
b = Counter.options(name="b", lifetime="detached").remote()
out = [orchestra.get(b.inc.remote(), timeout=60)[0]]
kill_head()
out.append(sorted(r["name"] for r in list_actors() if r["state"] != "DEAD"))
kill_head()
pg = placement_group([{"far": 0.1}], lifetime="detached")
out.append(orchestra.get(pg.ready(), timeout=60) is True)
out.append(orchestra.get(b.inc.remote(), timeout=60)[0])
print(json.dumps(out), flush=True)
orchestra.shutdown()
""".replace("{counter}", COUNTER)


def test_what_a_driver_asks_as_the_head_dies_is_asked_again_of_the_restarted_head(
        state: str) -> None:
    """A kill, an actor's and a group's creation, a query, each sent right after a
    SIGKILL of the head (_runtime/verbs.py): made again on the restarted head once the
    driver is connected to it, with the effect of one: the killed actor does not come
    back with its process (a restarted head that had its record waits for that process),
    the new one runs once under its name and keeps its state, the group is ready."""
    rec = start_head(state, "--state-store", "sqlite://" + str(Path(state, "s.db")))
    join(rec)
    r = subprocess.run([sys.executable, "-c", ASKS, rec["run_dir"]], capture_output=True,
                       text=True, timeout=4 * T, env=dict(os.environ, PYTHONPATH=REPO))
    assert r.returncode == 0, r.stderr[-4000:] + cluster_logs(state)
    assert json.loads(r.stdout.strip().splitlines()[-1]) == [1, ["b"], True, 2], \
        r.stderr[-4000:] + cluster_logs(state)


def test_a_driver_outlives_the_head_and_its_detached_actor_goes_on(state: str) -> None:
    """A driver of `orchestra start --head` connects to the restarted head by itself
    (_runtime/reconnect.py): the same actor handle reaches the detached counter, which goes
    on at 6 in its process of before; new tasks run; its large put is there (copied); a
    ref another process made, whose value it never read, raises ObjectLostError naming
    the lost head."""
    rec = start_head(state, "--state-store", "sqlite://" + str(Path(state, "s.db")))
    join(rec)
    out, _ = through_a_kill(rec, LIVES_ON)
    assert out == [5, True, 42, True, True]


OWN_ACTORS = """
import json, os, sys, orchestra
orchestra.init(address="auto", namespace="own")

{counter}
@orchestra.remote
class Here:   # on the head's own node: its process dies with the head
    def __init__(self):
        self.n = 0
    def inc(self):
        self.n += 1
        return self.n

far = Counter.remote()   # not detached, on the joined node
here = Here.remote()
dropped = Counter.remote()
for _ in range(5):
    n, pid, _ = orchestra.get(far.inc.remote(), timeout=30)
[orchestra.get(here.inc.remote(), timeout=30) for _ in range(3)]
dropped_pid = orchestra.get(dropped.inc.remote(), timeout=30)[1]
print("ready", json.dumps([pid, dropped_pid]), flush=True)
sys.stdin.readline()   # the head is killed, and back
del dropped            # its last handle goes while the head is away
out = [n, orchestra.get(far.inc.remote(), timeout=60)[:2] == [6, pid],
       orchestra.get(here.inc.remote(), timeout=60)]
print(json.dumps(out), flush=True)
sys.stdin.readline()   # the driver exits: its actors with it
orchestra.shutdown()
""".replace("{counter}", COUNTER)


def test_a_drivers_own_actors_outlive_the_head_and_still_die_with_the_driver(
        state: str) -> None:
    """Non-detached actors are kept by the head's state store as detached ones are, under
    their driver's key (Hello.driver_key); the driver connected to the restarted head
    claims them (_head/rejoin.py claim): the counter on the joined node goes on at 6 in
    its process of before, the one on the head's node is made again (its constructor runs
    again), a handle dropped while the head was away stops its actor, and the driver's
    exit stops them all, as before the restart."""
    rec = start_head(state, "--state-store", "sqlite://" + str(Path(state, "s.db")))
    join(rec)
    driver = start_driver(OWN_ACTORS)
    try:
        assert driver.stdout is not None and driver.stdin is not None
        ready = driver.stdout.readline().split(maxsplit=1)
        assert ready and ready[0] == "ready", driver.communicate(timeout=T)[1]
        pid, dropped_pid = json.loads(ready[1])
        kill_head(rec)
        driver.stdin.write("go\n")
        driver.stdin.flush()
        line = driver.stdout.readline()
        assert line, driver.communicate(timeout=T)[1] + Path(rec["run_dir"], "stderr.log").read_text()
        assert json.loads(line) == [5, True, 1]
        wait_until(lambda: pid_gone(dropped_pid), T, "the dropped actor's process gone")
        assert not pid_gone(pid)
        driver.stdin.write("go\n")
        driver.stdin.flush()
        driver.communicate(timeout=T)
        assert driver.returncode == 0
        wait_until(lambda: pid_gone(pid), T, "the driver's actor stopped with the driver")
    finally:
        driver.kill()


def test_a_drivers_own_actor_stops_when_the_driver_does_not_come_back(state: str) -> None:
    """The driver dies with the head: the restarted head takes its actor's process back
    (it does not know yet whether the driver comes), and stops it once the drivers' time
    to connect again is over."""
    rec = start_head(state, "--state-store", "sqlite://" + str(Path(state, "s.db")),
                     "--reconnect-timeout", "2.5")
    join(rec)
    driver = start_driver(OWN_ACTORS)
    try:
        assert driver.stdout is not None
        ready = driver.stdout.readline().split(maxsplit=1)
        assert ready and ready[0] == "ready", driver.communicate(timeout=T)[1]
        pid, _ = json.loads(ready[1])
        head = serving_head(rec)
        os.kill(head, signal.SIGKILL)
    finally:
        driver.kill()
    driver.wait()
    serving_head(rec, other_than=head)
    time.sleep(1)
    assert not pid_gone(pid)   # taken back: its driver may come yet
    wait_until(lambda: pid_gone(pid), T, "the actor of a driver that did not come back stopped")
    log = Path(rec["run_dir"], "stderr.log").read_text()
    assert "whose driver did not connect again are stopped" in log, log
    # Its job ended too, and says why (_scheduler/jobs.py).
    wait_until(lambda: "job(s) whose driver did not connect again ended" in
               Path(rec["run_dir"], "stderr.log").read_text(), T, "its job ended")
    r = cli("list", "jobs", "--json")
    assert r.returncode == 0, r.stderr
    [job] = [j for j in json.loads(r.stdout) if j["driver_pid"] == driver.pid]
    assert (job["status"], job["message"], job["connected"]) == (
        "FAILED", "its driver did not connect again within 2.5 s of the head's restart", False)


HOLDS = """
import sys, orchestra
orchestra.init(address="auto", namespace="holds")

@orchestra.remote
class Own:
    def ping(self):
        return 1

@orchestra.remote
class Kept:
    def ping(self):
        return 1

own = Own.remote()
kept = Kept.options(name="kept", lifetime="detached").remote()
orchestra.get([own.ping.remote(), kept.ping.remote()], timeout=30)
print("ready", flush=True)
sys.stdin.readline()
"""


JOB = """
import json, os, sys, orchestra
from orchestra.util.state import list_jobs
orchestra.init(address="auto")
def mine():
    return [j for j in list_jobs(limit=0) if j["driver_pid"] == os.getpid()]
before = mine()
print("ready", flush=True)
sys.stdin.readline()                    # the head is killed, and back
print(json.dumps([before, mine()]), flush=True)
"""

ENDS = """
import os, sys, orchestra
from orchestra.exceptions import OrchestraError
real = os.urandom   # the driver's key (Hello.driver_key), by the first argument
os.urandom = lambda n: sys.argv[1].encode() * n if n == 16 else real(n)
try:
    orchestra.init(address="auto")
except OrchestraError as exc:
    print(exc)
    sys.exit(3)
@orchestra.remote
def f():
    return 1
assert orchestra.get(f.remote(), timeout=30) == 1
if sys.argv[2] == "killed":
    os._exit(0)
"""


def ends(key: str, how: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-c", ENDS, key, how], capture_output=True,
                          text=True, timeout=T, env=dict(os.environ, PYTHONPATH=REPO))


def test_the_jobs_of_before_are_kept_and_a_driver_goes_on_in_its_own(state: str) -> None:
    """The job table (_scheduler/jobs.py) is in the state store: after the head's SIGKILL
    the restarted head lists the jobs that ended before (one by shutdown, one killed),
    the driver connected across the gap is in the same job, still RUNNING; a driver
    whose job ended is refused, naming it; `orchestra status` and `orchestra list` are
    no job."""
    rec = start_head(state, "--state-store", "sqlite://" + str(Path(state, "s.db")),
                     beside=True)
    for key, how in (("A", "ended"), ("B", "killed")):
        r = ends(key, how)
        assert r.returncode == 0, r.stdout + r.stderr
    assert cli("status").returncode == 0
    out, _ = through_a_kill(rec, JOB)
    before, after = out
    assert len(before) == 1 and before[0]["status"] == "RUNNING", out
    assert after == before, out   # the same job (its id, its start), connected again
    again = ends("A", "ended")    # the key of a job that ended
    assert again.returncode == 3, again.stdout + again.stderr
    assert "job" in again.stdout and "ended (SUCCEEDED)" in again.stdout and \
        "not taken back" in again.stdout, again.stdout
    r = cli("list", "jobs", "--json", "--limit", "0")
    assert r.returncode == 0, r.stderr
    rows = json.loads(r.stdout)
    assert [(j["status"], j["message"]) for j in rows] == [
        ("SUCCEEDED", None),
        ("FAILED", "its driver exited without shutdown(), or was killed"),
        ("SUCCEEDED", None)], rows   # the JOB driver ended too, with its shutdown()
    assert rows[2]["job_id"] == before[0]["job_id"]
    assert all(" -c " in j["entrypoint"] for j in rows), rows


def test_a_stopped_head_leaves_no_record_of_the_drivers_actors_in_its_store(state: str) -> None:
    """`orchestra stop` tells the drivers the cluster stopped: a head started on the same
    store later makes again the detached actor, not the driver's own (whose driver is
    gone: its constructor would run for nobody)."""
    import sqlite3
    db = Path(state, "s.db")
    start_head(state, "--state-store", "sqlite://" + str(db))
    driver = start_driver(HOLDS)
    try:
        assert driver.stdout is not None
        assert driver.stdout.readline().strip() == "ready", driver.communicate(timeout=T)[1]

        def kept() -> list[bool]:
            with sqlite3.connect(db) as con:
                rows = con.execute("SELECT value FROM state WHERE tbl='actors'").fetchall()
            return sorted(bool(pb.DurableActor.FromString(v).owner_key) for (v,) in rows)
        wait_until(lambda: kept() == [False, True], T, "both actors' records written")
        assert cli("stop").returncode == 0
    finally:
        driver.kill()
    assert kept() == [False]   # the detached one's only


PUTS_UNSENT = """
import json, os, signal, sys, orchestra
import numpy as np
from orchestra._cluster.supervisor import head_pid
from orchestra._runtime import context
orchestra.init(address="auto")

@orchestra.remote
def first(v):
    return float(v[0]) if hasattr(v, "shape") else v

pid = head_pid(sys.argv[1])
warm = [orchestra.put(np.full(25_000, -1.0)) for _ in range(3)]   # spares of the class come
medium = [orchestra.put(np.full(25_000, float(i))) for i in range(4)]
small = [orchestra.put({"i": i}) for i in range(4)]
unsent = len(context._client.refs.sealed)   # a batch not sent yet (RefCounts.seal)
os.kill(pid, signal.SIGKILL)
print("unsent at the kill:", unsent, file=sys.stderr)
out = orchestra.get([first.remote(r) for r in small + medium], timeout=90)
print(json.dumps(out), flush=True)
orchestra.shutdown()
"""


def test_puts_the_head_had_not_heard_of_when_it_died_are_put_again(state: str) -> None:
    """A driver's puts reach the head in batches (_objects/refs.py): those still
    waiting to be sent when the head is SIGKILLed (the driver kills it right after
    them) are put again on the restarted head with the rest of what the driver holds,
    and tasks there read them."""
    rec = start_head(state)
    join(rec)
    r = subprocess.run([sys.executable, "-c", PUTS_UNSENT, rec["run_dir"]], capture_output=True,
                       text=True, timeout=4 * T, env=dict(os.environ, PYTHONPATH=REPO))
    assert r.returncode == 0, r.stderr[-4000:] + cluster_logs(state)
    assert json.loads(r.stdout.strip().splitlines()[-1]) == \
        [{"i": i} for i in range(4)] + [float(i) for i in range(4)], r.stderr[-4000:]


IN_FLIGHT = """
import json, os, sys, threading, time, orchestra
orchestra.init(address="auto")

@orchestra.remote(max_retries=0)
def step(prev, n, size):   # a chain's step: its argument, 1 KiB or 600 KiB, is the last's value
    time.sleep(0.3)
    return (prev[0] + 1, b"s" * size)

@orchestra.remote(max_retries=0)
def slow(i):
    time.sleep(1.5)
    return i * i

@orchestra.remote
def big(n):
    return bytes(range(256)) * (n // 256)

@orchestra.remote(max_retries=0)
def touch(path):
    time.sleep(1.5)
    with open(path, "a") as f:
        f.write("ran")

small = orchestra.put({"kept": [1, 2, 3]})
large = orchestra.put(b"L" * (1 << 20))            # in shared memory, mapped here: copied
done_big = big.remote(1 << 20)                     # made before, in shared memory: made again
done_small = orchestra.get(orchestra.put(7))
assert len(orchestra.get(done_big, timeout=30)) == 1 << 20
ref = orchestra.put((0, b""))
for n in range(12):                                # the driver keeps only the last ref
    ref = step.remote(ref, n, 1024 if n % 2 else 600 * 1024)
squares = [slow.remote(i) for i in range(6)]
touch.remote(sys.argv[1])                          # fire and forget: its ref dropped at once
got = {}
waiter = threading.Thread(target=lambda: got.update(sq=orchestra.get(squares, timeout=90)))
waiter.start()                                     # a get() that blocks across the gap
print("ready", flush=True)
sys.stdin.readline()                               # the head is killed, and back
waiter.join()
out = [got.get("sq"), orchestra.get(ref, timeout=90)[0], orchestra.get(small),
       len(orchestra.get(done_big, timeout=60)), done_small,
       orchestra.get(large, timeout=10) == b"L" * (1 << 20)]
deadline = time.monotonic() + 20
while not os.path.exists(sys.argv[1]) and time.monotonic() < deadline:
    time.sleep(0.1)
out.append(os.path.exists(sys.argv[1]))
print(json.dumps(out), flush=True)
orchestra.shutdown()
"""


def test_a_drivers_work_in_flight_outlives_the_head(state: str) -> None:
    """Tasks running and queued when the head is SIGKILLed, a chain whose driver keeps
    only its last ref (arguments of 1 KiB and 600 KiB), a get() blocked across the gap,
    small values held, a result in shared memory made before, a large put, a task
    whose ref the driver dropped at once: the driver carries them over to the restarted
    head (_runtime/replay.py: small values put again, tasks submitted again, large values
    it maps copied) and every value comes; the dropped task runs (once or twice)."""
    rec = start_head(state, "--num-cpus", "4")
    join(rec)
    touched = Path(state, "touched")
    out, err = through_a_kill(rec, IN_FLIGHT, str(touched), pause_s=0.8)   # the chain runs
    assert out == [[i * i for i in range(6)], 12, {"kept": [1, 2, 3]}, 1 << 20, 7, True, True]
    assert "lost with the cluster's head" not in err, err


KEPT_ON_NODE = """
import json, sys, orchestra
orchestra.init(address="auto")

@orchestra.remote(resources={"far": 1})
def made(path, n):
    with open(path, "a") as f:
        f.write("ran\\n")
    return bytes([n]) * (1 << 20)                  # in the joined node's store

refs = [made.remote(sys.argv[1], n) for n in range(3)]
ready, _ = orchestra.wait(refs, num_returns=3, timeout=30)   # done, never read here
assert len(ready) == 3
print("ready", flush=True)
sys.stdin.readline()                               # the head is killed, and back
vals = orchestra.get(refs, timeout=60)
print(json.dumps([v == bytes([n]) * (1 << 20) for n, v in enumerate(vals)]), flush=True)
orchestra.shutdown()
"""


def test_results_a_joined_node_holds_outlive_the_head_and_do_not_run_again(state: str) -> None:
    """Results of finished tasks in a joined node's store when the head is SIGKILLed,
    which the driver never read (else it carries its maps over itself): the node keeps
    them (ObjectStore.carry_over) and tells the restarted head as it joins again; the
    driver's tasks made again end with them at once (_scheduler/kept.py), so every value
    is read from the node and no task runs twice."""
    rec = start_head(state, "--num-cpus", "1")
    join(rec)
    ran = Path(state, "ran")
    out, err = through_a_kill(rec, KEPT_ON_NODE, str(ran))
    assert out == [True, True, True]
    assert ran.read_text().splitlines() == ["ran"] * 3, "a task ran again"
    log = Path(rec["run_dir"], "stderr.log").read_text()
    assert "kept 3 object(s) from before the restart" in log, log


RUNNING_ON_NODE = """
import json, sys, time, orchestra
orchestra.init(address="auto")

@orchestra.remote(resources={"far": 0.3})             # the three at once, on the node
def slow(path, n):
    with open(path, "a") as f:
        f.write(f"{n}\\n")
    time.sleep(4)                                    # the head is killed meanwhile
    if n == 1:
        raise ValueError("as it should")
    return [n, b"r" * (n * 512 * 1024)]              # inline, and 1 MiB in shared memory

refs = [slow.remote(sys.argv[1], n) for n in (0, 1, 2)]
deadline = time.monotonic() + 30
while time.monotonic() < deadline and len(open(sys.argv[1]).read().split()) < 3:
    time.sleep(0.05)
print("ready", flush=True)
sys.stdin.readline()                               # the head is killed, and back
out = []
for ref in refs:
    try:
        n, pad = orchestra.get(ref, timeout=60)
        out.append([n, len(pad)])
    except ValueError as exc:
        out.append("raised" if "as it should" in str(exc) else str(exc))
print(json.dumps(out), flush=True)
orchestra.shutdown()
"""


def test_tasks_running_on_a_joined_node_outlive_the_head_and_do_not_run_again(
        state: str) -> None:
    """Tasks running on a joined node when the head is SIGKILLed run on: each worker
    connects to the restarted head as its task's (Hello.resume_task; the head waits for
    the nodes of before and their workers before it runs the tasks its drivers make
    again, _scheduler/kept.py), and answers it; the driver reads every result (inline,
    in shared memory, an error) and no task runs twice."""
    rec = start_head(state, "--state-store", "sqlite://" + str(Path(state, "s.db")))
    join(rec, "--num-cpus", "3")
    ran = Path(state, "ran")
    ran.touch()
    out, err = through_a_kill(rec, RUNNING_ON_NODE, str(ran))
    assert out == [[0, 0], "raised", [2, 1 << 20]], err
    assert sorted(ran.read_text().split()) == ["0", "1", "2"], "a task ran again"


ACTOR_CALLS = """
import json, sys, time, orchestra
from orchestra.exceptions import ObjectLostError
orchestra.init(address="auto", namespace="calls")

@orchestra.remote(resources={"far": 0.3}, max_task_retries=-1)
class Slow:
    def twice(self, x):
        time.sleep(1.0)
        return [2 * x, b"t" * (x * 300 * 1024)]   # 0 B to 900 KiB: inline and in shared memory

kept = Slow.options(name="kept", lifetime="detached").remote()
once = Slow.options(name="once", lifetime="detached", max_task_retries=0).remote()
own = Slow.remote()                                # not detached: its driver's, kept too
orchestra.get([a.twice.remote(0) for a in (kept, once, own)], timeout=30)   # all up
calls = [kept.twice.remote(i) for i in range(1, 4)]   # in flight and queued at the kill
unkept = once.twice.remote(1)
goes_on = own.twice.remote(2)
print("ready", flush=True)
sys.stdin.readline()                               # the head is killed, and back
out = [[(n, len(pad)) for n, pad in orchestra.get(calls, timeout=90)]]
try:
    orchestra.get(unkept, timeout=60)
    out.append("answered")
except ObjectLostError as exc:
    out.append(type(exc).__name__)
out.append(orchestra.get(goes_on, timeout=60)[0])
orchestra.kill(kept)
orchestra.kill(once)
print(json.dumps(out), flush=True)
orchestra.shutdown()
"""


def test_actor_calls_in_flight_outlive_the_head_when_they_may_run_again(state: str) -> None:
    """Calls of a detached actor with max_task_retries, running and queued when the head
    is SIGKILLed, are sent again to the restarted head in their order and answer (their
    results inline and in shared memory); a call without retries raises ObjectLostError
    (it may have run: it is not run again); a call of the driver's own (not detached)
    actor is sent again as well and answers (the restarted head kept that actor too)."""
    rec = start_head(state, "--state-store", "sqlite://" + str(Path(state, "s.db")))
    join(rec)
    out, _ = through_a_kill(rec, ACTOR_CALLS, pause_s=0.3)   # the first call runs
    assert out == [[[2, 300 * 1024], [4, 600 * 1024], [6, 900 * 1024]], "ObjectLostError", 4]


GIVES_UP = """
import sys, time, orchestra
from orchestra.exceptions import ClusterLostError
orchestra.init(address="auto")

@orchestra.remote
def inc(x):
    return x + 1

print(orchestra.get(inc.remote(1), timeout=30), flush=True)
sys.stdin.readline()   # the head is killed, and nothing starts it again
time.sleep(0.5)   # (a worker lent to this driver may answer a call until it dies too)
t0 = time.monotonic()
try:   # a call made as the head dies is lost with it: its get() says so
    print(orchestra.get(inc.remote(2), timeout=30))
except ClusterLostError as exc:
    print(f"lost after {time.monotonic() - t0:.1f} s: {exc}")
"""


def test_a_driver_whose_head_stays_away_stops_after_the_heads_reconnect_timeout(
        state: str) -> None:
    rec = start_head(state, "--reconnect-timeout", "1.5")
    driver = start_driver(GIVES_UP)
    head = serving_head(rec)
    os.kill(rec["pid"], signal.SIGSTOP)   # nothing starts the head again
    try:
        assert driver.stdout is not None and driver.stdin is not None
        assert driver.stdout.readline().strip() == "2"
        os.kill(head, signal.SIGKILL)
        driver.stdin.write("go\n")
        driver.stdin.flush()
        out, err = driver.communicate(timeout=T)
    finally:
        os.kill(rec["pid"], signal.SIGKILL)
        driver.kill()
    assert driver.returncode == 0, err
    said = out.strip().splitlines()[-1]
    assert said.startswith("lost after ") and "head process" in said, out
    assert 0.5 <= float(said.split()[2]) < 15, said


GANG_AGAIN = """
import json, sys, time, orchestra
orchestra.init(address="auto")

class Member:
    def rank(self):
        return orchestra.gang_context().rank

def gang():
    return orchestra.gang(Member, 2, num_cpus=1, num_gpus=0, spread=True, timeout_s=60,
                          heartbeat_interval_s=0.5, max_missing_heartbeats=4)

g = gang()
out = [orchestra.get(g.call("rank"), timeout=60)]
print("ready", flush=True)
sys.stdin.readline()   # the head is killed, and back
deadline = time.monotonic() + 30
while not g.dead_members() and time.monotonic() < deadline:
    time.sleep(0.1)
try:
    g.check()
    out.append("the gang of before lives")
except orchestra.GangMemberDiedError as exc:
    out.append("died" in str(exc))
g.shutdown()
g2 = gang()
out.append(orchestra.get(g2.call("rank"), timeout=60))
g2.shutdown()
print(json.dumps(out), flush=True)
orchestra.shutdown()
"""


def test_a_gang_in_flight_aborts_with_the_head_and_a_new_one_forms(state: str) -> None:
    """Its members die with the head (or, on a joined node, with their connection to
    it): the gang says a member died, and the driver, connected to the restarted head,
    forms a new gang there."""
    rec = start_head(state, "--num-cpus", "2")
    join(rec)
    driver = start_driver(GANG_AGAIN)
    try:
        assert driver.stdout is not None and driver.stdin is not None
        ready = driver.stdout.readline().strip()
        assert ready == "ready", driver.communicate(timeout=T)[1]
        kill_head(rec)
        driver.stdin.write("go\n")
        driver.stdin.flush()
        out, err = driver.communicate(timeout=T)
        assert driver.returncode == 0, err
        assert json.loads(out.strip().splitlines()[-1]) == [[0, 1], True, [0, 1]]
    finally:
        driver.kill()


KEEPS_GOING = """
import collections, json, os, sys, time, orchestra
from orchestra.exceptions import GetTimeoutError, ObjectLostError
orchestra.init(address="auto", namespace="soak")

{counter}
@orchestra.remote(max_retries=3)
def sq(x):
    return x * x

@orchestra.remote(max_retries=3)
def inc(x):
    return x + 1

c = Counter.options(name="c", lifetime="detached").remote()
last, pid0, _ = orchestra.get(c.inc.remote(), timeout=60)
counts = collections.Counter()
print("ready", flush=True)
deadline = time.monotonic() + float(sys.argv[1])
ref = orchestra.put(0)
while time.monotonic() < deadline:
    try:   # an actor call in flight as the head dies may be lost with it (said so)
        n, pid, _ = orchestra.get(c.inc.remote(), timeout=60)
        counts["actor ok" if pid == pid0 and n > last else "actor state lost"] += 1
        last = n
    except ObjectLostError as exc:
        counts["actor call lost with the head" if "lost with the cluster's head" in str(exc)
               else str(exc)] += 1
    except GetTimeoutError:
        counts["hung"] += 1
    try:   # tasks are never lost: the driver sends them again to the restarted head
        right = orchestra.get([sq.remote(j) for j in range(20)], timeout=60) == [j * j for j in range(20)]
        counts["tasks ok" if right else "wrong"] += 1
        for _ in range(5):   # a chain whose driver keeps only the last ref
            ref = inc.remote(ref)
        counts["chain ok" if orchestra.get(ref, timeout=60) % 5 == 0 else "wrong"] += 1
        small, large = orchestra.put(last), orchestra.put(bytes([last % 256]) * (200 << 10))
        right = orchestra.get(small) == last and orchestra.get(large) == bytes([last % 256]) * (200 << 10)
        counts["puts ok" if right else "wrong"] += 1
    except ObjectLostError as exc:
        counts[f"tasks lost: {exc}"] += 1
    except GetTimeoutError:
        counts["hung"] += 1
print(json.dumps(dict(counts)), flush=True)
""".replace("{counter}", COUNTER)

HEAD_KILLS_S = float(os.environ.get("ORCHESTRA_HEAD_KILLS_S", "8"))


@pytest.mark.timeout(int(HEAD_KILLS_S) * 3 + 120)
def test_work_goes_on_through_head_kills_and_the_detached_actor_keeps_its_state(state: str) -> None:
    """One driver calls a detached counter on a joined node and runs tasks while the head
    is SIGKILLed every ~5 s (longer: ORCHESTRA_HEAD_KILLS_S=600, one kill every 13 s, under
    the supervisor's 5 a minute): no hang, no wrong value, the counter never goes back and
    stays in its process; no task is lost (the driver carries its work over,
    _runtime/replay.py); an actor call in flight as the head dies may be lost (at most
    one a kill, ObjectLostError naming the lost head)."""
    rec = start_head(state, "--num-cpus", "2", "--state-store",
                     "sqlite://" + str(Path(state, "s.db")))
    join(rec)
    driver = subprocess.Popen([sys.executable, "-c", KEEPS_GOING, str(HEAD_KILLS_S)],
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                              env=dict(os.environ, PYTHONPATH=REPO))
    kills = 0
    try:
        assert driver.stdout is not None
        assert driver.stdout.readline().strip() == "ready"
        every = 5.0 if HEAD_KILLS_S < 60 else 13.0
        end = time.monotonic() + HEAD_KILLS_S - every
        while time.monotonic() < end:
            time.sleep(every)
            head = serving_head(rec)
            os.kill(head, signal.SIGKILL)
            kills += 1
            serving_head(rec, other_than=head)
        out, err = driver.communicate(timeout=T + HEAD_KILLS_S)
    finally:
        driver.kill()
    log = Path(rec["run_dir"], "stderr.log").read_text()
    assert driver.returncode == 0, err + "\n--- the head's log:\n" + log
    counts = json.loads(out.strip().splitlines()[-1])
    print(f"{kills} head kills: {counts}")
    assert kills >= 1 and counts["actor ok"] > 0 and counts["tasks ok"] > 0
    assert set(counts) <= {"actor ok", "tasks ok", "chain ok", "puts ok",
                           "actor call lost with the head"}, counts
    assert counts.get("actor call lost with the head", 0) <= kills, counts
    assert "Traceback" not in log, log


BESIDE = """
import json, os, sys, time, orchestra
orchestra.init(address="auto", namespace="beside")
{counter}
@orchestra.remote
def slow(path):
    with open(path, "a") as f:
        f.write("ran\\n")
    time.sleep(4)                       # the head is killed meanwhile
    return b"s" * (1 << 20)

me = orchestra.get_runtime_context().get_node_id()
c = Counter.options(name="c", lifetime="detached").remote()
for _ in range(5):
    n, pid = orchestra.get(c.inc.remote(), timeout=30)
held = orchestra.put(b"h" * (1 << 20))
running = slow.remote(sys.argv[1])
while not os.path.getsize(sys.argv[1]):
    time.sleep(0.05)
# The node's one CPU is taken: an actor of no CPU, made now, finds no node with more
# CPU free than the head's; it goes to the node all the same, never to the head.
light = Counter.options(name="light", lifetime="detached", num_cpus=0).remote()
light_pid = orchestra.get(light.inc.remote(), timeout=30)[1]
print("ready", flush=True)
sys.stdin.readline()                    # the head is killed, and back
from orchestra.util.state import list_actors
print(json.dumps([me, n, orchestra.get(c.inc.remote(), timeout=60) == [6, pid],
                  [a["num_restarts"] for a in list_actors() if a["name"] in ("c", "light")],
                  orchestra.get(running, timeout=60) == b"s" * (1 << 20),
                  orchestra.get(held, timeout=60) == b"h" * (1 << 20),
                  orchestra.get(light.inc.remote(), timeout=60) == [2, light_pid]]),
      flush=True)
orchestra.shutdown()
""".replace("{counter}", HERE_COUNTER)


def test_the_head_machines_work_outlives_the_head(state: str) -> None:
    """`orchestra start --head` runs the machine's work on a node beside the head (as
    Ray's head runs its raylet apart from the GCS): a driver of that machine uses that
    node's store, its detached actors and tasks run there (an actor of no CPU too, while
    the node's CPU is taken: never on the head), and all of it outlives the head: the
    counters go on in their processes, the task that was running answers without running
    again, the put is there."""
    rec = start_head(state, "--state-store", "sqlite://" + str(Path(state, "s.db")),
                     beside=True)
    [node] = [n for n in records(state) if n["kind"] == "node"]
    ran = Path(state, "ran")
    ran.touch()
    out, err = through_a_kill(rec, BESIDE, str(ran))
    assert out == [f"{node['node_id']:016x}", 5, True, [0, 0], True, True, True], \
        err + cluster_logs(state)
    assert ran.read_text() == "ran\n", "the running task ran again"
