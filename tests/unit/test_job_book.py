"""The job table (orchestra/_scheduler/jobs.py), driven by a Hypothesis state machine:
drivers connect (new ones, and those of before connecting again), end with shutdown()
or are killed, the head restarts (a new book restored from what the store holds, as
the store's thread replays ``out``), the drivers' reconnect time runs out, the head
stops. Whatever the order: the store holds exactly the book's jobs; a job keeps its id
across restarts; a job that ended never runs again and its driver is refused; a job
is RUNNING exactly while its driver is connected or, after a restart, awaited; at most
KEEP_ENDED ended jobs are kept. No processes."""
from __future__ import annotations

import pytest
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from orchestra._head import records
from orchestra._scheduler import jobs
from orchestra._scheduler.jobs import FAILED, RUNNING, STOPPED, SUCCEEDED, JobBook

pytestmark = pytest.mark.timeout(60)

KEYS = [bytes([i]) * 16 for i in range(6)]


class Jobs(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.book = JobBook()
        self.store: dict[str, bytes] = {}
        self.now = 1000
        self.next_conn = 1
        self.boot = 0
        self.conn_of: dict[bytes, int] = {}     # driver key -> its live connection
        self.ids: dict[bytes, str] = {}         # driver key -> the job id it got first
        self.ended: set[bytes] = set()          # keys whose job ended
        self.awaited: set[bytes] = set()        # RUNNING after a restart, not back yet
        self.refused = 0

    def _drain(self) -> None:
        for d in self.book.out:
            assert d.table == jobs.JOBS
            if d.value is None:
                self.store.pop(d.key, None)
            else:
                self.store[d.key] = records.encode(d.table, d.value)   # as the head writes it
        self.book.out.clear()

    def _tick(self) -> int:
        self.now += 7
        return self.now

    @rule(key=st.sampled_from(KEYS))
    def connect(self, key: bytes) -> None:
        if key in self.conn_of:
            return
        conn = (self.boot << 32) + self.next_conn
        self.next_conn += 1
        job = self.book.connected(conn, key, pid=conn, node_id=2, namespace="ns",
                                  entrypoint="python x.py", now_ms=self._tick())
        self._drain()
        if key in self.ended:
            assert job is None, "a driver whose job ended was taken back"
            self.refused += 1
            return
        assert job is not None and job.rec.status == RUNNING
        assert job.rec.job_id == self.ids.setdefault(key, f"{conn:08x}")
        self.conn_of[key] = conn
        self.awaited.discard(key)

    @rule(key=st.sampled_from(KEYS), clean=st.booleans())
    def leave(self, key: bytes, clean: bool) -> None:
        conn = self.conn_of.pop(key, None)
        if conn is None:
            return
        if clean:
            self.book.ending(conn)
        self.book.disconnected(conn, self._tick())
        self._drain()
        rec = self.book.jobs[key].rec
        assert rec.status == (SUCCEEDED if clean else FAILED)
        assert rec.end_ms == self.now
        self.ended.add(key)

    @rule()
    def head_restarts(self) -> None:
        """SIGKILL: connections drop without a word; a new head restores the store."""
        self.awaited |= set(self.conn_of)
        self.conn_of.clear()
        self.boot += 1
        self.book = JobBook()
        kept, unreadable = records.read({jobs.JOBS: dict(self.store)})
        assert unreadable == [] and self.book.restore(kept[jobs.JOBS]) == []
        self._drain()

    @precondition(lambda self: bool(self.awaited))
    @rule()
    def reconnect_time_runs_out(self) -> None:
        gone = self.book.expire(60, self._tick())
        self._drain()
        assert {j.key for j in gone} == self.awaited
        for key in self.awaited:
            assert "did not connect again within 60 s" in self.book.jobs[key].rec.message
        self.ended |= self.awaited
        self.awaited.clear()

    @rule()
    def head_stops(self) -> None:
        """orchestra stop: running jobs stop with the cluster; their drivers are told."""
        self.book.stopped(self._tick())
        self._drain()
        for key in set(self.conn_of) | self.awaited:
            assert self.book.jobs[key].rec.status == STOPPED
        self.ended |= set(self.conn_of) | self.awaited
        self.conn_of.clear()
        self.awaited.clear()

    @invariant()
    def the_store_holds_the_book(self) -> None:
        assert self.store == {k.hex(): records.encode(jobs.JOBS, j.rec)
                              for k, j in self.book.jobs.items()}

    @invariant()
    def running_exactly_while_connected_or_awaited(self) -> None:
        running = {k for k, j in self.book.jobs.items() if j.rec.status == RUNNING}
        assert running == set(self.conn_of) | self.awaited
        assert {k for k, j in self.book.jobs.items() if j.rec.status != RUNNING} \
            == self.ended & set(self.book.jobs)
        assert self.book.waiting() == len(self.awaited)

    @invariant()
    def rows_name_each_job_once(self) -> None:
        rows = self.book.rows()
        assert sorted(r["job_id"] for r in rows) == sorted(self.ids[k] for k in self.book.jobs)
        for key, conn in self.conn_of.items():
            assert self.book.job_id(conn) == self.ids[key]


TestJobs = Jobs.TestCase
TestJobs.settings = settings(max_examples=150, stateful_step_count=30, deadline=None)


def test_only_the_newest_ended_jobs_are_kept(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(jobs, "KEEP_ENDED", 3)
    book = JobBook()
    for conn in range(1, 8):
        book.connected(conn, bytes([conn]) * 16, pid=conn, node_id=0, namespace="",
                       entrypoint="", now_ms=conn)
        book.disconnected(conn, conn)
    gone = [d.key for d in book.out if d.value is None]
    assert gone == [(bytes([c]) * 16).hex() for c in range(1, 5)]
    assert [r["job_id"] for r in book.rows()] == [f"{c:08x}" for c in (5, 6, 7)]
    assert book.job_id(1) is None and book.job_id(7) == "00000007"


def test_an_unreadable_record_is_said_and_dropped() -> None:
    book = JobBook()
    good = jobs.JobRecord(job_id="00000001", status=RUNNING)
    problems = book.restore({"zz": good, (b"a" * 16).hex(): good})
    assert len(problems) == 1 and "job zz" in problems[0]
    assert [(d.key, d.value) for d in book.out] == [("zz", None)]
    assert book.waiting() == 1
