"""The driver's side of task progress bars without processes: what a bar line carries,
how a bar renders, and what Bars writes to a terminal and to a pipe."""
from __future__ import annotations

import io
import json

from orchestra._observe.progress_bars import PREFIX, Bars, parse, render


class _Tty(io.StringIO):
    def isatty(self) -> bool:
        return True


def _state(uuid: str, x: int, total: int | None = 10, closed: bool = False) -> dict[str, object]:
    return {"uuid": uuid, "x": x, "total": total, "desc": f"bar {uuid}", "unit": "it",
            "start": 0.0, "closed": closed}


def test_only_well_formed_bar_lines_parse() -> None:
    line = PREFIX + json.dumps(_state("a", 3))
    assert parse(line) == _state("a", 3)
    assert parse("a log line") is None
    assert parse(PREFIX + "{not json") is None
    assert parse(PREFIX + json.dumps({"x": 1})) is None   # no uuid: printed as it is


def test_render_with_and_without_a_total() -> None:
    line = render(_state("a", 4), now=2.0, where="pid=7")
    assert line.startswith("bar a:  40%|########            | 4/10 [00:02<00:03, 2.00it/s]")
    assert line.endswith("(pid=7)")
    assert render(_state("b", 5, total=None), now=1.0) == "bar b: 5it [00:01, 5.00it/s]"


def test_a_pipe_gets_one_line_per_bar_when_it_closes() -> None:
    out = io.StringIO()
    bars = Bars(out)
    for i in range(50):
        bars.update(_state("a", i), pid=1)
    assert out.getvalue() == ""
    bars.update(_state("a", 10, closed=True), pid=1)
    bars.update(_state("b", 2), pid=2)
    bars.print_lines(out, ["(f pid=2) hello"])
    bars.close_all()   # at shutdown: the open bar's last state, once
    lines = out.getvalue().splitlines()
    assert [ln.split(":")[0] for ln in lines] == ["bar a", "(f pid=2) hello", "bar b"]


def test_a_terminal_redraws_the_open_bars_in_place_below_log_lines() -> None:
    out = _Tty()
    bars = Bars(out)
    bars.update(_state("a", 1), pid=1)
    bars.update(_state("b", 1), pid=2)        # a new bar draws at once: up one line, both
    assert out.getvalue().count("\n") == 3
    assert out.getvalue().rsplit("\x1b[1A\r\x1b[J", 1)[1].count("\n") == 2
    before = out.getvalue()
    bars.print_lines(out, ["log"])            # bars cleared, the line, bars again
    added = out.getvalue()[len(before):]
    assert added.startswith("\x1b[2A\r\x1b[J" + "log\n")
    assert added.count("\n") == 3
    bars.update(_state("a", 10, closed=True), pid=1)
    tail = out.getvalue().rsplit("\x1b[J", 1)[1]
    assert tail.splitlines()[0].startswith("bar a: 100%")     # stays above
    assert tail.splitlines()[1].startswith("bar b:  10%")     # the one still open


def test_a_dag_orders_each_node_once_children_first() -> None:
    import orchestra
    from orchestra._api.dag import InputNode, MultiOutputNode, order

    @orchestra.remote
    def f(*xs: object) -> None: ...

    with InputNode() as inp:
        shared = f.bind(inp[0])
        left, right = f.bind(shared), f.bind([shared, {"k": inp.y}])
        root = MultiOutputNode([left, right, shared])
    nodes = order(root)
    assert len(nodes) == len({id(n) for n in nodes}) == 7   # inp, inp[0], inp.y, 3 f's, root
    pos = {id(n): i for i, n in enumerate(nodes)}
    for n in nodes:
        assert all(pos[id(c)] < pos[id(n)] for c in n.children())
    assert nodes[-1] is root
