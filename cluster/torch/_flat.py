"""A torch ``state_dict`` as named tensors plus a JSON description, and back.

The one encoding shared by the optimizer broadcast and the checkpoint trackable (no pickle):

- a module's ``state_dict()`` is already ``{name: tensor}``: names are kept, and the description
  is ``{"kind": "module"}``;
- an optimizer's ``state_dict()`` is ``{"state": {index: {key: tensor | number}},
  "param_groups": [...]}``: tensors are named ``state.<index>.<key>``; numbers in the state and
  the whole ``param_groups`` (hyperparameters and parameter indices) go into the description.

:func:`unflatten` rebuilds exactly what ``load_state_dict`` takes.
"""

from __future__ import annotations

import json
from typing import Any

import torch

__all__ = ["decode", "encode", "flatten", "kind_of", "unflatten"]


def kind_of(obj: Any, what: str) -> str:
    """``"module"`` or ``"optimizer"``; ``TypeError`` naming ``what`` for anything else."""
    if isinstance(obj, torch.nn.Module):
        return "module"
    if isinstance(obj, torch.optim.Optimizer):
        return "optimizer"
    raise TypeError(f"{what} takes a torch.nn.Module or a torch.optim.Optimizer, got "
                    f"{type(obj).__module__}.{type(obj).__qualname__}")


def flatten(obj: Any, what: str) -> tuple[dict[str, torch.Tensor], dict[str, Any]]:
    """``(tensors, description)`` of ``obj.state_dict()`` (module or optimizer).

    Tensors are the state's own (detached, not copied). Raises ``TypeError`` for state this
    encoding cannot carry (a non-tensor module entry, a non-JSON hyperparameter).
    """
    state = obj.state_dict()
    if kind_of(obj, what) == "module":
        for name, value in state.items():
            if not isinstance(value, torch.Tensor):
                raise TypeError(f"{what}: module state {name!r} is a {type(value).__name__}, "
                                "not a tensor (get_extra_state is not supported)")
        return {name: value.detach() for name, value in state.items()}, {"kind": "module"}
    tensors: dict[str, torch.Tensor] = {}
    numbers: dict[str, Any] = {}
    for index, entries in state["state"].items():
        for key, value in entries.items():
            name = f"state.{index}.{key}"
            if isinstance(value, torch.Tensor):
                tensors[name] = value.detach()
            else:
                numbers[name] = value
    description = {"kind": "optimizer", "numbers": numbers,
                   "param_groups": state["param_groups"]}
    try:
        json.dumps(description)
    except TypeError as e:
        raise TypeError(f"{what}: the optimizer's param_groups or state hold a value JSON cannot "
                        f"carry ({e}); use numbers, strings, bools, None and lists") from e
    return tensors, description


def unflatten(tensors: dict[str, torch.Tensor], description: dict[str, Any]) -> dict[str, Any]:
    """The ``state_dict`` that :func:`flatten` described."""
    if description["kind"] == "module":
        return dict(tensors)
    state: dict[int, dict[str, Any]] = {}
    for name, value in [*tensors.items(), *description["numbers"].items()]:
        _, index, key = name.split(".", 2)
        state.setdefault(int(index), {})[key] = value
    groups = [dict(g, params=list(g["params"])) for g in description["param_groups"]]
    return {"state": state, "param_groups": groups}


def encode(description: dict[str, Any]) -> torch.Tensor:
    """The description as a uint8 tensor of JSON (to travel with the tensors)."""
    return torch.frombuffer(bytearray(json.dumps(description, sort_keys=True).encode()),
                            dtype=torch.uint8)


def decode(data: Any) -> dict[str, Any]:
    """The description :func:`encode` wrote (from a uint8 tensor or NumPy array)."""
    raw = data.numpy().tobytes() if isinstance(data, torch.Tensor) else bytes(data)
    return json.loads(raw.decode())
