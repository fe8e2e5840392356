"""Which joblib batches run (orchestra/_libs/joblib_backend.Slots), driven by Hypothesis:
batches offered, batches ending and the pool stopped, in any order. Never more than
``limit`` run at once; a batch waits only while ``limit`` run; batches start in the
order offered; each starts once, or is handed back by stop(), never both; nothing
starts after stop(), and an offer after it is refused. No processes."""
from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

pytest.importorskip("joblib")
from orchestra._libs.joblib_backend import Slots  # noqa: E402

pytestmark = pytest.mark.timeout(60)

_STEP = st.sampled_from(["offer", "offer", "finish", "stop"])


@settings(max_examples=300, deadline=None)
@given(st.integers(1, 4), st.lists(_STEP, max_size=40))
def test_at_most_limit_run_and_each_batch_starts_once_in_order(limit: int,
                                                                steps: list[str]) -> None:
    slots = Slots(limit)
    offered: list[int] = []
    started: list[int] = []
    returned: list[int] = []
    running: list[int] = []
    for step in steps:
        if step == "offer":
            item = len(offered)
            if slots.stopped:
                with pytest.raises(ValueError, match="terminated"):
                    slots.offer(item)
                continue
            offered.append(item)
            go = slots.offer(item)
            assert go == ([item] if len(running) < limit else [])
        elif step == "finish":
            if not running:
                continue
            running.pop(0)
            go = slots.finished()
            if slots.stopped:
                assert go == []
        else:
            returned += slots.stop()
            go = []
        started += go
        running += go
        assert len(running) == slots.running <= limit
        waiting = [i for i in offered if i not in started and i not in returned]
        assert list(slots.waiting) == waiting
        assert not waiting or len(running) == limit or slots.stopped
    assert started == sorted(started)   # in the order offered
    assert not set(started) & set(returned)
    assert sorted(started + returned + list(slots.waiting)) == offered
