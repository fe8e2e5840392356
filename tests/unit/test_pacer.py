"""The client's background thread's pace (_runtime/pacer.py): short rounds while busy,
a doubling wait while idle, bounded, and a stir that ends a long wait."""
from __future__ import annotations

import threading

import pytest
from hypothesis import given
from hypothesis import strategies as st

from orchestra._runtime.pacer import LONG, SHORT, Pacer

pytestmark = pytest.mark.timeout(30)


@given(st.lists(st.sampled_from(["busy", "idle", "stir"]), max_size=60))
def test_the_wait_is_short_after_busy_rounds_and_doubles_while_idle(events):
    p = Pacer()
    idle = 0
    for e in events:
        if e == "stir":
            p.stir()
            continue
        busy = p.took() or e == "busy"
        p.done(busy)
        idle = 0 if busy else idle + 1
        assert p.wait == min(SHORT * 2 ** idle, LONG)
        assert SHORT <= p.wait <= LONG


def test_a_stir_is_taken_once():
    p = Pacer()
    p.stir()
    assert p.took() and not p.took()


def test_a_stir_ends_a_long_wait_and_stop_ends_the_rounds():
    p = Pacer()
    p.wait = 1000.0   # no round would come by itself within the test's time
    rounds: list[bool] = []
    t = threading.Thread(target=lambda: rounds.extend([p.sleep(), p.took()]))
    t.start()
    p.stir()
    t.join(timeout=10)
    assert not t.is_alive() and rounds == [True, True] and p.rounds == 1
    t = threading.Thread(target=lambda: rounds.append(p.sleep()))
    t.start()
    p.stop()
    t.join(timeout=10)
    assert not t.is_alive() and rounds[-1] is False and p.rounds == 1
