"""NCCL among the co-located ranks of one host, one GPU per rank, set up through shared memory.

:class:`HostNccl` wraps one :class:`~cluster.collectives.nccl.NcclComm` per local rank. Its
communicator is built lazily, by the first :meth:`HostNccl.ready`, which is itself a collective
of the local ranks (over their
:class:`~cluster.collectives.shared_memory.SharedMemoryCollectives`): they learn each other's
GPU and whether NCCL works there, agree on one answer, and, when it is yes, local rank 0's NCCL
unique id reaches the others through the shared-memory arena. No network is used.

>>> host = HostNccl(shm_collectives, timeout_seconds=60)  # doctest: +SKIP
>>> if host.ready(call.seq, signature, device, call.deadline):  # doctest: +SKIP
...     total = host.all_reduce(x, "SUM")
"""

from __future__ import annotations

import logging
import re
from collections.abc import Sequence
from typing import Any

import numpy as np

from cluster.collectives import nccl
from cluster.collectives.ops import ReduceOp
from cluster.collectives.shared_memory import SharedMemoryCollectives
from cluster.deadline import Deadline

__all__ = ["HostNccl", "nccl_decision"]

log = logging.getLogger(__name__)

_NO_GPU_ID = -1  # in the gathered table: this rank's GPU has no known PCI address


class HostNccl:
    """NCCL among the co-located ranks of one host, one GPU per rank; set up lazily, once.

    One instance per local rank, over that rank's ``local`` collectives. Call :meth:`ready` on
    every local rank at the same point; when it returns True, :meth:`all_reduce` and
    :meth:`broadcast` run on NCCL among the ``local.size`` ranks (all ranks must then make the
    same calls in the same order with equally shaped arrays of one dtype; NCCL cannot check
    this, ``timeout_seconds`` bounds the hang a disagreement causes). ``timeout_seconds`` is
    handed to :class:`~cluster.collectives.nccl.NcclComm` and bounds each operation; ``None``
    waits without limit. Not thread-safe: each rank drives its instance from one thread at a
    time, as it does its collective group.
    """

    def __init__(self, local: SharedMemoryCollectives, *,
                 timeout_seconds: float | None = None) -> None:
        self._local = local
        self._timeout = timeout_seconds
        self._answer: bool | None = None  # set once by the first ready() that completes
        self._device: int | None = None  # the GPU the first ready() was given
        self._comm: nccl.NcclComm | None = None
        self._failed: str | None = None  # why the set-up failed part-way, if it did
        self._closed = False

    def __repr__(self) -> str:
        state = ("closed" if self._closed else "not set up" if self._answer is None
                 else f"GPU {self._device}, NCCL {'on' if self._answer else 'off'}")
        return f"HostNccl(local rank {self._local.rank} of {self._local.size}, {state})"

    @property
    def comm(self) -> nccl.NcclComm | None:
        """The communicator once :meth:`ready` returned True; ``None`` before or otherwise."""
        return self._comm

    def ready(self, seq: int, signature: str, device: int, deadline: Deadline) -> bool:
        """Whether NCCL is usable among the local ranks, with this rank on GPU ``device``.

        A collective of the local ranks: all must call it at the same point with the same
        ``seq``/``signature`` (those of the enclosing collective; ranks that disagree get
        ``CollectiveMismatchError`` from the arena). The first call all-gathers each rank's
        ``device``, the PCI address of that GPU (``CUDA_VISIBLE_DEVICES`` may show each task
        a different GPU as device 0) and whether :func:`nccl.available` holds there; NCCL is
        usable only if it holds on every rank and the GPUs are distinct (NCCL refuses two
        ranks on one GPU): see :func:`nccl_decision`. Local rank 0 logs the decision and its
        reason once, at INFO. If usable, local rank 0 makes a unique id, the others receive it
        by a shared-memory broadcast, and every rank builds
        ``NcclComm(local.size, uid, local.rank, device)`` (which blocks until all have joined;
        NCCL's init has no deadline). The answer is the same on every local rank.

        Later calls return the cached answer without communicating. ``device`` is fixed for
        the life of the instance: a different one raises ``ValueError`` (on that rank only;
        the others go on, so NCCL's ``timeout_seconds`` is what ends their wait). Raises
        ``TypeError``/``ValueError`` for a ``device`` that is not an int >= 0 (before any
        communication), ``ValueError`` after :meth:`close` or once the communicator was aborted
        (an operation timed out or failed), ``RuntimeError`` if an earlier first call failed
        part-way (the ranks may no longer be in step; retrying would hang or mismatch); errors
        of the local collectives (timeout, mismatch, a dead peer) pass through.
        """
        # Checked before communicating: a bad argument is this rank's bug, not the group's.
        if isinstance(device, bool) or not isinstance(device, int | np.integer):
            raise TypeError(f"device must be a GPU id (an int), got {device!r}")
        if device < 0:
            raise ValueError(f"device must be a GPU id >= 0, got {device}")
        device = int(device)
        if self._closed:
            raise ValueError(f"ready() on a closed {self!r}; create a new HostNccl")
        if self._failed is not None:
            raise RuntimeError(f"{self!r}: NCCL set-up failed earlier ({self._failed}); the "
                               "local ranks may be out of step, so it is not retried")
        if self._answer is None:
            try:
                self._set_up(seq, signature, device, deadline)
            except BaseException as e:
                self._failed = f"{type(e).__name__}: {e}"
                raise
        elif device != self._device:
            raise ValueError(
                f"{self!r} was set up for GPU {self._device} and cannot move to GPU {device}: "
                "an NCCL communicator is bound to its GPU; keep each rank's arrays on the GPU "
                "it first used, or create a new group"
            )
        if self._comm is not None and self._comm.closed:
            raise ValueError(f"the NCCL communicator of {self!r} was aborted (an operation timed "
                             "out or failed); create a new group")
        assert self._answer is not None
        return self._answer

    def _set_up(self, seq: int, signature: str, device: int, deadline: Deadline) -> None:
        local = self._local
        has_nccl = nccl.available()
        gpu = _pci_address(device) if has_nccl else None
        mine = np.array([device, int(has_nccl), _NO_GPU_ID if gpu is None else gpu], np.int64)
        _, gathered = local.all_gather(seq, signature, mine, deadline, rows=1, row_items=3)
        table = gathered.reshape(local.size, 3)
        # Every rank decides from the same gathered bytes, so all agree without a vote.
        usable, reason = nccl_decision(
            [int(d) for d in table[:, 0]], [bool(a) for a in table[:, 1]],
            [None if g == _NO_GPU_ID else int(g) for g in table[:, 2]])
        if local.rank == 0:
            log.info("%s", reason)
        if usable:
            uid = self._share_unique_id(seq, signature, deadline)
            self._comm = nccl.NcclComm(local.size, uid, local.rank, device,
                                       timeout_seconds=self._timeout)
        self._device, self._answer = device, usable

    def _share_unique_id(self, seq: int, signature: str, deadline: Deadline) -> bytes:
        """Local rank 0's fresh NCCL unique id, on every local rank.

        One status byte travels ahead of the 128 id bytes: if rank 0 cannot make an id, the
        others learn it from the broadcast at once instead of waiting for a deadline.
        """
        local = self._local
        work = np.zeros(1 + nccl.UNIQUE_ID_BYTES, np.uint8)
        error: BaseException | None = None
        if local.rank == 0:
            try:
                work[1:] = np.frombuffer(nccl.unique_id(), np.uint8)
                work[0] = 1
            except Exception as e:  # CuPy/NCCL errors: reported after the broadcast below
                error = e
        local.broadcast(seq, signature, work, 0, deadline)
        if error is not None:
            raise error
        if not work[0]:
            raise RuntimeError("local rank 0 could not create an NCCL unique id (see its error)")
        return work[1:].tobytes()

    def _live(self, what: str) -> nccl.NcclComm:
        if self._closed:
            raise ValueError(f"{what} on a closed {self!r}")
        if self._comm is None:
            raise RuntimeError(f"{what} on {self!r}: call ready() on every local rank first and "
                               "use NCCL only when it returned True")
        return self._comm

    def all_reduce(self, array: Any, op: ReduceOp | str) -> Any:
        """``op`` of ``array`` over the local ranks, as a new CuPy array on this rank's GPU.

        Bitwise identical on every local rank; ``MEAN`` divides by ``local.size`` (not the
        world size: divide once more, or reduce with ``SUM``, when hosts are combined after).
        ``array`` must be a contiguous CuPy array on the GPU given to :meth:`ready`; see
        :meth:`NcclComm.all_reduce` for dtypes and errors.
        """
        return self._live("all_reduce").all_reduce(array, op)

    def broadcast(self, array: Any, root: int) -> Any:
        """Local rank ``root``'s ``array`` on every local rank, as a new CuPy array (other ranks'
        ``array`` gives only shape and dtype)."""
        return self._live("broadcast").broadcast(array, root)

    def close(self) -> None:
        """Destroy the communicator, if any. Idempotent; later calls raise ``ValueError``."""
        self._closed = True
        comm, self._comm = self._comm, None
        if comm is not None:
            comm.close()


def nccl_decision(devices: Sequence[int], available: Sequence[bool],
                  gpus: Sequence[int | None]) -> tuple[bool, str]:
    """Whether NCCL can join the local ranks, and why, as one log line.

    ``devices[r]`` is local rank ``r``'s CuPy device id, ``available[r]`` whether
    :func:`nccl.available` holds there, ``gpus[r]`` its GPU's PCI address as an int (``None``
    when unknown: then the device ids stand for the GPUs). NCCL needs it available on every
    rank and one GPU per rank.

    >>> usable, reason = nccl_decision([0, 0], [True, True], [0x3B0000, 0x3B0000])
    >>> usable
    False
    >>> print(reason)  # doctest: +NORMALIZE_WHITESPACE
    NCCL off among 2 local ranks: local ranks 0 and 1 both on GPU 0 at 0000:3B:00.0 (one GPU
    per task needed); the host path carries GPU values
    """
    n = len(devices)
    missing = [r for r in range(n) if not available[r]]
    known = all(g is not None for g in gpus)
    same: dict[int, list[int]] = {}
    for r in range(n):
        same.setdefault(gpus[r] if known else devices[r], []).append(r)  # type: ignore[arg-type]
    shared = [ranks for ranks in same.values() if len(ranks) > 1]
    if not missing and not shared:
        on = ", ".join(f"local rank {r} on {_gpu(devices[r], gpus[r])}" for r in range(n))
        return True, f"NCCL on among {n} local ranks, one GPU each ({on})"
    reasons = []
    if missing:
        reasons.append(f"NCCL unavailable on {_ranks(missing)} (CuPy, its NCCL library or a "
                       "visible GPU is missing there)")
    for ranks in shared:
        both = "both" if len(ranks) == 2 else "all"
        ids = sorted({devices[r] for r in ranks})
        gpu = (_gpu(ids[0], gpus[ranks[0]]) if len(ids) == 1 else
               f"one GPU (devices {', '.join(map(str, ids))} of their tasks)")
        reasons.append(f"{_ranks(ranks)} {both} on {gpu} (one GPU per task needed)")
    return False, (f"NCCL off among {n} local ranks: {'; '.join(reasons)}; the host path "
                   "carries GPU values")


def _gpu(device: int, address: int | None) -> str:
    if address is None:
        return f"GPU {device}"
    domain, bus, slot, function = (address >> 24, (address >> 16) & 0xFF, (address >> 8) & 0xFF,
                                   address & 0xFF)
    return f"GPU {device} at {domain:04X}:{bus:02X}:{slot:02X}.{function:X}"


def _ranks(ranks: Sequence[int]) -> str:
    if len(ranks) == 1:
        return f"local rank {ranks[0]}"
    return f"local ranks {', '.join(map(str, ranks[:-1]))} and {ranks[-1]}"


def _pci_address(device: int) -> int | None:
    """GPU ``device``'s PCI address ("0000:3B:00.0") as one int, the same in every process
    whatever ``CUDA_VISIBLE_DEVICES`` numbers it; ``None`` if CuPy cannot tell."""
    try:
        import cupy

        address = str(cupy.cuda.Device(device).pci_bus_id)
    except Exception:  # no CuPy, no driver, a device that is not there: CuPy's own errors
        return None
    parts = re.fullmatch(r"([0-9a-fA-F]+):([0-9a-fA-F]+):([0-9a-fA-F]+)\.([0-9a-fA-F]+)",
                         address.strip())
    if parts is None:
        return None
    domain, bus, slot, function = (int(p, 16) for p in parts.groups())
    return (domain << 24) | (bus << 16) | (slot << 8) | function
