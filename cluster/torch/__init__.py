"""``cluster.torch``: PyTorch training on the runtime, DistributedDataParallel's way.

Imported only when used (``import cluster`` never imports torch). In a task of a launched
cluster (not a doctest: it needs the cluster)::

    import cluster, cluster.torch
    strategy = cluster.MultiWorkerMirroredStrategy()                  # one replica per task
    model = make_model().to(cluster.torch.device(strategy))           # this task's GPU, or cpu
    cluster.torch.broadcast_module(model, strategy)                   # rank 0's initial state
    grads = cluster.torch.DistributedGradients(model, strategy)       # hooks + buckets
    for x, y in batches:
        loss_fn(model(x), y).backward()   # bucketed all-reduces start during backward
        grads.synchronize()               # p.grad = the mean over the tasks, in place
        optimizer.step(); optimizer.zero_grad()

- :func:`device`: this task's device: its own GPU (local rank r takes GPU r), or the CPU.
- :class:`DistributedGradients`: gradient averaging overlapped with backward, ``no_sync()`` for
  accumulation, unused parameters handled (:mod:`cluster.torch._gradients`); CPU or CUDA
  models: NCCL among a host's GPUs when each task has its own, else pinned host staging
  (:mod:`cluster.torch._transfer`).
- :func:`broadcast_module`, :func:`broadcast_optimizer_state`: rank 0's state everywhere.
- :class:`StateDict`: a module's or optimizer's ``state_dict`` in a ``cluster.checkpoint``;
  :func:`load_state_dict` reads it back in plain torch.

Strategies: one replica per process (``MultiWorkerMirroredStrategy``, one device per task, or a
single-replica strategy). ``MirroredStrategy`` with several replicas runs them as threads of one
process: there, average each replica's gradients with ``get_replica_context().all_reduce``.
"""

from __future__ import annotations

from cluster.torch._broadcast import broadcast_module, broadcast_optimizer_state
from cluster.torch._device import device
from cluster.torch._gradients import DistributedGradients
from cluster.torch._state import StateDict, load_state_dict
from cluster.torch._transfer import Placement, Transfer

__all__ = [
    "DistributedGradients",
    "Placement",
    "StateDict",
    "Transfer",
    "broadcast_module",
    "broadcast_optimizer_state",
    "device",
    "load_state_dict",
]
