"""Error messages a new user meets first: they name the cause and the fix in plain
words. No processes."""
from __future__ import annotations

import threading

import pytest

import orchestra
from orchestra._objects.serialization import dumps_function


def test_an_unknown_option_names_the_one_it_is_likely_a_typo_of() -> None:
    with pytest.raises(TypeError, match=r"num_cpu \(did you mean num_cpus\?\)"):
        @orchestra.remote(num_cpu=1)
        def f() -> None:
            pass

    with pytest.raises(TypeError, match=r"max_restart \(did you mean max_restarts\?\)"):
        @orchestra.remote(max_restart=1)
        class A:
            pass

    # Nothing close: the option alone, then the valid ones.
    with pytest.raises(TypeError, match=r"unknown option\(s\) colour for .*; valid options: "):
        @orchestra.remote(colour="red")
        def g() -> None:
            pass


def test_a_function_that_cannot_be_pickled_is_named_once() -> None:
    """It read 'could not serialize remote function function <function ...>'."""
    lock = threading.Lock()

    def holds_a_lock() -> object:
        return lock

    with pytest.raises(TypeError) as err:
        dumps_function(holds_a_lock)
    text = str(err.value)
    assert "could not serialize remote function " + __name__ + \
        ".test_a_function_that_cannot_be_pickled_is_named_once.<locals>.holds_a_lock()" in text
    assert "function function" not in text and "_thread.lock" in text


@pytest.mark.parametrize("wrap", [lambda g: g, lambda g: {"items": [g]}])
def test_a_generator_argument_is_told_to_become_a_list(wrap) -> None:
    from orchestra._objects.serialization import serialize
    with pytest.raises(TypeError, match=r"pass list\(gen\) instead"):
        serialize(wrap(i * i for i in range(3)))
    with pytest.raises(TypeError, match="lock, socket, open file"):   # other values: as before
        serialize(threading.Lock())


def test_a_type_in_a_message_has_its_article() -> None:
    """('wait() takes a list of ObjectRefs, not a int')"""
    from orchestra._checks import a_type
    assert a_type(5) == "an int" and a_type([]) == "a list" and a_type(None) == "a NoneType"
    assert a_type(object()) == "an object" and a_type(1.5) == "a float"
