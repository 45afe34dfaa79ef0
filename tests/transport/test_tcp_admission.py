"""Which pending data handshake gives way to a new one (a pure policy, table-tested)."""

from __future__ import annotations

import pytest

from cluster.transport._tcp_admission import evictee, source_key


@pytest.mark.parametrize(("pending", "source", "expected"), [
    ([], "a", None),  # room
    (["a", "b", "a"], "c", None),  # room: neither limit reached
    (["a", "b", "a", "a"], "a", 0),  # "a" at its share (3): its own oldest goes
    (["b", "a", "a", "a"], "a", 1),  # ... whoever is older in the table
    (["b", "a", "a", "c", "d", "a"], "e", 1),  # table full (6): the busiest source's oldest
    (["b", "c", "a", "d", "e", "f"], "g", 0),  # all hold one: the oldest of all
    (["x", "a", "a", "b", "b", "x"], "y", 0),  # a tie between sources: the oldest of them
    (["x", "a", "a", "a", "b", "b"], "x", 1),  # the lone "x" survives the busier "a"
])
def test_evictee(pending, source, expected) -> None:
    assert evictee(pending, source, per_source=3, total=6) == expected


def test_a_lone_peer_outlives_a_flood_from_other_addresses() -> None:
    # A real peer's handshake (one slot, from its own address) amid a flood from 3 addresses
    # that keeps opening connections: the peer's slot is never the one given up.
    pending = ["peer"]
    for i in range(1000):
        source = f"attacker-{i % 3}"
        victim = evictee(pending, source, per_source=16, total=64)
        if victim is not None:
            assert pending[victim] != "peer"
            del pending[victim]
        pending.append(source)
    assert "peer" in pending and len(pending) <= 64


@pytest.mark.parametrize(("host", "key"), [
    ("127.0.0.1", "127.0.0.1"),
    ("::ffff:10.0.0.7", "10.0.0.7"),  # a dual-stack listener sees IPv4 peers like this
    ("2001:db8::1", "2001:db8::/64"),
    ("2001:db8::ffff:1234", "2001:db8::/64"),  # same /64: one source
    ("fe80::1%eth0", "fe80::/64"),
    ("not an address", "not an address"),
])
def test_source_key(host, key) -> None:
    assert source_key(host) == key
