"""Which pending TCP data handshake gives way to a new one: fairness per source, pure functions.

The acceptor of :mod:`~cluster.transport.tcp` runs at most ``total`` handshakes at once (each
holds a thread until it finishes or its deadline passes). A stranger can open connections and
then say nothing; if a full table refused newcomers, such connections would lock real peers out
for as long as they last. So the table never refuses a newcomer: it drops an older pending
handshake instead, chosen so that one source cannot crowd out another:

- a source at its share (``per_source``) gives up its own oldest handshake;
- otherwise a full table gives up the oldest handshake of the source holding the most slots.

A real peer finishes its handshake within a round trip or two, while a hostile connection can
only wait, so the oldest are the hostile ones: a peer from another address is dropped only when
no source holds more slots than its one (a flood from more addresses than there are slots), and
a peer sharing the flood's address only when ``per_source`` newer connections arrive from it
during its handshake; the connector then retries within its deadline.
"""

from __future__ import annotations

import ipaddress
from collections import Counter
from collections.abc import Sequence

__all__ = ["evictee", "source_key"]


def source_key(host: str) -> str:
    """The source a pending-handshake slot is charged to: the IPv4 address (also when mapped
    into IPv6), or the /64 of an IPv6 one (an attacker holds a whole /64 as easily as one
    address)."""
    try:
        ip = ipaddress.ip_address(host.split("%", 1)[0])
    except ValueError:
        return host
    if isinstance(ip, ipaddress.IPv6Address):
        if ip.ipv4_mapped is not None:
            return str(ip.ipv4_mapped)
        return str(ipaddress.IPv6Network((ip, 64), strict=False))
    return str(ip)


def evictee(pending: Sequence[str], source: str, per_source: int, total: int) -> int | None:
    """The index in ``pending`` of the handshake to drop so one from ``source`` can start, or
    None when there is room.

    ``pending`` lists the sources of the handshakes in progress, oldest first.
    ``per_source <= total`` and both are at least 1.
    """
    mine = [i for i, s in enumerate(pending) if s == source]
    if len(mine) >= per_source:
        return mine[0]
    if len(pending) >= total:
        counts = Counter(pending)
        most = max(counts.values())
        return next(i for i, s in enumerate(pending) if counts[s] == most)
    return None
