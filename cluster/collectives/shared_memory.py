"""Collectives among the co-located ranks of one host, through their shared-memory arena.

Each algorithm moves data in rounds of at most ``round_bytes`` per rank (see
:mod:`~cluster.collectives.arena` for rounds, progress and the buffer reuse rule); with two
staging buffers per rank, a rank fills round ``t + 1`` while slower peers still read round ``t``.

- :meth:`SharedMemoryCollectives.all_reduce` picks by size. Small (one round, at most
  ``whole_bytes``): every rank copies its value in, one wait, and every rank reduces all values
  itself (latency: one synchronisation). Large: a direct reduce-scatter (rank ``k`` reduces
  part ``k`` of every round, reading each peer's copy straight from its buffer, in rank order,
  into its own buffer) and a direct all-gather (every rank copies the other parts out). Each
  rank copies in ``(L - 1)/L`` of the data and copies out as much: no ring, no per-chunk
  messages, two synchronisations per round.
- Both compute every element as ``((x_0 op x_1) op x_2) ...`` in rank order, once (large) or
  identically on every rank (small), so every rank gets the same bytes from either.
- :meth:`all_reduce_many` runs the direct algorithm over several arrays of one dtype as if
  concatenated (no copy joins them): rounds stay full across array boundaries, so a step
  synchronises as often as its total size needs, not once or more per array.
- Single copy: where the local ranks may read each other's memory (``process_vm_readv``,
  :mod:`~cluster.collectives.cma`, proven once per group at its first large all-reduce), the
  direct all-reduce skips the arena: rank ``k`` reads its peers' parts of segment ``k`` straight
  from their input arrays, and the all-gather reads the other segments straight from their
  owners' outputs. The same reductions in the same order (the same bytes), three
  synchronisations per call instead of two per round, and no copy into or out of the arena.
  Its two copying steps wait for no one, so a rank with cores to spare runs them on several
  threads. By default where the cost model of the host's shape says it pays
  (:func:`auto_single_copy`: where ranks take turns on cores, or have cores to spare);
  otherwise, or where the kernel forbids it, the staged rounds above.
- Algorithm choices come from :mod:`~cluster.collectives.cost`'s model per host shape (cores
  and co-located ranks, message size): the small algorithm's threshold and single copy.
- :meth:`reduce_scatter`, :meth:`all_gather` (sizes may differ per rank), :meth:`broadcast` and
  :meth:`barrier` follow the same pattern.

Inputs are never written. ``out`` may be the input itself when the caller owns it: each round
reads the input's parts before it writes the same parts of ``out``.

A direct all-reduce may fuse an update (:mod:`~cluster.collectives.epilogue`): rank ``k``
applies it to part ``k`` of ``out`` with the values it just reduced, stages the updated part,
and the all-gather copies updated parts instead of reduced ones.
"""

from __future__ import annotations

import bisect
import functools
import math

import numpy as np

from cluster.collectives import cma, cost, kernels
from cluster.collectives.arena import Arena, progress
from cluster.collectives.cores import host_cores
from cluster.collectives.epilogue import Update
from cluster.collectives.lanes import Guard, Job, LaneThreads
from cluster.collectives.ops import ReduceOp, combine_into, finalize, reduce_into
from cluster.collectives.schedule import Range, segments
from cluster.deadline import Deadline
from cluster.errors import PeerUnavailableError

__all__ = ["SharedMemoryCollectives", "auto_copy_threads", "auto_single_copy",
           "auto_whole_bytes"]


def auto_whole_bytes(local_size: int, cpus: int | None = None) -> int:
    """The largest all-reduce that every rank reduces whole, for ``local_size`` ranks on
    ``cpus`` cores (this machine's by default): :func:`cost.whole_bytes` of that shape.

    On 2 cores: 16 KiB for 2 ranks (the direct algorithm wins from 32 KiB: 64 KiB in 0.04 ms
    against 0.07 ms), 512 KiB for 3 or 4 (each extra wait is a scheduler turn: 4 ranks, 256 KiB
    in 0.51 ms against 0.71 ms; 1 MiB in 1.13 ms against 0.81 ms). On 16 cores, with a core per
    rank, waits are cheap and every rank's phases run in parallel, so the direct algorithm's
    fewer moved bytes win early: 16 KiB for 2 ranks, 8 KiB for 4, 4 KiB for 8.
    """
    return cost.whole_bytes(_shape(local_size, cpus))


def auto_single_copy(local_size: int, cpus: int | None = None) -> bool:
    """Whether ``local_size`` ranks on ``cpus`` cores (this machine's by default) read each
    other's arrays in place by default: :func:`cost.single_copy_pays` at the default round.

    On 2 cores: not for 2 ranks (ResNet-50's ``apply_gradients`` staged in 37-42 ms, in place in
    42-50 ms), yes for 3 or 4, where every staged round's two waits are scheduler turns (4 ranks:
    median 112.5 ms against 125.5 ms over six pairs). On 16 cores: yes for 2, 4 or 8 ranks,
    whose cores to spare run its copying on several threads per rank (:func:`auto_copy_threads`);
    not for 16, where each rank copies its staged part on its own core in parallel with the
    others and the waits that single copy saves cost microseconds.
    """
    return cost.single_copy_pays(_shape(local_size, cpus), DEFAULT_ROUND_BYTES)


def auto_copy_threads(local_size: int, cpus: int | None = None) -> int:
    """Threads a rank runs a single-copy all-reduce's copying on: :func:`cost.copy_threads`
    of the host's shape (1 on 2 cores; 4 for 2 or 4 ranks on 16 cores, 2 for 8)."""
    return cost.copy_threads(_shape(local_size, cpus))


DEFAULT_ROUND_BYTES = 2 << 20
"""The arena round a group's single-copy decision assumes (the group's default round), so the
decision depends on the host's shape alone, not on a group's tuning."""


def _shape(local_size: int, cpus: int | None) -> cost.HostShape:
    """``local_size`` ranks on ``cpus`` cores, this host's by default (:func:`~cluster.
    collectives.cores.host_cores`, the same on every rank of a host, unlike an affinity mask)."""
    return cost.HostShape(cpus if cpus is not None else host_cores(), local_size)


class SharedMemoryCollectives:
    """The collectives of one rank over ``arena``; every local rank makes the same calls.

    Each method takes the collective's ``seq`` and ``signature`` (for mismatch detection), and
    its ``deadline``.
    """

    def __init__(self, arena: Arena, *, whole_bytes: int | None = None,
                 single_copy: bool | None = None, copy_threads: int | None = None) -> None:
        self.arena = arena
        self.rank = arena.local_rank
        self.size = arena.local_size
        self.whole_bytes = auto_whole_bytes(self.size) if whole_bytes is None else whole_bytes
        self._t = 0  # the next round of this arena (the same on every local rank)
        # Single-copy all-reduces: wanted here; proven for the group at the first one (None).
        if single_copy is None:
            single_copy = auto_single_copy(self.size)
        self._want_single_copy = single_copy and cma.supported()
        self._single_copy: bool | None = None
        # Single copy's read blocks: per copy thread, one per local rank.
        self._scratch: list[list[np.ndarray]] = []
        self._copy_threads = auto_copy_threads(self.size) if copy_threads is None else copy_threads
        self._workers = LaneThreads(f"{arena.group}-shm")

    @property
    def single_copy(self) -> bool | None:
        """Whether large all-reduces read peers' arrays in place (``None``: not decided yet)."""
        return self._single_copy

    def algorithm(self, nbytes: int) -> str:
        """``"whole"`` or ``"direct"``: which all-reduce a message of ``nbytes`` uses."""
        fits = nbytes <= min(self.whole_bytes, self.arena.layout.round_bytes)
        return "whole" if fits else "direct"

    # -- all-reduce ------------------------------------------------------------------------------

    def all_reduce(self, seq: int, signature: str, src: np.ndarray, out: np.ndarray,
                   op: ReduceOp, count: int, deadline: Deadline, *,
                   update: Update | None = None) -> None:
        """``out = op(src over local ranks)`` (flat, contiguous); MEAN divides by ``count``.

        With ``update`` (direct algorithm only: see :meth:`algorithm`), ``out`` instead ends as
        ``update(out, op(src ...))``, each part updated by the rank that reduced it; ``out``
        must then hold the same bytes on every rank and must not be ``src``.
        """
        self.arena.announce(seq, signature)
        if update is not None:
            if self.algorithm(src.nbytes) != "direct" or out is src:
                raise ValueError("a fused update needs the direct algorithm and out != src")
            self._all_reduce_direct([src], [out], op, count, deadline, update)
        elif self.algorithm(src.nbytes) == "whole":
            self._whole(src, out, op, count, deadline)
        else:
            self._all_reduce_direct([src], [out], op, count, deadline, None)

    def all_reduce_many(self, seq: int, signature: str, srcs: list[np.ndarray],
                        outs: list[np.ndarray], op: ReduceOp, count: int, deadline: Deadline, *,
                        update: Update | None = None) -> None:
        """:meth:`all_reduce` of several flat arrays of one dtype with the direct algorithm, in
        rounds over their concatenation (no copy joins them): ``outs[j]`` as ``all_reduce``
        would leave it for ``srcs[j]``. With ``update``, no ``outs[j]`` may be its ``srcs[j]``.
        Each element is reduced in rank order as alone, so the bytes are those of one call per
        array. ``outs[j]`` may be ``srcs[j]`` but overlaps no other array of either list.
        """
        if len({s.dtype for s in srcs}) > 1:
            raise ValueError("all_reduce_many takes arrays of one dtype")
        if update is not None and any(o is s for s, o in zip(srcs, outs, strict=True)):
            raise ValueError("a fused update needs out != src")
        self.arena.announce(seq, signature)
        self._all_reduce_direct(srcs, outs, op, count, deadline, update)

    def _all_reduce_direct(self, srcs: list[np.ndarray], outs: list[np.ndarray], op: ReduceOp,
                           count: int, deadline: Deadline, update: Update | None) -> None:
        """The large all-reduce: single-copy where the group proved it works, else staged."""
        bounds = segments(sum(s.size for s in srcs), self.size)
        if self._single_copy is None:
            self._single_copy = self._prove_single_copy(deadline)
        if self._single_copy and len(srcs) * _ADDRESS_BYTES <= self.arena.layout.round_bytes:
            self._read_in_place(srcs, outs, bounds, op, count, deadline, update)
        else:
            self._direct(srcs, outs, bounds, op, count, deadline, gather=True, update=update)

    def _prove_single_copy(self, deadline: Deadline) -> bool:
        """Decide, with every local rank, whether all of them can read each other's memory.

        Two rounds: each rank publishes a token's address and bytes, reads every peer's token
        through :func:`cma.prove`, and publishes whether all matched; the answer is the AND, so
        every rank takes the same algorithm. A rank that does not want single copies says no.
        """
        arena, me = self.arena, self.rank
        token = cma.Token()  # alive until every peer has read it (the second round's wait)
        t = self._begin_round(deadline)
        mine = arena.buffer(me, t)
        mine[:8].view(np.uint64)[0] = token.address
        mine[8:24] = token.array
        arena.post(progress(t, 1))
        arena.wait_all(progress(t, 1), deadline)
        ok = self._want_single_copy
        for k in range(self.size):
            if ok and k != me:
                theirs = arena.buffer(k, t)
                address = int(theirs[:8].view(np.uint64)[0])
                ok = cma.prove(arena.pid(k), address, bytes(theirs[8:24]))
        t = self._begin_round(deadline)
        arena.set_aux(t, int(ok))
        arena.post(progress(t, 1))
        arena.wait_all(progress(t, 1), deadline)
        return all(arena.aux(k, t) for k in range(self.size))

    def _read_in_place(self, srcs: list[np.ndarray], outs: list[np.ndarray],
                       bounds: list[Range], op: ReduceOp, count: int, deadline: Deadline,
                       update: Update | None) -> None:
        """The direct all-reduce with no staging: every rank reads its peers' arrays in place.

        1. Each rank publishes the addresses of its ``srcs`` and ``outs`` (one round).
        2. Rank ``k`` reduces segment ``k`` of the concatenation in blocks: it reads every
           peer's part of the block straight from the peer's input (one kernel copy into a
           cache-sized scratch), reduces in rank order as :meth:`_direct` does, and writes (or
           updates) its own ``outs``.
        3. Once every segment is done (one synchronisation), each rank copies the other
           segments from their owners' ``outs`` straight into its own, and waits until every
           peer has finished reading before it returns (one more).

        Three synchronisations per call instead of two per round, and no copy into or out of
        the arena. Steps 2 and 3 wait for no one, so they run on the rank's copy threads
        (:func:`auto_copy_threads`), each on a part of the range. Peers read only ``srcs`` in
        step 2 and only ``outs``' owned segments in
        step 3, so ``out`` may be ``src`` (each rank writes only its own segment in step 2).
        """
        arena, me, size = self.arena, self.rank, self.size
        dtype = srcs[0].dtype
        item = dtype.itemsize
        starts = np.cumsum([0, *(s.size for s in srcs)]).tolist()
        t = self._begin_round(deadline)
        table = arena.buffer(me, t)[: len(srcs) * _ADDRESS_BYTES].view(np.uint64).reshape(-1, 2)
        table[:, 0] = [s.ctypes.data for s in srcs]
        table[:, 1] = [o.ctypes.data for o in outs]
        arena.post(progress(t, 1))
        arena.wait_all(progress(t, 1), deadline)
        peers = {k: arena.buffer(k, t)[: table.nbytes].view(np.uint64).reshape(-1, 2).tolist()
                 for k in range(size) if k != me}
        # Steps 2 and 3 read and write nothing another rank waits on: split over threads.
        threads = self._copy_threads
        a, b = bounds[me]
        parts = [(a + lo, a + hi) for lo, hi in segments(b - a, threads)]

        def reduce_part(guard: Guard, lo_part: int, hi_part: int, blocks: list[np.ndarray]
                        ) -> int:
            scratch = [blk.view(dtype) for blk in blocks]
            block = scratch[0].size
            for lo in range(lo_part, hi_part, block):
                hi = min(lo + block, hi_part)
                pieces = _pieces(starts, lo, hi)
                views = [s[: hi - lo] for s in scratch]
                for k, table_k in peers.items():
                    self._read(k, [(views[k].ctypes.data + at * item,
                                    table_k[j][0] + plo * item, (phi - plo) * item)
                                   for j, plo, phi, at in pieces])
                with guard.writing():
                    _reduce_pieces(op, count, pieces, srcs, outs, views, me, update,
                                   staged=False)
            return 0

        self._in_parallel([functools.partial(reduce_part, lo_part=lo, hi_part=hi,
                                             blocks=self._read_blocks(i))
                           for i, (lo, hi) in enumerate(parts)], deadline)
        t = self._begin_round(deadline)
        arena.post(progress(t, 1))
        arena.wait_all(progress(t, 1), deadline)

        def gather_part(guard: Guard, part: int) -> int:
            for k, table_k in peers.items():
                ka, kb = bounds[k]
                lo, hi = segments(kb - ka, threads)[part]
                with guard.writing():
                    self._read(k, [(outs[j].ctypes.data + plo * item, table_k[j][1] + plo * item,
                                    (phi - plo) * item)
                                   for j, plo, phi, _ in _pieces(starts, ka + lo, ka + hi)])
            return 0

        self._in_parallel([functools.partial(gather_part, part=i) for i in range(threads)],
                          deadline)
        arena.post(progress(t, 2))
        arena.wait_all(progress(t, 2), deadline)

    def _in_parallel(self, jobs: list[Job], deadline: Deadline) -> None:
        """Run ``jobs`` on the rank's copy threads (the one on this thread when alone); they
        write under a guard, so none writes after this returns or raises."""
        if len(jobs) == 1:
            jobs[0](Guard())
        else:
            self._workers.run(jobs, deadline)

    def _read_blocks(self, thread: int = 0) -> list[np.ndarray]:
        """One :data:`_READ_BLOCK_BYTES` block of scratch per local rank (ours holds the result)
        for copy thread ``thread``, made once and viewed as any dtype (the size is a multiple
        of every itemsize)."""
        while len(self._scratch) <= thread:
            self._scratch.append([np.empty(_READ_BLOCK_BYTES, np.uint8)
                                  for _ in range(self.size)])
        return self._scratch[thread]

    def _read(self, k: int, pairs: list[tuple[int, int, int]]) -> None:
        """:func:`cma.read` from local rank ``k``; a failure names the peer."""
        try:
            cma.read(self.arena.pid(k), pairs)
        except cma.CmaError as e:
            peer = self.arena.peers[k]
            raise PeerUnavailableError(
                f"reading {peer}'s arrays in shared memory failed: {e.strerror}",
                task=peer.task, address=peer.address,
            ) from e

    def reduce_scatter(self, seq: int, signature: str, src: np.ndarray, out: np.ndarray,
                       bounds: list[Range], op: ReduceOp, count: int,
                       deadline: Deadline) -> None:
        """Leave ``out[bounds[rank]]`` reduced over local ranks (the rest of ``out`` untouched)."""
        self.arena.announce(seq, signature)
        self._direct([src], [out], bounds, op, count, deadline, gather=False)

    def _whole(self, src: np.ndarray, out: np.ndarray, op: ReduceOp, count: int,
               deadline: Deadline) -> None:
        arena = self.arena
        t = self._begin_round(deadline)
        n = src.size
        views = [arena.buffer(k, t)[: src.nbytes].view(src.dtype) for k in range(self.size)]
        np.copyto(views[self.rank], src)
        arena.post(progress(t, 1))
        arena.wait_all(progress(t, 1), deadline)
        if n:
            _reduce_in_order(op, out, views)
            finalize(op, out, count)

    def _direct(self, srcs: list[np.ndarray], outs: list[np.ndarray], bounds: list[Range],
                op: ReduceOp, count: int, deadline: Deadline, *, gather: bool,
                update: Update | None = None) -> None:
        """The direct algorithm over ``srcs`` (flat, one dtype) as if concatenated, into
        ``outs`` (their like); ``bounds`` segments the concatenation among local ranks.

        Rounds run over the concatenation, so arrays share rounds: several arrays cost the
        rounds of their total, not one partly empty round or more each (ResNet-50's 30 lone
        gradients took 62 rounds at N=2, one by one, against 49).
        """
        arena, me, size = self.arena, self.rank, self.size
        dtype = srcs[0].dtype
        starts = np.cumsum([0, *(s.size for s in srcs)]).tolist()
        per = max(1, arena.layout.round_bytes // size // dtype.itemsize)  # items per part, round
        nrounds = max(rounds_for(b - a, per) for a, b in bounds)
        for i in range(nrounds):
            t = self._begin_round(deadline)
            parts = [_pieces(starts, min(a + i * per, b), min(a + (i + 1) * per, b))
                     for a, b in bounds]
            mine = _parts_view(arena.buffer(me, t), dtype, per, size)
            for k, pieces in enumerate(parts):
                if k != me:
                    for j, lo, hi, at in pieces:
                        np.copyto(mine[k][at : at + hi - lo], srcs[j][lo:hi])
            arena.post(progress(t, 1))
            arena.wait_all(progress(t, 1), deadline)
            if parts[me]:
                staged = [_parts_view(arena.buffer(k, t), dtype, per, size)[me]
                          for k in range(size)]
                _reduce_pieces(op, count, parts[me], srcs, outs, staged, me, update, staged=True)
            if gather:
                arena.post(progress(t, 2))
                arena.wait_all(progress(t, 2), deadline)
                for k, pieces in enumerate(parts):
                    if k != me and pieces:
                        theirs = _parts_view(arena.buffer(k, t), dtype, per, size)[k]
                        for j, lo, hi, at in pieces:
                            np.copyto(outs[j][lo:hi], theirs[at : at + hi - lo])

    # -- other collectives -----------------------------------------------------------------------

    def all_gather(self, seq: int, signature: str, src: np.ndarray, deadline: Deadline, *,
                   rows: int, row_items: int) -> tuple[list[int], np.ndarray]:
        """Every rank's flat ``src`` (``rows`` rows of ``row_items`` items) concatenated in rank
        order: ``(rows of every rank, result)``. Ranks may differ in ``rows`` only."""
        arena, me = self.arena, self.rank
        arena.announce(seq, signature)
        per = max(1, arena.layout.round_bytes // src.dtype.itemsize)
        counts: list[int] | None = None
        all_rows: list[int] = []
        out = np.empty(0, src.dtype)
        i = 0
        while counts is None or i < max(rounds_for(c, per) for c in counts):
            t = self._begin_round(deadline)
            piece = src[i * per : (i + 1) * per]
            np.copyto(arena.buffer(me, t)[: piece.nbytes].view(src.dtype), piece)
            arena.set_aux(t, rows)
            arena.post(progress(t, 1))
            arena.wait_all(progress(t, 1), deadline)
            if counts is None:  # the first round also tells every rank's size
                all_rows = [rows if k == me else arena.aux(k, t) for k in range(self.size)]
                counts = [r * row_items for r in all_rows]
                out = np.empty(sum(counts), src.dtype)
                start = sum(counts[:me])
                np.copyto(out[start : start + src.size], src)
            offset = 0
            for k, c in enumerate(counts):
                lo, hi = min(i * per, c), min((i + 1) * per, c)
                if k != me and hi > lo:
                    data = arena.buffer(k, t)[: (hi - lo) * src.dtype.itemsize]
                    np.copyto(out[offset + lo : offset + hi], data.view(src.dtype))
                offset += c
            i += 1
        return all_rows, out

    def gather_segments(self, seq: int, signature: str, work: np.ndarray, bounds: list[Range],
                        deadline: Deadline) -> None:
        """Fill every ``bounds[k]`` of flat ``work`` from local rank ``k``, which holds it (the
        all-gather half of the direct algorithm, in place): in rounds, each rank stages its
        segment's part and copies the others' parts out."""
        arena, me = self.arena, self.rank
        arena.announce(seq, signature)
        dtype = work.dtype
        per = max(1, arena.layout.round_bytes // dtype.itemsize)
        for i in range(max(rounds_for(b - a, per) for a, b in bounds)):
            t = self._begin_round(deadline)
            parts = [(min(a + i * per, b), min(a + (i + 1) * per, b)) for a, b in bounds]
            lo, hi = parts[me]
            np.copyto(arena.buffer(me, t)[: (hi - lo) * dtype.itemsize].view(dtype), work[lo:hi])
            arena.post(progress(t, 1))
            arena.wait_all(progress(t, 1), deadline)
            for k, (lo, hi) in enumerate(parts):
                if k != me and hi > lo:
                    np.copyto(work[lo:hi],
                              arena.buffer(k, t)[: (hi - lo) * dtype.itemsize].view(dtype))

    def broadcast(self, seq: int, signature: str, work: np.ndarray, root: int,
                  deadline: Deadline) -> None:
        """Copy the root's flat ``work`` into ``work`` on every other local rank.

        Readers report each round read; the root returns once every reader has read the last
        round (so it has also compared every reader's signature with its own).
        """
        arena, me = self.arena, self.rank
        arena.announce(seq, signature)
        per = max(1, arena.layout.round_bytes // work.dtype.itemsize)
        t = self._t
        for i in range(rounds_for(work.size, per)):
            t = self._begin_round(deadline, readers_only=root)
            piece = work[i * per : (i + 1) * per]
            staged = arena.buffer(root, t)[: piece.nbytes].view(work.dtype)
            if me == root:
                np.copyto(staged, piece)
                arena.post(progress(t, 1))
            else:
                arena.wait(root, progress(t, 1), deadline)
                np.copyto(piece, staged)
                arena.post(progress(t + 1, 0))
        if me == root:
            arena.wait_all(progress(t + 1, 0), deadline)

    def barrier(self, seq: int, signature: str, deadline: Deadline) -> None:
        """Return once every local rank has entered this collective."""
        self.arena.announce(seq, signature)
        t = self._begin_round(deadline)
        self.arena.post(progress(t, 1))
        self.arena.wait_all(progress(t, 1), deadline)

    # -- rounds ----------------------------------------------------------------------------------

    def _begin_round(self, deadline: Deadline, readers_only: int | None = None) -> int:
        """Take the next round number; wait until this rank's buffer for it is free.

        With ``readers_only=root``, only the root writes this round (a broadcast): the others
        write nothing and need not wait.
        """
        t = self._t
        self._t += 1
        if readers_only is None or readers_only == self.rank:
            free = progress(t - self.arena.layout.nbuf + 1, 0)
            if free > 0:
                self.arena.wait_all(free, deadline)
        return t


_ADDRESS_BYTES = 16
"""Bytes of one array's entry in a single-copy all-reduce's address table (input, output)."""

_READ_BLOCK_BYTES = 1 << 20
"""Bytes per peer read in one kernel copy by a single-copy all-reduce: 11.9 GB/s into a 1 MiB
scratch on the machines measured, 9.2 GB/s at 256 KiB, 5.7 GB/s at 64 KiB (the per-call cost)."""


def _parts_view(buffer: np.ndarray, dtype: np.dtype, per: int, size: int) -> list[np.ndarray]:
    """A rank's round buffer as ``size`` parts of ``per`` items each."""
    typed = buffer[: per * size * dtype.itemsize].view(dtype)
    return [typed[k * per : (k + 1) * per] for k in range(size)]


def _pieces(starts: list[int], lo: int, hi: int) -> list[tuple[int, int, int, int]]:
    """Elements ``[lo, hi)`` of arrays concatenated (array ``j`` holds ``starts[j]`` up to
    ``starts[j + 1]``) as ``(j, start, stop, at)``: a slice of array ``j`` and where it begins
    in the range. Empty slices are left out."""
    pieces = []
    first = lo
    j = max(0, bisect.bisect_right(starts, lo) - 1)
    while lo < hi:
        stop = min(hi, starts[j + 1])
        if stop > lo:
            pieces.append((j, lo - starts[j], stop - starts[j], lo - first))
            lo = stop
        j += 1
    return pieces


def _reduce_pieces(op: ReduceOp, count: int, pieces: list[tuple[int, int, int, int]],
                   srcs: list[np.ndarray], outs: list[np.ndarray], received: list[np.ndarray],
                   me: int, update: Update | None, *, staged: bool) -> None:
    """Reduce this rank's ``pieces`` (``(j, lo, hi, at)`` as :func:`_pieces` gives them).

    Operand ``k`` of a piece is ``srcs[j][lo:hi]`` for ``k == me`` and ``received[k][at:...]``
    for a peer; the result goes to ``received[me]`` (the collective's own buffer), then into
    ``outs[j][lo:hi]``, or updates it (fused). ``staged``: peers copy the result from
    ``received[me]``, so an updated part is copied back there while it is hot. A SUM with an
    :class:`~cluster.collectives.epilogue.AddScaled` update does all of it in one pass
    (:func:`kernels.sum_add_scaled`) where that applies.
    """
    for j, lo, hi, at in pieces:
        operands = [srcs[j][lo:hi] if k == me else received[k][at : at + hi - lo]
                    for k in range(len(received))]
        result = received[me][at : at + hi - lo]
        if op is ReduceOp.SUM and kernels.sum_add_scaled(update, operands, outs[j][lo:hi],
                                                         result if staged else None):
            continue  # summed, updated (and copied back) in one pass
        if not staged and update is None and not np.may_share_memory(outs[j], srcs[j]):
            # No peer reads the result from our buffer and the output aliases no operand: the
            # reduction writes it straight there, one pass over memory fewer.
            _reduce_in_order(op, outs[j][lo:hi], operands)
            finalize(op, outs[j][lo:hi], count)
            continue
        _reduce_in_order(op, result, operands)
        finalize(op, result, count)
        if update is None:
            np.copyto(outs[j][lo:hi], result)
        else:
            update(outs[j][lo:hi], result)
            if staged:
                np.copyto(result, outs[j][lo:hi])


def _reduce_in_order(op: ReduceOp, out: np.ndarray, operands: list[np.ndarray]) -> None:
    """``out = ((operands[0] op operands[1]) op operands[2]) ...``; ``out`` may alias none of
    ``operands[1:]``."""
    if len(operands) == 1:
        np.copyto(out, operands[0])
        return
    combine_into(op, out, operands[0], operands[1])
    for other in operands[2:]:
        reduce_into(op, out, other)


def rounds_for(count: int, per_round: int) -> int:
    """Rounds needed to move ``count`` items ``per_round`` at a time (at least one)."""
    return max(1, math.ceil(count / per_round))
