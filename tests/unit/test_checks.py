"""The checks of what users pass (orchestra/_checks.py): a bool is never an int."""
from __future__ import annotations

import pytest

from orchestra._checks import is_int, is_number

pytestmark = pytest.mark.timeout(10)


@pytest.mark.parametrize(("value", "at_least", "ok"), [
    (0, None, True), (3, 1, True), (-1, -1, True), (0, 1, False), (True, None, False),
    (False, 0, False), (1.0, None, False), ("1", None, False), (None, None, False)])
def test_an_int_is_an_int_not_a_bool_and_at_least_its_bound(value, at_least, ok) -> None:
    assert is_int(value, at_least) is ok


@pytest.mark.parametrize(("value", "ok"), [
    (0, True), (2.5, True), (float("nan"), True), (True, False), ("2", False), (None, False)])
def test_a_number_is_an_int_or_a_float_not_a_bool(value, ok) -> None:
    assert is_number(value) is ok
