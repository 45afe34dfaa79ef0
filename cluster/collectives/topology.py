"""Which ranks of a group share a host, and the set-up of their shared-memory arenas.

:func:`discover` runs once per group, as a collective of its own over the (authenticated)
network transport, on every rank:

1. every rank's :func:`~cluster.collectives.shm_segment.host_key` (and whether it can use shared
   memory) is all-gathered; ranks with equal keys form a host, leader = its lowest rank;
2. each leader creates the host's segment and writes a random nonce into it; the segment's
   name and the nonce are all-gathered (only over the authenticated transport: a name found any
   other way is never trusted);
3. members attach and check the nonce, which proves they see the leader's memory (same machine
   identity, not just the same address); the outcome is all-gathered, so every rank decides
   alike, then the leader unlinks the name: from here on nothing is left in ``/dev/shm``
   whatever happens to the processes.

A host whose set-up fails anywhere (no space in ``/dev/shm``, a member that cannot attach)
falls back to the network for its ranks, with a warning; only transport errors, timeouts and
mismatches raise.
"""

from __future__ import annotations

import logging
import secrets
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from cluster.collectives import cost, ring, shm_segment
from cluster.collectives._exchange import Exchange
from cluster.collectives.arena import Arena, ArenaLayout
from cluster.deadline import Deadline
from cluster.transport.api import Transport

__all__ = ["Topology", "discover"]

log = logging.getLogger(__name__)

_NAME_BYTES = 96
_NONCE_BYTES = 16


@dataclass(frozen=True)
class Topology:
    """The group's hosts (tuples of group ranks, ordered by their lowest rank) seen from one rank.

    A host of several ranks shares memory; a rank that cannot is a host of its own.
    """

    hosts: tuple[tuple[int, ...], ...]
    rank: int

    @property
    def host(self) -> tuple[int, ...]:
        """The ranks of this rank's host."""
        return next(h for h in self.hosts if self.rank in h)

    @property
    def local_rank(self) -> int:
        return self.host.index(self.rank)

    @property
    def leaders(self) -> tuple[int, ...]:
        return tuple(h[0] for h in self.hosts)

    @property
    def single_host(self) -> bool:
        return len(self.hosts) == 1

    @property
    def shares_memory(self) -> bool:
        """Whether any host has more than one rank."""
        return any(len(h) > 1 for h in self.hosts)

    @property
    def striped(self) -> bool:
        """Whether a ``HIER`` all-reduce crosses hosts on every rank, one stripe each: two hosts
        or more, each of the same number (two or more) of ranks. Then local rank ``j`` of every
        host carries stripe ``j`` across the hosts (:attr:`column`); otherwise the leaders carry
        the whole host total."""
        sizes = {len(h) for h in self.hosts}
        return len(self.hosts) > 1 and len(sizes) == 1 and min(sizes) > 1

    @property
    def column(self) -> tuple[int, ...]:
        """The ranks at this rank's local index on every host, in host order (on a striped
        topology, those that all-reduce this rank's stripe across the hosts)."""
        j = self.local_rank
        return tuple(h[j] for h in self.hosts if j < len(h))


def discover(
    transport: Transport,
    *,
    group: str,
    seq: int,
    deadline: Deadline,
    layout_for: Callable[[int], ArenaLayout],
    host_id: str = "",
    shared_memory: bool = True,
    spin_seconds: float | None = None,
) -> tuple[Topology, Arena | None]:
    """Set up the group's hosts (see the module doc); returns this rank's arena, if any.

    ``layout_for(local_size)`` gives the arena layout of a host of that many ranks; it must be
    the same function on every rank (its sample is part of the set-up's signature), as must
    ``shared_memory`` (False: every rank stays on the network). ``spin_seconds``: how long the
    arena's waits poll before they sleep; by default the host shape's
    (:func:`~cluster.collectives.cost.spin_seconds`).
    """
    sample = layout_for(2).describe() if shared_memory else "off"
    ex = Exchange(transport, group=group, seq=seq, kind="setup",
                  signature=f"setup shared-memory={sample}", deadline=deadline)
    usable = shared_memory and shm_segment.supported()
    keys, step = _all_gather(ex, shm_segment.host_key(host_id) + bytes([usable]), 0)
    hosts = _group_hosts(keys)
    topology = Topology(hosts, transport.rank)
    host = topology.host
    leader = host[0] == transport.rank
    layout = layout_for(len(host)) if len(host) > 1 else None
    segment: shm_segment.Segment | None = None
    nonce = secrets.token_bytes(_NONCE_BYTES)
    record = bytes(_NAME_BYTES + _NONCE_BYTES)
    try:
        if leader and layout is not None:
            shm_segment.sweep_stale()
            try:
                segment = shm_segment.Segment.create(layout.size)
                segment.buf[:_NONCE_BYTES] = nonce
                record = segment.name.encode().ljust(_NAME_BYTES, b"\0") + nonce
            except OSError as e:
                log.warning("%s: no shared memory for %d co-located ranks (%s); they use the "
                            "network", transport.peers[transport.rank], len(host), e)
        records, step = _all_gather(ex, record, step)
        if layout is not None and not leader:
            segment = _attach(records[host[0]], layout.size)
        arena = None
        if segment is not None and layout is not None:
            spin = (cost.spin_seconds(cost.HostShape.here(len(host)))
                    if spin_seconds is None else spin_seconds)
            arena = Arena(segment, layout, topology.local_rank,
                          [transport.peers[r] for r in host], transport.check,
                          group=group, spin_seconds=spin)
            arena.register()
        oks, step = _all_gather(ex, bytes([arena is not None]), step)
        ex.end()
    except BaseException:
        if segment is not None:
            segment.close()
        raise
    if segment is not None:
        segment.unlink()
    # Hosts where any rank failed fall back to the network: each of their ranks on its own.
    final: list[tuple[int, ...]] = []
    for h in hosts:
        if len(h) > 1 and all(oks[r][0] for r in h):
            final.append(h)
        else:
            final.extend((r,) for r in h)
    final.sort()
    topology = Topology(tuple(final), transport.rank)
    if arena is not None and len(topology.host) == 1:
        arena.close()
        arena = None
    if arena is not None:
        arena.registered()
    return topology, arena


def _group_hosts(keys: list[bytes]) -> tuple[tuple[int, ...], ...]:
    by_key: dict[bytes, list[int]] = {}
    hosts: list[list[int]] = []
    for rank, key in enumerate(keys):
        if not key[-1]:  # this rank cannot use shared memory
            hosts.append([rank])
            continue
        if key not in by_key:
            by_key[key] = []
            hosts.append(by_key[key])
        by_key[key].append(rank)
    return tuple(sorted(tuple(h) for h in hosts))


def _attach(record: bytes, size: int) -> shm_segment.Segment | None:
    name = record[:_NAME_BYTES].rstrip(b"\0").decode(errors="replace")
    nonce = record[_NAME_BYTES:]
    if not name:
        return None  # the leader could not create it
    try:
        segment = shm_segment.Segment.attach(name, size)
    except (OSError, ValueError) as e:
        log.warning("cannot attach the host's shared memory %s (%s): not the same host after "
                    "all; using the network", name, e)
        return None
    if bytes(segment.buf[:_NONCE_BYTES]) != nonce:
        log.warning("shared memory %s holds another nonce: not the same host; using the network",
                    name)
        segment.close()
        return None
    return segment


def _all_gather(ex: Exchange, record: bytes, first_step: int) -> tuple[list[bytes], int]:
    """Every rank's ``record`` (same length everywhere), over the network ring."""
    size = len(record)
    work = np.zeros(size * ex.size, np.uint8)
    work[ex.rank * size : (ex.rank + 1) * size] = np.frombuffer(record, np.uint8)
    bounds = [(r * size, (r + 1) * size) for r in range(ex.size)]
    step = ring.all_gather(ex, work, bounds, max(size, 1), first_step)
    return [work[a:b].tobytes() for a, b in bounds], step
