"""Arrivals (_api/progress.py): which pending ids have come, found among the ids added to
the results since the last look. Dicts in, ids out: no cluster."""
from __future__ import annotations

import pytest

from orchestra._api.progress import _FULL_SCAN_S, Arrivals

pytestmark = pytest.mark.timeout(10)


def make(results: list[bytes], pending: list[bytes]) -> tuple[dict[bytes, object], Arrivals]:
    res: dict[bytes, object] = dict.fromkeys(results, "v")
    return res, Arrivals(res, dict.fromkeys(pending, "ref"))


def test_the_first_look_finds_the_pending_ids_already_here_in_input_order() -> None:
    _, arr = make([b"x", b"c", b"a"], [b"a", b"b", b"c"])
    assert arr.any_ready()
    assert arr.take() == [b"a", b"c"]


def test_later_looks_find_the_ids_that_came_in_arrival_order_and_only_pending_ones() -> None:
    res, arr = make([b"x"], [b"a", b"b", b"c"])
    assert not arr.any_ready()
    for k in (b"c", b"y", b"a"):
        res[k] = "v"
    assert arr.any_ready()
    assert arr.take() == [b"c", b"a"]


def test_what_was_found_is_kept_until_taken() -> None:
    # A nested wait asks twice: the second look must not forget the first one's ids.
    res, arr = make([], [b"a", b"b"])
    assert not arr.any_ready()
    res[b"a"] = "v"
    assert arr.any_ready() and arr.any_ready()
    assert arr.take() == [b"a"]
    assert not arr.any_ready() and arr.take() == []


def test_an_id_taken_out_of_pending_is_not_found_again() -> None:
    res, arr = make([b"a"], [b"a", b"b"])
    assert arr.any_ready()
    for k in arr.take():
        del arr.pending[k]
    res[b"b"] = "v"
    assert arr.any_ready() and arr.take() == [b"b"]


def test_a_mark_removed_from_the_results_falls_back_to_a_whole_scan() -> None:
    res, arr = make([b"m"], [b"a"])
    assert not arr.any_ready()
    del res[b"m"]          # the mark's ref was freed
    res[b"a"] = "v"
    assert arr.any_ready() and arr.take() == [b"a"]


def test_an_id_the_walk_cannot_see_is_found_by_the_periodic_whole_scan() -> None:
    res, arr = make([b"m"], [b"a"])
    assert not arr.any_ready()
    del res[b"m"]          # the mark removed and added again after a pending id:
    res[b"a"] = "v"        # the walk back from the newest key stops at once
    res[b"m"] = "v"
    assert not arr.any_ready()
    arr.scanned_at -= _FULL_SCAN_S
    assert arr.any_ready() and arr.take() == [b"a"]


def test_empty_results_are_looked_at_without_error() -> None:
    res, arr = make([], [b"a"])
    assert not arr.any_ready() and not arr.any_ready()
    res[b"a"] = "v"
    assert arr.any_ready() and arr.take() == [b"a"]
