"""Checks of what users pass: an int is an int, never a bool (``True`` is an ``int`` to
Python, and ``num_returns=True`` is a mistake, not a 1)."""
from __future__ import annotations

from typing import TypeGuard


def is_int(value: object, at_least: int | None = None) -> TypeGuard[int]:
    """``value`` is an int (not a bool), and at least ``at_least`` when given."""
    return isinstance(value, int) and not isinstance(value, bool) and (
        at_least is None or value >= at_least)


def is_number(value: object) -> TypeGuard[int | float]:
    """``value`` is an int or a float (not a bool)."""
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def a_type(value: object) -> str:
    """``value``'s type with its article, for messages: "an int", "a list"."""
    name = type(value).__name__
    return f"{'an' if name[:1].lower() in 'aeiou' else 'a'} {name}"
