"""The scheduler's core alone, driven in one process by simulated nodes and workers: how
fast it decides and how much memory it keeps, from 10 to 1,000 nodes.

    python tools/sim_core.py [--nodes 10,100,1000] [--workers 16] [--tasks 1000000]
                             [--actors 2000] [--groups 500] [--json FILE]

For each node count N, a fresh SchedulerState (orchestra/_scheduler/state.py: the head's
decisions, no I/O) gets N nodes of W CPUs, each with W workers connected at once (as
their processes would), and one driver; then, each phase timed:

    queue   T no-op tasks submitted by the driver, each a Call as the driver makes it;
            the first N*W*2 go out at once (each worker takes 2: the pipeline), the rest
            wait in the ready queue ............................... submits/s, bytes/task
    drain   every Execute the core sends is answered at once with a TaskDone, and the
            driver drops the result (a RefDelta decrement): each answer is a decision
            (the worker's next task) ......................................... tasks/s
    actors  A actors of 1 CPU each (less where the cluster has fewer CPUs) created,
            their dedicated workers connected and constructors answered, then one call
            each answered ......................................... actors/s, bytes/actor
    groups  G placement groups of 2 bundles of 1 CPU (PACK) created (those the cluster
            cannot hold wait), then removed .......................... groups/s

Memory is what Python allocated and still holds after each phase (tracemalloc, in a
second, smaller pass: tracing slows the core), per node (the build), per queued task,
per live actor. The core is what the head runs for
every event; the head's edge (frames in and out, the sockets) comes on top, and the
simulated nodes against a real head are another tool's work.
"""
from __future__ import annotations

import argparse
import gc
import itertools
import json
import os
import sys
import time
import tracemalloc
from typing import Any

if __name__ == "__main__":   # run by path from a checkout: the package beside it
    sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

from orchestra._head.inbound import call_in  # noqa: E402
from orchestra._proto import types_pb2  # noqa: E402
from orchestra._scheduler.data import inline  # noqa: E402
from orchestra._scheduler.events import Hello, TaskDone  # noqa: E402
from orchestra._scheduler.groups import GroupSpec  # noqa: E402
from orchestra._scheduler.instructions import Execute, KillWorker, StartWorker  # noqa: E402
from orchestra._scheduler.state import SchedulerState  # noqa: E402

DRIVER = 1
_WORKER_CONN = 1_000_000   # a worker's connection id: this + its worker id
_FUNCTION = b"F" * 16
_ids = itertools.count(1)


def _rss() -> int:
    """Bytes Python allocated and still holds (tracemalloc, when a memory pass runs it)."""
    gc.collect()
    return tracemalloc.get_traced_memory()[0] if tracemalloc.is_tracing() else 0


def _call(name: str, cpus: float, num_returns: int = 1, *, actor: bool = False,
          actor_id: bytes = b"") -> Any:
    """A Call as the driver makes it, as the head's edge hands it to the core (call_in:
    its message rides along, as in the head)."""
    tid = next(_ids).to_bytes(12, "big")
    msg = types_pb2.Call(task_id=tid, function_id=_FUNCTION, num_returns=num_returns,
                         resources={"CPU": cpus} if cpus else {}, name=name, actor_id=actor_id)
    if actor:
        msg.actor.CopyFrom(types_pb2.ActorSpec(actor_id=tid + b"\xff" * 4, class_name="A"))
    return call_in(msg)


class Sim:
    """A SchedulerState whose workers connect as soon as the core starts them and answer
    every task at once."""

    def __init__(self, nodes: int, workers: int, max_workers: int) -> None:
        self.s = SchedulerState(pipeline_depth=2)
        self.done = 0
        for nid in range(nodes):
            self.s.add_node(nid, {"CPU": float(workers)}, num_workers=workers,
                            max_workers=max_workers)
        self.s.client_connected(DRIVER, Hello(kind="driver", pid=1))
        self.pump(answer=False)

    def connect(self, worker_id: int) -> None:
        self.s.client_connected(_WORKER_CONN + worker_id,
                                Hello(kind="worker", pid=worker_id, worker_id=worker_id))

    def pump(self, answer: bool = True, drop: bool = True) -> int:
        """Carry out what the core decided until it decides nothing more: workers
        started connect, tasks sent are answered (``answer``) and their results dropped
        by the driver (``drop``). The tasks answered."""
        s = self.s
        answered = 0
        while s.out:
            out, s.out = s.out, []
            for ins in out:
                t = type(ins)
                if t is StartWorker:
                    self.connect(ins.worker_id)
                elif t is KillWorker:   # its process is gone at once
                    s.worker_died(ins.worker_id, ins.reason)
                elif answer and t is Execute and not ins.nested:
                    call = ins.call
                    returns = [inline(call.task_id + i.to_bytes(4, "big"), b"N.")
                               for i in range(call.num_returns)]
                    s.task_done(ins.conn, TaskDone(task_id=call.task_id, returns=returns))
                    if drop and returns:
                        s.directory.ref_delta(DRIVER, (), [r.object_id for r in returns])
                    answered += 1
        self.done += answered
        return answered


def _phase(out: dict[str, float], name: str, n: int, t0: float, rss0: int | None = None,
           per: str = "") -> None:
    dt = time.perf_counter() - t0
    out[f"{name}_per_s"] = n / dt if dt else 0.0
    out[f"{name}_s"] = dt
    if rss0 is not None and per:
        out[f"bytes_per_{per}"] = (_rss() - rss0) / max(n, 1)


def run(nodes: int, workers: int, tasks: int, actors: int, groups: int) -> dict[str, float]:
    out: dict[str, float] = {"nodes": nodes, "workers": nodes * workers, "tasks": tasks}
    rss0 = _rss()
    t0 = time.perf_counter()
    sim = Sim(nodes, workers, max_workers=workers + actors // nodes + 2)
    _phase(out, "build", nodes, t0, rss0, "node")
    s = sim.s

    # queue: the driver submits every task; the first ones go to the workers at once
    calls = [_call("noop", 1.0) for _ in range(tasks)]
    rss1 = _rss()
    t0 = time.perf_counter()
    for c in calls:
        s.submit(DRIVER, c)
    _phase(out, "queue", tasks, t0, rss1, "queued_task")
    del calls
    first, s.out = s.out, []
    out["sent_at_once"] = sum(1 for i in first if type(i) is Execute)

    # drain: each answer frees a worker's slot, and the core sends the next task
    s.out = first
    t0 = time.perf_counter()
    while sim.pump():
        pass
    _phase(out, "drain", sim.done, t0)
    out["left_in_core"] = len(s.tasks) + len(s.objects)

    # actors: each a dedicated worker; created, constructed, called once
    cpus = min(1.0, nodes * workers / max(actors, 1))   # all fit at once
    ctors = []
    for _ in range(actors):
        ctors.append(_call("A.__init__", cpus, num_returns=0, actor=True))
    rss2 = _rss()
    t0 = time.perf_counter()
    for ctor in ctors:
        s.create_actor(DRIVER, ctor)
        sim.pump()
    _phase(out, "actors", actors, t0, rss2, "actor")
    alive = sum(1 for a in s.actor_table.actors.values() if a.state.name == "ALIVE")
    out["actors_alive"] = alive
    t0 = time.perf_counter()
    for ctor in ctors:
        s.submit(DRIVER, _call("A.f", 0, actor_id=ctor.actor.actor_id))
        sim.pump()
    _phase(out, "actor_calls", actors, t0)

    # groups: two bundles of one CPU each, packed; created, then removed
    for ctor in ctors:
        s.actor_table.kill(ctor.actor.actor_id, True, reason="simulation: next phase")
    sim.pump()
    gids = [next(_ids).to_bytes(12, "big") for _ in range(groups)]
    t0 = time.perf_counter()
    for gid in gids:
        s.groups.create(DRIVER, GroupSpec(gid, ({"CPU": 1.0}, {"CPU": 1.0}), "PACK"))
        s.schedule()
        sim.pump()
    _phase(out, "groups", groups, t0)
    out["groups_placed"] = sum(1 for g in s.groups.groups.values() if all(
        n is not None for n in g.nodes))
    t0 = time.perf_counter()
    for gid in gids:
        s.groups.remove(gid)
        sim.pump()
    _phase(out, "group_removals", groups, t0)
    return out


_ROWS = [
    ("build_s", "build: nodes and workers connected (s)", "{:.2f}"),
    ("bytes_per_node", "memory per node with its workers (KB)", "{:,.1f}", 1e-3),
    ("tasks", "tasks queued", "{:,.0f}"),
    ("queue_per_s", "tasks submitted/s (all queued)", "{:,.0f}"),
    ("bytes_per_queued_task", "memory per queued task (bytes)", "{:,.0f}"),
    ("drain_per_s", "tasks answered/s (each a decision)", "{:,.0f}"),
    ("actors_per_s", "actors created and constructed/s", "{:,.0f}"),
    ("bytes_per_actor", "memory per live actor (KB)", "{:,.1f}", 1e-3),
    ("actor_calls_per_s", "actor calls answered/s (one each)", "{:,.0f}"),
    ("groups_per_s", "placement groups (2 bundles) created/s", "{:,.0f}"),
    ("group_removals_per_s", "placement groups removed/s", "{:,.0f}"),
]


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--nodes", default="10,100,1000", help="node counts, comma-separated")
    p.add_argument("--workers", type=int, default=16, help="workers (and CPUs) per node")
    p.add_argument("--tasks", default="1000000",
                   help="tasks queued, one count for all or one per node count")
    p.add_argument("--actors", type=int, default=2000)
    p.add_argument("--groups", type=int, default=500)
    p.add_argument("--json", help="write the figures here too")
    a = p.parse_args(argv)
    results = []
    counts = [int(x) for x in a.nodes.split(",")]
    tasks = [int(x) for x in a.tasks.split(",")]
    tasks = tasks * len(counts) if len(tasks) == 1 else tasks
    for n, t in zip(counts, tasks, strict=True):
        r = run(n, a.workers, t, a.actors, a.groups)
        tracemalloc.start()
        mem = run(n, a.workers, min(t, 20_000), min(a.actors, 500), 0)
        tracemalloc.stop()
        r.update({k: v for k, v in mem.items() if k.startswith("bytes_per_")})
        if a.json:   # after each count: a long run keeps what it measured
            with open(a.json, "w") as f:
                json.dump(results + [r], f, indent=1)
        results.append(r)
        print(f"{n} nodes: done ({r['drain_s'] + r['queue_s']:.1f} s of tasks; "
              f"{r['actors_alive']:.0f} actors alive, {r['groups_placed']:.0f} groups placed, "
              f"{r['left_in_core']:.0f} tasks and objects left)", flush=True)
    width = max(len(row[1]) for row in _ROWS)
    print(f"\n{'':{width}}" + "".join(f"{int(r['nodes']):>12,} nodes" for r in results))
    for key, label, fmt, *scale in _ROWS:
        cells = "".join(f"{fmt.format(r[key] * (scale[0] if scale else 1)):>18}" for r in results)
        print(f"{label:{width}}{cells}")
    print(f"\ntasks: {', '.join(f'{t:,}' for t in tasks)}; {a.actors:,} actors, {a.groups:,} groups; "
          f"{a.workers} workers per node; Python {sys.version.split()[0]}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
