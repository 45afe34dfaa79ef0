"""Cross-device ops: how a strategy reduces values over its replicas (TF's ``cross_device_ops``).

A strategy hands its ops the components of each value, one per local replica; the ops return
the reduced value per local replica (the same array object may serve several replicas). Every
replica of every worker gets bitwise-identical results: local components are summed in replica
order by one thread, and the cross-process collectives give every rank the same bytes.

- :class:`ReductionToOneDevice`: sum on the host (or the first device); one process.
- :class:`NcclAllReduce`: NCCL among the local GPUs (``cupy.cuda.nccl``) when every component
  is a CuPy array on its own GPU; otherwise the host reduction.
- :class:`CollectiveAllReduce`: hierarchical, for MultiWorkerMirroredStrategy: reduce inside the
  process, all-reduce across processes with the ring (:class:`~cluster.collectives.CollectiveGroup`,
  fused into ``bytes_per_pack`` packs), give the result to every local replica.

Inject one with ``MirroredStrategy(cross_device_ops=...)``, as in TensorFlow.
"""

from __future__ import annotations

import sys
from abc import ABC, abstractmethod
from collections.abc import Sequence
from typing import Any

import numpy as np

from cluster._family import is_cupy, xp_of
from cluster.collectives.group import CollectiveGroup
from cluster.collectives.ops import ReduceOp
from cluster.collectives.options import CommunicationOptions
from cluster.values import DistributedValues, Mirrored

__all__ = [
    "CollectiveAllReduce",
    "CrossDeviceOps",
    "NcclAllReduce",
    "ReductionToOneDevice",
]

Components = Sequence[Any]


def _to_host(value: Any) -> np.ndarray:
    return value.get() if is_cupy(value) else np.asarray(value)


def _local_combine(op: ReduceOp, components: Components) -> Any:
    """``op`` over ``components`` in replica order (MEAN: their sum; the caller divides)."""
    first = components[0]
    xp = xp_of(first)
    acc = xp.array(first, copy=True)
    for other in components[1:]:
        other = xp.asarray(other) if xp is np else _same_device(acc, other)
        if op is ReduceOp.MAX:
            xp.maximum(acc, other, out=acc)
        elif op is ReduceOp.MIN:
            xp.minimum(acc, other, out=acc)
        else:
            acc = acc + other if acc.shape != other.shape else xp.add(acc, other, out=acc)
    return acc


def _same_device(like: Any, value: Any) -> Any:
    cupy = sys.modules["cupy"]
    with like.device:
        return cupy.asarray(value)


def finish_mean(op: ReduceOp, total: Any, count: int) -> Any:
    """A SUM turned into the MEAN over ``count`` replicas (true division, as tf.distribute)."""
    if op is not ReduceOp.MEAN:
        return total
    return total / count


class CrossDeviceOps(ABC):
    """Reduces per-replica components; subclasses implement :meth:`batch_reduce_components`."""

    @abstractmethod
    def batch_reduce_components(
        self, op: ReduceOp, values: Sequence[Components], num_replicas_in_sync: int,
        options: CommunicationOptions | None = None,
    ) -> list[list[Any]]:
        """For each value (its local components), the ``op`` over all replicas, per local replica.

        MEAN divides by ``num_replicas_in_sync``.
        """

    def gather_components(self, components: Components, axis: int,
                          options: CommunicationOptions | None = None) -> Any:
        """Every replica's component concatenated along ``axis``, in replica order."""
        xp = xp_of(components[0])
        return xp.concatenate([xp.asarray(c) for c in components], axis=axis)

    def broadcast_from_first(self, value: Any, options: CommunicationOptions | None = None) -> Any:
        """The first worker's ``value`` (identity in one process)."""
        return value

    # -- TensorFlow's public surface ---------------------------------------------------------------

    def reduce(self, reduce_op: Any, per_replica_value: Any, destinations: Any = None,
               options: CommunicationOptions | None = None) -> Mirrored:
        """``reduce_op`` over the replicas of ``per_replica_value``, as a Mirrored value."""
        return self.batch_reduce(reduce_op, [(per_replica_value, destinations)], options)[0]

    def batch_reduce(self, reduce_op: Any, value_destination_pairs: Sequence[tuple[Any, Any]],
                     options: CommunicationOptions | None = None) -> list[Mirrored]:
        op = ReduceOp.parse(reduce_op)
        values = [_components(v) for v, _ in value_destination_pairs]
        count = len(values[0]) if values else 1
        reduced = self.batch_reduce_components(op, values, count, options)
        return [Mirrored(r) for r in reduced]


def _components(value: Any) -> list[Any]:
    if isinstance(value, DistributedValues):
        return list(value.values)
    return [value]


class ReductionToOneDevice(CrossDeviceOps):
    """Sum every component in one place (host memory or the first component's GPU)."""

    def __init__(self, reduce_to_device: str | None = None, accumulation_fn: Any = None) -> None:
        self._device = reduce_to_device

    def batch_reduce_components(self, op, values, num_replicas_in_sync, options=None):
        out = []
        for components in values:
            total = finish_mean(op, _local_combine(op, components), num_replicas_in_sync)
            out.append([total] * len(components))
        return out


class NcclAllReduce(CrossDeviceOps):
    """NCCL all-reduce among local GPUs; the host reduction for anything else.

    Used when every component is a CuPy array on a distinct GPU and ``cupy.cuda.nccl`` is
    available. The communicator is created on first use for that set of devices and kept.
    """

    def __init__(self, num_packs: int = 1) -> None:
        self._comms: dict[tuple[int, ...], Any] = {}
        self._fallback = ReductionToOneDevice()

    def _nccl_devices(self, components: Components) -> tuple[int, ...] | None:
        if len(components) < 2 or not all(is_cupy(c) for c in components):
            return None
        devices = tuple(c.device.id for c in components)
        if len(set(devices)) != len(devices):
            return None
        try:
            from cupy.cuda import nccl  # noqa: F401 - optional (extra 'gpu'): is NCCL here?
        except ImportError:
            return None
        return devices

    def batch_reduce_components(self, op, values, num_replicas_in_sync, options=None):
        out = []
        for components in values:
            devices = self._nccl_devices(components)
            if devices is None:
                out.extend(self._fallback.batch_reduce_components(op, [components],
                                                                  num_replicas_in_sync, options))
            else:
                out.append(self._nccl(op, components, devices, num_replicas_in_sync))
        return out

    def _nccl(self, op: ReduceOp, components: Components, devices: tuple[int, ...],
              count: int) -> list[Any]:
        import cupy  # optional (extra 'gpu'): reached only with GPU components
        from cupy.cuda import nccl

        comms = self._comms.get(devices)
        if comms is None:
            comms = self._comms[devices] = nccl.NcclCommunicator.initAll(list(devices))
        nccl_op = {ReduceOp.SUM: nccl.NCCL_SUM, ReduceOp.MEAN: nccl.NCCL_SUM,
                   ReduceOp.MAX: nccl.NCCL_MAX, ReduceOp.MIN: nccl.NCCL_MIN}[op]
        dtype = _nccl_dtype(nccl, components[0].dtype)
        results = []
        for component in components:
            with component.device:
                results.append(cupy.ascontiguousarray(component).copy())
        nccl.groupStart()
        for comm, buf in zip(comms, results, strict=True):
            with buf.device:
                stream = cupy.cuda.get_current_stream().ptr
                comm.allReduce(buf.data.ptr, buf.data.ptr, buf.size, dtype, nccl_op, stream)
        nccl.groupEnd()
        for buf in results:
            with buf.device:
                cupy.cuda.get_current_stream().synchronize()
        return [finish_mean(op, r, count) for r in results]


def _nccl_dtype(nccl: Any, dtype: np.dtype) -> int:
    table = {"float16": nccl.NCCL_FLOAT16, "float32": nccl.NCCL_FLOAT32,
             "float64": nccl.NCCL_FLOAT64, "int32": nccl.NCCL_INT32, "int64": nccl.NCCL_INT64}
    try:
        return table[np.dtype(dtype).name]
    except KeyError:
        raise TypeError(f"NCCL all-reduce does not support dtype {dtype}") from None


class CollectiveAllReduce(CrossDeviceOps):
    """Hierarchical all-reduce across worker processes (MultiWorkerMirroredStrategy's ops)."""

    def __init__(self, group: CollectiveGroup, local_ops: CrossDeviceOps | None = None) -> None:
        self._group = group
        self._local = local_ops or NcclAllReduce()

    @property
    def group(self) -> CollectiveGroup:
        return self._group

    def batch_reduce_components(self, op, values, num_replicas_in_sync, options=None):
        if not values:
            return []
        sum_op = ReduceOp.SUM if op is ReduceOp.MEAN else op
        crossing = self._group.world_size > 1
        # One local replica and a cross-process all-reduce (which never modifies its inputs and
        # returns fresh buffers): the component itself goes in, saving a copy of every gradient.
        local = [c[0] if crossing and len(c) == 1 else
                 self._local.batch_reduce_components(sum_op, [c], len(c), options)[0][0]
                 for c in values]
        hosts = [_to_host(x) for x in local]
        if crossing:
            hosts = self._group.all_reduce_many(hosts, sum_op, options=options)
        out = []
        for components, total in zip(values, hosts, strict=True):
            total = finish_mean(op, np.asarray(total), num_replicas_in_sync)
            out.append([_like(c, total) for c in components])
        return out

    def gather_components(self, components, axis, options=None):
        local = _to_host(CrossDeviceOps.gather_components(self, components, axis, options))
        if self._group.world_size == 1:
            return local
        return self._group.all_gather(local, axis, options=options)

    def broadcast_from_first(self, value, options=None):
        if self._group.world_size == 1:
            return value
        host = self._group.broadcast(_to_host(value), 0, options=options)
        return _like(value, np.asarray(host))


def _like(template: Any, host: np.ndarray) -> Any:
    """``host`` on ``template``'s device (a CuPy array's GPU), else as is."""
    if is_cupy(template):
        cupy = sys.modules["cupy"]
        with template.device:
            return cupy.asarray(host)
    return host
