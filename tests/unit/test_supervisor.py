"""The head supervisor's decisions (orchestra/_cluster/supervisor.py, RestartBook): a head
that dies is started again at once, at most MAX_RESTARTS times within WINDOW_S; a stop
asked, or a head that ended on its own with code 0, ends the supervision; a head that
never started is not retried."""
from __future__ import annotations

import signal

import pytest
from hypothesis import given
from hypothesis import strategies as st

from orchestra._cluster.supervisor import (
    MAX_RESTARTS,
    WINDOW_S,
    GiveUp,
    Restart,
    RestartBook,
    Stop,
    describe_exit,
)

KILLED = -signal.SIGKILL


def test_a_head_that_dies_is_started_again():
    book = RestartBook()
    assert book.exited(0.0, KILLED, ready=True, stopping=False) == Restart(
        "the head died (killed by SIGKILL)")


def test_a_head_that_dies_too_often_stays_down_saying_why():
    book = RestartBook()
    for i in range(MAX_RESTARTS):
        assert isinstance(book.exited(float(i), KILLED, ready=True, stopping=False), Restart)
    last = book.exited(10.0, 1, ready=True, stopping=False)
    assert isinstance(last, GiveUp)
    assert f"died {MAX_RESTARTS + 1} times within {WINDOW_S:.0f} s" in last.reason
    assert "exit code 1" in last.reason and "orchestra stop" in last.reason


def test_deaths_far_apart_are_restarted_for_ever():
    book = RestartBook()
    for i in range(50):
        assert isinstance(book.exited(i * WINDOW_S / 2, KILLED, ready=True, stopping=False),
                          Restart)


def test_a_head_that_never_started_is_not_retried():
    decision = RestartBook().exited(0.0, 1, ready=False, stopping=False)
    assert isinstance(decision, GiveUp) and "failed to start" in decision.reason


def test_a_restart_that_fails_to_start_counts_as_a_death():
    book = RestartBook()
    assert isinstance(book.exited(0.0, KILLED, ready=True, stopping=False), Restart)
    assert isinstance(book.exited(1.0, 1, ready=False, stopping=False), Restart)


@pytest.mark.parametrize("code", [0, KILLED, 1])
def test_a_stop_asked_ends_it_whatever_the_exit(code):
    assert isinstance(RestartBook().exited(0.0, code, ready=True, stopping=True), Stop)


def test_a_head_that_ended_on_its_own_is_not_restarted():
    decision = RestartBook().exited(0.0, 0, ready=True, stopping=False)
    assert isinstance(decision, Stop) and "on its own" in decision.reason


def test_exits_in_words():
    assert describe_exit(-signal.SIGSEGV) == "killed by SIGSEGV"
    assert describe_exit(3) == "exit code 3"
    assert describe_exit(-200) == "killed by signal 200"


exits = st.lists(st.tuples(st.floats(0, 40), st.sampled_from([0, 1, KILLED, -signal.SIGSEGV]),
                           st.booleans(), st.booleans()), max_size=40)


@given(exits)
def test_restarts_never_exceed_the_limit_in_any_window(events):
    book = RestartBook()
    now, restarted = 0.0, []
    for dt, code, ready, stopping in events:
        now += dt
        decision = book.exited(now, code, ready=ready, stopping=stopping)
        if isinstance(decision, Restart):
            assert code != 0 and not stopping and book.ever_ready
            restarted.append(now)
            assert sum(1 for t in restarted if now - t < WINDOW_S) <= MAX_RESTARTS
        else:   # the supervisor ends: a later exit cannot come
            assert isinstance(decision, Stop) == (stopping or code == 0)
            break
