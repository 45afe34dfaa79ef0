"""Pipelined ring algorithms over a :class:`~cluster.collectives._exchange.Exchange`.

All-reduce is reduce-scatter then all-gather (each rank sends ``2 (N - 1) / N`` of the data, the
bandwidth optimum). Every segment travels in sub-chunks of at most ``chunk_bytes`` and each chunk
is forwarded the moment it has been reduced (or copied), so while one chunk is on the wire the
next one is being received and reduced: ``Transport.send`` returns as soon as the payload may be
reused. Received chunks are reduced straight from the transport's buffer into the working array
(``np.frombuffer``, no copy).

With ``source`` (the caller's input, left untouched) the working array needs no initial copy of
it: in the reduce-scatter schedules a rank receives each segment at most once, so every combine
is ``op(source[seg], incoming)`` and every byte of ``work`` is written exactly once (by the
last combine or by the all-gather), never copied in first. At 64 MiB that copy into fresh
memory cost about a quarter of the whole all-reduce on this machine. Partial sums that are only
forwarded do not touch ``work`` at all: they go to one reused chunk of scratch (in cache for
4 MiB chunks, warm pages for whole segments), since ``send`` returns once its payload may be
reused.

The functions take ``first_step`` so several algorithm runs can share one collective (one
sequence number): each returns the first step number it left unused.

With ``update`` (:data:`~cluster.collectives.epilogue.Update`), an all-reduce applies an
elementwise rule instead of returning the sum: the rank that completes a segment's reduction
applies ``update(out_chunk, reduced_chunk)`` to that chunk of ``out`` while it is still in cache,
and the all-gather then carries ``out``'s updated chunks, not the reduced ones. Each element's
update runs once in the group; ``work`` only holds partial sums (scratch).

With two :class:`~cluster.collectives.lanes.Lanes`, an all-reduce splits its elements in two
halves, each all-reduced by a ring of its own on a lane thread: the first to the right, the
second to the left (:mod:`~cluster.collectives.lanes`).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import NamedTuple

import numpy as np

from cluster.collectives import kernels
from cluster.collectives._exchange import Exchange
from cluster.collectives.epilogue import Update
from cluster.collectives.lanes import Guard, Lanes, LaneView
from cluster.collectives.ops import ReduceOp, combine_into, finalize
from cluster.collectives.schedule import (
    Range,
    RingStep,
    chunk_ranges,
    ring_all_gather,
    ring_all_reduce,
    ring_reduce_scatter,
    segments,
)

Empty = Callable[[int, np.dtype], np.ndarray]
"""``empty(size, dtype)``: an uninitialised flat array (``np.empty``, or a buffer pool's)."""

_SCRATCH_BYTES = 512 * 1024
"""Block size of a fused update (:func:`_combine_update`): with the three arrays it streams,
within the 1 MiB per-core L2 of the machines measured. 13.0 ms for a rank's half of ResNet-50
(51 MB) at N=2 as one 4 MiB sum into ``work`` then the update, 9.2-9.9 ms with 256 KiB-1 MiB
blocks of a reused scratch, 11.5 ms with 64 KiB blocks (Python's per-block cost)."""

__all__ = ["RingArray", "all_gather", "all_reduce", "all_reduce_many", "reduce_scatter",
           "run_ring"]


class RingArray(NamedTuple):
    """One flat, contiguous array's part in a ring run over several (:func:`all_reduce_many`).

    ``work``: reduced in place, or the result buffer when ``source`` (the local values, read
    only) is given. ``out``: with the run's ``update``, the array the update applies to (flat,
    like ``work``, the same bytes on every rank); ``work`` is then scratch.
    """

    work: np.ndarray
    source: np.ndarray | None = None
    out: np.ndarray | None = None


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
    empty: Empty = np.empty,
    lanes: Lanes | None = None,
) -> int:
    """Reduce across ranks into ``work`` (flat, contiguous); segments are ``bounds`` (with one
    lane; several ``lanes`` segment their halves evenly).

    The local values are ``source`` when given (same shape as ``work``; ``work`` may then hold
    anything on entry), else ``work`` itself (reduced in place). With ``update``, ``out`` (flat,
    like ``work``, holding the same bytes on every rank) ends as ``update`` applied to it with
    the reduced values, and ``work`` is scratch (see the module doc).
    """
    if (out is None) != (update is None):
        raise ValueError("ring.all_reduce takes out and update together")
    if lanes is not None and lanes.count > 1:
        return _run_lanes(ex, [RingArray(work, source, out)], op, chunk_bytes, first_step,
                          update, empty, lanes)
    steps = ring_all_reduce(ex.rank, ex.size)
    return run_ring(ex, [RingArray(work, source, out)], bounds, steps, chunk_bytes, op=op,
                    first_step=first_step, update=update, empty=empty)


def all_reduce_many(
    ex: Exchange,
    arrays: Sequence[RingArray],
    op: ReduceOp,
    chunk_bytes: int,
    first_step: int = 0,
    *,
    update: Update | None = None,
    empty: Empty = np.empty,
    lanes: Lanes | None = None,
) -> int:
    """:func:`all_reduce` of several arrays of one dtype in one ring run (one per lane),
    segmented as if they were concatenated (with no copy). Arrays with ``out`` are updated
    when ``update`` is given.

    One run instead of one per array: each ring step then sends about ``len(arrays) / N + 1``
    messages instead of ``len(arrays)``. That is what counts where ranks outnumber cores: each
    message the main thread waits for is a hand-off from its receiving thread, and there a
    woken thread waits for a core (at N = 4 on 2 cores, ResNet-50's gradients took 200 ms as
    one ring per array against 155 ms for one array of the same bytes, with 4x the voluntary
    context switches). Every rank gets the same bytes, which may differ in the last bits from
    :func:`all_reduce` of each array alone (another segment, another order of reduction).
    Returns the next unused step number.
    """
    if not arrays:
        return first_step
    dtypes = {a.work.dtype for a in arrays}
    if len(dtypes) != 1:
        raise ValueError(f"ring.all_reduce_many takes arrays of one dtype, got {dtypes}")
    if lanes is not None and lanes.count > 1:
        return _run_lanes(ex, arrays, op, chunk_bytes, first_step, update, empty, lanes)
    total = sum(a.work.size for a in arrays)
    steps = ring_all_reduce(ex.rank, ex.size)
    return run_ring(ex, arrays, segments(total, ex.size), steps, chunk_bytes, op=op,
                    first_step=first_step, update=update, empty=empty)


def _run_lanes(ex: Exchange, arrays: Sequence[RingArray], op: ReduceOp, chunk_bytes: int,
               first_step: int, update: Update | None, empty: Empty, lanes: Lanes) -> int:
    """The all-reduce of ``arrays`` (concatenated) as ``lanes.count`` rings, each over its part
    of the elements on a lane thread, odd lanes running the other way round. The exchange's
    handshake goes first, alone (never piggybacked), so data starts at step 1; lane ``l`` uses
    the ``2 (N - 1)`` steps after lane ``l - 1``'s. Returns the next unused step number."""
    ex.begin(piggyback_send=False, piggyback_recv=False)
    first = max(first_step, 1)  # step 0 chunk 0 is the handshake's
    count = 2 * (ex.size - 1)  # a ring all-reduce's steps, on every rank and lane
    jobs = []
    for lane, part in enumerate(_lane_parts(arrays, lanes.count)):
        def job(guard: Guard, lane: int = lane, part: list[RingArray] = part) -> int:
            view = LaneView(ex, reverse=lane % 2 == 1, guard=guard)
            total = sum(a.work.size for a in part)
            return run_ring(view, part, segments(total, ex.size),
                            ring_all_reduce(view.rank, view.size), chunk_bytes, op=op,
                            first_step=first + lane * count, update=update, empty=empty)
        jobs.append(job)
    lanes.threads.run(jobs, ex.deadline)
    return first + lanes.count * count


def _lane_parts(arrays: Sequence[RingArray], count: int) -> list[list[RingArray]]:
    """``arrays``' elements (as if concatenated) in ``count`` contiguous parts of even size,
    each a list of views (a lane of tiny arrays may get none)."""
    total = sum(a.work.size for a in arrays)
    parts: list[list[RingArray]] = []
    for lo, hi in segments(total, count):
        part, start = [], 0
        for a in arrays:
            stop = start + a.work.size
            p_lo, p_hi = max(lo, start) - start, min(hi, stop) - start
            if p_hi > p_lo:
                part.append(RingArray(
                    a.work[p_lo:p_hi],
                    None if a.source is None else a.source[p_lo:p_hi],
                    None if a.out is None else a.out[p_lo:p_hi]))
            start = stop
        parts.append(part)
    return parts


def reduce_scatter(
    ex: Exchange,
    work: np.ndarray,
    bounds: Sequence[Range],
    op: ReduceOp,
    chunk_bytes: int,
    first_step: int = 0,
    *,
    source: np.ndarray | None = None,
    empty: Empty = np.empty,
) -> int:
    """Leave segment ``bounds[rank]`` of ``work`` reduced across ranks (the rest is scratch).

    Local values come from ``source`` when given, as in :func:`all_reduce`.
    """
    steps = ring_reduce_scatter(ex.rank, ex.size)
    return run_ring(ex, [RingArray(work, source)], bounds, steps, chunk_bytes, op=op,
                    first_step=first_step, empty=empty)


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
    return run_ring(ex, [RingArray(work)], bounds, steps, chunk_bytes, op=None,
                    first_step=first_step)


def run_ring(
    ex: Exchange | LaneView,
    arrays: Sequence[RingArray],
    bounds: Sequence[Range],
    steps: Sequence[RingStep],
    chunk_bytes: int,
    *,
    op: ReduceOp | None,
    first_step: int = 0,
    update: Update | None = None,
    empty: Empty = np.empty,
) -> int:
    """Run ring ``steps`` (from :mod:`~cluster.collectives.schedule`) over ``arrays``.

    ``bounds`` segments the arrays' elements as if they were concatenated; each step sends its
    segment's part of every array it covers, in sub-chunks of at most ``chunk_bytes`` (a step
    with nothing sends one empty message). Step ``i`` uses message step ``first_step + i``.
    ``op`` reduces combining steps; the op's final step (``MEAN``'s division) is applied to each
    chunk of the owned segment as the last combining step completes it, before it is gathered.
    An array's ``source``, if given, holds its local values (see the module doc); the combining
    steps must then receive distinct segments. With ``update``, arrays with ``out`` are updated
    instead of reduced: the last combining step applies ``update`` to ``out``'s chunks, and the
    gathering steps fill ``out`` instead of ``work``. A segment this rank only forwards a
    partial sum of is left as it was in ``work`` (the all-gather fills it, or it is scratch).
    ``empty(size, dtype)`` allocates that scratch (one chunk; a group's buffer pool, so that
    chunks of 32 MiB do not come from fresh pages every call). Returns the next unused step
    number.
    """
    if not steps or not arrays:
        return first_step
    # The ring's first message goes right as (0, 0) before anything blocks: the handshake.
    ex.begin(piggyback_send=first_step == 0, piggyback_recv=first_step == 0)
    table = _chunk_table(arrays, bounds, chunk_bytes)
    combined = [s.recv for s in steps if s.combine]
    once = len(combined) == len(set(combined))
    if any(a.source is not None for a in arrays):
        assert once, "a segment would be combined twice"

    def fused(a: int) -> bool:
        return update is not None and arrays[a].out is not None

    def piece(segment: int, c: int, role: str = "work") -> np.ndarray:
        a, lo, hi = table[segment][c]
        array = arrays[a]
        if role == "local":  # where this rank's values are
            base = array.work if array.source is None else array.source
        elif role == "final":  # where finished chunks live and leave from
            base = array.out if fused(a) else array.work
        else:
            base = array.work
        return base[lo:hi]

    # Gathered chunks may land straight in their place: by the time one arrives, this rank has
    # sent its last contribution to that chunk (the chain that produced it passed through us).
    for i, step in enumerate(steps):
        if not step.combine:
            for c in range(len(table[step.recv])):
                ex.post(ex.left, first_step + i, c, piece(step.recv, c, "final"))
    first = steps[0].send
    for c in range(len(table[first])):
        ex.send(ex.right, first_step, c, piece(first, c, "local"))
    last_combine = max((i for i, s in enumerate(steps) if s.combine), default=-1)
    # Sums that only pass through this rank (a partial sum forwarded, a fused chunk's sums
    # before its update) go to a reused scratch buffer, not to ``work``: writing
    # ``work`` would pull each line in from memory and later push it back, for values that are
    # dead once sent. ``send`` returns once its payload may be reused, so one chunk's room does.
    scratch: np.ndarray | None = None
    for i, step in enumerate(steps):
        # The segment received now is the one sent at the next step (schedule invariant).
        forward = i + 1 < len(steps)
        for c in range(len(table[step.recv])):
            mine = piece(step.recv, c)
            if step.combine:
                assert op is not None
                incoming = ex.recv(ex.left, first_step + i, c, mine.dtype, mine.size)
                a = table[step.recv][c][0]
                local = piece(step.recv, c, "local")  # ``mine`` itself when in place
                source = None if arrays[a].source is None else local
                if scratch is None:
                    scratch = empty(max(hi - lo for t in table for _, lo, hi in t),
                                    mine.dtype)
                with ex.writing():
                    if i == last_combine and fused(a):  # the owner updates, the gather carries
                        assert update is not None
                        target = piece(step.recv, c, "final")
                        _combine_update(op, ex.size, mine, source, incoming, target, update,
                                        scratch[:_SCRATCH_BYTES // mine.itemsize])
                        mine = target
                    elif i != last_combine and forward and once:
                        # A partial sum, dead once sent: its segment is gathered or scratch later.
                        passing = scratch[:mine.size]
                        combine_into(op, passing, local, incoming)
                        mine = passing
                    else:
                        combine_into(op, mine, local, incoming)
                        if i == last_combine:
                            finalize(op, mine, ex.size)
            else:
                mine = piece(step.recv, c, "final")
                ex.recv_into(ex.left, first_step + i, c, mine)
            if forward:
                ex.send(ex.right, first_step + i + 1, c, mine)
    return first_step + len(steps)


def _combine_update(op: ReduceOp, count: int, mine: np.ndarray, source: np.ndarray | None,
                    incoming: np.ndarray, target: np.ndarray, update: Update,
                    scratch: np.ndarray) -> None:
    """The last combine of a fused chunk: ``update(target, finalized op(local, incoming))``, a
    block of ``scratch``'s size at a time.

    With ``source`` (the caller's values) the sums go to ``scratch``, not to ``mine``: ``work``
    is scratch for a fused array, and writing it would pull a fresh line of memory in and push
    it back out for every element, where ``scratch`` stays in a core's cache. In place
    (``source`` is None, ``mine`` holds the local values) ``mine`` takes the sums, a block at a
    time, so that ``update`` reads them from cache. Either way, the bytes are those of the
    whole-chunk sequence: every step is elementwise. A SUM with an ``AddScaled`` update takes
    one compiled pass over the whole chunk instead (:func:`kernels.sum_add_scaled`).
    """
    local = mine if source is None else source
    if op is ReduceOp.SUM and kernels.sum_add_scaled(update, [local, incoming], target):
        return  # one pass: no sums to keep in cache
    block = scratch.size
    for lo in range(0, mine.size, block):
        hi = min(lo + block, mine.size)
        sums = mine[lo:hi] if source is None else scratch[:hi - lo]
        combine_into(op, sums, local[lo:hi], incoming[lo:hi])
        finalize(op, sums, count)
        update(target[lo:hi], sums)


def _chunk_table(arrays: Sequence[RingArray], bounds: Sequence[Range],
                 chunk_bytes: int) -> list[list[tuple[int, int, int]]]:
    """Per segment of ``bounds`` (over the arrays' elements, concatenated), its messages as
    ``(array index, start, stop)`` in that array, in order."""
    starts = [0]
    for array in arrays:
        starts.append(starts[-1] + array.work.size)
    itemsize = arrays[0].work.itemsize
    table = []
    for seg_start, seg_stop in bounds:
        pieces = []
        for a in range(len(arrays)):
            lo = max(seg_start, starts[a]) - starts[a]
            hi = min(seg_stop, starts[a + 1]) - starts[a]
            if hi > lo:
                pieces += [(a, lo + c_lo, lo + c_hi)
                           for c_lo, c_hi in chunk_ranges(hi - lo, itemsize, chunk_bytes)]
        if not pieces:  # every step sends: the message pattern must not depend on the sizes
            pieces.append((0, 0, 0))
        table.append(pieces)
    return table
