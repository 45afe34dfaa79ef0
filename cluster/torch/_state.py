"""``StateDict``: a torch module's or optimizer's ``state_dict`` as a ``cluster.checkpoint``
trackable, and :func:`load_state_dict` to read one back without the runtime.

Tensor names in the checkpoint (``path`` is where the trackable sits in the ``Checkpoint``):

=====================================  =========================================================
``model/fc1.weight``                   a module's ``state_dict()`` entry, under its own name
``optimizer/state.0.exp_avg``          an optimizer's state tensor (parameter index, key)
``optimizer/description.json``         the optimizer's ``param_groups`` and non-tensor state, as
                                       UTF-8 JSON bytes (a uint8 tensor; no pickle)
=====================================  =========================================================

A checkpoint is a directory with a safetensors file, so a module's state loads in plain torch
too: ``safetensors.torch.load_file(f"{ckpt}/tensors.safetensors")``, keep the ``model/`` names,
strip the prefix (what :func:`load_state_dict` does, for optimizers too).
"""

from __future__ import annotations

import os
from typing import Any

import numpy as np
import torch

from cluster._family import to_array
from cluster.checkpoint._trackables import Entry
from cluster.torch import _flat

__all__ = ["DESCRIPTION", "StateDict", "load_state_dict"]

DESCRIPTION = "description.json"
"""The name (under the trackable's path) of an optimizer's JSON description."""


def _numpy(tensor: torch.Tensor) -> np.ndarray:
    """``tensor``'s values as NumPy: a view of a CPU tensor, a host copy of a GPU one."""
    return to_array(tensor.detach().cpu(), "checkpoint")[0]


def _dtype(tensor: torch.Tensor) -> np.dtype:
    """``tensor``'s NumPy dtype, without copying it off its device."""
    return _numpy(torch.empty(0, dtype=tensor.dtype)).dtype


def _torch(array: np.ndarray) -> torch.Tensor:
    array = np.array(array)  # a private, writable copy (checkpoint arrays may be read-only)
    if array.dtype.name == "bfloat16":
        return torch.from_numpy(array.view(np.int16)).view(torch.bfloat16)
    return torch.from_numpy(array)


class StateDict:
    """Track ``obj.state_dict()`` (a ``torch.nn.Module`` or ``torch.optim.Optimizer``) in a
    :class:`~cluster.checkpoint.Checkpoint`:

    >>> ckpt = Checkpoint(model=StateDict(model, strategy),                 # doctest: +SKIP
    ...                   optimizer=StateDict(optimizer, strategy), step=step)

    - Save reads the live state (no copy for CPU tensors; a GPU tensor is copied to the host
      when it is written). Under a multi-worker ``strategy``
      (default: the current one) every task calls save and the chief writes, as for variables;
      the replicas are identical (``DistributedGradients``), so the chief's state is everyone's.
    - Restore is strict and all-or-nothing, as for every trackable: the checkpoint must hold
      exactly this module's ``state_dict`` keys with the same dtypes and shapes (``ValueError``
      naming what differs, before anything changes); module tensors are written in place
      (``copy_``, onto whatever device each is on), an optimizer gets ``load_state_dict``
      (state created if it had none yet, on its parameters' devices, as torch places it).
    """

    def __init__(self, obj: Any, strategy: Any = None) -> None:
        self._kind = _flat.kind_of(obj, "StateDict")
        self._obj = obj
        if strategy is None:
            import cluster

            strategy = cluster.get_strategy()
        self._distribute_strategy = strategy  # whose chief writes (cluster.checkpoint._group)

    def __repr__(self) -> str:
        return f"StateDict({type(self._obj).__name__})"

    # -- the checkpoint's protocol (cluster.checkpoint._trackables) ------------------------------

    def _checkpoint_save(self, path: str) -> list[Entry]:
        tensors, description = _flat.flatten(self._obj, f"Checkpoint at {path}")
        entries = [Entry(f"{path}/{name}", _dtype(t), tuple(t.shape),
                         lambda t=t: _numpy(t), _unused)
                   for name, t in tensors.items()]
        if self._kind == "optimizer":
            data = _flat.encode(description).numpy()
            entries.append(Entry(f"{path}/{DESCRIPTION}", data.dtype, data.shape,
                                 lambda: data, _unused))
        return entries

    def _checkpoint_restore(self, path: str, saved: dict[str, np.ndarray]) -> list[Entry]:
        """Entries for ``saved`` (the checkpoint's tensors under ``path/``, prefix removed)."""
        if self._kind == "module":
            return self._restore_module(path, saved)
        return self._restore_optimizer(path, saved)

    def _restore_module(self, path: str, saved: dict[str, np.ndarray]) -> list[Entry]:
        tensors, _ = _flat.flatten(self._obj, f"Checkpoint at {path}")
        _same_names(path, set(tensors), set(saved))

        def apply(tensor: torch.Tensor) -> Any:
            def write(array: np.ndarray) -> None:
                with torch.no_grad():
                    tensor.copy_(_torch(array))
            return write

        return [Entry(f"{path}/{name}", _dtype(t), tuple(t.shape), lambda t=t: _numpy(t),
                      apply(t)) for name, t in tensors.items()]

    def _restore_optimizer(self, path: str, saved: dict[str, np.ndarray]) -> list[Entry]:
        if DESCRIPTION not in saved:
            raise ValueError(f"Checkpoint: {path} holds no optimizer state ({path}/{DESCRIPTION} "
                             "is missing); was it saved from a module?")
        description = _flat.decode(saved[DESCRIPTION])
        if description.get("kind") != "optimizer":
            raise ValueError(f"Checkpoint: {path} was saved from a {description.get('kind')}, "
                             "not an optimizer")
        groups = [len(g["params"]) for g in self._obj.state_dict()["param_groups"]]
        saved_groups = [len(g["params"]) for g in description["param_groups"]]
        if groups != saved_groups:
            raise ValueError(f"Checkpoint: the optimizer at {path} has parameter groups of sizes "
                             f"{groups}, the checkpoint {saved_groups}")
        names = {name for name in saved if name != DESCRIPTION}
        bad = sorted(n for n in names if not n.startswith("state."))
        if bad:
            raise ValueError(f"Checkpoint: {path} has entries an optimizer does not: {bad}")

        def load(_: np.ndarray) -> None:
            state = {name: _torch(saved[name]) for name in names}
            self._obj.load_state_dict(_flat.unflatten(state, description))

        entries = [Entry(f"{path}/{name}", saved[name].dtype, tuple(saved[name].shape),
                         lambda name=name: saved[name], _unused) for name in sorted(names)]
        data = saved[DESCRIPTION]
        entries.append(Entry(f"{path}/{DESCRIPTION}", data.dtype, tuple(data.shape),
                             lambda: data, load))  # last: every check has passed by then
        return entries


def _unused(_: np.ndarray) -> None:
    """``apply`` of a saved entry whose value another entry's ``apply`` loads."""


def _same_names(path: str, wanted: set[str], saved: set[str]) -> None:
    missing, extra = sorted(wanted - saved), sorted(saved - wanted)
    if missing or extra:
        raise ValueError(
            f"Checkpoint: the module at {path} does not match the checkpoint: "
            + "; ".join(part for part in (f"missing {missing}" if missing else "",
                                          f"not in the module {extra}" if extra else "")
                        if part))


def load_state_dict(checkpoint: str | os.PathLike, path: str) -> dict[str, Any]:
    """The torch ``state_dict`` saved at ``path`` (e.g. ``"model"``) in checkpoint directory
    ``checkpoint``: ``module.load_state_dict(load_state_dict(ckpt, "model"))`` in plain torch,
    no strategy needed. Raises ``KeyError`` when nothing was saved under ``path``."""
    from cluster.checkpoint import _format

    tensors, _ = _format.read_checkpoint(os.fspath(checkpoint))
    prefix = f"{path}/"
    saved = {k[len(prefix):]: v for k, v in tensors.items() if k.startswith(prefix)}
    if not saved:
        raise KeyError(f"checkpoint {checkpoint} holds nothing under {path!r}")
    if DESCRIPTION not in saved:
        return {name: _torch(array) for name, array in saved.items()}
    description = _flat.decode(saved.pop(DESCRIPTION))
    return _flat.unflatten({n: _torch(a) for n, a in saved.items()}, description)
