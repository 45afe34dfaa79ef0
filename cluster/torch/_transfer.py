"""How a module's gradients reach the collectives: decided once per module, applied per bucket.

Three ways, one per :class:`Transfer`:

- ``HOST``: CPU tensors. The host collectives (shared memory inside a host, the ring across
  hosts) read them through DLPack and reduce them in place: no copy for a large gradient.
- ``DEVICE``: CUDA tensors handed to the group as they are (DLPack to CuPy, no copy); the group
  runs NCCL among each host's GPUs (:class:`~cluster.collectives.host_nccl.HostNccl`) and the
  ring across hosts. Chosen when every task has CuPy with NCCL and every task sharing a host
  has its own GPU: the torchrun layout.
- ``STAGED``: CUDA tensors copied into one pinned host buffer per bucket (reused every step),
  reduced there in place by the host collectives, copied back. Chosen where NCCL cannot run
  (tasks sharing a GPU, no CuPy, a single task, a group on the network path) and for bfloat16
  buckets (CuPy has no bfloat16).

The decision is a function of facts every rank gathers alike (:func:`choose_transfer`, pure
and table-tested), so every rank hands the group the same kind of values in the same calls.

The CUDA-only lines of the staging live here (:func:`host_buffer`, :func:`copy_stream`,
:func:`wait_for`, :func:`finish_copies`), each a no-op or plain allocation for CPU tensors, so
the same bucket code runs and is tested on the CPU.
"""

from __future__ import annotations

import enum
import logging
import sys
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from cluster.collectives.options import CommunicationImplementation

__all__ = [
    "Placement",
    "Transfer",
    "choose_transfer",
    "copy_stream",
    "finish_copies",
    "host_buffer",
    "host_view",
    "plan",
    "wait_for",
]

log = logging.getLogger("cluster.torch")


class Transfer(enum.Enum):
    """How one bucket's gradients travel (see the module doc)."""

    HOST = "host"
    DEVICE = "device"
    STAGED = "staged"


@dataclass(frozen=True)
class Placement:
    """Where a module's parameters live and how their gradients travel, with the reason (logged
    once per module, shown in ``repr``)."""

    device: torch.device
    transfer: Transfer
    reason: str

    def for_dtype(self, dtype: torch.dtype) -> Transfer:
        """The transfer of a bucket of ``dtype``: bfloat16 is staged where the module's
        gradients would go to NCCL (CuPy, which carries them there, has no bfloat16)."""
        if self.transfer is Transfer.DEVICE and dtype == torch.bfloat16:
            return Transfer.STAGED
        return self.transfer


def choose_transfer(device_type: str, world_size: int, gpus: Sequence[int],
                    nccl: Sequence[bool], hosts: Sequence[Sequence[int]] | None,
                    ring: bool) -> tuple[Transfer, str]:
    """``(transfer, reason)`` for parameters on ``device_type`` (``"cpu"``, ``"cuda"``).

    ``gpus[r]``/``nccl[r]``: rank ``r``'s GPU index and whether CuPy with NCCL works there;
    ``hosts``: the group's hosts as its set-up found them (ranks sharing memory), ``None`` when
    it never set them up; ``ring``: the group's options force the network ring. Every rank
    passes the same values, so every rank decides alike.

    >>> choose_transfer("cuda", 2, [0, 1], [True, True], [(0, 1)], False)[0]
    <Transfer.DEVICE: 'device'>
    >>> choose_transfer("cuda", 2, [0, 0], [True, True], [(0, 1)], False)
    (<Transfer.STAGED: 'staged'>, 'ranks 0 and 1 share GPU 0 (NCCL needs one GPU per task)')
    """
    if device_type == "cpu":
        return Transfer.HOST, "CPU tensors, reduced in place by the host collectives"
    if world_size == 1:
        return Transfer.STAGED, "one task: nothing crosses a GPU boundary"
    missing = [r for r, ok in enumerate(nccl) if not ok]
    if missing:
        return Transfer.STAGED, (f"CuPy with NCCL is not usable on rank(s) "
                                 f"{', '.join(map(str, missing))}")
    if ring or hosts is None:
        return Transfer.STAGED, "the group runs on the network path"
    if len(hosts) > 1 and not any(len(h) > 1 for h in hosts):
        return Transfer.STAGED, ("no two tasks share a host's memory: the network ring "
                                 "carries host memory")
    for host in hosts:
        seen: dict[int, int] = {}
        for rank in host:
            gpu = gpus[rank]
            if gpu in seen:
                return Transfer.STAGED, (f"ranks {seen[gpu]} and {rank} share GPU {gpu} "
                                         "(NCCL needs one GPU per task)")
            seen[gpu] = rank
    return Transfer.DEVICE, "NCCL among each host's GPUs, one GPU per task"


def plan(device: torch.device, group: Any) -> Placement:
    """The :class:`Placement` of a module on ``device`` in ``group``, logged once at INFO.

    For CUDA parameters in a group of several ranks this is a collective (one small
    ``all_gather`` of each rank's GPU and NCCL availability): every rank calls it at the same
    point. CPU parameters need no communication.
    """
    gpus: list[int] = []
    nccl: list[bool] = []
    hosts = None
    ring = group.options.implementation is CommunicationImplementation.RING
    if device.type == "cuda" and group.world_size > 1:
        mine = np.array([[torch.cuda.current_device() if device.index is None else device.index,
                          int(_nccl_available())]], np.int64)
        table = np.asarray(group.all_gather(mine))  # also sets up the group's hosts
        gpus, nccl = [int(g) for g in table[:, 0]], [bool(ok) for ok in table[:, 1]]
        topology = group.topology
        hosts = None if topology is None else topology.hosts
    transfer, reason = choose_transfer(device.type, group.world_size, gpus, nccl, hosts, ring)
    placement = Placement(device, transfer, reason)
    if device.type != "cpu":
        log.info("cluster.torch: gradients on %s travel %s: %s", device,
                 "through NCCL" if transfer is Transfer.DEVICE
                 else "through pinned host buffers", reason)
    return placement


def _nccl_available() -> bool:
    from cluster.collectives import nccl  # imports CuPy when present: only for CUDA models

    return nccl.available()


# -- staging: the CUDA-specific lines, no-ops on the CPU -------------------------------------


def host_buffer(numel: int, dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    """A zeroed host tensor of ``numel`` items, page-locked when ``device`` is a GPU (copies
    between pinned memory and the GPU run asynchronously, at full bus speed)."""
    return torch.empty(numel, dtype=dtype, pin_memory=device.type == "cuda").zero_()


def copy_stream(device: torch.device) -> Any:
    """The stream a copy issued now on ``device`` runs on (the current CUDA stream), or
    ``None`` on the CPU, where copies are done when they return."""
    return torch.cuda.current_stream(device) if device.type == "cuda" else None


def wait_for(streams: Iterable[Any]) -> None:
    """Block until the work issued so far on ``streams`` (from :func:`copy_stream`) is done,
    so that host code may read what was copied there."""
    for stream in streams:
        if stream is not None:
            stream.synchronize()


def finish_copies(device: torch.device) -> None:
    """Block until the copies issued on ``device``'s current stream are done (a pinned buffer
    may then be written again)."""
    if device.type == "cuda":
        torch.cuda.current_stream(device).synchronize()


def host_view(tensor: torch.Tensor) -> np.ndarray:
    """A NumPy view of host ``tensor`` (pinned or not; bfloat16 through ml_dtypes), for the
    collectives' in-place host path. Pinned memory is handed over as NumPy: through DLPack it
    would be announced as CUDA host memory, which the collectives take for a GPU value."""
    if tensor.dtype == torch.bfloat16:
        return tensor.view(torch.int16).numpy().view(_bfloat16())
    return tensor.numpy()


def _bfloat16() -> Any:
    ml_dtypes = sys.modules.get("ml_dtypes")
    if ml_dtypes is None:
        import ml_dtypes  # the 'torch' extra brings it: bfloat16 for NumPy
    return ml_dtypes.bfloat16
