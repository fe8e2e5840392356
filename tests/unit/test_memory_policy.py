"""The memory monitor's two halves without processes: whom the head picks
(orchestra/_scheduler/memory.py; Hypothesis drives random workers: the newest retriable
task first (a worker lent to a driver counts as an old one), then the newest task,
actors last, idle workers never) and what a node reads
(orchestra/_node/memory.py: cgroup v1 and v2 files, /proc/meminfo, the settings)."""
from __future__ import annotations

from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from orchestra._node import memory
from orchestra._scheduler import memory as policy
from orchestra._scheduler.call import Call
from orchestra._scheduler.events import MemoryPressure
from orchestra._scheduler.model import Task, Worker

workers = st.lists(st.tuples(st.sampled_from(["idle", "task", "lent", "actor", "starting actor"]),
                             st.integers(-1, 3), st.integers(0, 1000), st.integers(0, 2)),
                   max_size=12)


def make(spec: list[tuple[str, int, int, int]]) -> list[Worker]:
    out = []
    for i, (kind, retries, seq, node) in enumerate(spec):
        w = Worker(100 + i, node)
        w.conn = -1 if kind == "starting actor" else 7
        if kind in ("actor", "starting actor"):
            w.actor = object()
        elif kind == "lent":   # running a driver's direct calls, unseen by the head
            w.lent_to = 1
        elif kind == "task":
            t = Task(Call(bytes(12), name="f", max_retries=retries), 1)
            t.seq = seq
            w.queue.append(t)
        out.append(w)
    return out


@given(workers)
def test_the_victim_is_the_newest_retriable_task_then_the_newest_task_then_an_actor(spec):
    ws = make(spec)
    pressure = MemoryPressure(used=95, limit=100, threshold=0.9, where="the machine", workers={})
    kill = policy.choose(ws, pressure, 0, "n0")
    mine = [w for w in ws if w.node_id == 0]
    tasks = [w for w in mine if w.actor is None and (w.queue or w.lent_to is not None)]
    seq = {w.worker_id: w.queue[0].seq if w.queue else 0 for w in tasks}
    retriable = [w for w in tasks if not w.queue or w.queue[0].retries_left != 0]
    actors = [w for w in mine if w.actor is not None and w.conn >= 0]
    if not tasks and not actors:
        assert kill is None   # idle workers, a starting actor, other nodes: never
        return
    assert kill is not None and kill.node_id == 0
    victim = next(w for w in ws if w.worker_id == kill.worker_id)
    if retriable:
        assert victim in retriable
        assert seq[victim.worker_id] == max(seq[w.worker_id] for w in retriable)
    elif tasks:
        assert victim in tasks and seq[victim.worker_id] == max(seq[w.worker_id] for w in tasks)
    else:
        assert victim.worker_id == max(w.worker_id for w in actors)
    assert kill.reason.startswith(policy.MEMORY_KILL)


def test_the_reason_names_the_usage_the_limit_and_the_process():
    p = MemoryPressure(used=int(2.9 * (1 << 30)), limit=3 << 30, threshold=0.95,
                       where="cgroup v2 /job", workers={5: 1 << 30})
    assert policy.reason(p, "node-a", 5) == (
        "killed by the memory monitor: node node-a used 2.90 GiB of 3.00 GiB (97%, past its "
        "threshold of 95%; cgroup v2 /job), and this process held 1.00 GiB of its own")


def write(root: Path, rel: str, files: dict[str, str]) -> None:
    d = root / rel
    d.mkdir(parents=True, exist_ok=True)
    for name, text in files.items():
        (d / name).write_text(text)


def test_a_cgroup_v1_limit_is_read_less_its_inactive_file_pages(tmp_path):
    write(tmp_path, "memory/job", {"memory.limit_in_bytes": "1000000\n",
                                   "memory.usage_in_bytes": "900000\n",
                                   "memory.stat": "cache 5\ntotal_inactive_file 100000\n"})
    got = memory._cgroup("4:memory:/job\n1:cpu:/\n", str(tmp_path))
    assert got == memory.MemoryReading(800000, 1000000, "cgroup v1 /job")
    write(tmp_path, "memory/free", {"memory.limit_in_bytes": "9223372036854771712\n"})
    assert memory._cgroup("4:memory:/free\n", str(tmp_path)) is None   # no limit


def test_a_cgroup_v2_limit_is_read_and_max_is_none(tmp_path):
    write(tmp_path, "a/b", {"memory.max": "2000\n", "memory.current": "1500\n",
                            "memory.stat": "anon 1000\ninactive_file 300\n"})
    assert memory._cgroup("0::/a/b\n", str(tmp_path)) == memory.MemoryReading(
        1200, 2000, "cgroup v2 /a/b")
    write(tmp_path, "c", {"memory.max": "max\n"})
    assert memory._cgroup("0::/c\n", str(tmp_path)) is None


def test_the_machine_is_read_from_meminfo_and_the_tighter_limit_wins(tmp_path):
    info = "MemTotal:       1000 kB\nMemFree:  100 kB\nMemAvailable:   250 kB\n"
    assert memory._machine(info) == memory.MemoryReading(750 << 10, 1000 << 10, "the machine")
    reading = memory.read(str(tmp_path))   # no cgroup files there: the machine's
    assert reading.where == "the machine" and 0 < reading.used < reading.limit


def test_the_settings_come_from_the_environment_and_a_bad_one_is_named():
    assert memory.settings({}) == (0.95, 0.1)
    assert memory.settings({"ORCHESTRA_MEMORY_USAGE_THRESHOLD": "0.8",
                            "ORCHESTRA_MEMORY_MONITOR_REFRESH_MS": "0"}) == (0.8, 0.0)
    with pytest.raises(ValueError, match="ORCHESTRA_MEMORY_USAGE_THRESHOLD='lots'"):
        memory.settings({"ORCHESTRA_MEMORY_USAGE_THRESHOLD": "lots"})
    with pytest.raises(ValueError, match=r"must be in \(0, 1\]"):
        memory.settings({"ORCHESTRA_MEMORY_USAGE_THRESHOLD": "1.5"})


def test_the_monitor_asks_once_then_waits_for_its_victim():
    m = memory.MemoryMonitor(1e-9)   # this machine is always past it
    first = m.check({3: 0, 4: 1})
    assert first is not None and first.threshold == 1e-9 and first.used > 0
    assert set(first.workers) == {4}   # worker 3 has no process yet
    assert m.check({3: 0}) is None   # asked a moment ago: the head answers
    m.victim(3)
    assert m.check({3: 0}) is None   # its victim is not dead yet
    m.gone(3)
    assert m.check({}) is not None   # still past the threshold: asked again
    assert memory.MemoryMonitor(1.0).check({}) is None   # never past all of it


def test_a_task_the_monitor_killed_runs_again_later_and_later_and_a_cancelled_one_fails():
    ran, failed = [], []
    later = policy.RetryLater(ran.append, failed.append)
    later.tick(100.0)
    tasks = []
    for attempt in (1, 2, 3, 9):
        t = Task(Call(bytes([attempt]) * 12, name="f"), 1)
        t.attempt = attempt
        later.hold(t)
        tasks.append(t)
    assert later.tick(100.9) is False and ran == []
    assert later.tick(101.0) is True and ran == [tasks[0]]          # 1 s after the first
    later.tick(102.0)
    assert ran == tasks[:2]                                          # 2 s after the second
    tasks[2].cancelled = True
    later.tick(104.0)
    assert ran == tasks[:2] and failed == [tasks[2]]                 # cancelled meanwhile
    later.tick(129.9)
    assert len(ran) == 2
    later.tick(130.0)
    assert ran == [tasks[0], tasks[1], tasks[3]]                     # at most 30 s


def test_the_scheduler_holds_the_task_of_a_worker_the_monitor_killed_until_its_time():
    from _sched_helpers import Cluster, executed, make_call
    c = Cluster(cpus=1)
    call = make_call("hog")
    call.max_retries = 2
    c.submit(call)
    [(wid, tid)] = executed(c.take())
    c.s.retry_later.tick(50.0)
    c.s.worker_died(wid, policy.MEMORY_KILL + ": node n used 0.99 GiB of 1.00 GiB")
    out = c.take()
    assert executed(out) == []   # not at once
    (new_wid,) = c.started(out)
    c.connect(new_wid)
    assert executed(c.take()) == []
    assert c.s.retry_later.tick(51.0) is True
    c.s.schedule()
    assert executed(c.take()) == [(new_wid, tid)]   # a second later, on the new worker


def test_the_monitor_reads_five_times_as_often_near_the_threshold():
    r = memory.read()
    used = r.used / r.limit
    if used > 0.8:
        pytest.skip(f"this machine uses {used:.0%} of its memory: no room to be below and near")
    near = memory.MemoryMonitor(used + memory.NEAR / 2)   # just under it
    far = memory.MemoryMonitor(min(1.0, used + memory.NEAR + 0.1))
    assert near.check({}) is None and far.check({}) is None   # neither past it
    assert near.wait_s(0.1) == pytest.approx(0.1 / memory.FAST)
    assert far.wait_s(0.1) == 0.1
    past = memory.MemoryMonitor(1e-9)
    assert past.check({}) is not None and past.wait_s(0.1) == pytest.approx(0.02)
