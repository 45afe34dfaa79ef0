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

Besides reducing, every ops applies an elementwise update with the reduced gradients
(:meth:`CrossDeviceOps.reduce_and_update`, what ``optimizer.apply_gradients`` of plain SGD runs):
one plan, SUM then ``update(target, summed)`` on every replica's copy, with two fused routes,
host memory (the update runs where each segment's reduction completes,
:meth:`CollectiveGroup.all_reduce_apply`) and the GPU (the reduction on the device, then sum,
scale and add in one CuPy kernel, :func:`~cluster.collectives.kernels.sum_add_scaled_on_gpu`),
and the unfused one (reduce, then the update) for anything else.
"""

from __future__ import annotations

import sys
from abc import ABC, abstractmethod
from collections.abc import Iterable, Sequence
from typing import Any

import numpy as np

from cluster._family import Family, family_of, is_cupy, on_device_of, to_array, to_host
from cluster.collectives import kernels, nccl
from cluster.collectives.epilogue import Update
from cluster.collectives.group import CollectiveGroup
from cluster.collectives.ops import ReduceOp, finalize
from cluster.collectives.options import CommunicationOptions
from cluster.values import DistributedValues, Mirrored

__all__ = [
    "CollectiveAllReduce",
    "Components",
    "CrossDeviceOps",
    "NcclAllReduce",
    "ReductionToOneDevice",
    "components_of",
]


class Components(tuple):
    """One value's local components (arrays, one per local replica, in replica order) and its
    :class:`~cluster._family.Family`, decided once where the value entered the strategy, from
    the first replica's component (the family results go back in).

    A tuple, so ops written for plain sequences of components take it as is; ops that receive a
    plain sequence (code calling them directly) decide the family once themselves
    (:func:`family_of_components`).
    """

    family: Family

    def __new__(cls, arrays: Iterable[Any], family: Family) -> Components:
        self = super().__new__(cls, arrays)
        self.family = family
        return self


def components_of(values: Sequence[Any], what: str = "") -> Components:
    """``values`` (one per local replica) as arrays, with the family of the first decided once.
    ``TypeError`` naming ``what`` for a value of no supported family."""
    first, family = family_of(values[0], what)
    return Components([first, *(to_array(v, what)[0] for v in values[1:])], family)


def family_of_components(components: Sequence[Any]) -> Family:
    """The family ``components`` carry (:class:`Components`), or the first one's, decided here
    for a plain sequence."""
    if isinstance(components, Components):
        return components.family
    return family_of(components[0])[1]


ComponentsLike = Sequence[Any]


def _local_combine(op: ReduceOp, components: ComponentsLike) -> Any:
    """``op`` over ``components`` in replica order, as a fresh array (MEAN: their sum)."""
    first = components[0]
    xp = family_of_components(components).xp
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


def finish_mean(op: ReduceOp, total: Any, count: int | float) -> Any:
    """A fresh SUM ``total`` (an array nobody else holds, or a NumPy scalar) turned into the
    MEAN over ``count``; other ops return ``total``.

    The strategies' one MEAN: floating values are divided in place by
    :func:`~cluster.collectives.ops.finalize` (the collectives' own); integers by true
    division into a new floating array, as tf.distribute's ``divide_by_n`` does.
    """
    if op is not ReduceOp.MEAN:
        return total
    if np.dtype(total.dtype).kind in "iub" or not (isinstance(total, np.ndarray)
                                                   or is_cupy(total)):
        return total / count  # integers, and NumPy scalars (immutable): a new value
    finalize(op, total, count)
    return total


def _per_replica(total: Any, components: ComponentsLike) -> list[Any]:
    """``total`` for every local replica: the array itself where a replica's component lives on
    its device (the same object may serve several; a strategy copies for the repeats), else one
    copy onto that component's GPU (or host)."""
    out = []
    for c in components:
        same = is_cupy(c) == is_cupy(total) and (
            not is_cupy(c) or c.device.id == total.device.id)
        out.append(total if same else on_device_of(c, to_host(total)))
    return out


class CrossDeviceOps(ABC):
    """Reduces per-replica components; subclasses implement :meth:`batch_reduce_components`."""

    @abstractmethod
    def batch_reduce_components(
        self, op: ReduceOp, values: Sequence[ComponentsLike], num_replicas_in_sync: int,
        options: CommunicationOptions | None = None,
    ) -> list[list[Any]]:
        """For each value (its local components), the ``op`` over all replicas, per local replica.

        MEAN divides by ``num_replicas_in_sync``, once. Results are fresh arrays the caller owns
        (never an input, never written by a later call), each on its replica's component's
        device; one array may serve several replicas (a caller that hands them out copies the
        repeats).
        """

    def reduce_and_update(
        self, values: Sequence[ComponentsLike], targets: Sequence[ComponentsLike], update: Update,
        num_replicas_in_sync: int, options: CommunicationOptions | None = None,
    ) -> bool:
        """For each value (its local components, gradients), its SUM over every replica applied
        by the elementwise ``update(target, summed)`` to each of its ``targets`` (one per local
        replica, in the same order: the variable's components, written in place).

        Contract (:mod:`cluster.collectives.epilogue`): ``update`` is elementwise; every
        replica's target holds the same bytes on entry and ends with the bytes of the unfused
        update (reduce, then ``update``); values are never written; each target matches its
        components' shape and dtype and shares no memory with them (the strategy checks).

        Returns whether the update was fused with the reduction. This default is the unfused
        route, for any ops: :meth:`batch_reduce_components`, then the update per target (on a
        GPU, SGD's update as one CuPy kernel); it returns ``False``. Ops with a fused route
        override it and return ``True`` where they took it.
        """
        reduced = self.batch_reduce_components(ReduceOp.SUM, values, num_replicas_in_sync,
                                               options)
        for per_replica, value_targets in zip(reduced, targets, strict=True):
            _apply_each(update, value_targets, per_replica)
        return False

    def gather_components(self, components: ComponentsLike, axis: int,
                          options: CommunicationOptions | None = None) -> Any:
        """Every replica's component concatenated along ``axis``, in replica order."""
        xp = family_of_components(components).xp
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


def _apply_reduced(update: Update, target: Any, reduced: Any, *, scratch: bool) -> None:
    """The unfused epilogue on any device: ``update(target, reduced)`` over the whole ``target``
    (NumPy, or CuPy on its GPU), with the SUM ``reduced`` of its gradient (any device: copied
    to the target's where it lives elsewhere).

    On a GPU an :class:`~cluster.collectives.epilogue.AddScaled` is one elementwise kernel
    (:func:`~cluster.collectives.kernels.sum_add_scaled_on_gpu`); other updates get
    ``update`` itself. ``scratch``: whether ``reduced`` may be overwritten (the update's
    scratch); when not, the update gets a copy.
    """
    target_on_gpu = is_cupy(target)
    if target_on_gpu != is_cupy(reduced) or (
            target_on_gpu and reduced.device.id != target.device.id):
        reduced, scratch = _moved_to_target(reduced, target), True
    if target_on_gpu and kernels.sum_add_scaled_on_gpu(update, [reduced], target):
        return
    if not scratch:
        reduced = reduced.copy()
    update(target.reshape(-1), reduced.reshape(-1))


def _moved_to_target(reduced: Any, target: Any) -> Any:
    """``reduced`` copied onto ``target``'s device (its GPU, or the host)."""
    if is_cupy(reduced) and not is_cupy(target):
        return sys.modules["cupy"].asnumpy(reduced)
    cupy = sys.modules["cupy"]
    with cupy.cuda.Device(target.device.id):
        # cupy.asarray would return a CuPy array of another GPU as it is: copy it across.
        return cupy.array(reduced, copy=True) if is_cupy(reduced) else cupy.asarray(reduced)


def _apply_each(update: Update, targets: ComponentsLike, per_replica: Sequence[Any]) -> None:
    """``update`` of each target with its replica's result; a result that serves several
    replicas is the update's scratch only at its last use."""
    uses: dict[int, int] = {}
    for r in per_replica:
        uses[id(r)] = uses.get(id(r), 0) + 1
    for target, r in zip(targets, per_replica, strict=True):
        uses[id(r)] -= 1
        _apply_reduced(update, target, r, scratch=uses[id(r)] == 0)


def _gpu_sums(update: Update, values: Sequence[ComponentsLike], targets: Sequence[ComponentsLike]
              ) -> bool:
    """Whether every value's local components can be summed into each of its targets by the
    one GPU kernel (all on the target's GPU, SGD's update)."""
    return all(kernels.gpu_fusable(update, components, t)
               for components, value_targets in zip(values, targets, strict=True)
               for t in value_targets)


def _components(value: Any) -> Components:
    values = list(value.values) if isinstance(value, DistributedValues) else [value]
    return components_of(values, "cross_device_ops.reduce")


class ReductionToOneDevice(CrossDeviceOps):
    """Sum every component in one place (host memory or the first component's GPU)."""

    def __init__(self, reduce_to_device: str | None = None, accumulation_fn: Any = None) -> None:
        self._device = reduce_to_device

    def batch_reduce_components(self, op, values, num_replicas_in_sync, options=None):
        out = []
        for components in values:
            total = finish_mean(op, _local_combine(op, components), num_replicas_in_sync)
            out.append(_per_replica(total, components))
        return out

    def reduce_and_update(self, values, targets, update, num_replicas_in_sync, options=None):
        """Fused where every value's components live on its targets' GPU: one kernel per
        target sums them in replica order, scales and adds (no summed array is made); else
        the unfused route."""
        if not values or not _gpu_sums(update, values, targets):
            return super().reduce_and_update(values, targets, update, num_replicas_in_sync,
                                             options)
        for components, value_targets in zip(values, targets, strict=True):
            for target in value_targets:
                kernels.sum_add_scaled_on_gpu(update, components, target)
        return True


class NcclAllReduce(CrossDeviceOps):
    """NCCL all-reduce among local GPUs; the host reduction for anything else.

    Used when every component is a CuPy array on a distinct GPU and NCCL is available
    (:func:`cluster.collectives.nccl.available`). One process drives every GPU, so this uses
    :meth:`~cluster.collectives.nccl.NcclComm.for_devices` and
    :func:`~cluster.collectives.nccl.all_reduce_devices` (one NCCL group, deadlines, the dtype
    table and MEAN's division of the one NCCL module). The communicator is created on first use
    for that set of devices and kept.
    """

    def __init__(self, num_packs: int = 1) -> None:
        self._comms: dict[tuple[int, ...], list[nccl.NcclComm]] = {}
        self._fallback = ReductionToOneDevice()

    def _nccl_devices(self, components: ComponentsLike) -> tuple[int, ...] | None:
        # The family says GPU; every replica's component must be on one (CPU and GPU replicas
        # may be mixed) and on a GPU of its own.
        if len(components) < 2 or not family_of_components(components).on_gpu \
                or not all(is_cupy(c) for c in components):
            return None
        devices = tuple(c.device.id for c in components)
        if len(set(devices)) != len(devices) or not nccl.available():
            return None
        return devices

    def batch_reduce_components(self, op, values, num_replicas_in_sync, options=None):
        out = []
        for components in values:
            devices = self._nccl_devices(components)
            if devices is None:
                out.extend(self._fallback.batch_reduce_components(op, [components],
                                                                  num_replicas_in_sync, options))
                continue
            comms = self._comms.get(devices)
            if comms is None:
                comms = self._comms[devices] = nccl.NcclComm.for_devices(list(devices))
            # NCCL's MEAN divides by the GPUs it spans; another count is divided here, once.
            inner = op if op is not ReduceOp.MEAN or len(devices) == num_replicas_in_sync \
                else ReduceOp.SUM
            cupy = sys.modules["cupy"]
            arrays = []
            for c in components:
                with c.device:
                    # Not ascontiguousarray alone: it makes a 0-d value shape (1,).
                    arrays.append(c if c.flags.c_contiguous
                                  else cupy.ascontiguousarray(c).reshape(c.shape))
            results = nccl.all_reduce_devices(comms, arrays, inner)
            if inner is not op:
                results = [finish_mean(op, r, num_replicas_in_sync) for r in results]
            out.append(results)
        return out

    def reduce_and_update(self, values, targets, update, num_replicas_in_sync, options=None):
        """Where no value spans several GPUs, the host reduction's (fused on one GPU); else
        NCCL, then the update per GPU (one kernel each for SGD)."""
        if all(self._nccl_devices(c) is None for c in values):
            return self._fallback.reduce_and_update(values, targets, update,
                                                    num_replicas_in_sync, options)
        return super().reduce_and_update(values, targets, update, num_replicas_in_sync, options)


class CollectiveAllReduce(CrossDeviceOps):
    """Hierarchical all-reduce across worker processes (MultiWorkerMirroredStrategy's ops).

    A thin layer: combine each value's local components (``local_ops``: NCCL among several
    local GPUs, else a host sum), then one :meth:`CollectiveGroup.all_reduce_many` of every
    value (NumPy or CuPy, routed per family), then MEAN's division, once: inside the collective
    when every value has one local replica and a floating dtype (the group divides by its size,
    which is then the replica count), else by :func:`finish_mean`. Results are the group's
    fresh arrays, handed to the replicas without copies where they live on the same device.
    """

    def __init__(self, group: CollectiveGroup, local_ops: CrossDeviceOps | None = None) -> None:
        self._group = group
        self._local = local_ops or NcclAllReduce()

    @property
    def group(self) -> CollectiveGroup:
        return self._group

    def batch_reduce_components(self, op, values, num_replicas_in_sync, options=None):
        if not values:
            return []
        crossing = self._group.world_size > 1
        in_group = (op is ReduceOp.MEAN and crossing
                    and num_replicas_in_sync == self._group.world_size
                    and all(len(c) == 1 and np.dtype(c[0].dtype).kind not in "iub"
                            for c in values))
        inner = op if in_group or op is not ReduceOp.MEAN else ReduceOp.SUM
        if crossing:
            # A lone local replica goes in as is: the group never writes its inputs and returns
            # fresh arrays, so no copy of any gradient is made here.
            local = [c[0] if len(c) == 1 else self._local_total(inner, c, options)
                     for c in values]
            totals = self._group.all_reduce_many(local, inner, options=options)
        else:
            totals = [self._local_total(inner, c, options) for c in values]
        out = []
        for components, total in zip(values, totals, strict=True):
            if inner is not op:
                total = finish_mean(op, total, num_replicas_in_sync)
            out.append(_per_replica(total, components))
        return out

    def reduce_and_update(self, values, targets, update, num_replicas_in_sync, options=None):
        """Fused where each value has one local replica: host values (and targets) by
        :meth:`CollectiveGroup.all_reduce_apply`, the update running where each segment's
        reduction completes; CuPy values on their targets' GPU by the device all-reduce, then
        the one kernel (scale and add) on each GPU. Anything else: the unfused route."""
        if not values or any(len(c) != 1 for c in values):
            return super().reduce_and_update(values, targets, update, num_replicas_in_sync,
                                             options)
        grads = [c[0] for c in values]
        flat = [t[0] for t in targets]
        if not any(family_of_components(c).on_gpu for c in values) \
                and not any(is_cupy(t) for t in flat):
            self._group.all_reduce_apply(grads, flat, update, ReduceOp.SUM, options=options)
            return True
        if not _gpu_sums(update, values, targets):
            return super().reduce_and_update(values, targets, update, num_replicas_in_sync,
                                             options)
        totals = self._group.all_reduce_many(grads, ReduceOp.SUM, options=options) \
            if self._group.world_size > 1 else grads
        for total, target in zip(totals, flat, strict=True):
            if not kernels.sum_add_scaled_on_gpu(update, [total], target):
                _apply_reduced(update, target, total, scratch=total is not target)
        return True

    def _local_total(self, op: ReduceOp, components: ComponentsLike,
                     options: CommunicationOptions | None) -> Any:
        """``op`` over one value's local components, fresh (one replica: a copy)."""
        return self._local.batch_reduce_components(op, [components], len(components),
                                                   options)[0][0]

    def gather_components(self, components, axis, options=None):
        local = to_host(CrossDeviceOps.gather_components(self, components, axis, options))
        if self._group.world_size == 1:
            return local
        return self._group.all_gather(local, axis, options=options)

    def broadcast_from_first(self, value, options=None):
        if self._group.world_size == 1:
            return value
        host = self._group.broadcast(to_host(value), 0, options=options)
        return on_device_of(value, np.asarray(host))
