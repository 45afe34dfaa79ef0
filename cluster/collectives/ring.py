"""Pipelined ring algorithms over a :class:`~cluster.collectives._exchange.Exchange`.

All-reduce is reduce-scatter then all-gather (each rank sends ``2 (N - 1) / N`` of the data, the
bandwidth optimum). Every segment travels in sub-chunks of at most ``chunk_bytes`` and each chunk
is forwarded the moment it has been reduced (or copied), so while one chunk is on the wire the
next one is being received and reduced: ``Transport.send`` returns as soon as the payload may be
reused. Received chunks are reduced straight from the transport's buffer into the working array
(``np.frombuffer``, no copy).

With ``source`` (the caller's input, left untouched) the working array needs no initial copy of
it: in the reduce-scatter schedules a rank receives each segment at most once, so every combine
is ``work[seg] = op(source[seg], incoming)`` and every byte of ``work`` is written exactly once
(by a combine or by the all-gather), never copied in first. At 64 MiB that copy into fresh
memory cost about a quarter of the whole all-reduce on this machine.

The functions take ``first_step`` so several algorithm runs can share one collective (one
sequence number): each returns the first step number it left unused.

With ``update`` (:data:`~cluster.collectives.epilogue.Update`), an all-reduce applies an
elementwise rule instead of returning the sum: the rank that completes a segment's reduction
applies ``update(out_chunk, reduced_chunk)`` to that chunk of ``out`` while it is still in cache,
and the all-gather then carries ``out``'s updated chunks, not the reduced ones. Each element's
update runs once in the group; ``work`` only holds partial sums (scratch).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from cluster.collectives._exchange import Exchange
from cluster.collectives.epilogue import Update
from cluster.collectives.ops import ReduceOp, combine_into, finalize, reduce_into
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
    *,
    source: np.ndarray | None = None,
    out: np.ndarray | None = None,
    update: Update | None = None,
) -> int:
    """Reduce across ranks into ``work`` (flat, contiguous); segments are ``bounds``.

    The local values are ``source`` when given (same shape as ``work``; ``work`` may then hold
    anything on entry), else ``work`` itself (reduced in place). With ``update``, ``out`` (flat,
    like ``work``, holding the same bytes on every rank) ends as ``update`` applied to it with
    the reduced values, and ``work`` is scratch (see the module doc).
    """
    steps = ring_all_reduce(ex.rank, ex.size)
    return run_ring(ex, work, bounds, steps, chunk_bytes, op=op, first_step=first_step,
                    source=source, out=out, update=update)


def reduce_scatter(
    ex: Exchange,
    work: np.ndarray,
    bounds: Sequence[Range],
    op: ReduceOp,
    chunk_bytes: int,
    first_step: int = 0,
    *,
    source: np.ndarray | None = None,
) -> int:
    """Leave segment ``bounds[rank]`` of ``work`` reduced across ranks (the rest is scratch).

    Local values come from ``source`` when given, as in :func:`all_reduce`.
    """
    steps = ring_reduce_scatter(ex.rank, ex.size)
    return run_ring(ex, work, bounds, steps, chunk_bytes, op=op, first_step=first_step,
                    source=source)


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
    source: np.ndarray | None = None,
    out: np.ndarray | None = None,
    update: Update | None = None,
) -> int:
    """Run ring ``steps`` (from :mod:`~cluster.collectives.schedule`) over ``work``.

    Step ``i`` uses message step ``first_step + i``. ``op`` reduces combining steps; the op's
    final step (``MEAN``'s division) is applied to each chunk of the owned segment as the last
    combining step completes it, before it is gathered. ``source``, if given, holds the local
    values (see the module doc); the combining steps must then receive distinct segments.
    ``update`` and ``out`` (both or neither) turn the reduction into an update of ``out``: the
    last combining step applies ``update`` to ``out``'s chunks, and the gathering steps fill
    ``out`` instead of ``work``. Returns the next unused step number.
    """
    if (out is None) != (update is None):
        raise ValueError("run_ring takes out and update together")
    if not steps:
        return first_step
    # The ring's first message goes right as (0, 0) before anything blocks: the handshake.
    ex.begin(piggyback_send=first_step == 0, piggyback_recv=first_step == 0)
    dtype = work.dtype
    chunks = [chunk_ranges(stop - start, dtype.itemsize, chunk_bytes) for start, stop in bounds]

    def piece(segment: int, c: int, array: np.ndarray = work) -> np.ndarray:
        base = bounds[segment][0]
        lo, hi = chunks[segment][c]
        return array[base + lo : base + hi]

    local = work if source is None else source
    final = work if out is None else out  # where finished chunks live and leave from
    if source is not None:
        combined = [s.recv for s in steps if s.combine]
        assert len(combined) == len(set(combined)), "a segment would be combined twice"
    # Gathered chunks may land straight in ``work``: by the time one arrives, this rank has
    # sent its last contribution to that chunk (the chain that produced it passed through us).
    for i, step in enumerate(steps):
        if not step.combine:
            for c in range(len(chunks[step.recv])):
                ex.post(ex.left, first_step + i, c, piece(step.recv, c, final))
    first = steps[0].send
    for c in range(len(chunks[first])):
        ex.send(ex.right, first_step, c, piece(first, c, local))
    last_combine = max((i for i, s in enumerate(steps) if s.combine), default=-1)
    for i, step in enumerate(steps):
        # The segment received now is the one sent at the next step (schedule invariant).
        forward = i + 1 < len(steps)
        for c in range(len(chunks[step.recv])):
            mine = piece(step.recv, c)
            if step.combine:
                assert op is not None
                incoming = ex.recv(ex.left, first_step + i, c, dtype, mine.size)
                if source is None:
                    reduce_into(op, mine, incoming)
                else:
                    combine_into(op, mine, piece(step.recv, c, source), incoming)
                if i == last_combine:
                    finalize(op, mine, ex.size)
                    if update is not None:  # fused: the owner updates, the gather carries it
                        target = piece(step.recv, c, final)
                        update(target, mine)
                        mine = target
            else:
                mine = piece(step.recv, c, final)
                ex.recv_into(ex.left, first_step + i, c, mine)
            if forward:
                ex.send(ex.right, first_step + i + 1, c, mine)
    return first_step + len(steps)
