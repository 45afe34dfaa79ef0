"""The collectives of the ``LOCAL`` and ``HIER`` routes: shared memory inside a host, and the
hierarchical all-reduce across hosts.

:class:`HostCollectives` runs them for one rank of a
:class:`~cluster.collectives.group.CollectiveGroup` whose hosts are set up
(:mod:`~cluster.collectives.topology`; the route comes from
:func:`~cluster.collectives.route.choose_route`):

- ``LOCAL``: the group is one host; every collective is a
  :class:`~cluster.collectives.shared_memory.SharedMemoryCollectives` call.
- ``HIER``: an all-reduce across hosts. Where every host has the same number of ranks (a
  striped topology, :attr:`~cluster.collectives.topology.Topology.striped`): a reduce-scatter
  inside each host over shared memory leaves local rank ``j`` with stripe ``j`` of its host's
  total; local rank ``j`` of every host all-reduces that stripe across the hosts over the
  network (each rank its own ring, so every core and connection of a host carries a share of
  the bytes that cross hosts, and no host total is gathered only to be sent); then an
  all-gather inside each host. Otherwise (hosts of different sizes) SUM (or MAX/MIN) inside
  each host, the host totals across one leader per host, then a broadcast inside each host.
  Either way MEAN's division is applied once, by the rank that carried those bytes across, and
  every rank gets the same bytes. The whole group first runs the network handshake, so ranks
  on different paths or with different arguments fail at once instead of waiting in shared
  memory.
- CuPy all-reduces on either route use NCCL among the host's GPUs
  (:class:`~cluster.collectives.host_nccl.HostNccl`) where every local rank can; host memory is
  then touched only by the leader's copy that crosses the network. Every copy between a GPU
  and host memory goes through the group's :class:`~cluster._staging.Staging`.

Every method takes the group's :class:`Call` and computes; arguments are validated by the group.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from typing import Any

import numpy as np

from cluster._family import is_cupy, on_device_of, stage, to_host
from cluster._staging import Staging
from cluster.collectives import _packing
from cluster.collectives._buffers import BufferPool
from cluster.collectives._call import Call
from cluster.collectives._packing import spec
from cluster.collectives.epilogue import Update, apply_whole
from cluster.collectives.host_nccl import HostNccl
from cluster.collectives.network import NetworkCollectives
from cluster.collectives.ops import ReduceOp, check_reducible
from cluster.collectives.route import Route
from cluster.collectives.schedule import Range, segments
from cluster.collectives.shared_memory import SharedMemoryCollectives

__all__ = ["AcrossHosts", "HostCollectives"]

AcrossHosts = Callable[[Call, np.ndarray, ReduceOp], None]
"""All-reduce a flat array in place across hosts (a host total among the leaders, or a stripe
among one rank per host), then apply MEAN's division over the whole group: the group's network
part of the ``HIER`` route."""


_ByDtype = dict[np.dtype, tuple[list[np.ndarray], list[np.ndarray]]]
"""Lone arrays that share rounds: per dtype, their flat sources and outputs."""


def _add(by_dtype: _ByDtype, src: np.ndarray, out: np.ndarray) -> None:
    srcs, outs = by_dtype.setdefault(src.dtype, ([], []))
    srcs.append(src)
    outs.append(out)


class HostCollectives:
    """One rank's ``LOCAL`` and ``HIER`` collectives.

    - ``shm``: this rank's shared-memory collectives; ``None`` when it is alone on its host
      (it then takes part in ``HIER`` all-reduces as its host's leader only).
    - ``network``: the whole group's network collectives (for the ``HIER`` handshake).
    - ``across_hosts``: on a rank that carries bytes across hosts (every rank of a group of
      several hosts when ``striped``, else the hosts' leaders), else ``None``.
    - ``striped``: every host has the same number of ranks (see the module doc).
    - ``configs``: the signature text of each route
      (:func:`~cluster.collectives.route.shm_config`, ``hier_config``).
    - ``world_size``: the group's size (MEAN's divisor on a ``LOCAL`` route).
    - ``staging``: the group's pinned host buffers for CuPy values' copies.
    """

    def __init__(
        self,
        shm: SharedMemoryCollectives | None,
        network: NetworkCollectives,
        *,
        across_hosts: AcrossHosts | None,
        striped: bool,
        configs: Mapping[Route, str],
        world_size: int,
        buffers: BufferPool,
        staging: Staging,
    ) -> None:
        self.shm = shm
        self._network = network
        self._across_hosts = across_hosts
        self._striped = striped
        self._configs = dict(configs)
        self._world_size = world_size
        self._buffers = buffers
        self._staging = staging
        self._nccl: HostNccl | None = None  # NCCL among the host's GPUs, once a CuPy value came

    def config(self, route: Route) -> str:
        """The signature text of ``route`` (``LOCAL`` or ``HIER``)."""
        return self._configs[route]

    # -- all-reduce ------------------------------------------------------------------------------

    def all_reduce(self, call: Call, route: Route, array: np.ndarray, owned: bool,
                   op: ReduceOp) -> np.ndarray:
        """``op`` of ``array`` over the group, flat; reduces into ``array`` when ``owned``."""
        work, source = self._buffers.output_for(array, owned)
        signature = f"all_reduce {op.value} {spec(array)} {self.config(route)}"
        if route is Route.HIER:
            self._network.handshake(call, signature)
        self._reduce(call, route, signature, work if source is None else source, work, op)
        return work

    def all_reduce_many(self, call: Call, route: Route, arrays: list[Any], owned: list[bool],
                        plan: list[list[int]], op: ReduceOp) -> list[Any]:
        """``op`` of each value, in one collective: NumPy arrays packed as ``plan`` says (lists
        of indices of NumPy ``arrays``; results are views of the packs), a pack of one array
        reduced without packing (in place when ``owned[i]``; on the ``LOCAL`` route, those of a
        dtype large enough for the direct algorithm share one run of rounds, after the packs),
        and each CuPy array through NCCL
        among the host's GPUs as :meth:`device_all_reduce` does (CuPy results, on their GPU)."""
        signature = (
            f"all_reduce_many {op.value} {_packing.describe(arrays)} "
            f"pack={call.options.bytes_per_pack} {self.config(route)}"
        )
        if route is Route.HIER:
            self._network.handshake(call, signature)
        results: list[Any] = [np.empty(0)] * len(arrays)
        direct: _ByDtype = {}
        for indices in plan:
            if len(indices) == 1:
                i = indices[0]
                work, source = self._buffers.output_for(arrays[i], owned[i])
                results[i] = work.reshape(arrays[i].shape)
                src = work if source is None else source
                if self._shares_rounds(route, src):
                    _add(direct, src, work)
                    continue
                self._reduce(call, route, signature, src, work, op)
                continue
            members = [arrays[i] for i in indices]
            buffer, ranges = _packing.pack(members, self._buffers.empty)
            self._reduce(call, route, signature, buffer, buffer, op)
            views = _packing.unpack(buffer, ranges, [a.shape for a in members])
            for i, view in zip(indices, views, strict=True):
                results[i] = view
        self._reduce_sharing_rounds(call, signature, direct, op)
        for i, value in enumerate(arrays):
            if is_cupy(value):  # the device route
                results[i] = self._device_reduce(call, route, signature, value, op)
        return results

    def all_reduce_apply(self, call: Call, route: Route, arrays: list[np.ndarray],
                         targets: list[np.ndarray], plan: list[list[int]], op: ReduceOp,
                         update: Update) -> None:
        """``update(targets[i], op of arrays[i])`` (NumPy, packed as ``plan`` says), in one
        collective. On the ``LOCAL`` route, every array of a dtype whose arrays together are
        large enough for the direct algorithm joins that dtype's one run of rounds, packed or
        not, and the update is fused into it (:mod:`~cluster.collectives.epilogue`) after the
        rest: rounds already span arrays, so a pack would only add a copy in, a collective of
        its own and an update by every rank. The rest are reduced, then updated by every
        rank."""
        signature = (
            f"all_reduce_apply {op.value} {_packing.describe(arrays)} "
            f"pack={call.options.bytes_per_pack} {self.config(route)}"
        )
        if route is Route.HIER:
            self._network.handshake(call, signature)
        fused: _ByDtype = {}
        joining = self._dtypes_sharing_rounds(route, arrays)
        for indices in plan:
            if arrays[indices[0]].dtype in joining:  # a pack holds one dtype
                for i in indices:
                    _add(fused, np.ascontiguousarray(arrays[i]).reshape(-1), targets[i])
                continue
            if len(indices) == 1:
                i = indices[0]
                src = np.ascontiguousarray(arrays[i]).reshape(-1)
                work = self._buffers.empty(src.size, src.dtype)
                self._reduce(call, route, signature, src, work, op)
                apply_whole(update, targets[i], work)
                continue
            members = [arrays[i] for i in indices]
            buffer, ranges = _packing.pack(members, self._buffers.empty)
            self._reduce(call, route, signature, buffer, buffer, op)
            for i, (lo, hi) in zip(indices, ranges, strict=True):
                apply_whole(update, targets[i], buffer[lo:hi])
        self._reduce_sharing_rounds(call, signature, fused, op, update)

    def _shares_rounds(self, route: Route, src: np.ndarray) -> bool:
        """Whether a lone array joins its dtype's shared-memory run of rounds: on the ``LOCAL``
        route, large enough for the direct algorithm."""
        return route is Route.LOCAL and self.shm is not None \
            and self.shm.algorithm(src.nbytes) == "direct"

    def _dtypes_sharing_rounds(self, route: Route, arrays: list[np.ndarray]) -> set[np.dtype]:
        """The dtypes whose arrays, all together, take the direct algorithm on the ``LOCAL``
        route (none on the others)."""
        if route is not Route.LOCAL or self.shm is None:
            return set()
        totals: dict[np.dtype, int] = {}
        for array in arrays:
            totals[array.dtype] = totals.get(array.dtype, 0) + array.nbytes
        return {dtype for dtype, total in totals.items()
                if self.shm.algorithm(total) == "direct"}

    def _reduce_sharing_rounds(self, call: Call, signature: str, by_dtype: _ByDtype,
                               op: ReduceOp, update: Update | None = None) -> None:
        """One shared-memory run of direct rounds per dtype over its arrays, in order of first
        appearance (the same on every rank)."""
        if not by_dtype:
            return
        assert self.shm is not None
        for srcs, outs in by_dtype.values():
            self.shm.all_reduce_many(call.seq, signature, srcs, outs, op, self._world_size,
                                     call.deadline, update=update)

    def device_all_reduce(self, call: Call, route: Route, value: Any, op: ReduceOp) -> Any:
        """A CuPy all-reduce (needs ``shm``): NCCL among the host's GPUs, host memory only at
        the host boundary (the leader's copy that crosses the network). Without NCCL on every
        local rank, or with two ranks on one GPU, the host path under the same signature."""
        check_reducible(value.dtype, "all_reduce")
        signature = f"all_reduce {op.value} {spec(value)} device/{self.config(route)}"
        if route is Route.HIER:
            self._network.handshake(call, signature)
        return self._device_reduce(call, route, signature, value, op)

    def _device_reduce(self, call: Call, route: Route, signature: str, value: Any,
                       op: ReduceOp) -> Any:
        """One CuPy value of a collective whose handshake is done: NCCL, or the host path."""
        assert self.shm is not None
        if self._nccl is None:
            self._nccl = HostNccl(self.shm, timeout_seconds=call.options.deadline_seconds)
        if not self._nccl.ready(call.seq, signature, value.device.id, call.deadline):
            staged = stage(value, "all_reduce", self._staging)
            work, source = self._buffers.output_for(staged.array, staged.owned)
            self._reduce(call, route, signature, work if source is None else source, work, op)
            return staged.restore(work.reshape(staged.array.shape))
        if route is Route.LOCAL:
            return self._nccl.all_reduce(value, op)
        inner = ReduceOp.SUM if op is ReduceOp.MEAN else op
        total = self._nccl.all_reduce(value, inner)
        if self._across_hosts is not None and self._leads:  # the host boundary: one copy
            host = to_host(total, self._staging).reshape(-1)  # out, one back in
            self._across_hosts(call, host, op)
            total = on_device_of(total, host.reshape(value.shape), self._staging)
        return self._nccl.broadcast(total, 0)

    def _reduce(self, call: Call, route: Route, signature: str, src: np.ndarray,
                work: np.ndarray, op: ReduceOp) -> None:
        """All-reduce flat ``src`` into ``work`` (may be ``src``) on ``route``."""
        if route is Route.LOCAL:
            assert self.shm is not None
            self.shm.all_reduce(call.seq, signature, src, work, op, self._world_size,
                                call.deadline)
            return
        inner = ReduceOp.SUM if op is ReduceOp.MEAN else op
        if self._stripes(work.nbytes):  # every rank carries its stripe of the host total
            assert self.shm is not None and self._across_hosts is not None
            bounds = segments(work.size, self.shm.size)
            lo, hi = bounds[self.shm.rank]
            self.shm.reduce_scatter(call.seq, signature, src, work, bounds, inner, 1,
                                    call.deadline)
            self._across_hosts(call, work[lo:hi], op)
            self.shm.gather_segments(call.seq, signature, work, bounds, call.deadline)
            return
        # The leaders carry the host totals: SUM (or MAX/MIN) inside the host, across leaders,
        # then MEAN's division once by the leader, whose bytes every local rank copies.
        if self.shm is not None:
            self.shm.all_reduce(call.seq, signature, src, work, inner, 1, call.deadline)
        elif work is not src:
            np.copyto(work, src)
        if self._across_hosts is not None and self._leads:
            self._across_hosts(call, work, op)
        if self.shm is not None:
            self.shm.broadcast(call.seq, signature, work, 0, call.deadline)

    @property
    def _leads(self) -> bool:
        """Whether this rank is its host's leader (local rank 0, or alone on its host): the
        one that carries a whole host total across hosts."""
        return self.shm is None or self.shm.rank == 0

    def _stripes(self, nbytes: int) -> bool:
        """Whether a ``HIER`` all-reduce of ``nbytes`` crosses hosts in stripes: on a striped
        topology, where each stripe is large enough for the network ring. Below that the
        latency of more ranks in the network step, and of three steps inside the host instead
        of two, costs more than the stripes save (4 KiB among 2 hosts of 2 ranks: 3.0 ms in
        stripes, 2.0 ms through the leaders; 64 MiB: 141 ms against 166 ms). The same on every
        rank: the size and the threshold are in the call's signature."""
        assert self.shm is not None or not self._striped
        return self._striped and nbytes // self.shm.size >= self._network.small_message_bytes

    # -- the other collectives (LOCAL only) ------------------------------------------------------

    def all_gather(self, call: Call, array: np.ndarray, axis: int) -> np.ndarray:
        """Every rank's ``array`` concatenated along ``axis`` (sizes along it may differ)."""
        assert self.shm is not None
        moved = np.moveaxis(array, axis, 0)
        rows, rest = moved.shape[0], moved.shape[1:]
        shape = ",".join("?" if d == axis else str(n) for d, n in enumerate(array.shape))
        flat = np.ascontiguousarray(moved).reshape(-1)
        signature = f"all_gather {array.dtype}[{shape}] axis={axis} {self.config(Route.LOCAL)}"
        all_rows, out = self.shm.all_gather(call.seq, signature, flat, call.deadline,
                                            rows=rows, row_items=math.prod(rest))
        gathered = out.reshape((sum(all_rows), *rest))
        return gathered if axis == 0 else np.ascontiguousarray(np.moveaxis(gathered, 0, axis))

    def broadcast(self, call: Call, array: np.ndarray, work: np.ndarray, root: int) -> None:
        """Copy the root's flat ``work`` into ``work`` on every other rank (``array``: the
        caller's value, for the signature)."""
        assert self.shm is not None
        signature = f"broadcast root={root} {spec(array)} {self.config(Route.LOCAL)}"
        self.shm.broadcast(call.seq, signature, work, root, call.deadline)

    def reduce_scatter(self, call: Call, array: np.ndarray, bounds: list[Range],
                       op: ReduceOp) -> np.ndarray:
        """A flat array whose ``bounds[rank]`` holds ``op`` of ``array`` over all ranks there."""
        assert self.shm is not None
        work = np.empty(array.size, array.dtype)
        signature = f"reduce_scatter {op.value} {spec(array)} {self.config(Route.LOCAL)}"
        self.shm.reduce_scatter(call.seq, signature, np.ascontiguousarray(array).reshape(-1),
                                work, bounds, op, self._world_size, call.deadline)
        return work

    def barrier(self, call: Call, signature: str = "barrier shm") -> None:
        """Return once every rank has entered this barrier (signed ``signature``)."""
        assert self.shm is not None
        self.shm.barrier(call.seq, signature, call.deadline)
