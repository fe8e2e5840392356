"""as_completed() and progress bars on a real local cluster.

as_completed(refs) yields refs in the order their values come, as
concurrent.futures.as_completed does with futures; ``progress=`` on get, wait and
as_completed draws a tqdm bar on stderr (checked in a driver of its own, whose stderr
is captured) and changes no result.
"""
from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from collections.abc import Iterator

import pytest

import _helpers as h
import orchestra
from _probes import child_env
from orchestra.exceptions import GetTimeoutError, TaskError

pytestmark = pytest.mark.timeout(60)

T = 30  # seconds: every wait in these tests has a deadline


@orchestra.remote
class Counter:
    def __init__(self) -> None:
        self.n = 0

    def inc(self) -> int:
        self.n += 1
        return self.n


@orchestra.remote
def items(n: int) -> Iterator[int]:
    yield from range(n)


@orchestra.remote
def drain_in_a_task(n: int) -> list[int]:
    refs = [h.identity.remote(i) for i in range(n)]
    return sorted(orchestra.get(r) for r in orchestra.as_completed(refs, timeout=T))


# ------------------------------------------------------------------ as_completed

def test_as_completed_yields_refs_in_the_order_they_finish(cluster, gates):
    a, b, c = gates("a"), gates("b"), gates("c")
    ra, rb, rc = h.gated.remote(a, "a"), h.gated.remote(b, "b"), h.gated.remote(c, "c")
    it = orchestra.as_completed([ra, rb, rc], timeout=T)
    b.open()
    assert next(it) == rb
    c.open()
    assert next(it) == rc
    a.open()
    assert next(it) == ra
    with pytest.raises(StopIteration):
        next(it)


def test_as_completed_yields_refs_already_ready_first_in_input_order(cluster, gates):
    g = gates()
    slow = h.gated.remote(g, 0)
    puts = [orchestra.put(i) for i in range(5)]
    it = orchestra.as_completed([puts[3], slow, *puts[:3], puts[4]], timeout=T)
    assert [next(it) for _ in range(5)] == [puts[3], puts[0], puts[1], puts[2], puts[4]]
    g.open()
    assert list(it) == [slow]


def test_as_completed_yields_every_ref_once_with_its_value(cluster):
    refs = [h.identity.remote(i) for i in range(200)]
    got = list(orchestra.as_completed(refs, timeout=T))
    assert sorted(got, key=refs.index) == refs
    assert sorted(orchestra.get(got, timeout=T)) == list(range(200))


def test_as_completed_yields_a_ref_given_twice_once(cluster):
    r, s = orchestra.put(1), h.identity.remote(2)
    assert sorted(orchestra.as_completed([r, s, r, s], timeout=T), key=[r, s].index) == [r, s]


def test_as_completed_of_nothing_yields_nothing(cluster):
    assert list(orchestra.as_completed([])) == []
    assert list(orchestra.as_completed(iter(()), timeout=0)) == []


def test_as_completed_takes_any_iterable(cluster):
    refs = [h.identity.remote(i) for i in range(3)]
    assert set(orchestra.as_completed(r for r in refs)) == set(refs)


def test_as_completed_raises_a_timeout_error_naming_the_refs_left(cluster, gates):
    g = gates()
    ready, slow = orchestra.put(1), h.gated.remote(g, 2)
    it = orchestra.as_completed([ready, slow, orchestra.put(3)], timeout=0.3)
    assert {next(it), next(it)} != {slow}
    with pytest.raises(GetTimeoutError, match=r"1 of 3 refs not ready") as info:
        next(it)
    assert isinstance(info.value, TimeoutError)
    g.open()
    assert orchestra.get(slow, timeout=T) == 2   # the task kept running


def test_as_completed_takes_refs_of_actor_calls_puts_and_generator_items(cluster):
    counter = Counter.remote()
    call = counter.inc.remote()
    put = orchestra.put("p")
    gen_items = list(items.remote(3))
    refs = [call, put, *gen_items]
    got = list(orchestra.as_completed(refs, timeout=T))
    assert set(got) == set(refs) and len(got) == len(refs)
    assert orchestra.get(got, timeout=T) == orchestra.get(got, timeout=T)
    assert sorted(map(str, orchestra.get(got, timeout=T))) == ["0", "1", "1", "2", "p"]


def test_as_completed_yields_a_failed_task_and_get_raises_its_error(cluster):
    bad = h.raise_value_error.remote("boom")
    [got] = orchestra.as_completed([bad], timeout=T)
    with pytest.raises(TaskError, match="boom"):
        orchestra.get(got, timeout=T)


def test_as_completed_inside_a_task(cluster):
    assert orchestra.get(drain_in_a_task.remote(20), timeout=T) == list(range(20))


@pytest.mark.parametrize("bad, error", [
    ([1], TypeError), ("ref", TypeError), ([None], TypeError),
])
def test_as_completed_rejects_what_is_not_a_ref(cluster, bad, error):
    with pytest.raises(error, match="ObjectRef"):
        orchestra.as_completed(bad)


def test_as_completed_rejects_an_object_ref_generator_naming_what_to_do(cluster):
    gen = items.remote(2)
    with pytest.raises(TypeError, match=r"iterate the generator"):
        orchestra.as_completed([gen])
    assert len(list(gen)) == 2


@pytest.mark.parametrize("timeout", [-1, float("nan"), "1"])
def test_as_completed_rejects_a_bad_timeout_at_once(cluster, timeout):
    with pytest.raises(ValueError, match="timeout"):
        orchestra.as_completed([orchestra.put(1)], timeout=timeout)


@pytest.mark.parametrize("call", ["get", "wait", "as_completed"])
def test_progress_must_be_a_bool_or_a_label(cluster, call):
    refs = [orchestra.put(1)]
    with pytest.raises(TypeError, match="progress must be True, False or a label"):
        if call == "as_completed":
            orchestra.as_completed(refs, progress=1)
        else:
            getattr(orchestra, call)(refs, progress=1)


# ------------------------------------------------------------------ progress bars

def test_get_and_wait_with_progress_give_what_they_give_without(cluster):
    refs = [h.identity.remote(i) for i in range(50)] + [orchestra.put("x")] * 2
    assert orchestra.get(refs, timeout=T, progress=True) == orchestra.get(refs, timeout=T)
    assert orchestra.get(refs[0], timeout=T, progress="one") == 0
    distinct = refs[:51]
    assert orchestra.wait(distinct, num_returns=10, timeout=T, progress=True) == \
        orchestra.wait(distinct, num_returns=10, timeout=T)


def test_get_with_progress_raises_the_timeout_and_the_task_error(cluster, gates):
    g = gates()
    with pytest.raises(GetTimeoutError, match=r"1 of 2 objects not ready"):
        orchestra.get([orchestra.put(1), h.gated.remote(g)], timeout=0.2, progress=True)
    with pytest.raises(TaskError, match="boom"):
        orchestra.get([h.raise_value_error.remote("boom")], timeout=T, progress=True)


def test_wait_with_progress_ends_at_its_timeout_without_error(cluster, gates):
    g = gates()
    ready, slow = orchestra.put(1), h.gated.remote(g)
    assert orchestra.wait([slow, ready], num_returns=2, timeout=0.2, progress=True) == \
        ([ready], [slow])


def test_wait_with_progress_over_an_object_ref_generator(cluster):
    gen = items.remote(2)
    ready, _ = orchestra.wait([gen], num_returns=1, timeout=T, progress=True)
    assert ready == [gen]
    assert len(list(gen)) == 2


_DRIVER = textwrap.dedent("""
    import json, sys, orchestra
    orchestra.init(num_cpus=2)

    @orchestra.remote
    def square(x):
        return x * x

    refs = [square.remote(i) for i in range(40)]
    plain = orchestra.get(refs, timeout=60)
    quiet_tqdm = "tqdm" not in sys.modules           # the default path imports no tqdm
    sys.stderr.write("@@get\\n")
    with_bar = orchestra.get(refs, timeout=60, progress=True)
    sys.stderr.write("@@wait\\n")
    ready, _ = orchestra.wait(refs, num_returns=25, timeout=60, progress="waiting")
    sys.stderr.write("@@as_completed\\n")
    order = [orchestra.get(r) for r in orchestra.as_completed(refs[:30], timeout=60,
                                                              progress="squares")]
    sys.stderr.write("@@end\\n")
    print(json.dumps({"same": plain == with_bar, "quiet_tqdm": quiet_tqdm,
                      "ready": len(ready), "got": sorted(order) == sorted(plain[:30])}))
    orchestra.shutdown()
""")




def _final_line(section: str) -> str:
    """tqdm rewrites its line with carriage returns: the last state is after the last."""
    return section.replace("\r", "\n").strip().splitlines()[-1]


def test_progress_bars_are_drawn_on_stderr_with_their_totals_and_final_counts(no_cluster,
                                                                              tmp_path):
    proc = subprocess.run([sys.executable, "-c", _DRIVER], cwd=tmp_path, env=child_env(),
                          capture_output=True, text=True, timeout=50, stdin=subprocess.DEVNULL)
    assert proc.returncode == 0, proc.stderr
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    assert out == {"same": True, "quiet_tqdm": True, "ready": 25, "got": True}
    err = proc.stderr
    before, rest = err.split("@@get\n", 1)
    assert "it/s" not in before and "obj/s" not in before and "%|" not in before
    get_part, rest = rest.split("@@wait\n", 1)
    wait_part, rest = rest.split("@@as_completed\n", 1)
    ac_part = rest.split("@@end\n", 1)[0]
    assert _final_line(get_part).startswith("get: 100%")
    assert " 40/40 [" in _final_line(get_part) and "obj/s]" in _final_line(get_part)
    assert _final_line(wait_part).startswith("waiting: 100%")
    assert " 25/25 [" in _final_line(wait_part)
    assert _final_line(ac_part).startswith("squares: 100%")
    assert " 30/30 [" in _final_line(ac_part)
