"""The scheduler's core at scale, bounded: tasks queued behind others cost no scan of
the workers, and the simulator of tools/sim_core.py (simulated nodes and workers
answering at once) runs every task, actor and placement group through (no processes,
no sockets)."""
from __future__ import annotations

import importlib.util
from pathlib import Path

from _sched_helpers import Nodes, executed, make_call

# The simulator, loaded by path (sys.path left alone: workers of other tests inherit it).
_spec = importlib.util.spec_from_file_location(
    "sim_core", Path(__file__).resolve().parents[2] / "tools" / "sim_core.py")
assert _spec is not None and _spec.loader is not None
sim_core = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(sim_core)


def test_tasks_queued_behind_others_are_not_rescheduled_at_each_submit(monkeypatch):
    c = Nodes({0: {"CPU": 1}, 1: {"CPU": 1}}, pipeline_depth=1)
    picks = []
    pick = c.s.worker_pool.pick
    monkeypatch.setattr(c.s.worker_pool, "pick", lambda t: picks.append(t) or pick(t))
    first = [c.submit(make_call()) for _ in range(2)]   # one on each worker
    behind = [c.submit(make_call()) for _ in range(50)]
    # Two picks that took a worker, one that found none; the 49 after it joined the
    # queue without a look at the workers.
    assert len(picks) == 3
    ran = executed(c.take())
    assert sorted(t for _, t in ran) == sorted(call.task_id for call in first)
    done = 0
    while ran:   # each answer frees a worker, which takes the next task in order
        wid, tid = ran.pop(0)
        call = next(x for x in first + behind if x.task_id == tid)
        c.done(wid, call)
        done += 1
        ran.extend(executed(c.take()))
    assert done == 52 and not c.s.has_ready()


def test_a_task_queued_behind_others_runs_when_a_new_node_joins():
    c = Nodes({0: {"CPU": 1}}, pipeline_depth=1)
    calls = [c.submit(make_call()) for _ in range(3)]
    assert len(executed(c.take())) == 1
    c.s.add_node(1, {"CPU": 2}, num_workers=2, max_workers=4)
    for wid in c.started(c.take()):
        c.connect(wid)
    ran = executed(c.take())
    assert sorted(t for _, t in ran) == sorted(x.task_id for x in calls[1:])
    assert {c.node_of(w) for w, _ in ran} == {1}


def test_the_simulator_runs_every_task_actor_and_group_through():
    out = sim_core.run(nodes=3, workers=4, tasks=500, actors=6, groups=4)
    assert out["sent_at_once"] == 3 * 4 * 2   # each worker takes two (the pipeline)
    assert out["drain_s"] > 0 and out["left_in_core"] == 0
    assert out["actors_alive"] == 6 and out["groups_placed"] == 4
