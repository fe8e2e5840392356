"""The scheduler's instructions: typed values the head carries out, each naming its node."""
from __future__ import annotations

import inspect
import typing

import pytest

from orchestra._head.head import Head
from orchestra._scheduler import instructions as _instructions
from orchestra._scheduler.instructions import FreeSegment, Instruction, KillWorker, Send, StartWorker

pytestmark = pytest.mark.timeout(10)

KINDS = typing.get_args(Instruction)
# Frames to a connection, and the head's own records: no node concerned.
NODE_KINDS = [k for k in KINDS if k.__name__ not in ("Send", "Push", "LateSend", "Durable")]


def test_every_instruction_class_of_the_module_is_an_instruction():
    classes = {obj for obj in vars(_instructions).values()
               if inspect.isclass(obj) and obj.__module__ == _instructions.__name__}
    assert classes == set(KINDS)


@pytest.mark.parametrize("kind", NODE_KINDS, ids=lambda k: k.__name__)
def test_an_instruction_that_concerns_a_node_names_it_first(kind):
    assert kind._fields[0] == "node_id"


@pytest.mark.parametrize("kind", KINDS, ids=lambda k: k.__name__)
def test_the_head_carries_out_every_kind_of_instruction(kind):
    assert f"type(ins) is {kind.__name__}" in inspect.getsource(Head.carry_out)


def test_instructions_are_immutable_and_compare_by_value():
    ins = KillWorker(0, 3, "cancelled with force=True")
    assert ins == KillWorker(node_id=0, worker_id=3, reason="cancelled with force=True")
    with pytest.raises(AttributeError):
        ins.worker_id = 4  # type: ignore[misc]


def test_fields_are_named_for_what_they_hold():
    assert StartWorker(0, 7).worker_id == 7
    assert FreeSegment(1, "/orchestra-seg").key == "/orchestra-seg"
    assert Send(5, 2, b"m").conn == 5
