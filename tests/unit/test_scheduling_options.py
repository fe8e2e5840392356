"""scheduling_strategy= and public node ids, on the client side: what is accepted, what
is refused and how, and what travels in the Call. No cluster."""
from __future__ import annotations

import pickle

import pytest

import orchestra
from orchestra._api.remote_function import placement_of
from orchestra._ids import node_from_hex, node_hex
from orchestra._proto import types_pb2
from orchestra.util.scheduling_strategies import NodeAffinitySchedulingStrategy

pytestmark = pytest.mark.timeout(10)

HEX2 = "0000000000000002"


@pytest.mark.parametrize("node_id", [0, 2, 255, 2**64 - 1])
def test_node_hex_is_16_lowercase_hex_digits_and_reads_back(node_id: int) -> None:
    s = node_hex(node_id)
    assert len(s) == 16 and s == s.lower() and node_from_hex(s) == node_id


def test_node_from_hex_takes_upper_case_too() -> None:
    assert node_from_hex("00000000000000AB") == 0xAB


@pytest.mark.parametrize("bad", ["", "2", "0x00000000000002", "000000000000000g",
                                 "00000000000000020", 2, None])
def test_a_malformed_node_id_is_refused_naming_it_and_the_form(bad: object) -> None:
    with pytest.raises(ValueError, match="16 hex digits") as info:
        node_from_hex(bad)  # type: ignore[arg-type]
    assert repr(bad) in str(info.value)


def test_node_affinity_keeps_its_id_and_softness() -> None:
    s = NodeAffinitySchedulingStrategy(HEX2.upper(), soft=True)
    assert (s.node_id, s.soft) == (HEX2, True)
    assert s == NodeAffinitySchedulingStrategy(HEX2, soft=True) != NodeAffinitySchedulingStrategy(HEX2)
    assert pickle.loads(pickle.dumps(s)) == s
    assert "soft=True" in repr(s)


def test_node_affinity_refuses_a_bad_id_or_softness() -> None:
    with pytest.raises(ValueError, match="bad node id"):
        NodeAffinitySchedulingStrategy("node-2")
    with pytest.raises(TypeError, match="soft must be True or False"):
        NodeAffinitySchedulingStrategy(HEX2, soft="yes")  # type: ignore[arg-type]


@pytest.mark.parametrize("value", [None, "DEFAULT"])
def test_the_default_strategy_sets_no_placement(value: object) -> None:
    assert placement_of(value) is None


def test_spread_and_affinity_become_the_calls_placement() -> None:
    assert placement_of("SPREAD") == types_pb2.Placement(strategy="SPREAD")
    assert placement_of(NodeAffinitySchedulingStrategy(HEX2, soft=True)) == types_pb2.Placement(
        strategy="NODE_AFFINITY", node_id=2, soft=True)


@pytest.mark.parametrize("value, error", [
    ("spread", ValueError), ("PACK", ValueError), ("", ValueError),
    (3, TypeError), (object(), TypeError), ({"node_id": HEX2}, TypeError)])
def test_an_unknown_strategy_is_refused_naming_the_accepted_ones(value: object, error: type) -> None:
    with pytest.raises(error, match='"SPREAD"') as info:
        placement_of(value)
    assert "NodeAffinitySchedulingStrategy" in str(info.value) and repr(value) in str(info.value)


def test_remote_functions_and_actor_classes_take_the_option() -> None:
    def f() -> None: ...

    class A: ...

    rf = orchestra.remote(scheduling_strategy="SPREAD")(f)
    assert rf.options(scheduling_strategy=NodeAffinitySchedulingStrategy(HEX2))._options[
        "scheduling_strategy"] == NodeAffinitySchedulingStrategy(HEX2)
    ac = orchestra.remote(scheduling_strategy=NodeAffinitySchedulingStrategy(HEX2, soft=True))(A)
    assert ac.options(scheduling_strategy="DEFAULT")._options["scheduling_strategy"] == "DEFAULT"


def test_a_bad_strategy_is_refused_at_decoration_and_in_options() -> None:
    def f() -> None: ...

    class A: ...

    with pytest.raises(ValueError, match="scheduling_strategy='spread'"):
        orchestra.remote(scheduling_strategy="spread")(f)
    with pytest.raises(TypeError, match="scheduling_strategy=7"):
        orchestra.remote(f).options(scheduling_strategy=7)
    with pytest.raises(ValueError, match="accepted"):
        orchestra.remote(A).options(scheduling_strategy="ANYWHERE")


def test_a_warning_of_the_head_is_shown_once_per_text() -> None:
    import types
    import warnings

    from orchestra._runtime.client import CoreClient
    client = types.SimpleNamespace(_warned=set())
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        for text in ("task f() waits for a node", "task f() waits for a node", "another"):
            CoreClient.warn(client, text)  # type: ignore[arg-type]
    assert [str(w.message) for w in seen] == ["task f() waits for a node", "another"]
    assert all(w.category is RuntimeWarning for w in seen)
