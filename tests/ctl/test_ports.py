"""The one free-port picker: distinct ports, bindable, outside the kernel's ephemeral range (where
another process's connection could take one before its task binds it), and a clear error for a
bad host."""

from __future__ import annotations

import socket

import pytest

from cluster.ctl import ports
from cluster.ctl.ports import PICK_FROM, ephemeral_range, pick_free_ports


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


def test_ports_lie_outside_the_ephemeral_range(monkeypatch, tmp_path) -> None:
    ranges = tmp_path / "ip_local_port_range"
    ranges.write_text("32768\t60999\n")
    monkeypatch.setattr(ports, "_EPHEMERAL", ranges)
    assert ephemeral_range() == (32768, 60999)
    chosen = pick_free_ports("127.0.0.1", 40)
    assert len(set(chosen)) == 40
    assert all(PICK_FROM[0] <= p < PICK_FROM[1] or p > 60999 for p in chosen), chosen
    with socket.socket() as held:  # one taken: never chosen, the others still are
        held.bind(("127.0.0.1", chosen[0]))
        held.listen(1)
        for _ in range(20):
            assert chosen[0] not in pick_free_ports("127.0.0.1", 5)


@pytest.mark.parametrize("text", ["1024 65535", "", "not a range", None])
def test_without_room_outside_the_range_the_kernel_chooses(monkeypatch, tmp_path, text) -> None:
    ranges = tmp_path / "ip_local_port_range"
    if text is not None:  # None: no such file (another OS)
        ranges.write_text(text)
    monkeypatch.setattr(ports, "_EPHEMERAL", ranges)
    chosen = pick_free_ports("127.0.0.1", 3)
    assert len(set(chosen)) == 3 and all(0 < p < 65536 for p in chosen)
