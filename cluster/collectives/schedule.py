"""Pure schedules of the collective algorithms: integer tables, no I/O, no arrays.

Everything an algorithm decides (how elements split into segments, which segment travels at each
ring step, how a segment splits into pipelined sub-chunks, who pairs with whom in recursive
doubling, who is whose parent in the binomial tree) is computed here and table-tested
(``tests/collectives/test_schedule.py``); the algorithm modules only move bytes along these
tables.
"""

from __future__ import annotations

from typing import NamedTuple

__all__ = [
    "DoublingPlan",
    "Range",
    "RingStep",
    "TreePlan",
    "chunk_ranges",
    "doubling_plan",
    "ring_all_gather",
    "ring_all_reduce",
    "ring_reduce_scatter",
    "segments",
    "tree_plan",
]

Range = tuple[int, int]
"""A half-open ``(start, stop)`` range of element indices."""


def segments(n: int, parts: int) -> list[Range]:
    """Split ``range(n)`` into ``parts`` contiguous ``(start, stop)`` ranges, in order.

    Like ``numpy.array_split``: the first ``n % parts`` ranges hold one element more than the
    rest, so sizes differ by at most one; when ``n < parts`` the trailing ranges are empty.

    >>> segments(10, 4)
    [(0, 3), (3, 6), (6, 8), (8, 10)]
    """
    if parts < 1:
        raise ValueError(f"parts must be >= 1, got {parts}")
    if n < 0:
        raise ValueError(f"n must be >= 0, got {n}")
    base, extra = divmod(n, parts)
    out: list[Range] = []
    start = 0
    for i in range(parts):
        stop = start + base + (1 if i < extra else 0)
        out.append((start, stop))
        start = stop
    return out


def chunk_ranges(length: int, itemsize: int, chunk_bytes: int) -> list[Range]:
    """Sub-chunks of a segment of ``length`` elements for pipelining, relative to its start.

    Each chunk holds at most ``chunk_bytes`` bytes but at least one element, so a chunk size
    below the item size still makes progress. There is always at least one chunk (an empty one
    for an empty segment), so every step of an algorithm sends a message and the message
    pattern does not depend on the data size.

    >>> chunk_ranges(10, 4, 16)
    [(0, 4), (4, 8), (8, 10)]
    """
    if length < 0 or itemsize < 1 or chunk_bytes < 1:
        raise ValueError(
            f"bad chunking: length={length}, itemsize={itemsize}, chunk_bytes={chunk_bytes}"
        )
    per = max(1, chunk_bytes // itemsize)
    if length == 0:
        return [(0, 0)]
    return [(start, min(start + per, length)) for start in range(0, length, per)]


class RingStep(NamedTuple):
    """One ring step: send segment ``send`` to the right neighbour, receive segment ``recv`` from
    the left one, and combine it into ours (``combine``, reduce-scatter) or copy it (all-gather).
    """

    send: int
    recv: int
    combine: bool


def ring_reduce_scatter(rank: int, size: int) -> list[RingStep]:
    """The ``size - 1`` reduce-scatter steps of ``rank``; afterwards it owns segment ``rank``.

    At step ``s`` rank ``r`` sends segment ``(r - s - 1) % size`` and receives and reduces
    segment ``(r - s - 2) % size``, which it sends on at step ``s + 1``. Each segment is reduced
    along one chain of ranks ending at its owner, so its result is computed exactly once.
    """
    _check_rank(rank, size)
    return [RingStep((rank - s - 1) % size, (rank - s - 2) % size, True) for s in range(size - 1)]


def ring_all_gather(rank: int, size: int) -> list[RingStep]:
    """The ``size - 1`` all-gather steps of ``rank``, which starts owning segment ``rank``.

    At step ``s`` rank ``r`` sends segment ``(r - s) % size`` and receives segment
    ``(r - s - 1) % size``, which it forwards at step ``s + 1``.
    """
    _check_rank(rank, size)
    return [RingStep((rank - s) % size, (rank - s - 1) % size, False) for s in range(size - 1)]


def ring_all_reduce(rank: int, size: int) -> list[RingStep]:
    """Reduce-scatter then all-gather: ``2 * (size - 1)`` steps.

    The segment received at each step is the one sent at the next, across the phase boundary
    too (the owned segment, fully reduced at the last reduce-scatter step, is the first one
    gathered), so a chunk can be forwarded as soon as it has been reduced.
    """
    return ring_reduce_scatter(rank, size) + ring_all_gather(rank, size)


class DoublingPlan(NamedTuple):
    """Recursive doubling for ``size`` ranks, seen from one rank.

    ``core`` is the largest power of two <= ``size``. Ranks ``core + i`` (the extra ranks) fold
    their value into rank ``i`` before the exchange and get the result back from it afterwards,
    as MPI and gloo do for sizes that are not powers of two.

    - ``fold``: for an extra rank, the core rank it sends to and hears back from; for a core rank
      ``i < size - core``, the extra rank it absorbs; otherwise ``None``.
    - ``extra``: whether this rank is an extra rank (it takes part in no exchange round).
    - ``partners``: the partner of each exchange round, ``rank ^ (1 << k)`` (empty for extra ranks).
    """

    core: int
    fold: int | None
    extra: bool
    partners: tuple[int, ...]


def doubling_plan(rank: int, size: int) -> DoublingPlan:
    """The recursive-doubling plan of ``rank`` in a group of ``size``."""
    _check_rank(rank, size)
    core = 1 << (size.bit_length() - 1)
    if rank >= core:
        return DoublingPlan(core, rank - core, True, ())
    fold = rank + core if rank + core < size else None
    rounds = core.bit_length() - 1
    return DoublingPlan(core, fold, False, tuple(rank ^ (1 << k) for k in range(rounds)))


class TreePlan(NamedTuple):
    """The binomial tree rooted at rank 0, seen from one rank.

    - ``parent``: the rank this one sends its partial result to and hears the result back
      from: ``rank`` with its lowest set bit cleared (``None`` for the root);
    - ``children``: ``rank + 2**j`` for every ``2**j`` below ``rank``'s lowest set bit (every
      power of two for the root) that is in the group, in increasing order. Child ``rank + 2**j``
      roots the subtree of ranks ``[rank + 2**j, rank + 2**(j+1))`` (clipped to the group), so
      folding the children in this order after our own value combines contiguous, increasing
      blocks of ranks: one fixed evaluation order for every rank.

    The reduction climbs the tree (a child completes after its own children), the result comes
    back down. A rank receiving one message at a time, the root holds the sum after
    ``ceil(log2(size))`` steps, so the all-reduce takes ``2 * ceil(log2(size))`` message
    latencies and ``2 * (size - 1)`` messages in all, against recursive doubling's ``log2``
    latencies and ``size * log2(size)`` messages.
    """

    parent: int | None
    children: tuple[int, ...]


def tree_plan(rank: int, size: int) -> TreePlan:
    """The binomial-tree plan of ``rank`` in a group of ``size``.

    >>> tree_plan(0, 6)
    TreePlan(parent=None, children=(1, 2, 4))
    >>> tree_plan(4, 6)
    TreePlan(parent=0, children=(5,))
    """
    _check_rank(rank, size)
    low = rank & -rank  # lowest set bit; 0 for the root
    parent = None if rank == 0 else rank - low
    limit = low if rank else 1 << max(0, (size - 1).bit_length())
    children = []
    bit = 1
    while bit < limit and rank + bit < size:
        children.append(rank + bit)
        bit <<= 1
    return TreePlan(parent, tuple(children))


def _check_rank(rank: int, size: int) -> None:
    if size < 1 or not 0 <= rank < size:
        raise ValueError(f"rank {rank} is not in a group of size {size}")
