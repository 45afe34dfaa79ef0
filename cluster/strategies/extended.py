"""``StrategyExtended``: the device-level half of a strategy (``strategy.extended``).

It holds the local devices (one replica each), the cross-device ops and the communication
options. It turns values into local components and back (reduce, gather, broadcast from the
first replica, hand results out to each replica's device), creates the strategy's variables
and applies updates to them. :class:`~cluster.strategies.base.Strategy` is the user-facing half
that calls it.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterable, Sequence
from typing import TYPE_CHECKING, Any

import numpy as np

from cluster import _context, _nest
from cluster._family import Family, family_of, is_cupy
from cluster.collectives.ops import ReduceOp
from cluster.collectives.options import CommunicationOptions
from cluster.cross_device_ops import Components, CrossDeviceOps, components_of
from cluster.strategies._accessors import WorkerInfo, shared_tensor_error
from cluster.strategies._checks import is_floating, require_cross_replica
from cluster.strategies._devices import Device
from cluster.strategies._leaves import (
    call_options,
    check_gather_rank,
    is_plain,
    is_shared_tensor,
)
from cluster.strategies._variables import (
    DistributedVariable,
    MirroredVariable,
    SyncOnReadVariable,
)
from cluster.values import (
    DistributedValues,
    Mirrored,
    check_component_counts,
    regroup,
    select_replica,
)
from cluster.variables import (
    Variable,
    VariableAggregation,
    VariableSynchronization,
    component_variable,
    full_name,
    initial_array,
    validate_options,
)

if TYPE_CHECKING:
    from cluster.strategies.base import Strategy

__all__ = ["StrategyExtended"]


class StrategyExtended(WorkerInfo):
    """The device-level half of a strategy (``strategy.extended``); who this process is in it
    (``worker_index``, ``num_workers``, ``is_chief``, ...): :class:`WorkerInfo`."""

    def __init__(
        self,
        container_strategy: Strategy,
        devices: Sequence[Device],
        cross_device_ops: CrossDeviceOps,
        *,
        num_workers: int = 1,
        worker_index: int = 0,
        options: CommunicationOptions | None = None,
    ) -> None:
        if cross_device_ops is not None and not isinstance(cross_device_ops, CrossDeviceOps):
            raise TypeError(
                f"cross_device_ops must be a cluster.cross_device_ops.CrossDeviceOps, got "
                f"{cross_device_ops!r}"
            )
        self._container = container_strategy
        self._devices = tuple(devices)
        self._local_count = len(self._devices)
        self._options = options
        self._set_group(cross_device_ops, num_workers, worker_index)

    def _set_group(self, cross_device_ops: CrossDeviceOps, num_workers: int,
                   worker_index: int) -> None:
        """The ops and this process's place among the workers (at construction, and when an
        elastic regroup swaps the group: :mod:`cluster.strategies._elastic`)."""
        self._cross_device_ops = cross_device_ops
        self._num_workers = num_workers
        self._worker_index = worker_index
        self._first_replica_id = worker_index * self._local_count

    # -- devices -------------------------------------------------------------------------------

    @property
    def worker_devices(self) -> tuple[str, ...]:
        return tuple(str(d) for d in self._devices)

    @property
    def parameter_devices(self) -> tuple[str, ...]:
        return self.worker_devices

    @property
    def first_replica_id(self) -> int:
        """The replica id in sync group of this worker's first local replica."""
        return self._first_replica_id

    @property
    def devices(self) -> tuple[Device, ...]:
        """The local replicas' devices, in replica order."""
        return self._devices

    @property
    def cross_device_ops(self) -> CrossDeviceOps:
        """The ops that combine values across replicas and workers."""
        return self._cross_device_ops

    @property
    def communication_options(self) -> CommunicationOptions | None:
        """The strategy's default options for its collectives (a call's own options win)."""
        return self._options

    def _elastic_enabled(self) -> bool:
        """Whether the group can re-form (``cluster.elastic``): only an elastic
        ``MultiWorkerMirroredStrategy``'s can (:mod:`cluster.strategies._elastic`)."""
        return False

    @property
    def _num_replicas_in_sync(self) -> int:
        return self._num_workers * self._local_count

    def device_scope(self, index: int) -> contextlib.AbstractContextManager:
        """The context in which local replica ``index`` runs: its GPU made current (CuPy),
        nothing for a CPU replica."""
        device = self._devices[index]
        if device.is_gpu:
            import cupy  # optional (extra 'gpu'): only GPU replicas need it

            return cupy.cuda.Device(device.index)
        return contextlib.nullcontext()

    def place(self, index: int, array: Any) -> Any:
        """A copy of ``array`` on local replica ``index``'s device."""
        device = self._devices[index]
        if device.is_gpu:
            import cupy  # optional (extra 'gpu'): only GPU replicas need it

            with cupy.cuda.Device(device.index):
                return cupy.array(array, copy=True)
        return np.array(array.get() if hasattr(array, "get") else array, copy=True)

    # -- components ------------------------------------------------------------------------------

    def local_components(self, value: Any, what: str) -> Components:
        """The local components of a leaf as arrays, with its family decided once (the edge
        of every reduction: carried down to the ops and used for the way back); a plain value
        serves a single replica."""
        if isinstance(value, DistributedValues):
            if len(value.values) != self._local_count:
                check_component_counts(value, self._local_count, what)
            values = [v._read() if isinstance(v, Variable) else v for v in value.values]
        elif isinstance(value, Variable):
            values = [value._read()]
        else:
            if self._local_count != 1:
                if is_shared_tensor(value):
                    raise shared_tensor_error(f"reduce {what}", value, self._local_count)
                raise ValueError(
                    f"A non-DistributedValues value {value!r:.60} cannot be reduced with "
                    f"{what} over {self._local_count} local replicas; pass the PerReplica value "
                    "that strategy.run returned"
                )
            values = [value]
        return components_of(values)

    def reduce_to_host(self, op: ReduceOp, value: Any) -> Any:
        """``op`` of a leaf over every replica of every worker: one array (same on all ranks).

        A plain value is every local replica's value for MEAN (its mean is itself, as TF's
        ``reduce_non_distributed_value``); SUM of it needs a single local replica."""
        if op is ReduceOp.MEAN:
            components = self.local_components_any(value, op.value)
        else:
            components = self.local_components(value, op.value)
        return self._cross_device_ops.batch_reduce_components(
            op, [components], self._num_replicas_in_sync, self._options)[0][0]

    def first_replica_value(self, value: Any) -> Any:
        """Global replica 0's component of a leaf, on every worker."""
        first = self.local_components_any(value, "ONLY_FIRST_REPLICA")[0]
        return self._cross_device_ops.broadcast_from_first(first, self._options)

    def all_reduce_nest(self, op: ReduceOp, value: Any, options: Any) -> Any:
        """Every leaf of ``value`` (a nest of this worker's local per-replica values) reduced
        by ``op`` over all replicas of all workers; what ``ReplicaContext.all_reduce`` runs,
        once per step, in the merge call."""
        leaves = _nest.flatten(value)
        if not leaves:
            return value
        # A plain leaf (1.5, a NumPy array) is each replica's own value, as in TF, where it
        # becomes one tensor per replica: SUM over 2 replicas of 1.5 is 3.0.
        for leaf in leaves:
            if self._local_count > 1 and is_shared_tensor(leaf):
                raise shared_tensor_error("all_reduce", leaf, self._local_count)
        comps = [self.local_components_any(leaf, f"all_reduce {op.value}") for leaf in leaves]
        reduced = self._cross_device_ops.batch_reduce_components(
            op, comps, self._num_replicas_in_sync, call_options(options, self._options))
        out = []
        for components, per_replica in zip(comps, reduced, strict=True):
            family = components.family
            results = [family.restore(r) for r in self._hand_out(per_replica, family)]
            out.append(Mirrored(results) if len(results) > 1 else results[0])
        return _nest.pack_sequence_as(value, out)

    def _hand_out(self, per_replica: Sequence[Any], family: Family) -> list[Any]:
        """The ops' fresh results (see ``CrossDeviceOps.batch_reduce_components``), one array of
        its own per local replica, where the caller's family lives (:meth:`_home`): a result is
        given out as is to the first replica it suits; repeats (one array serving several
        replicas) and results elsewhere are copied."""
        given: set[int] = set()
        out = []
        for i, r in enumerate(per_replica):
            home = self._home(i, family)
            if id(r) in given or not _lives_at(r, home):
                r = _copy_to(home, r)
            given.add(id(r))
            out.append(r)
        return out

    def _home(self, index: int, family: Family) -> int | None:
        """Where local replica ``index`` gets a result of a value of ``family``: host memory
        (``None``) for a host value, whatever the replica's device (NumPy in, NumPy out); for a
        GPU value the replica's GPU, or the value's own GPU for a CPU replica."""
        if not family.on_gpu:
            return None
        device = self._devices[index]
        return device.index if device.is_gpu else family.device

    def all_gather_nest(self, value: Any, axis: int, options: Any) -> Any:
        """Every leaf of ``value`` concatenated along ``axis`` over all replicas of all workers,
        one copy per local replica; what ``ReplicaContext.all_gather`` runs in the merge call."""
        out = []
        for leaf in _nest.flatten(value):
            comps = self.local_components_any(leaf, "all_gather")
            check_gather_rank(comps, axis)
            gathered = self._cross_device_ops.gather_components(
                comps, axis, call_options(options, self._options))
            family = comps.family
            copies = [family.restore(_copy_to(self._home(i, family), gathered))
                      for i in range(self._local_count)]
            out.append(Mirrored(copies) if len(copies) > 1 else copies[0])
        return _nest.pack_sequence_as(value, out)

    def local_components_any(self, value: Any, what: str) -> Components:
        """Components of a leaf (its family decided once, as :meth:`local_components`); a plain
        value counts as the same value on every replica."""
        if isinstance(value, DistributedValues):
            return self.local_components(value, what)
        array, family = family_of(value._read() if isinstance(value, Variable) else value)
        return Components([array] * self._local_count, family)

    # -- TensorFlow's public extended API -------------------------------------------------------

    def reduce_to(self, reduce_op: Any, value: Any, destinations: Any = None,
                  options: CommunicationOptions | None = None) -> Any:
        """``reduce_op`` of ``value`` over every replica: Mirrored (plain with one replica)."""
        return self.batch_reduce_to(reduce_op, [(value, destinations)], options)[0]

    def batch_reduce_to(self, reduce_op: Any, value_destination_pairs: Iterable[tuple[Any, Any]],
                        options: CommunicationOptions | None = None) -> list[Any]:
        """``reduce_to`` of many values in one collective (fused into ``bytes_per_pack`` packs).

        As in TF: a plain (non-distributed) value is every replica's value, so MEAN returns it
        and SUM needs a single local replica (``ValueError`` otherwise).

        Raises:
          RuntimeError: called inside ``strategy.run`` (use ``merge_call``), or under another
            strategy's scope.
          ValueError: an unknown reduce op.
        """
        require_cross_replica(self._container, "strategy.extended.batch_reduce_to",
                              "call it in merge_call's function")
        op = ReduceOp.parse(reduce_op)
        values = [v for v, _ in value_destination_pairs]
        as_is = [op is ReduceOp.MEAN and self._local_count > 1 and is_plain(v) for v in values]
        comps = [self.local_components(v, op.value) for v, keep in zip(values, as_is, strict=True)
                 if not keep]
        reduced = iter(self._cross_device_ops.batch_reduce_components(
            op, comps, self._num_replicas_in_sync, call_options(options, self._options))
            if comps else [])
        out = []
        for value, keep in zip(values, as_is, strict=True):
            r = value if keep else next(reduced)
            out.append(r if keep else Mirrored(r) if len(r) > 1 else r[0])
        return out

    def reduce_and_update(self, pairs: Sequence[tuple[Any, Variable]], update: Callable,
                          options: CommunicationOptions | None = None) -> bool:
        """SUM each gradient of ``pairs`` over every replica and apply the elementwise
        ``update(value, summed)`` to every local copy of its variable:
        :meth:`CrossDeviceOps.reduce_and_update`, fused into the reduction where the ops can
        (:mod:`cluster.collectives.epilogue`). Returns False, having done nothing, where the
        update cannot be applied elementwise as given: a variable without one component per
        local replica, or a gradient not of its variable's shape and dtype (or sharing its
        memory); the caller then reduces and updates itself.
        """
        values, targets = [], []
        for grad, variable in pairs:
            components = variable.values if isinstance(variable, DistributedVariable) \
                else (variable,)
            if len(components) != self._local_count:
                return False
            grads = self.local_components(grad, "SUM")
            copies = [c._read() for c in components]
            if not all(_updatable(g, t) for g, t in zip(grads, copies, strict=True)):
                return False
            values.append(grads)
            targets.append(copies)
        self._cross_device_ops.reduce_and_update(values, targets, update,
                                                 self._num_replicas_in_sync,
                                                 call_options(options, self._options))
        return True

    def update(self, var: Variable, fn: Callable, args: tuple = (), kwargs: dict | None = None,
               group: bool = True) -> Any:
        """``fn(component, *args, **kwargs)`` for each local component of ``var`` (cross-replica
        context); distributed arguments are split per replica."""
        kwargs = {} if kwargs is None else kwargs
        if isinstance(var, DistributedVariable) and var._distribute_strategy is not self._container:
            raise ValueError(
                f"update: variable {var.name} was created under another strategy's scope; "
                "create it under this strategy's scope"
            )
        components = var.values if isinstance(var, DistributedVariable) else (var,)
        results = []
        with _context.push(self._container, None):
            for i, component in enumerate(components):
                with self.device_scope(i):
                    results.append(fn(component, *select_replica(i, args),
                                      **select_replica(i, kwargs)))
        return regroup(results) if group else results

    def value_container(self, value: Any) -> Any:
        return value

    def apply_gradients(self, optimizer: Any, pairs: list[tuple[Any, Variable]],
                        aggregate: bool) -> int:
        """Apply one update of ``optimizer`` to ``pairs`` (``(gradient, variable)``, variables of
        this strategy); returns the optimizer's new iteration count.

        Here: in the caller's replica context, once for all replicas (``merge_call``), summing
        the gradients over every replica first when ``aggregate``. Raises ``RuntimeError`` in
        cross-replica context. Strategies whose variables live elsewhere override this.
        """
        return optimizer._apply_in_replica_context(pairs, aggregate)

    def create_variable(self, initial_value: Any = None, trainable: bool | None = None,
                        name: str | None = None, dtype: Any = None,
                        synchronization: Any = VariableSynchronization.AUTO,
                        aggregation: Any = None, shape: Any = None, *,
                        broadcast: bool = True) -> Variable:
        """A variable of this strategy (what ``cluster.Variable(...)`` under its scope makes):
        mirrored or sync-on-read components, one per local replica, from global replica 0's
        initial value (``broadcast=False``: each worker's own, for values the same everywhere,
        such as an optimizer's zero slots). Inside ``strategy.run`` it is created once, in
        cross-replica context. Raises ``ValueError`` as ``tf.Variable`` under a strategy does.
        """
        aggregation = VariableAggregation.NONE if aggregation is None else aggregation
        context = _context.get_replica_context()
        if context is not None and context.strategy is self._container:
            # Created inside run: once, in cross-replica context, from replica 0's arguments.
            return context.merge_call(
                _create_in_merge, args=(initial_value, trainable, name, dtype, synchronization,
                                        aggregation, shape))
        synchronization, aggregation, trainable = validate_options(
            synchronization, aggregation, trainable)
        if synchronization is VariableSynchronization.NONE:
            raise ValueError(
                f"synchronization=NONE is not supported under a distribution strategy (variable "
                f"{name or 'Variable'}); use AUTO, ON_WRITE or ON_READ"
            )
        value = initial_array(initial_value, dtype, shape)
        self._check_aggregation_dtype(aggregation, value.dtype, full_name(name))
        if broadcast:
            value = self._cross_device_ops.broadcast_from_first(value, self._options)
        return self._make_variable(value, name=full_name(name), trainable=trainable,
                                   synchronization=synchronization, aggregation=aggregation)

    def _check_aggregation_dtype(self, aggregation: VariableAggregation, dtype: np.dtype,
                                 name: str) -> None:
        """Refuse MEAN for a non-floating variable, as TF's distributed variables do (a mean of
        integers would truncate). Strategies whose variables are not mirrored (one device,
        central storage, parameter servers) accept it, as in TF."""
        if aggregation is VariableAggregation.MEAN and not is_floating(dtype):
            raise ValueError(
                f"creating distributed Variable {name} with aggregation=MEAN and a non-floating "
                f"dtype ({np.dtype(dtype)}) is not supported under {type(self._container).__name__}"
                "; use aggregation=SUM or ONLY_FIRST_REPLICA, or a floating dtype"
            )

    def _make_variable(self, value: Any, **options: Any) -> Variable:
        components = [component_variable(self.place(i, value), options["name"])
                      for i in range(self._local_count)]
        if options["synchronization"] is VariableSynchronization.ON_READ:
            return SyncOnReadVariable(self._container, components, **options)
        return MirroredVariable(self._container, components, **options)


def _lives_at(array: Any, home: int | None) -> bool:
    """Whether ``array`` is in host memory (``home`` None) or on GPU ``home``."""
    if home is None:
        return isinstance(array, np.ndarray | np.generic) and not is_cupy(array)
    return is_cupy(array) and array.device.id == home


def _copy_to(home: int | None, array: Any) -> Any:
    """A copy of ``array`` in host memory (``home`` None) or on GPU ``home``."""
    if home is None:
        return np.array(array.get() if is_cupy(array) else array, copy=True)
    import cupy  # optional (extra 'gpu'): a GPU value exists only where it is installed

    with cupy.cuda.Device(home):
        return cupy.array(array, copy=True)


def _updatable(grad: Any, target: Any) -> bool:
    """Whether ``target`` (a variable's copy) can take an elementwise update from ``grad``:
    same shape and dtype, C-contiguous and writeable, no shared memory."""
    if tuple(grad.shape) != tuple(target.shape) or grad.dtype != target.dtype \
            or not target.flags.c_contiguous:
        return False
    if is_cupy(target):
        return grad is not target and not (is_cupy(grad) and grad.data.ptr == target.data.ptr)
    return isinstance(target, np.ndarray) and bool(target.flags.writeable) and not (
        isinstance(grad, np.ndarray) and not is_cupy(grad) and np.may_share_memory(grad, target))


def _create_in_merge(strategy: Any, initial_value, trainable, name, dtype, synchronization,
                     aggregation, shape) -> Variable:
    first = select_replica(0, initial_value)
    return strategy.extended.create_variable(first, trainable, select_replica(0, name), dtype,
                                              synchronization, aggregation, shape)
