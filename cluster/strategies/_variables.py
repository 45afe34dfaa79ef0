"""The distributed variables that strategies create (exported by :mod:`cluster.strategies`).

A distributed variable holds plain :class:`~cluster.variables.Variable` components, one per local
replica (one in all for :class:`CentralVariable`). Which component a read or write touches
depends on the calling thread's context: a replica thread of the owning strategy uses its own;
cross-replica code (and code outside every strategy) uses the primary or, for sync-on-read
variables, the aggregate over every replica of every worker.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

from cluster import _context
from cluster.collectives.ops import ReduceOp
from cluster.values import DistributedValues, PerReplica
from cluster.variables import (
    Variable,
    VariableAggregation,
    VariableSynchronization,
    convert_for,
)

if TYPE_CHECKING:
    from cluster.strategies.base import Strategy

__all__ = ["CentralVariable", "DistributedVariable", "MirroredVariable", "SyncOnReadVariable"]

_OPS: dict[str, Callable[[Any, Any], Any]] = {
    "assign": lambda old, value: value,
    "assign_add": lambda old, value: old + value,
    "assign_sub": lambda old, value: old - value,
}


def reduce_op_for(aggregation: VariableAggregation, name: str) -> ReduceOp:
    """The ReduceOp of a SUM/MEAN aggregation (``ValueError`` for the others)."""
    if aggregation is VariableAggregation.SUM:
        return ReduceOp.SUM
    if aggregation is VariableAggregation.MEAN:
        return ReduceOp.MEAN
    raise ValueError(
        f"{name}: aggregation {aggregation} cannot be turned into a ReduceOp; create the "
        "variable with aggregation=VariableAggregation.SUM or MEAN"
    )


class DistributedVariable(Variable, DistributedValues):
    """A variable of a strategy: components per local replica, chosen by the calling context."""

    def __init__(self, strategy: Strategy, components: Sequence[Variable], *, name: str,
                 trainable: bool, synchronization: VariableSynchronization,
                 aggregation: VariableAggregation) -> None:
        DistributedValues.__init__(self, components)
        self._strategy = strategy
        self._name = name
        self._trainable = trainable
        self._synchronization = synchronization
        self._aggregation = aggregation

    @property
    def _distribute_strategy(self) -> Strategy:
        return self._strategy

    @property
    def dtype(self):
        return self._values[0].dtype

    @property
    def shape(self) -> tuple[int, ...]:
        return self._values[0].shape

    def _select(self, replica_index: int) -> Any:
        # A replica gets the variable itself, which picks its component when read or written.
        return self

    def _local_index(self) -> int | None:
        """This thread's replica index in the owning strategy; None in cross-replica context."""
        frame = _context.current_frame()
        if frame.strategy is self._strategy:
            context = frame.replica_context
            return None if context is None else context._local_index
        if _context.is_default(frame.strategy):
            return None  # as TF: outside every scope, the variable enters its own strategy
        raise RuntimeError(
            f"Mixing different Strategy objects: variable {self.name} belongs to "
            f"{_context.describe(self._strategy)} but is used under "
            f"{_context.describe(frame.strategy)}. Create the variable under the scope of the "
            "strategy that runs the step"
        )

    def _write(self, value: Any) -> None:  # pragma: no cover - writes go through _update
        raise AssertionError("distributed variables write through _update")

    def _update(self, kind: str, value: Any) -> Any:
        raise NotImplementedError

    def assign(self, value, use_locking=None, name=None, read_value=True):
        self._update("assign", value)
        return self if read_value else None

    def assign_add(self, delta, use_locking=None, name=None, read_value=True):
        self._update("assign_add", delta)
        return self if read_value else None

    def assign_sub(self, delta, use_locking=None, name=None, read_value=True):
        self._update("assign_sub", delta)
        return self if read_value else None

    def _apply_to(self, component: Variable, kind: str, value: Any) -> None:
        component._write(_OPS[kind](component._read(), convert_for(component, value, kind)))

    def __repr__(self) -> str:
        inner = ", ".join(repr(c.numpy()) for c in self._values)
        return (f"<cluster.{type(self).__name__} '{self.name}' shape={self.shape} "
                f"dtype={self.dtype}, components=[{inner}]>")


class MirroredVariable(DistributedVariable):
    """Identical on every replica; replica-context writes combine by ``aggregation``.

    - NONE: each replica writes its own component (TensorFlow 2 does the same; keep the values
      identical yourself, or choose an aggregation).
    - SUM / MEAN: the replicas' values are reduced over every replica of every worker, then
      written to every component.
    - ONLY_FIRST_REPLICA: replica 0's value (global replica 0) is written everywhere.
    """

    def _read(self) -> Any:
        index = self._local_index()
        return self._values[index or 0]._read()

    def _update(self, kind: str, value: Any) -> None:
        index = self._local_index()
        if index is None:
            for component in self._values:
                self._apply_to(component, kind, value)
        elif self._aggregation is VariableAggregation.NONE:
            self._apply_to(self._values[index], kind, value)
        else:
            context = _context.get_replica_context()
            context.merge_call(_merge_update, args=(self, kind, value))


def _merge_update(strategy: Strategy, variable: MirroredVariable, kind: str, value: Any) -> None:
    extended = strategy.extended
    if variable.aggregation is VariableAggregation.ONLY_FIRST_REPLICA:
        combined = extended.first_replica_value(value)
    else:
        combined = extended.reduce_to_host(reduce_op_for(variable.aggregation, variable.name),
                                            value)
    for component in variable.values:
        variable._apply_to(component, kind, combined)


class SyncOnReadVariable(DistributedVariable):
    """Written per replica, aggregated when read in cross-replica context (metrics' state)."""

    def _read(self) -> Any:
        index = self._local_index()
        if index is not None:
            return self._values[index]._read()
        if self._aggregation is VariableAggregation.ONLY_FIRST_REPLICA:
            return self._values[0]._read()
        op = reduce_op_for(self._aggregation, self.name)
        with _context.push(self._strategy, None):
            return self._strategy.extended.reduce_to_host(op, self._per_replica())

    def _per_replica(self) -> Any:
        reads = [c._read() for c in self._values]
        return PerReplica(reads) if len(reads) > 1 else reads[0]

    def _update(self, kind: str, value: Any) -> None:
        index = self._local_index()
        if index is not None:
            self._apply_to(self._values[index], kind, value)
            return
        if self._aggregation is VariableAggregation.SUM:
            if kind != "assign":
                raise ValueError(
                    f"SyncOnReadVariable {self.name} does not support {kind} in cross-replica "
                    "context when aggregation is SUM; call it inside strategy.run, or assign a "
                    "new total"
                )
            value = convert_for(self._values[0], value, kind) / len(self._values)
        for component in self._values:
            self._apply_to(component, kind, value)


class CentralVariable(DistributedVariable):
    """One copy on the parameter device, read by every replica (CentralStorageStrategy)."""

    def _read(self) -> Any:
        self._local_index()  # refuses use under another strategy
        return self._values[0]._read()

    def _update(self, kind: str, value: Any) -> None:
        index = self._local_index()
        if index is None:
            self._apply_to(self._values[0], kind, value)
            return
        extended = self._strategy.extended
        if self._aggregation is VariableAggregation.NONE:
            if extended.num_local_replicas > 1:
                raise ValueError(
                    f"{kind} on {self.name} in replica context needs an aggregation with "
                    f"{extended.num_local_replicas} replicas; create the variable with "
                    "aggregation=VariableAggregation.SUM, MEAN or ONLY_FIRST_REPLICA"
                )
            self._apply_to(self._values[0], kind, value)
            return
        context = _context.get_replica_context()
        context.merge_call(_merge_update, args=(self, kind, value))
