"""``cluster.torch.device()``: the torch device of this task, one GPU per task by default.

What torchrun users write as ``torch.device("cuda", int(os.environ["LOCAL_RANK"]))``, without
an environment variable: the local rank is this task's place among the group's tasks on its
host (in rank order), learnt from the group itself (:func:`local_rank`), so it is right under
``clusterctl``, Kubernetes, Slurm or any launcher that writes ``TF_CONFIG``.
"""

from __future__ import annotations

import logging
import weakref
from typing import Any

import numpy as np
import torch

from cluster.collectives.shm_segment import host_key
from cluster.torch._gradients import group_of

__all__ = ["device", "local_rank"]

log = logging.getLogger("cluster.torch")

_LOCAL: weakref.WeakKeyDictionary[Any, tuple[int, int]] = weakref.WeakKeyDictionary()
"""group -> (local rank, tasks on this host): learnt once per group."""
_LOGGED: set[str] = set()


def local_rank(group: Any) -> tuple[int, int]:
    """``(local rank, local size)`` of this rank in ``group``: its index among the group's
    ranks on the same host (in rank order), and how many there are.

    The first call for a group of several ranks is a collective (every rank sends 32 bytes
    that identify its host): every rank makes it at the same point. Later calls are free.
    """
    cached = _LOCAL.get(group)
    if cached is not None:
        return cached
    if group.world_size == 1:
        result = (0, 1)
    else:
        mine = np.frombuffer(host_key(), np.uint8).reshape(1, -1)
        keys = np.asarray(group.all_gather(mine))
        same = [r for r in range(group.world_size) if np.array_equal(keys[r], keys[group.rank])]
        result = (same.index(group.rank), len(same))
    _LOCAL[group] = result
    return result


def device(strategy: Any = None) -> torch.device:
    """This task's torch device, made torch's current CUDA device: ``cuda:i`` when torch sees
    a GPU, else ``cpu``.

    >>> model = make_model().to(cluster.torch.device(strategy))  # doctest: +SKIP

    - ``i`` is the strategy's own GPU when it has exactly one (a task whose replica is
      ``/gpu:i``); otherwise the task's local rank (its place among the tasks on its host)
      modulo the GPUs torch sees, which are what ``CUDA_VISIBLE_DEVICES`` leaves it (Slurm and
      Kubernetes narrow it per task; then every task has its GPU 0). With G GPUs and G tasks
      on a host, task r takes GPU r: the torchrun layout, where the gradients of
      :class:`~cluster.torch.DistributedGradients` go through NCCL. With more tasks than GPUs,
      tasks share them (gradients then go through pinned host memory); the decision and its
      reason are logged once at INFO.
    - ``strategy`` (default: the current one) must have one replica per process (as for
      :class:`~cluster.torch.DistributedGradients`; ``ValueError`` otherwise). The first call
      in a task of several is a collective (see :func:`local_rank`): make it on every task at
      the same point, e.g. right after creating the strategy.
    """
    group = group_of(strategy, "cluster.torch.device")
    rank, size = local_rank(group)  # on every machine alike: every task takes part
    if not torch.cuda.is_available():
        return torch.device("cpu")
    if strategy is None:
        import cluster  # the current strategy, as group_of found it

        strategy = cluster.get_strategy()
    gpus = [d.index for d in strategy.extended.devices if d.is_gpu]
    count = torch.cuda.device_count()
    if len(gpus) == 1 and gpus[0] < count:
        index, why = gpus[0], f"the strategy's replica is /gpu:{gpus[0]}"
    else:
        index = rank % count
        why = (f"local rank {rank} of {size} on this host, {count} GPU(s) visible"
               + (f": {size} tasks share {count} GPU(s)" if size > count else ""))
    torch.cuda.set_device(index)
    chosen = torch.device("cuda", index)
    if str(chosen) not in _LOGGED:
        _LOGGED.add(str(chosen))
        log.info("cluster.torch: this task uses %s (%s)", chosen, why)
    return chosen
