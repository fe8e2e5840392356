"""tools/sim_nodes.py, bounded: simulated nodes join a real head over TCP (as joining
nodes do: TLS or the token's handshake, join, register, heartbeats), the head starts
their workers and places a driver's tasks on them, and every task is answered there.
The tool's figures at 100-1,000 nodes are in docs/performance.md ("How far the head
goes"); this checks that what it measures is the head at work, not a head refusing it.
"""
from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

pytestmark = pytest.mark.timeout(120)

_spec = importlib.util.spec_from_file_location(
    "sim_nodes", Path(__file__).resolve().parents[2] / "tools" / "sim_nodes.py")
assert _spec is not None and _spec.loader is not None
sim_nodes = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(sim_nodes)


def test_simulated_nodes_join_a_real_head_and_answer_every_task_it_places():
    row = sim_nodes.measure(nodes=6, workers=2, tasks=400, idle_s=2.5, processes=2,
                            join_timeout_s=60)
    assert row["nodes lost"] == 0
    assert row["tasks answered by simulated workers"] >= 400
    # the head's heartbeats reached every node while idle (1 s apart: ~2 a node)
    assert row["idle: heartbeats seen"] >= 6
    assert row["head RSS, nodes joined (MB)"] > 0 and row["tasks/s"] > 0
