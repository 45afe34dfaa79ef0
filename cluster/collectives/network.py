"""The collectives over the network: each one an :class:`~cluster.collectives._exchange.Exchange`
driven by the algorithms of :mod:`~cluster.collectives.ring`,
:mod:`~cluster.collectives.doubling`, :mod:`~cluster.collectives.tree` and
:mod:`~cluster.collectives.broadcast`.

:class:`NetworkCollectives` runs the ``NETWORK`` route of a
:class:`~cluster.collectives.group.CollectiveGroup` (and the leaders' part of its ``HIER``
route). It only computes: arguments are validated and the call numbered by the group. Each
method opens one exchange under a signature naming the kind, the arguments and the algorithm
(ranks that disagree fail the handshake), runs the algorithm, and ends the exchange.
"""

from __future__ import annotations

import math

import numpy as np

from cluster.collectives import _packing, broadcast, doubling, ring, tree
from cluster.collectives._buffers import BufferPool, working_copy
from cluster.collectives._call import Call
from cluster.collectives._exchange import Exchange
from cluster.collectives._packing import spec
from cluster.collectives.arena import Arena
from cluster.collectives.cost import HostShape
from cluster.collectives.epilogue import Update, apply_whole
from cluster.collectives.lanes import Lanes, LaneThreads
from cluster.collectives.ops import ReduceOp
from cluster.collectives.options import CollectiveSettings, CommunicationOptions
from cluster.collectives.route import (
    algorithm_config,
    network_algorithm,
    ring_chunk_bytes,
    ring_lanes,
)
from cluster.collectives.schedule import Range, segments
from cluster.transport.api import Transport

__all__ = ["NetworkCollectives"]

# The whole-buffer algorithms for latency-bound messages, by their name in route's decisions.
_LATENCY_BOUND = {"doubling": doubling.all_reduce, "tree": tree.all_reduce}


class NetworkCollectives:
    """One rank's network collectives in group ``name`` over ``transport``.

    Every rank of the group makes the same calls, each under the :class:`Call` its group
    numbered. ``small_message_bytes`` and ``chunk_bytes`` feed
    :func:`~cluster.collectives.route.network_algorithm`; results too large for malloc's heap
    come from ``buffers``. When the group's co-located ranks share an arena, set :attr:`arena`:
    every signature is then announced there too, so a co-located peer that took the
    shared-memory path for the same call detects the mismatch instead of waiting.
    """

    def __init__(
        self,
        transport: Transport,
        name: str,
        *,
        settings: CollectiveSettings,
        small_message_bytes: int,
        chunk_bytes: int,
        buffers: BufferPool,
    ) -> None:
        self._transport = transport
        self._name = name
        self._settings = settings
        self._small = small_message_bytes
        self._chunk = chunk_bytes
        self._buffers = buffers
        self.arena: Arena | None = None
        # Every rank derives this from the same cluster spec (and, on one host, the same
        # cores), so all pick the same ring chunk and lanes.
        hosts = {p.address.rsplit(":", 1)[0] for p in transport.peers if p.address}
        self._shape = HostShape.here(transport.world_size) if len(hosts) <= 1 else None
        self._lane_threads = LaneThreads(f"{name}-ring")

    @property
    def rank(self) -> int:
        return self._transport.rank

    @property
    def world_size(self) -> int:
        return self._transport.world_size

    def algorithm(self, nbytes: int, options: CommunicationOptions, itemsize: int = 1) -> str:
        """:func:`~cluster.collectives.route.network_algorithm` with this group's sizes; a ring
        names the message size :meth:`ring_chunk` gives (so it is part of the signature)."""
        return network_algorithm(self._settings, options, nbytes,
                                 small_message_bytes=self._small,
                                 chunk_bytes=self.ring_chunk(nbytes, itemsize),
                                 lanes=self.lanes(nbytes).count)

    @property
    def small_message_bytes(self) -> int:
        """Below this, all-reduces take the latency algorithm (recursive doubling), not the
        ring."""
        return self._small

    def ring_chunk(self, nbytes: int, itemsize: int) -> int:
        """:func:`~cluster.collectives.route.ring_chunk_bytes` for this group."""
        return ring_chunk_bytes(self._chunk, nbytes, itemsize, self.world_size,
                                shape=self._shape)

    def lanes(self, nbytes: int) -> Lanes:
        """The lanes of this group's ring all-reduce of ``nbytes``
        (:func:`~cluster.collectives.route.ring_lanes`)."""
        return Lanes(ring_lanes(self._settings, nbytes, self._shape), self._lane_threads)

    def algorithm_config(self, options: CommunicationOptions) -> str:
        """:func:`~cluster.collectives.route.algorithm_config` with this group's sizes."""
        return algorithm_config(self._settings, options, small_message_bytes=self._small,
                                chunk_bytes=self._chunk, shape=self._shape)

    def exchange(self, call: Call, signature: str) -> Exchange:
        """The exchange of ``call`` among all ranks, under ``signature``."""
        if self.arena is not None:
            # Co-located peers on the shared-memory path compare this with their own signature.
            self.arena.announce(call.seq, signature)
        return Exchange(
            self._transport,
            group=self._name,
            seq=call.seq,
            kind=call.kind,
            signature=signature,
            deadline=call.deadline,
        )

    def handshake(self, call: Call, signature: str) -> None:
        """The handshake of the whole group alone (see ``_exchange``), before anything waits:
        ranks on different paths or with different arguments fail here, at once."""
        self.exchange(call, signature).end()

    # -- the collectives (two ranks or more) -----------------------------------------------------

    def all_reduce(self, call: Call, array: np.ndarray, owned: bool, op: ReduceOp) -> np.ndarray:
        """``op`` of ``array`` over all ranks, flat; reduces into ``array`` when ``owned``."""
        algorithm = self.algorithm(array.nbytes, call.options, array.itemsize)
        ex = self.exchange(call, f"all_reduce {op.value} {spec(array)} {algorithm}")
        if not algorithm.startswith("ring"):
            work = working_copy(array, owned)
            _LATENCY_BOUND[algorithm](ex, work, op)
        else:
            # The ring reads the input where it lies and writes each result byte once.
            work, source = self._buffers.output_for(array, owned)
            bounds = segments(work.size, self.world_size)
            chunk = self.ring_chunk(array.nbytes, array.itemsize)
            ring.all_reduce(ex, work, bounds, op, chunk, source=source,
                            empty=self._buffers.empty, lanes=self.lanes(array.nbytes))
        ex.end()
        return work

    def all_reduce_many(self, call: Call, arrays: list[np.ndarray], owned: list[bool],
                        plan: list[list[int]], op: ReduceOp) -> list[np.ndarray]:
        """``op`` of each array, packed as ``plan`` says (lists of indices into ``arrays``), in
        one exchange; each pack picks its algorithm by its size, and the packs on the ring share
        one ring run per dtype (:func:`~cluster.collectives.ring.all_reduce_many`). A pack of one
        array is reduced without packing (in place when ``owned[i]``, else the ring reads it
        where it lies); other results are views of their pack. With one rank, only packs and
        unpacks."""
        ex = None
        if self.world_size > 1:
            signature = (
                f"all_reduce_many {op.value} {_packing.describe(arrays)} "
                f"pack={call.options.bytes_per_pack} {self.algorithm_config(call.options)}"
            )
            ex = self.exchange(call, signature)
        results: list[np.ndarray] = [np.empty(0)] * len(arrays)
        on_ring: list[ring.RingArray] = []
        step = 0
        for indices in plan:
            if len(indices) == 1:
                i = indices[0]
                if ex is None:
                    work = working_copy(arrays[i], owned[i])
                else:
                    work, step = self._reduce_alone(ex, call, arrays[i], owned[i], op, step,
                                                    on_ring)
                results[i] = work.reshape(arrays[i].shape)
                continue
            members = [arrays[i] for i in indices]
            buffer, ranges = _packing.pack(members, self._buffers.empty)
            if ex is not None:
                step = self._reduce_pack(ex, call, buffer, op, step, on_ring)
            views = _packing.unpack(buffer, ranges, [a.shape for a in members])
            for i, view in zip(indices, views, strict=True):
                results[i] = view
        if ex is not None:
            self._run_ring(ex, on_ring, op, step)
            ex.end()
        return results

    def all_reduce_apply(self, call: Call, arrays: list[np.ndarray], targets: list[np.ndarray],
                         plan: list[list[int]], op: ReduceOp, update: Update) -> None:
        """``update(targets[i], op of arrays[i])`` (packed as ``plan`` says), in one exchange
        (two ranks or more). Lone arrays on the ring fuse the update into the ring run
        (:mod:`~cluster.collectives.epilogue`); the rest are reduced, then updated by every
        rank."""
        signature = (
            f"all_reduce_apply {op.value} {_packing.describe(arrays)} "
            f"pack={call.options.bytes_per_pack} {self.algorithm_config(call.options)}"
        )
        ex = self.exchange(call, signature)
        on_ring: list[ring.RingArray] = []
        after: list[tuple[int, np.ndarray]] = []  # (index, reduced values): updated at the end
        step = 0
        for indices in plan:
            if len(indices) == 1:
                i = indices[0]
                queued = len(on_ring)
                work, step = self._reduce_alone(ex, call, arrays[i], False, op, step, on_ring,
                                                target=targets[i])
                if len(on_ring) == queued:  # reduced already (latency-bound): update it now
                    after.append((i, work))
                continue
            members = [arrays[i] for i in indices]
            buffer, ranges = _packing.pack(members, self._buffers.empty)
            step = self._reduce_pack(ex, call, buffer, op, step, on_ring)
            after += [(i, buffer[lo:hi]) for i, (lo, hi) in zip(indices, ranges, strict=True)]
        self._run_ring(ex, on_ring, op, step, update)
        for i, reduced in after:
            apply_whole(update, targets[i], reduced)
        ex.end()

    def _reduce_alone(self, ex: Exchange, call: Call, array: np.ndarray, owned: bool,
                      op: ReduceOp, step: int, on_ring: list[ring.RingArray], *,
                      target: np.ndarray | None = None) -> tuple[np.ndarray, int]:
        """A lone array: its flat result buffer and the exchange's next step. A latency-bound
        one is reduced now; one for the ring joins ``on_ring`` (``target``: its ``out``), to be
        reduced by :meth:`_run_ring`."""
        algorithm = self.algorithm(array.nbytes, call.options, array.itemsize)
        if not algorithm.startswith("ring"):
            work = working_copy(array, owned)
            return work, _LATENCY_BOUND[algorithm](ex, work, op, step)
        work, source = self._buffers.output_for(array, owned)
        on_ring.append(ring.RingArray(work, source, target))
        return work, step

    def _reduce_pack(self, ex: Exchange, call: Call, buffer: np.ndarray, op: ReduceOp,
                     step: int, on_ring: list[ring.RingArray]) -> int:
        """A pack, reduced in place: now when latency-bound, else it joins ``on_ring``."""
        algorithm = self.algorithm(buffer.nbytes, call.options, buffer.itemsize)
        if not algorithm.startswith("ring"):
            return _LATENCY_BOUND[algorithm](ex, buffer, op, step)
        on_ring.append(ring.RingArray(buffer))
        return step

    def _run_ring(self, ex: Exchange, on_ring: list[ring.RingArray], op: ReduceOp, step: int,
                  update: Update | None = None) -> int:
        """One ring run per dtype over the arrays ``on_ring``, in order of first appearance."""
        by_dtype: dict[np.dtype, list[ring.RingArray]] = {}
        for item in on_ring:
            by_dtype.setdefault(item.work.dtype, []).append(item)
        for dtype, items in by_dtype.items():
            nbytes = sum(item.work.nbytes for item in items)
            step = ring.all_reduce_many(ex, items, op, self.ring_chunk(nbytes, dtype.itemsize),
                                        step, update=update, empty=self._buffers.empty,
                                        lanes=self.lanes(nbytes))
        return step

    def all_gather(self, call: Call, array: np.ndarray, axis: int) -> np.ndarray:
        """Every rank's ``array`` concatenated along ``axis`` (sizes along it may differ)."""
        moved = np.moveaxis(array, axis, 0)
        rows, rest = moved.shape[0], moved.shape[1:]
        row_elems = math.prod(rest)
        shape = ",".join("?" if d == axis else str(n) for d, n in enumerate(array.shape))
        ex = self.exchange(
            call, f"all_gather {array.dtype}[{shape}] axis={axis} ring/{self._chunk}"
        )
        # Phase 1: every rank's size along the axis (they may differ, as in tf.distribute).
        sizes = np.zeros(self.world_size, np.int64)
        sizes[self.rank] = rows
        unit = segments(self.world_size, self.world_size)
        step = ring.all_gather(ex, sizes, unit, self._chunk)
        # Phase 2: the data, straight into the output buffer.
        offsets = np.concatenate([[0], np.cumsum(sizes)]) * row_elems
        bounds = [(int(offsets[i]), int(offsets[i + 1])) for i in range(self.world_size)]
        out = np.empty(int(offsets[-1]), dtype=array.dtype)
        lo, hi = bounds[self.rank]
        np.copyto(out[lo:hi].reshape(moved.shape), moved)
        ring.all_gather(ex, out, bounds, self._chunk, first_step=step)
        ex.end()
        gathered = out.reshape((int(sizes.sum()), *rest))
        return gathered if axis == 0 else np.ascontiguousarray(np.moveaxis(gathered, 0, axis))

    def broadcast(self, call: Call, array: np.ndarray, work: np.ndarray, root: int) -> None:
        """Copy the root's flat ``work`` into ``work`` on every other rank (``array``: the
        caller's value, for the signature)."""
        ex = self.exchange(call, f"broadcast root={root} {spec(array)} chain/{self._chunk}")
        broadcast.chain_broadcast(ex, work, root, self._chunk)
        ex.end()

    def reduce_scatter(self, call: Call, array: np.ndarray, bounds: list[Range],
                       op: ReduceOp) -> np.ndarray:
        """A flat array whose ``bounds[rank]`` holds ``op`` of ``array`` over all ranks there."""
        algorithm = self.algorithm(array.nbytes, call.options, array.itemsize)
        ex = self.exchange(call, f"reduce_scatter {op.value} {spec(array)} {algorithm}")
        if algorithm.startswith("ring"):
            work, source = self._buffers.output_for(array, owned=False)
            # bounds may be uneven here: the rule's even split is only the message size.
            chunk = self.ring_chunk(array.nbytes, array.itemsize)
            ring.reduce_scatter(ex, work, bounds, op, chunk, source=source,
                                empty=self._buffers.empty)
        else:  # latency-bound: a whole all-reduce, keep our segment
            work = working_copy(array, owned=False)
            _LATENCY_BOUND[algorithm](ex, work, op)
        ex.end()
        return work

    def barrier(self, call: Call, signature: str = "barrier") -> None:
        """Return once every rank has entered this barrier (signed ``signature``)."""
        ex = self.exchange(call, signature)
        doubling.all_reduce(ex, np.empty(0, np.uint8), None)
        ex.end()
