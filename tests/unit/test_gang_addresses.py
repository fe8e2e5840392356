"""Which interface holds an address (torch_env() names it for gloo and NCCL): on this
machine's real interfaces, no mocks."""
from __future__ import annotations

import os
import socket

import pytest

from orchestra._gang.member import interface_of, local_address_towards

pytestmark = pytest.mark.timeout(10)


def test_loopback_is_held_by_the_loopback_interface() -> None:
    assert interface_of("127.0.0.1") == "lo"


@pytest.mark.skipif(not os.path.exists("/proc/net/if_inet6"), reason="no IPv6 on this machine")
def test_an_ipv6_address_is_found_too() -> None:
    assert interface_of("::1") == "lo"


def test_the_address_on_the_route_out_is_held_by_an_interface_of_this_machine() -> None:
    me = local_address_towards("192.0.2.77")   # TEST-NET-1: routed by default, never reached
    names = {name for _, name in socket.if_nameindex()}
    if me.startswith("127."):
        pytest.skip("no route off this machine")
    assert interface_of(me) in names


def test_an_address_no_interface_holds_is_none() -> None:
    assert interface_of("203.0.113.250") is None
    assert interface_of("2001:db8::dead") is None
