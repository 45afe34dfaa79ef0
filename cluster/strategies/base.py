"""``Strategy``: what every strategy shares (``tf.distribute.Strategy``).

A strategy owns a tuple of local devices (one replica each) and cross-device ops, held by its
device-level half, :class:`~cluster.strategies.extended.StrategyExtended` (``strategy.extended``:
components, reductions, variable creation and updates). Subclasses choose the devices, the ops
and the variable kind; the user-facing half is here: scopes, ``run``, ``reduce``, ``gather`` and
datasets.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterable, Sequence
from typing import Any

import numpy as np

from cluster import _context, _nest, timeline
from cluster._family import to_host, xp_of
from cluster.collectives.ops import ReduceOp
from cluster.cross_device_ops import finish_mean
from cluster.data import DistributedDataset, DistributedDatasetsFromFunction
from cluster.strategies._checks import require_cross_replica
from cluster.strategies._leaves import check_gather_rank, first_component
from cluster.strategies.extended import StrategyExtended
from cluster.strategies.replica import call_for_each_replica
from cluster.values import (
    DistributedValues,
    Mirrored,
    PerReplica,
    check_component_counts,
    regroup,
    select_replica,
)
from cluster.variables import Variable

__all__ = ["Strategy", "StrategyExtended", "ValueContext"]


class ValueContext:
    """What ``experimental_distribute_values_from_function`` passes to its function."""

    def __init__(self, replica_id_in_sync_group: int = 0, num_replicas_in_sync: int = 1) -> None:
        self.replica_id_in_sync_group = replica_id_in_sync_group
        self.num_replicas_in_sync = num_replicas_in_sync

    def __repr__(self) -> str:
        return (f"ValueContext(replica_id_in_sync_group={self.replica_id_in_sync_group}, "
                f"num_replicas_in_sync={self.num_replicas_in_sync})")


class Strategy:
    """A way to run a computation on several replicas (``tf.distribute.Strategy``).

    ``scope()`` makes new variables distributed; ``run`` calls a function once per local
    replica; ``reduce``/``gather`` combine per-replica values over every replica of every worker.
    """

    def __init__(self, extended: StrategyExtended) -> None:
        self._extended = extended

    @property
    def extended(self) -> StrategyExtended:
        return self._extended

    @property
    def num_replicas_in_sync(self) -> int:
        """Replicas over all workers that take part in each synchronous step."""
        return self._extended.num_workers * self._extended.num_local_replicas

    @property
    def cluster_resolver(self) -> Any:
        """The resolver of a multi-worker strategy; ``None`` for local strategies (as TF)."""
        return None

    # -- scopes --

    @contextlib.contextmanager
    def scope(self):
        """Enter this strategy: variables created inside become its distributed variables.

        Entering it again inside its own scope is allowed.

        Raises:
          RuntimeError: inside ``strategy.run`` (a replica context), or inside another
            strategy's scope (TF: "Mixing different tf.distribute.Strategy objects").
        """
        if not _context.is_default(_context.current_frame().strategy):
            require_cross_replica(self, "strategy.scope()",
                                  "enter the scope before calling strategy.run")
        _context.entering_scope(self)
        with _context.push(self, None):
            yield self

    def _check_cross_replica(self, what: str) -> None:
        require_cross_replica(self, f"strategy.{what}", "inside a replica use "
                              "get_replica_context().all_reduce / all_gather")

    # -- running --

    def run(self, fn: Callable, args: Sequence[Any] = (), kwargs: dict | None = None,
            options: Any = None) -> Any:
        """``fn(*args, **kwargs)`` on each local replica; PerReplica results (plain with one).

        Distributed values among the arguments are split: each replica gets its component.

        Raises:
          ValueError: ``args`` is not a tuple or list (as TF).
          TypeError: ``fn`` is not callable or ``kwargs`` not a dict.
          RuntimeError: inside ``strategy.run`` or another strategy's scope.
        """
        if not callable(fn):
            raise TypeError(f"strategy.run: fn must be callable, got {type(fn).__name__}")
        if not isinstance(args, (tuple, list)):
            raise ValueError(
                f"strategy.run: args must be a tuple or list of arguments, got "
                f"{type(args).__name__}; write args=(value,)"
            )
        kwargs = {} if kwargs is None else kwargs
        if not isinstance(kwargs, dict):
            raise TypeError(f"strategy.run: kwargs must be a dict, got {type(kwargs).__name__}")
        self._check_cross_replica("run")
        local = self._extended.num_local_replicas
        check_component_counts(args, local, "strategy.run args")
        check_component_counts(kwargs, local, "strategy.run kwargs")
        with self.scope(), timeline.run_step(args):  # a step (or phase) of the timeline
            results = call_for_each_replica(self, fn, tuple(args), kwargs)
        return regroup(results)

    def experimental_local_results(self, value: Any) -> tuple[Any, ...]:
        """The components of ``value`` held by this worker's replicas, in replica order."""
        if isinstance(value, DistributedValues):
            return tuple(value.values)
        leaves = _nest.flatten(value)
        if any(isinstance(leaf, DistributedValues) and not isinstance(leaf, Variable)
               for leaf in leaves):
            return tuple(select_replica(i, value) for i in range(self._extended.num_local_replicas))
        return (value,)

    def experimental_distribute_values_from_function(self, value_fn: Callable) -> Any:
        """``value_fn(ValueContext)`` for each local replica, as one PerReplica value."""
        ext = self._extended
        values = []
        for i in range(ext.num_local_replicas):
            with ext.device_scope(i):
                values.append(value_fn(ValueContext(ext.worker_index * ext.num_local_replicas + i,
                                                    self.num_replicas_in_sync)))
        return PerReplica(values) if len(values) > 1 else values[0]

    # -- reductions --

    def reduce(self, reduce_op: Any, value: Any, axis: int | None = None) -> Any:
        """``reduce_op`` (SUM or MEAN) of ``value`` over every replica of every worker.

        ``axis`` also reduces along that axis of each replica's value (MEAN then averages over
        all elements, however the batch was split). A non-distributed value is taken as every
        replica's value: MEAN returns it, SUM needs one replica (as TF).
        """
        self._check_cross_replica("reduce")
        op = ReduceOp.parse(reduce_op)
        if op not in (ReduceOp.SUM, ReduceOp.MEAN):
            raise ValueError(f"strategy.reduce supports ReduceOp.SUM and MEAN, got {op}")
        leaves = _nest.flatten(value)
        ext = self._extended
        plan, items = [], []
        for leaf in leaves:
            if op is ReduceOp.MEAN and (isinstance(leaf, Mirrored) or (
                    not isinstance(leaf, DistributedValues) and ext.num_local_replicas > 1)):
                plan.append(("as_is", leaf, None))
                continue
            components = ext.local_components(leaf, op.value)
            if axis is None:
                plan.append(("plain", components.family.restore, len(items)))
                items.append(components)
            else:
                sums, counts = [], []
                for c in components:
                    xp = xp_of(c)  # per replica: CPU and GPU replicas may be mixed
                    sums.append(xp.sum(c, axis=axis))
                    counts.append(np.asarray(float(c.shape[axis] if c.ndim else 1)))
                plan.append(("axis", components.family.restore, len(items)))
                items.extend([sums, [np.asarray(to_host(c)) for c in counts]])
        with _context.push(self, None):
            reduced = ext.cross_device_ops.batch_reduce_components(
                ReduceOp.SUM, items, self.num_replicas_in_sync,
                ext.communication_options) if items else []
        out = []
        for kind, leaf_or_restore, index in plan:
            if kind == "as_is":
                out.append(first_component(leaf_or_restore))
                continue
            total = reduced[index][0]  # fresh: the caller's to keep (no copy)
            if kind == "axis" and op is ReduceOp.MEAN:
                total = finish_mean(op, total, float(to_host(reduced[index + 1][0])))
            else:
                total = finish_mean(op, total, self.num_replicas_in_sync)
            out.append(leaf_or_restore(total))  # the way back, decided at the edge
        return _nest.pack_sequence_as(value, out)

    def gather(self, value: Any, axis: int) -> Any:
        """Every replica's ``value`` concatenated along ``axis``, in replica order (all workers)."""
        self._check_cross_replica("gather")
        ext = self._extended
        out = []
        with _context.push(self, None):
            for leaf in _nest.flatten(value):
                components = ext.local_components_any(leaf, "gather")
                check_gather_rank(components, axis)
                gathered = ext.cross_device_ops.gather_components(
                    components, axis, ext.communication_options)
                out.append(components.family.restore(gathered))
        return _nest.pack_sequence_as(value, out)

    # -- input --

    def _wrap_local(self, pieces: list[Any]) -> Any:
        ext = self._extended
        if any(d.is_gpu for d in ext.devices):
            pieces = [_nest.map_structure(lambda x, i=i: ext.place(i, x), p)
                      for i, p in enumerate(pieces)]
        return regroup(pieces, "dataset pieces")

    def experimental_distribute_dataset(self, dataset: Iterable[Any], options: Any = None) -> Any:
        """Split each global batch of ``dataset`` across all replicas (see :mod:`cluster.data`)."""
        ext = self._extended
        return DistributedDataset(dataset, num_replicas_in_sync=self.num_replicas_in_sync,
                                  worker_index=ext.worker_index, num_workers=ext.num_workers,
                                  local_replicas=ext.num_local_replicas, wrap=self._wrap_local)

    def distribute_datasets_from_function(self, dataset_fn: Callable, options: Any = None) -> Any:
        """Per-replica batches from ``dataset_fn(InputContext)``, called once per worker."""
        ext = self._extended
        return DistributedDatasetsFromFunction(
            dataset_fn, num_workers=ext.num_workers, worker_index=ext.worker_index,
            local_replicas=ext.num_local_replicas, num_replicas_in_sync=self.num_replicas_in_sync,
            wrap=self._wrap_local)

    def __repr__(self) -> str:
        return (f"<cluster.{type(self).__name__} num_replicas_in_sync="
                f"{self.num_replicas_in_sync} devices={list(self._extended.worker_devices)}>")
