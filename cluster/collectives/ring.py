"""Pipelined ring algorithms over a :class:`~cluster.collectives._exchange.Exchange`.

All-reduce is reduce-scatter then all-gather (each rank sends ``2 (N - 1) / N`` of the data, the
bandwidth optimum). Every segment travels in sub-chunks of at most ``chunk_bytes`` and each chunk
is forwarded the moment it has been reduced (or copied), so while one chunk is on the wire the
next one is being received and reduced: ``Transport.send`` returns as soon as the payload may be
reused. Received chunks are reduced straight from the transport's buffer into the working array
(``np.frombuffer``, no copy).

The functions take ``first_step`` so several algorithm runs can share one collective (one
sequence number): each returns the first step number it left unused.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from cluster.collectives._exchange import Exchange
from cluster.collectives.ops import ReduceOp, finalize, reduce_into
from cluster.collectives.schedule import (
    Range,
    RingStep,
    chunk_ranges,
    ring_all_gather,
    ring_all_reduce,
    ring_reduce_scatter,
)

__all__ = ["all_gather", "all_reduce", "reduce_scatter", "run_ring"]


def all_reduce(
    ex: Exchange,
    work: np.ndarray,
    bounds: Sequence[Range],
    op: ReduceOp,
    chunk_bytes: int,
    first_step: int = 0,
) -> int:
    """Reduce ``work`` (flat, contiguous) in place across ranks; segments are ``bounds``."""
    steps = ring_all_reduce(ex.rank, ex.size)
    return run_ring(ex, work, bounds, steps, chunk_bytes, op=op, first_step=first_step)


def reduce_scatter(
    ex: Exchange,
    work: np.ndarray,
    bounds: Sequence[Range],
    op: ReduceOp,
    chunk_bytes: int,
    first_step: int = 0,
) -> int:
    """Leave segment ``bounds[rank]`` of ``work`` reduced across ranks (the rest is scratch)."""
    steps = ring_reduce_scatter(ex.rank, ex.size)
    return run_ring(ex, work, bounds, steps, chunk_bytes, op=op, first_step=first_step)


def all_gather(
    ex: Exchange,
    work: np.ndarray,
    bounds: Sequence[Range],
    chunk_bytes: int,
    first_step: int = 0,
) -> int:
    """Fill every segment of ``work`` from its owner; rank ``r`` holds ``bounds[r]`` on entry.

    Segments may have different sizes (every rank must pass the same ``bounds``).
    """
    steps = ring_all_gather(ex.rank, ex.size)
    return run_ring(ex, work, bounds, steps, chunk_bytes, op=None, first_step=first_step)


def run_ring(
    ex: Exchange,
    work: np.ndarray,
    bounds: Sequence[Range],
    steps: Sequence[RingStep],
    chunk_bytes: int,
    *,
    op: ReduceOp | None,
    first_step: int = 0,
) -> int:
    """Run ring ``steps`` (from :mod:`~cluster.collectives.schedule`) over ``work``.

    Step ``i`` uses message step ``first_step + i``. ``op`` reduces combining steps; the op's
    final step (``MEAN``'s division) is applied to each chunk of the owned segment as the last
    combining step completes it, before it is gathered. Returns the next unused step number.
    """
    if not steps:
        return first_step
    # The ring's first message goes right as (0, 0) before anything blocks: the handshake.
    ex.begin(piggyback_send=first_step == 0, piggyback_recv=first_step == 0)
    dtype = work.dtype
    chunks = [chunk_ranges(stop - start, dtype.itemsize, chunk_bytes) for start, stop in bounds]

    def piece(segment: int, c: int) -> np.ndarray:
        base = bounds[segment][0]
        lo, hi = chunks[segment][c]
        return work[base + lo : base + hi]

    first = steps[0].send
    for c in range(len(chunks[first])):
        ex.send(ex.right, first_step, c, piece(first, c))
    last_combine = max((i for i, s in enumerate(steps) if s.combine), default=-1)
    for i, step in enumerate(steps):
        # The segment received now is the one sent at the next step (schedule invariant).
        forward = i + 1 < len(steps)
        for c in range(len(chunks[step.recv])):
            mine = piece(step.recv, c)
            incoming = ex.recv(ex.left, first_step + i, c, dtype, mine.size)
            if step.combine:
                assert op is not None
                reduce_into(op, mine, incoming)
                if i == last_combine:
                    finalize(op, mine, ex.size)
            else:
                np.copyto(mine, incoming)
            if forward:
                ex.send(ex.right, first_step + i + 1, c, mine)
    return first_step + len(steps)
