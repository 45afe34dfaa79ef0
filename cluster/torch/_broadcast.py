"""Rank 0's model and optimizer state on every process: ``broadcast_module`` and
``broadcast_optimizer_state``.

Both send bytes: every tensor is viewed as ``uint8`` and packed into one buffer, so a whole
module (any mix of dtypes: float parameters, int64 counters, bool masks) is one broadcast, and
the copies on the other ranks are bitwise rank 0's. Tensors may be on the CPU or on GPUs: the
root packs them where they are and copies the bytes to the host once; the other ranks copy what
they receive onto each tensor's device once per device.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

from cluster.torch import _flat
from cluster.torch._gradients import group_of

__all__ = ["broadcast_module", "broadcast_optimizer_state", "broadcast_tensors"]


def _bytes_of(tensor: torch.Tensor) -> torch.Tensor:
    return tensor.detach().contiguous().reshape(-1).view(torch.uint8)


def _packed_on_host(tensors: list[torch.Tensor]) -> torch.Tensor:
    """The bytes of ``tensors``, concatenated, in host memory: packed on their device when they
    share one (a single copy off a GPU), else copied one by one."""
    parts = [_bytes_of(t) for t in tensors]
    if len({p.device for p in parts}) == 1:
        return torch.cat(parts).cpu()  # .cpu() of a CPU tensor is the tensor itself
    return torch.cat([p.cpu() for p in parts])


def broadcast_tensors(tensors: list[torch.Tensor], group: Any, root: int = 0) -> None:
    """Overwrite ``tensors`` (on any devices) in place with ``root``'s (one broadcast of their
    bytes).

    Every rank passes tensors of the same dtypes and shapes in the same order; a rank whose
    total size differs fails the collective with the group's mismatch error.
    """
    if not tensors:
        return
    if group.rank == root:
        packed = _packed_on_host(tensors)
    else:  # only the size matters here
        packed = torch.empty(sum(t.numel() * t.element_size() for t in tensors),
                             dtype=torch.uint8)
    received = torch.from_numpy(np.asarray(group.broadcast(packed.numpy(), root)))
    if group.rank == root:
        return  # already root's values, bit for bit
    on_device = {device: received.to(device)  # one copy per device
                 for device in {t.device for t in tensors}}
    offset = 0
    with torch.no_grad():
        for tensor in tensors:
            n = tensor.numel() * tensor.element_size()
            chunk = on_device[tensor.device][offset:offset + n]
            tensor.copy_(chunk.view(tensor.dtype).view(tensor.shape))
            offset += n


def broadcast_module(module: torch.nn.Module, strategy: Any = None, root: int = 0) -> None:
    """Make every process's ``module`` parameters and buffers bitwise equal to rank ``root``'s
    (rank 0: the chief, else worker 0), in place. Call it on every process, after building the
    model and before the first step (DDP does it in its constructor).

    Raises ``ValueError`` for a strategy without one replica per process (see
    :class:`~cluster.torch.DistributedGradients`).
    """
    group = group_of(strategy, "broadcast_module")
    tensors = [t for t in (*module.parameters(), *module.buffers())]
    unique = list({id(t): t for t in tensors}.values())  # shared ones once
    broadcast_tensors([t.data for t in unique], group, root)


def broadcast_optimizer_state(optimizer: torch.optim.Optimizer, strategy: Any = None,
                              root: int = 0) -> None:
    """Load rank ``root``'s optimizer state (``state_dict``: slots such as Adam's moments, step
    counts, and hyperparameters) into every process's ``optimizer``.

    Works whether or not the other ranks' optimizers have state yet (rank 0 resumed from a
    checkpoint, the others fresh): rank ``root``'s description travels first (two small
    broadcasts), then its tensors in one. The optimizers must be over parameters of the same
    shapes in the same order. Rank ``root``'s optimizer is not changed.
    """
    group = group_of(strategy, "broadcast_optimizer_state")
    tensors, description = _flat.flatten(optimizer, "broadcast_optimizer_state")
    description["layout"] = [[name, str(t.dtype).removeprefix("torch."), list(t.shape)]
                             for name, t in tensors.items()]
    header = _flat.encode(description)
    length = int(group.broadcast(np.array([header.numel()], np.int64), root)[0])
    if group.rank != root:
        header = torch.zeros(length, dtype=torch.uint8)
    header = torch.from_numpy(np.asarray(group.broadcast(header.numpy(), root)))
    if group.rank == root:
        broadcast_tensors(list(tensors.values()), group, root)
        return
    description = _flat.decode(header)
    received = {name: torch.empty(shape, dtype=getattr(torch, dtype))
                for name, dtype, shape in description.pop("layout")}
    broadcast_tensors(list(received.values()), group, root)
    optimizer.load_state_dict(_flat.unflatten(received, description))
