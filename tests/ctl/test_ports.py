"""The one free-port picker: distinct ports, bindable, and a clear error for a bad host."""

from __future__ import annotations

import socket

import pytest

from cluster.ctl.ports import pick_free_ports


@pytest.mark.parametrize("n", [0, 1, 5])
def test_ports_are_distinct_and_bindable_right_after(n: int) -> None:
    ports = pick_free_ports("127.0.0.1", n)
    assert len(ports) == n and len(set(ports)) == n
    for port in ports:
        with socket.socket() as s:
            s.bind(("127.0.0.1", port))


def test_a_host_that_cannot_be_bound_is_an_os_error_naming_it() -> None:
    with pytest.raises(OSError, match="cannot choose a port on host '192.0.2.1'"):
        pick_free_ports("192.0.2.1", 1)
