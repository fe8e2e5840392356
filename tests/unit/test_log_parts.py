"""The decisions of log forwarding without processes: which driver gets which lines
(LogRoutes), how lines are prefixed and folded (LineFolder), how `orchestra logs` finds
a task's or an actor's lines in a file, and code copied by value keeping its source."""
from __future__ import annotations

import linecache
import pickle
import traceback

from orchestra._cli.logs import _section, select
from orchestra._objects.code_source import dumps_by_value
from orchestra._observe.log_capture import short_name
from orchestra._observe.log_printer import LineFolder, fold_key, prefix
from orchestra._observe.log_router import LogRoutes
from orchestra._protocol import codec as _codec
from orchestra._protocol import pb


def _chunk(job=1, name="square", pid=10, lines=("hello",), stream=1, ip=""):
    return pb.LogChunk(job=job, name=name, pid=pid, lines=list(lines), stream=stream, ip=ip)


def test_the_job_field_is_protobufs_encoding_of_call_job():
    assert pb.Call.FromString(_codec.call(b"", b"t" * 12) + _codec.job_field(300)).job == 300
    assert _codec.job_field(7) == pb.Call(job=7).SerializeToString()


def test_lines_go_to_the_log_connection_of_their_job_only():
    routes = LogRoutes()
    routes.add(conn_id=50, job=1)
    routes.add(conn_id=60, job=2)
    msg = pb.LogLines(chunks=[_chunk(job=1), _chunk(job=2, lines=["b"]), _chunk(job=3)])
    out = routes.route(msg, default_job=None, ip="")
    assert {k: [list(c.lines) for c in v.chunks] for k, v in out.items()} == {50: [["hello"]], 60: [["b"]]}


def test_lines_of_no_job_go_to_the_default_driver_and_none_after_it_closed():
    routes = LogRoutes()
    routes.add(conn_id=50, job=1)
    assert list(routes.route(pb.LogLines(chunks=[_chunk(job=0)]), 1, "")) == [50]
    assert routes.remove(50) and not routes.remove(50)
    assert routes.route(pb.LogLines(chunks=[_chunk(job=1)]), 1, "") == {}


def test_the_head_names_the_node_on_a_cluster_of_several():
    routes = LogRoutes()
    routes.add(conn_id=50, job=1)
    (chunk,) = routes.route(pb.LogLines(chunks=[_chunk()]), None, "10.0.0.7")[50].chunks
    assert prefix(chunk) == "(square pid=10, ip=10.0.0.7)"


def test_a_task_is_named_by_its_function_and_a_constructor_by_its_class():
    assert short_name("__main__.square") == "square"
    assert short_name("pkg.mod.Counter.__init__") == "Counter"
    assert short_name("Counter.__init__") == "Counter"


def test_the_first_copy_is_printed_at_once_and_copies_of_other_workers_are_counted():
    folder = LineFolder(window_s=5)
    first = folder.add(_chunk(pid=1, lines=["loss 0.5 at step 3"]), now=0)
    assert first == [(1, "(square pid=1) loss 0.5 at step 3")]
    for pid in range(2, 9):
        assert folder.add(_chunk(pid=pid, lines=[f"loss 0.{pid} at step {pid}"]), now=1) == []
    assert folder.expire(now=4) == []
    assert folder.expire(now=5) == [(1, "(square pid=8) loss 0.8 at step 8 [repeated 7x across cluster]")]


def test_repeats_from_one_worker_are_printed_as_they_come():
    folder = LineFolder(window_s=5)
    assert len(folder.add(_chunk(lines=["tick", "tick"]), now=0)) == 2


def test_folding_off_prints_every_line_and_drain_prints_what_is_left():
    assert len(LineFolder(enabled=False).add(_chunk(lines=["a", "a"]), 0)) == 2
    folder = LineFolder()
    folder.add(_chunk(pid=1), 0)
    folder.add(_chunk(pid=2), 0)
    assert folder.drain() == [(1, "(square pid=2) hello")]
    assert fold_key("rank 3 of 0x1f ready") == "rank of ready"


def _write(tmp_path, name, text):
    logs = tmp_path / "logs"
    logs.mkdir(exist_ok=True)
    path = logs / name
    path.write_text(text)
    return str(path)


def test_orchestra_logs_finds_one_tasks_lines_and_an_actors_from_its_constructor(tmp_path):
    a = _write(tmp_path, "worker-1-100.out",
               ":orchestra:task aaaaaaaaaaaa square\none\n:orchestra:task bbbbbbbbbbbb square\ntwo\n")
    b = _write(tmp_path, "worker-2-200.out",
               ":orchestra:task cccccccccccc Counter\nmade\n:orchestra:actor dddddddddddd Counter "
               "cccccccccccc\n:orchestra:task eeeeeeeeeeee Counter\nincr\n")
    files, kind, ident, start = select([a, b], "bbbbbbbbbbbb00000000")   # an ObjectRef's hex
    assert (files, kind) == ([a], "task")
    with open(a) as f:
        assert [x for x in _section(f, kind, ident, start) if ":orchestra:" not in x] == ["two\n"]
    files, kind, ident, start = select([a, b], "dddddddd")
    with open(b) as f:
        assert [x for x in _section(f, kind, ident, start) if ":orchestra:" not in x] == ["made\n", "incr\n"]
    assert select([a, b], "200")[0] == [b]


def test_code_copied_by_value_keeps_its_file_and_ships_its_lines():
    name = "<ipython-input-9-feedface>"
    src = "def cell():\n    raise KeyError('in a cell')\n"
    linecache.cache[name] = (len(src), None, src.splitlines(True), name)
    ns: dict = {}
    exec(compile(src, name, "exec"), ns)
    data = dumps_by_value(ns["cell"])
    del linecache.cache[name]   # a worker has never seen the cell
    fn = pickle.loads(data)
    try:
        fn()
    except KeyError as exc:
        text = "".join(traceback.format_exception(exc))
    assert f'File "{name}", line 2, in cell' in text
    assert "raise KeyError('in a cell')" in text
