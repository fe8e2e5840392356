"""User metrics without processes: what a process records and reports, how the head adds
up every process's reports, the exposition text (types, buckets, escaping), the bounds;
and the dashboard's history and task-stream changes."""
from __future__ import annotations

import re
import threading

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from prometheus_client.parser import text_string_to_metric_families

from orchestra._observe import metrics as m
from orchestra._observe.history import History
from orchestra._observe.metrics_table import MetricsTable
from orchestra._observe.task_events import TaskTable
from orchestra._protocol import pb

SAMPLE = re.compile(r'^[a-zA-Z_:][a-zA-Z0-9_:]*(\{([a-zA-Z_][a-zA-Z0-9_]*="([^"\\]|\\.)*",?)*\})? '
                    r'(-?[0-9.e+]+|NaN|[+-]Inf)$')


@pytest.fixture
def recorder(monkeypatch: pytest.MonkeyPatch) -> m.Recorder:
    rec = m.Recorder()
    rec._thread = object()  # type: ignore[assignment]   # no reporting thread here
    monkeypatch.setattr(m, "_recorder", rec)
    return rec


def test_a_process_reports_increases_last_values_and_buckets(recorder: m.Recorder) -> None:
    c = m.Counter("requests", "Requests.", tag_keys=("route",))
    g = m.Gauge("queue_len", tag_keys=())
    h = m.Histogram("latency_s", "", boundaries=[0.1, 1.0], tag_keys=("route",))
    c.set_default_tags({"route": "/"})
    c.inc()
    c.inc(2, tags={"route": "/a"})
    c.inc(3, tags={"route": "/a"})
    g.set(5)
    g.set(7)
    for v in (0.05, 0.5, 5.0, 0.07):
        h.observe(v, tags={"route": "/a"})
    batch = recorder.take()
    assert batch is not None
    got = {(p.name, tuple(p.tag_values)): p for p in batch.points}
    assert got[("requests", ("/",))].value == 1 and got[("requests", ("/a",))].value == 5
    assert got[("queue_len", ())].value == 7
    hp = got[("latency_s", ("/a",))]
    assert list(hp.buckets) == [2, 1, 1] and hp.value == pytest.approx(5.62)
    assert recorder.take() is None   # nothing changed since


def test_bad_declarations_and_records_name_the_cause(recorder: m.Recorder) -> None:
    with pytest.raises(ValueError, match="letters, digits"):
        m.Counter("1bad")
    with pytest.raises(TypeError, match="tag_keys"):
        m.Counter("ok", tag_keys="route")   # type: ignore[arg-type]
    with pytest.raises(ValueError, match="increasing positive"):
        m.Histogram("h", boundaries=[1, 0.5])
    c = m.Counter("ok", tag_keys=("route",))
    with pytest.raises(ValueError, match=r"no value for tag\(s\) \['route'\]"):
        c.inc()
    with pytest.raises(ValueError, match="not among its tag_keys"):
        c.inc(tags={"other": "x"})
    with pytest.raises(ValueError, match="> 0"):
        c.inc(-1, tags={"route": "/"})
    with pytest.raises(TypeError, match="number"):
        m.Gauge("g").set("3")   # type: ignore[arg-type]


def _point(name: str, kind: int, value: float, tags: dict[str, str] | None = None,
           bounds: tuple[float, ...] = (), buckets: tuple[int, ...] = ()) -> pb.MetricsBatch:
    tags = tags or {}
    return pb.MetricsBatch(points=[pb.MetricPoint(
        name=name, kind=kind, description=f"{name} help", tag_keys=list(tags),
        tag_values=list(tags.values()), value=value, boundaries=bounds, buckets=buckets)])


def test_the_head_adds_every_process_and_exports_prometheus_text() -> None:
    t = MetricsTable()
    for _ in range(3):   # three processes' reports
        t.add(_point("requests", m.COUNTER, 2, {"route": "/a"}))
        t.add(_point("latency_s", m.HISTOGRAM, 0.5, {}, (0.1, 1.0), (1, 1, 0)))
    t.add(_point("queue_len", m.GAUGE, 4))
    t.add(_point("queue_len", m.GAUGE, 9))
    text = t.exposition()
    lines = text.splitlines()
    # A counter's samples are NAME_total, as Prometheus names counters.
    assert "# TYPE requests_total counter" in lines and 'requests_total{route="/a"} 6.0' in lines
    assert "# TYPE queue_len gauge" in lines and "queue_len 9.0" in lines
    assert "# TYPE latency_s histogram" in lines
    assert ['latency_s_bucket{le="0.1"} 3.0', 'latency_s_bucket{le="1.0"} 6.0',
            'latency_s_bucket{le="+Inf"} 6.0', "latency_s_count 6.0", "latency_s_sum 1.5"] == \
        [ln for ln in lines if ln.startswith("latency_s_")]
    assert all(ln.startswith("#") or SAMPLE.match(ln) for ln in lines), text
    # Prometheus's own parser reads it back: the types, the help, every value.
    fams = {f.name: f for f in text_string_to_metric_families(text)}
    assert (fams["requests"].type, fams["requests"].documentation) == ("counter", "requests help")
    assert [(s.name, s.labels, s.value) for s in fams["requests"].samples] == \
        [("requests_total", {"route": "/a"}, 6.0)]
    assert {s.name: s.value for s in fams["latency_s"].samples if "le" not in s.labels} == \
        {"latency_s_count": 6.0, "latency_s_sum": 1.5}


def test_label_values_are_escaped_and_a_conflicting_kind_is_dropped() -> None:
    t = MetricsTable()
    t.add(_point("evil", m.COUNTER, 1, {"who": 'a"b\\c\nd</script>'}))
    t.add(_point("evil", m.GAUGE, 5, {"who": "x"}))   # the same name as another kind
    text = t.exposition()
    lines = text.splitlines()
    assert 'evil_total{who="a\\"b\\\\c\\nd</script>"} 1.0' in lines
    assert all(ln.startswith("#") or SAMPLE.match(ln) for ln in lines)
    (fam,) = text_string_to_metric_families(text)
    assert [s.labels for s in fam.samples] == [{"who": 'a"b\\c\nd</script>'}]
    assert t.conflicts == 1


def test_series_are_bounded() -> None:
    t = MetricsTable(max_series=3)
    for i in range(5):
        t.add(_point("per_user", m.COUNTER, 1, {"user": str(i)}))
    assert t.series_count == 3 and t.dropped == 2
    assert len(t.rows()) == 3


def test_history_keeps_the_newest_points_and_answers_since() -> None:
    h = History(keep=3)
    for i in range(5):
        h.add(float(i), {"a": i * 1.0, **({"b": 1.0} if i == 0 else {})})
    assert h.since(0.0)["a"] == [[2.0, 2.0], [3.0, 3.0], [4.0, 4.0]]
    assert h.since(3.0) == {"a": [[4.0, 4.0]]}
    h.add(100.0, {"a": 1.0})          # "b" was not named for longer than it keeps
    assert "b" not in h.series


def test_task_table_numbers_changes_and_keeps_errors() -> None:
    t = TaskTable()
    b = pb.TaskEventBatch(start_task_id=[b"t1", b"t2"], start_name=["f", "g"],
                          start_actor_id=[b"", b""], start_kind=[0, 0], start_owner=[0, 0],
                          start_time=[1.0, 1.0], end_task_id=[b"t1"], end_time=[2.0],
                          end_error_type=["ValueError"], error_task_id=[b"t1"],
                          error_message=["bad"], error_traceback=["Traceback ...\nValueError: bad"])
    t.worker_batch(b, 1, 100, 0)
    recs, complete = t.changed_since(0)
    assert [r.task_id for r in recs] == [b"t2", b"t1"] and complete   # t1 changed last
    assert t.errors[b"t1"] == ("bad", "Traceback ...\nValueError: bad")
    seq = t.seq
    t.worker_batch(pb.TaskEventBatch(end_task_id=[b"t2"], end_time=[3.0], end_error_type=[""]),
                   1, 100, 0)
    recs, complete = t.changed_since(seq)
    assert [r.task_id for r in recs] == [b"t2"] and complete
    assert t.changed_since(t.seq) == ([], True)


def test_short_tasks_back_to_back_share_a_bar_in_the_task_stream() -> None:
    from orchestra._head.dashboard_views import merge_bars
    rows = [[0, 0, 0, 2, 0, 1], [0, 0, 3, 5, 0, 1], [0, 0, 6, 8, 0, 1],   # back to back: one bar
            [1, 0, 9, 11, 0, 1],                                         # another function
            [1, 0, 12, 14, 1, 1], [1, 0, 15, 17, 0, 1],                  # a failed one splits
            [1, 0, 100, 300, 0, 1], [1, 0, 301, 303, 0, 1],              # a long one stays alone
            [0, 1, 0, None, 0, 1]]                                       # running: alone
    assert merge_bars(rows) == [[0, 0, 0, 8, 0, 3], [1, 0, 9, 11, 0, 1], [1, 0, 12, 14, 1, 1],
                                [1, 0, 15, 17, 0, 1], [1, 0, 100, 300, 0, 1],
                                [1, 0, 301, 303, 0, 1], [0, 1, 0, None, 0, 1]]


# The recorder is shared by every thread of a process (they record) and its reporting
# thread (it takes): rule, one lock; every record lands in exactly one batch.

_OPS = st.lists(st.one_of(
    st.tuples(st.just("inc"), st.sampled_from(["a", "b"]), st.integers(1, 5)),
    st.tuples(st.just("set"), st.sampled_from(["a", "b"]), st.integers(-5, 5)),
    st.tuples(st.just("obs"), st.sampled_from(["a", "b"]), st.floats(0, 3)),
    st.tuples(st.just("take"), st.just(""), st.just(0))), max_size=60)


@settings(max_examples=200, deadline=None)
@given(_OPS)
def test_records_interleaved_with_takes_add_up_at_the_head(ops: list[tuple[str, str, float]]) -> None:
    rec = m.Recorder()
    rec._thread = object()  # type: ignore[assignment]
    old, m._recorder = m._recorder, rec
    try:
        c = m.Counter("c", tag_keys=("k",))
        g = m.Gauge("g", tag_keys=("k",))
        h = m.Histogram("h", boundaries=[1.0, 2.0], tag_keys=("k",))
        table = MetricsTable()
        want_c: dict[str, float] = {}
        want_g: dict[str, float] = {}
        want_h: dict[str, int] = {}
        for op, k, v in ops:
            if op == "inc":
                c.inc(v, tags={"k": k})
                want_c[k] = want_c.get(k, 0) + v
            elif op == "set":
                g.set(v, tags={"k": k})
                want_g[k] = v
            elif op == "obs":
                h.observe(v, tags={"k": k})
                want_h[k] = want_h.get(k, 0) + 1
            elif (batch := rec.take()) is not None:
                table.add(batch)
        if (batch := rec.take()) is not None:
            table.add(batch)
        got = {(r["name"], r["tags"]["k"]): r for r in table.rows()}
        assert {k: got[("c", k)]["value"] for k in want_c} == want_c
        assert {k: got[("g", k)]["value"] for k in want_g} == want_g
        assert {k: got[("h", k)]["count"] for k in want_h} == want_h
    finally:
        m._recorder = old


def test_threads_recording_while_the_reporter_takes_lose_nothing() -> None:
    rec = m.Recorder()
    rec._thread = object()  # type: ignore[assignment]
    old, m._recorder = m._recorder, rec
    try:
        c = m.Counter("hits")
        table = MetricsTable()
        stop = threading.Event()

        def reporter() -> None:
            while not stop.is_set():
                if (batch := rec.take()) is not None:
                    table.add(batch)

        t = threading.Thread(target=reporter)
        t.start()
        workers = [threading.Thread(target=lambda: [c.inc() for _ in range(5000)]) for _ in range(4)]
        for w in workers:
            w.start()
        for w in workers:
            w.join()
        stop.set()
        t.join()
        if (batch := rec.take()) is not None:
            table.add(batch)
        assert table.rows()[0]["value"] == 20_000
    finally:
        m._recorder = old
