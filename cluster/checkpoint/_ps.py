"""Checkpoints of parameter-server variables: the coordinator reads the shards and writes.

Design (issue 17 asks to choose between the coordinator reading every shard from the ``ps``
tasks and each ``ps`` task writing its own shards in parallel): the **coordinator reads**.

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
  disk is not the job's storage), and the ``ps`` service needs no new RPC.

The cost is one copy of the model through the coordinator's network link; the ps-writes design
would spread that over the ps tasks' links and disks. See the README for the figures.

Not saved: the optimizer slots that a parameter server keeps next to its variables (momentum,
Adam's ``m``/``v``, the per-variable step count). A checkpoint that tracks an optimizer with
slots together with parameter-server variables is refused (:func:`check_optimizers`) rather than
saved without them, which would silently change training on resume.

Consistency: values are read as they are when the save runs. Save between steps (after
``coordinator.join()``), as with TF, or a concurrent asynchronous step may be half in the
checkpoint (each shard is read atomically, the set of them is not).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from cluster.optimizers import Optimizer
from cluster.strategies._ps_variables import PsVariable, refresh

__all__ = ["PsSnapshot", "check_optimizers", "is_ps_variable"]


def is_ps_variable(variable: Any) -> bool:
    return isinstance(variable, PsVariable)


class PsSnapshot:
    """The values of ``variables`` (parameter-server handles), pulled on the first :meth:`get`,
    all at once: one request per ``ps`` task and strategy, the tasks concurrently."""

    def __init__(self, variables: Sequence[PsVariable]) -> None:
        self._variables = list(variables)
        self._values: dict[int, np.ndarray] | None = None

    def _pull(self) -> dict[int, np.ndarray]:
        by_strategy: dict[int, list[PsVariable]] = {}
        for variable in self._variables:
            by_strategy.setdefault(id(variable._strategy), []).append(variable)
        values: dict[int, np.ndarray] = {}
        for group in by_strategy.values():
            refresh(group)  # pulls every shard newer than the handle's cached one
            for variable in group:
                with variable._lock:
                    assert variable._value is not None  # refresh pulled every shard
                    values[id(variable)] = np.array(variable._value, copy=True)
        return values

    def get(self, variable: PsVariable) -> np.ndarray:
        if self._values is None:
            self._values = self._pull()
        return self._values[id(variable)]


def check_optimizers(leaves: Sequence[tuple[str, Any]]) -> None:
    """Raise ``TypeError`` when ``leaves`` hold parameter-server variables and an optimizer with
    slots: those slots live on the ps tasks and are not saved (see the module docstring)."""
    ps_paths = [p for p, v in leaves if isinstance(v, PsVariable)]
    if not ps_paths:
        return
    for path, leaf in leaves:
        if isinstance(leaf, Optimizer) and leaf._slot_names():
            raise TypeError(
                f"Checkpoint: optimizer {leaf.name} at {path} keeps slots "
                f"({', '.join(leaf._slot_names())}) on the parameter servers for "
                f"{', '.join(ps_paths)}, and checkpoints of ParameterServerStrategy do not save "
                "parameter-server optimizer slots yet; track the variables without this "
                "optimizer, or use an optimizer without slots (SGD without momentum)")
