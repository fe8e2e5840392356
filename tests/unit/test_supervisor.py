"""The head supervisor's decisions (orchestra/_cluster/supervisor.py, RestartBook): a head
that dies is started again at once, at most MAX_RESTARTS times within WINDOW_S; a stop
asked, or a head that ended on its own with code 0, ends the supervision; a head that
never started is not retried."""
from __future__ import annotations

import json
import signal
import subprocess
import sys

import pytest
from hypothesis import given
from hypothesis import strategies as st

from orchestra._cluster.supervisor import (
    MAX_PAUSE_S,
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
            assert (decision.pause_s == 0) == ready
            restarted.append(now)
            assert sum(1 for t in restarted if now - t < WINDOW_S) <= MAX_RESTARTS
        else:   # the supervisor ends: a later exit cannot come
            assert isinstance(decision, Stop) == (stopping or code == 0)
            break


def test_a_head_that_wrote_its_address_and_died_between_two_polls_had_started(
        tmp_path, monkeypatch):
    """The supervisor looks for the head's address every _POLL_S; a head killed just after
    it wrote it (a loaded machine, a user's quick kill) died serving: it is restarted, not
    called a head that failed to start (and given up on). A real head-like process writes
    the address and SIGKILLs itself within one poll."""
    from orchestra._cluster import supervisor
    cfg = tmp_path / "cfg.json"
    cfg.write_text(json.dumps({"session_dir": str(tmp_path), "listen": "127.0.0.1:0"}))
    sup = supervisor._Supervisor(str(cfg), str(tmp_path))
    monkeypatch.setattr(supervisor, "_POLL_S", 1.5)
    head = subprocess.Popen([sys.executable, "-c", (
        "import os, signal, time; time.sleep(0.3); "
        f"open({str(tmp_path / 'address')!r}, 'w').write('127.0.0.1:4321'); "
        "os.kill(os.getpid(), signal.SIGKILL)")])
    code, ready = sup._wait(head)
    assert (code, ready) == (KILLED, True)
    assert sup.book.exited(0.0, code, ready=ready, stopping=False) == Restart(
        "the head died (killed by SIGKILL)")
    assert sup.cfg["listen"] == "127.0.0.1:4321"   # its restarts listen on its port


def test_an_address_seen_before_its_port_was_written_is_read_again(tmp_path, monkeypatch):
    """A head's address file seen between its creation and its write says no port: the
    supervisor reads it again until it does, and its restarts listen on that port (it
    once took the empty file for the head serving, pinned nothing, and restarted the
    head on a new port while the drivers and nodes knew the old one). A head-like
    process makes the file empty, writes it 0.5 s later, then SIGKILLs itself."""
    from orchestra._cluster import supervisor
    cfg = tmp_path / "cfg.json"
    cfg.write_text(json.dumps({"session_dir": str(tmp_path), "listen": "127.0.0.1:0"}))
    sup = supervisor._Supervisor(str(cfg), str(tmp_path))
    address = str(tmp_path / "address")
    head = subprocess.Popen([sys.executable, "-c", (
        "import os, signal, time\n"
        f"f = open({address!r}, 'w'); f.flush()\n"
        "time.sleep(0.5)\n"
        "f.write('127.0.0.1:4322'); f.close()\n"
        "time.sleep(0.3)\n"
        "os.kill(os.getpid(), signal.SIGKILL)")])
    code, ready = sup._wait(head)
    assert (code, ready) == (KILLED, True)
    assert sup.cfg["listen"] == "127.0.0.1:4322"


def test_a_restart_that_failed_to_start_is_tried_again_later_and_later():
    """A head killed while serving starts again at once; one whose restart failed (its
    port held a moment by another socket) waits 0.5 s, then 1, 2, 4 s: the restarts
    allowed span seconds, enough for what held it to let go."""
    book = RestartBook()
    assert book.exited(0.0, KILLED, ready=True, stopping=False).pause_s == 0.0
    pauses = [book.exited(float(i), 1, ready=False, stopping=False) for i in range(1, 5)]
    assert [d.pause_s for d in pauses] == [0.5, 1.0, 2.0, 4.0]
    assert isinstance(book.exited(5.0, 1, ready=False, stopping=False), GiveUp)


def test_the_pause_after_failed_starts_is_capped_and_ends_once_one_serves():
    book = RestartBook(max_restarts=100)
    book.exited(0.0, KILLED, ready=True, stopping=False)
    for i in range(10):
        last = book.exited(float(i), 1, ready=False, stopping=False)
    assert last.pause_s == MAX_PAUSE_S
    assert book.exited(11.0, KILLED, ready=True, stopping=False).pause_s == 0.0


def test_a_socket_connected_to_itself_is_refused():
    """What a reconnecting client may meet on loopback while the head's port is closed:
    the kernel connects the socket to itself (it picked that port as its own). Held, it
    would keep the restarted head from listening there."""
    import socket

    from orchestra._protocol.connection import refuse_self_connect
    s = socket.socket()
    try:
        s.bind(("127.0.0.1", 0))
        s.connect(s.getsockname())   # TCP's simultaneous open, with itself
        with pytest.raises(ConnectionRefusedError, match="connected to itself"):
            refuse_self_connect(s)
    finally:
        s.close()
    with socket.create_server(("127.0.0.1", 0)) as server, \
            socket.create_connection(server.getsockname()) as ok:
        refuse_self_connect(ok)   # a real peer: nothing said
