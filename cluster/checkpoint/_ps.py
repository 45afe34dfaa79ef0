"""Checkpoints of parameter-server variables: the coordinator reads the shards and writes.

Design (the choice is between the coordinator reading every shard from the ``ps`` tasks and
each ``ps`` task writing its own shards in parallel): the **coordinator reads**.

- A save pulls every tracked :class:`~cluster.strategies._ps_variables.PsVariable` once, all of
  them together, in one concurrent request per ``ps`` task (:func:`~cluster.strategies.
  _ps_variables.refresh`), and saves each *logical* variable whole (the shards concatenated along
  axis 0) under its nest path, in the one safetensors file of :mod:`cluster.checkpoint._format`.
  The atomic commit (temporary directory, fsync, rename, then the ``checkpoint`` index) stays in
  one process, so a ``kill -9`` of any task mid-save leaves the previous checkpoint readable, with
  no cross-task two-phase commit.
- A restore assigns each saved logical variable through the handle of the *new* cluster, which
  splits it by that cluster's partitioner: a checkpoint written with P ``ps`` tasks restores with
  any other number (re-sharding costs nothing extra).
- Parameter servers need no access to the checkpoint directory (they often have none: a pod's
  disk is not the job's storage); the ``ps`` service only gained reads and writes of optimizer
  slots (below), no file handling.

The cost is one copy of the model through the coordinator's network link; the ps-writes design
would spread that over the ps tasks' links and disks. docs/benchmarks/checkpoint.md has the figures.

Optimizer state: the slots a parameter server keeps next to each shard (momentum, Adam's
``m``/``v``) are read and saved the same way, whole, as ``<optimizer>/slots/<variable>/<slot>``
(the names the other strategies use), with the per-variable update count (Adam's ``t``) as
``<optimizer>/ps_iterations/<variable>``; a restore writes them to the new shards (the
``ReadSlots``/``WriteSlots`` RPCs of ``proto/ps.proto``), adopting the tracked optimizer on a
variable that has not been pushed to yet, so training resumes bit for bit.

Consistency: values are read as they are when the save runs. Save between steps (after
``coordinator.join()``), as with TF, or a concurrent asynchronous step may be half in the
checkpoint (each shard is read atomically, the set of them is not).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from cluster._ps_values import OptimizerSpec
from cluster.optimizers import Optimizer
from cluster.ps.partitioners import Shard
from cluster.strategies._ps_variables import (
    PsVariable,
    connections_of,
    pulled_values,
    shards_of,
    strategy_of,
)

#: An entry's fields (``_trackables.Entry(*fields)``): name, dtype, shape, read, apply.
EntryFields = tuple[str, np.dtype, tuple[int, ...], Callable[[], np.ndarray],
                    Callable[[np.ndarray], None]]

__all__ = ["EntryFields", "PsSnapshot", "is_ps_variable", "optimizer_restore_entries",
           "optimizer_save_entries"]


def is_ps_variable(variable: Any) -> bool:
    return isinstance(variable, PsVariable)


class PsSnapshot:
    """The values of ``variables`` (parameter-server handles), pulled on the first :meth:`get`,
    all at once: one request per ``ps`` task and strategy, the tasks concurrently."""

    def __init__(self, variables: Sequence[PsVariable]) -> None:
        self._variables = list(variables)
        self._values: dict[int, np.ndarray] | None = None

    def get(self, variable: PsVariable) -> np.ndarray:
        if self._values is None:
            self._values = pulled_values(self._variables)
        return self._values[id(variable)]


def _split(variable: PsVariable, array: np.ndarray) -> list[tuple[Shard, np.ndarray]]:
    """``array`` (the logical variable's shape) cut into ``variable``'s shards."""
    return [(shard, array[shard.offset:shard.offset + shard.shape[0]] if shard.shape else array)
            for shard in shards_of(variable)]


def _spec_of(optimizer: Optimizer) -> OptimizerSpec | None:
    try:
        return OptimizerSpec.from_optimizer(optimizer)
    except TypeError:
        return None  # an optimizer without a parameter-server rule holds no ps state


class _SlotState:
    """The optimizer state of every shard of ``variables``: one ReadSlots per ps task."""

    def __init__(self, variables: Sequence[PsVariable]) -> None:
        self.by_shard: dict[str, tuple] = {}
        by_strategy: dict[int, list[PsVariable]] = {}
        for variable in variables:
            by_strategy.setdefault(id(strategy_of(variable)), []).append(variable)
        for group in by_strategy.values():
            requests: dict[int, list[str]] = {}
            for variable in group:
                for shard in shards_of(variable):
                    requests.setdefault(shard.ps, []).append(shard.name)
            connections = connections_of(group[0])
            self.by_shard.update(connections.read_slots(requests))

    def optimizer(self, variable: PsVariable) -> OptimizerSpec | None:
        return self.by_shard[shards_of(variable)[0].name][0]

    def iterations(self, variable: PsVariable) -> np.ndarray:
        return np.array(self.by_shard[shards_of(variable)[0].name][1], np.int64)

    def slot(self, variable: PsVariable, slot: str) -> np.ndarray:
        parts = [self.by_shard[shard.name][2][slot] for shard in shards_of(variable)]
        return parts[0].copy() if len(parts) == 1 else np.concatenate(parts, axis=0)


def _slot_names(path: str, var_path: str, spec: OptimizerSpec) -> list[tuple[str, str | None]]:
    return ([(f"{path}/slots/{var_path}/{slot}", slot) for slot in spec.slot_names]
            + [(f"{path}/ps_iterations/{var_path}", None)])


def _slot_entry(name: str, variable: PsVariable, spec: OptimizerSpec, slot: str | None,
                read: Any) -> EntryFields:
    def apply(array: np.ndarray) -> None:
        connections = connections_of(variable)
        if slot is None:
            for shard in shards_of(variable):
                connections.write_slots(shard.ps, shard.name, spec, iterations=int(array))
            return
        for shard, rows in _split(variable, np.asarray(array)):
            connections.write_slots(shard.ps, shard.name, spec, slots={slot: rows})

    if slot is None:
        return (name, np.dtype(np.int64), (), read, apply)
    return (name, np.dtype(variable.dtype), tuple(variable.shape), read, apply)


def optimizer_save_entries(leaves: Sequence[tuple[str, Any]]) -> list[EntryFields]:
    """The entries saving the parameter-server optimizer state of the ps variables in
    ``leaves``, for each tracked optimizer. Raises ``ValueError`` when a ps variable has
    optimizer state that no tracked optimizer owns (it could not be named, nor restored)."""
    variables = [(p, v) for p, v in leaves if isinstance(v, PsVariable)]
    if not variables:
        return []
    state = _SlotState([v for _, v in variables])
    optimizers = [(p, o, _spec_of(o)) for p, o in leaves if isinstance(o, Optimizer)]
    entries: list[EntryFields] = []
    for var_path, variable in variables:
        spec = state.optimizer(variable)
        if spec is None:
            continue  # never pushed to: no state
        owner = next((p for p, _, s in optimizers if s == spec), None)
        if owner is None:
            raise ValueError(
                f"Checkpoint: parameter-server variable {var_path} ({variable.name}) has state "
                f"of optimizer {spec}, which no tracked optimizer has; add that optimizer to "
                "the Checkpoint")
        for name, slot in _slot_names(owner, var_path, spec):
            read = (lambda v=variable: state.iterations(v)) if slot is None \
                else (lambda v=variable, s=slot: state.slot(v, s))
            entries.append(_slot_entry(name, variable, spec, slot, read))
    return entries


def optimizer_restore_entries(leaves: Sequence[tuple[str, Any]],
                              names: set[str]) -> list[EntryFields]:
    """The entries restoring the parameter-server optimizer state that checkpoint tensors
    ``names`` hold for the ps variables in ``leaves``."""
    variables = [(p, v) for p, v in leaves if isinstance(v, PsVariable)]
    entries: list[EntryFields] = []
    for path, leaf in leaves:
        spec = _spec_of(leaf) if isinstance(leaf, Optimizer) else None
        if spec is None:
            continue
        for var_path, variable in variables:
            for name, slot in _slot_names(path, var_path, spec):
                if name in names:
                    entries.append(_slot_entry(name, variable, spec, slot, _unreadable))
    return entries


def _unreadable() -> np.ndarray:
    raise AssertionError("restore entries are applied, never read")
