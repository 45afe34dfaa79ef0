"""The collectives of a distributed Keras model (torch backend), over the strategy's group.

- :func:`sum_gradients`: each task's gradients, weighted by its share of the global batch, summed
  over the tasks in one all-reduce. Keras' losses average over the rows they see
  (``sum_over_batch_size``), so task ``i``'s gradient is the mean over its ``n_i`` rows; weighting
  it by ``n_i / B`` and summing gives the mean over the ``B`` rows of the global batch: one
  process's gradient on the same batch, uneven shares included.
- :func:`sum_metric_updates`: what one step added to each metric variable (totals, counts,
  confusion counts), summed over the tasks, so every task's metric state is the global one.
- :func:`broadcast_variables`, :func:`broadcast_rng`: the chief's values, bitwise, everywhere.

Every task calls each function in the same order with variables of the same shapes (the same
model): these are collectives. Results are bitwise identical on every task.
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from typing import Any

import numpy as np
import torch

__all__ = ["broadcast_rng", "broadcast_variables", "rng_state", "set_rng_state", "snapshot",
           "sum_gradients", "sum_metric_updates"]


def _tensor(variable: Any) -> torch.Tensor:
    """The torch tensor behind a Keras variable (or a torch tensor itself)."""
    return variable.value if hasattr(variable, "value") else variable


def sum_gradients(group: Any, gradients: Sequence[Any], variables: Sequence[Any],
                  weight: float) -> list[torch.Tensor]:
    """``sum over tasks of weight_task * gradient_task``, one tensor per variable.

    A ``None`` gradient (a variable this task's loss did not reach) counts as zeros, so every
    task contributes the same layout."""
    if len(gradients) != len(variables):
        raise ValueError(f"optimizer.apply: {len(gradients)} gradients for {len(variables)} "
                         "variables")
    parts = []
    for gradient, variable in zip(gradients, variables, strict=True):
        target = _tensor(variable)
        if gradient is None:
            parts.append(torch.zeros(target.numel(), dtype=torch.float32))
        else:
            parts.append(gradient.detach().reshape(-1).to("cpu", torch.float32))
    flat = torch.cat(parts)
    if weight != 1.0:
        flat.mul_(weight)
    summed = torch.from_numpy(np.asarray(group.all_reduce(flat.numpy(), "SUM")))
    out, offset = [], 0
    for variable in variables:
        target = _tensor(variable)
        n = target.numel()
        out.append(summed[offset:offset + n].view(target.shape)
                   .to(target.device, target.dtype))
        offset += n
    return out


def snapshot(variables: Sequence[Any]) -> list[torch.Tensor]:
    """Copies of the variables' values (the state a step's metric updates start from)."""
    return [_tensor(v).detach().clone() for v in variables]


def sum_metric_updates(group: Any, variables: Sequence[Any],
                       before: Sequence[torch.Tensor]) -> None:
    """Set each variable to ``before + sum over tasks of (its value - before)``, in float64
    for the sum (counts stay exact)."""
    if not variables:
        return
    deltas = [(_tensor(v).detach().to("cpu", torch.float64) - b.to("cpu", torch.float64))
              .reshape(-1) for v, b in zip(variables, before, strict=True)]
    summed = torch.from_numpy(np.asarray(group.all_reduce(torch.cat(deltas).numpy(), "SUM")))
    offset = 0
    with torch.no_grad():
        for variable, base in zip(variables, before, strict=True):
            target = _tensor(variable)
            n = target.numel()
            delta = summed[offset:offset + n].view(target.shape)
            target.copy_((base.to("cpu", torch.float64) + delta).to(target.dtype))
            offset += n


def _bytes_of(tensor: torch.Tensor) -> torch.Tensor:
    return tensor.detach().to("cpu").contiguous().reshape(-1).view(torch.uint8)


def broadcast_variables(group: Any, variables: Sequence[Any], root: int = 0) -> None:
    """Overwrite the variables in place with task ``root``'s values, bit for bit (one broadcast
    of their bytes, any mix of dtypes)."""
    tensors = list({id(t): t for t in (_tensor(v) for v in variables)}.values())
    if not tensors:
        return
    packed = torch.cat([_bytes_of(t) for t in tensors])
    received = torch.from_numpy(np.asarray(group.broadcast(packed.numpy(), root)))
    if group.rank == root:
        return
    offset = 0
    with torch.no_grad():
        for tensor in tensors:
            n = tensor.numel() * tensor.element_size()
            chunk = received[offset:offset + n].view(tensor.dtype).view(tensor.shape)
            tensor.copy_(chunk)
            offset += n


def rng_state() -> np.ndarray:
    """torch's, NumPy's and Python's global random states as one uint8 array (fixed size)."""
    torch_state = torch.get_rng_state().numpy()
    _, keys, pos, has_gauss, cached = np.random.get_state()
    version, words, gauss_next = random.getstate()
    numbers = np.array([pos, has_gauss, cached, version,
                        np.nan if gauss_next is None else gauss_next], np.float64)
    return np.concatenate([torch_state, np.asarray(keys, np.uint32).view(np.uint8),
                           np.asarray(words, np.uint64).view(np.uint8), numbers.view(np.uint8)])


def set_rng_state(blob: np.ndarray) -> None:
    torch_size = torch.get_rng_state().numel()
    torch.set_rng_state(torch.from_numpy(blob[:torch_size].copy()))
    offset = torch_size
    keys = blob[offset:offset + 624 * 4].view(np.uint32)
    offset += 624 * 4
    words = blob[offset:offset + 625 * 8].view(np.uint64)
    offset += 625 * 8
    pos, has_gauss, cached, version, gauss_next = blob[offset:].view(np.float64)
    np.random.set_state(("MT19937", keys, int(pos), int(has_gauss), float(cached)))
    random.setstate((int(version), tuple(int(w) for w in words),
                     None if np.isnan(gauss_next) else float(gauss_next)))


def broadcast_rng(group: Any, root: int = 0) -> None:
    """torch's, NumPy's and Python's global random states set to task ``root``'s, so the
    shuffles Keras' data adapters draw from them (torch's sampler for arrays, Python's
    ``random`` for a ``PyDataset``, a torch ``DataLoader``'s own sampler) are the same
    permutation on every task: the chief's, which is what one process with the same seed
    draws."""
    received = np.asarray(group.broadcast(rng_state(), root))
    if group.rank != root:
        set_rng_state(received.copy())
