"""A distributed Keras model's training state as a ``cluster.checkpoint`` trackable.

Tensor names in the checkpoint (``path`` is where the trackable sits in the ``Checkpoint``):

============================  ===================================================================
``path/model/<i>``            ``model.variables[i]`` (weights, non-trainable state, seed states)
``path/optimizer/<i>``        ``optimizer.variables[i]`` (iterations, learning rate, slots)
``path/metrics/<i>``          ``model.metrics_variables[i]`` (totals and counts so far this epoch)
``path/random``               the global random states (torch, NumPy, Python) the epoch's shuffle
                              starts from, as bytes (:func:`cluster.keras._sync.rng_state`)
``path/position``             int64 ``[epoch, step]``: the next step to run
============================  ===================================================================

Save reads the live variables; restore checks every name, dtype and shape first (``ValueError``
naming the first mismatch, nothing changed), then writes the model's and the optimizer's
variables in place and hands the rest (metrics, random state, position) to the caller, which
applies them when ``fit`` reaches that epoch.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

from cluster.checkpoint._trackables import Entry

__all__ = ["KerasState"]


def _numpy(variable: Any) -> np.ndarray:
    return variable.value.detach().to("cpu").numpy()


class KerasState:
    """``model``'s variables, its optimizer's, its metrics', the random state and the position
    in ``fit``, for a :class:`~cluster.checkpoint.Checkpoint` under ``strategy`` (whose chief
    writes)."""

    def __init__(self, model: Any, strategy: Any) -> None:
        self.model = model
        self._distribute_strategy = strategy
        self.random = np.zeros(0, np.uint8)
        self.position = np.zeros(2, np.int64)
        self.restored: dict[str, Any] | None = None  # metrics, random, position once restored

    def __repr__(self) -> str:
        return f"KerasState({type(self.model).__name__})"

    def _groups(self) -> dict[str, list[Any]]:
        optimizer = self.model.optimizer
        return {"model": list(self.model.variables),
                "optimizer": list(optimizer.variables) if optimizer is not None else [],
                "metrics": list(self.model.metrics_variables)}

    def _checkpoint_save(self, path: str) -> list[Entry]:
        entries = [Entry(f"{path}/{group}/{i}", _numpy(v).dtype, tuple(v.shape),
                         lambda v=v: _numpy(v), _ignore)
                   for group, variables in self._groups().items()
                   for i, v in enumerate(variables)]
        for name in ("random", "position"):
            value = getattr(self, name)
            entries.append(Entry(f"{path}/{name}", value.dtype, value.shape,
                                 lambda value=value: value, _ignore))
        return entries

    def _checkpoint_restore(self, path: str, saved: dict[str, np.ndarray]) -> list[Entry]:
        groups = self._groups()
        wanted = {f"{group}/{i}" for group, vs in groups.items() for i in range(len(vs))}
        wanted |= {"random", "position"}
        if set(saved) != wanted:
            missing, extra = sorted(wanted - set(saved)), sorted(set(saved) - wanted)
            raise ValueError(f"Checkpoint: the Keras model at {path} does not match the "
                             f"checkpoint (a different model or optimizer?): missing {missing}, "
                             f"not in the model {extra}")
        restored: dict[str, Any] = {"metrics": []}
        entries = []
        for group, variables in groups.items():
            for i, variable in enumerate(variables):
                array = saved[f"{group}/{i}"]
                if group == "metrics":
                    restored["metrics"].append(array)
                    apply = _ignore
                else:
                    apply = _writer(variable)
                entries.append(Entry(f"{path}/{group}/{i}", _numpy(variable).dtype,
                                     tuple(variable.shape), lambda v=variable: _numpy(v), apply))

        def keep(name: str) -> Any:
            def apply(array: np.ndarray) -> None:
                restored[name] = np.array(array)
                if name == "position":  # last: every check has passed by then
                    self.restored = restored
            return apply

        for name in ("random", "position"):
            entries.append(Entry(f"{path}/{name}", saved[name].dtype, tuple(saved[name].shape),
                                 lambda name=name: saved[name], keep(name)))
        return entries


def _writer(variable: Any) -> Any:
    def write(array: np.ndarray) -> None:
        with torch.no_grad():
            variable.value.copy_(torch.from_numpy(np.array(array)))
    return write


def _ignore(_: np.ndarray) -> None:
    """``apply`` of an entry the caller applies itself (or a saved-only value)."""
