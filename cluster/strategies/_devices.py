"""Device strings, and which device a strategy takes when the user names none.

Device strings (``/cpu:0``, ``/gpu:1``, ``GPU:0``, ``/job:worker/replica:0/task:1/device:CPU:0``)
are parsed once at the edge into :class:`Device` and printed in TensorFlow's canonical form. CPU
indices are logical (any number of ``/cpu:k`` replicas run in one process, like TF's logical
CPU devices); GPU indices must name a GPU that CuPy sees.

With no devices given, :func:`choose_task_device` decides a ``MultiWorkerMirroredStrategy``
task's one replica (a pure function of the ``CLUSTER_DEVICES`` switch, the task's local rank and
the GPUs CuPy sees) and :func:`log_choice` says which, why, and how to change it, once per
process.
"""

from __future__ import annotations

import logging
import re
import threading
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from cluster.errors import TaskConfigError

__all__ = ["Device", "DeviceChoice", "choose_task_device", "gpu_count", "local_rank_of",
           "log_choice", "parse_devices"]

log = logging.getLogger(__name__)

_DEVICE = re.compile(
    r"^(?:/job:(?P<job>[A-Za-z_][\w-]*))?(?:/replica:(?P<replica>\d+))?(?:/task:(?P<task>\d+))?"
    r"(?:/?(?:device:)?(?P<kind>cpu|gpu|CPU|GPU):(?P<index>\d+))$"
)


@dataclass(frozen=True)
class Device:
    kind: str  # "CPU" or "GPU"
    index: int
    job: str = "localhost"
    task: int = 0

    @property
    def is_gpu(self) -> bool:
        return self.kind == "GPU"

    def __str__(self) -> str:
        return f"/job:{self.job}/replica:0/task:{self.task}/device:{self.kind}:{self.index}"


def gpu_count() -> int:
    """GPUs that CuPy can use here (0 without CuPy or without a driver)."""
    try:
        import cupy  # optional (extra 'gpu'): imported only when GPUs are asked about
    except ImportError:
        return 0
    try:
        return int(cupy.cuda.runtime.getDeviceCount())
    except Exception:  # no driver / no device: CuPy raises its own runtime error types
        return 0


def parse_devices(devices: Iterable[str], *, what: str, job: str = "localhost",
                  task: int = 0) -> tuple[Device, ...]:
    """Parse device strings; ``ValueError`` naming ``what`` and the bad entry."""
    if isinstance(devices, str):
        raise ValueError(f"{what}: expected a list of device strings, got the string {devices!r}")
    parsed = []
    for entry in devices:
        match = _DEVICE.match(entry.strip()) if isinstance(entry, str) else None
        if match is None:
            raise ValueError(
                f"{what}: {entry!r} is not a device string; use e.g. '/cpu:0' or '/gpu:1'"
            )
        parsed.append(Device(match["kind"].upper(), int(match["index"]), job, task))
    if not parsed:
        raise ValueError(f"{what}: the list of devices is empty")
    if len(set(parsed)) != len(parsed):
        raise ValueError(f"{what}: no duplicates allowed, got {list(devices)}")
    gpus = [d for d in parsed if d.is_gpu]
    if gpus:
        available = gpu_count()
        missing = [d for d in gpus if d.index >= available]
        if missing:
            raise ValueError(
                f"{what}: {', '.join(f'/gpu:{d.index}' for d in missing)} not found; "
                f"{available} GPU(s) visible to CuPy. Install CuPy (cupy-cuda12x, or "
                "cupy-cuda13x for CUDA 13 drivers) or use '/cpu:k'"
            )
    return tuple(parsed)


@dataclass(frozen=True)
class DeviceChoice:
    """Where a strategy's replica goes when the user named no device, and why.

    ``device``: a device string (``/cpu:0``, ``/gpu:1``); ``reason``: why that one; ``hint``:
    what the user can do to get another (empty when there is nothing to change).
    """

    device: str
    reason: str
    hint: str

    def describe(self, who: str) -> str:
        """The one log line: ``who`` takes ``device``: reason; hint."""
        return f"{who} takes {self.device}: {self.reason}" + (f"; {self.hint}" if self.hint else "")


def _physical(index: int, visible: str | None) -> str:
    """GPU ``index`` of CuPy's numbering, with the physical GPU when CUDA_VISIBLE_DEVICES says."""
    entries = [e.strip() for e in (visible or "").split(",") if e.strip()]
    if visible is not None and index < len(entries):
        return f"GPU {index} (CUDA_VISIBLE_DEVICES={visible} leaves it GPU {entries[index]})"
    return f"GPU {index}"


def choose_task_device(mode: str, local_rank: int, local_size: int, gpus: int,
                       visible: str | None = None) -> DeviceChoice:
    """The device of a task's one replica (``MultiWorkerMirroredStrategy()`` with no devices).

    ``mode`` is ``CLUSTER_DEVICES`` (``cpu`` or ``gpu``); the task is ``local_rank`` of the
    ``local_size`` tasks on its host; ``gpus`` is how many GPUs CuPy sees (those
    ``CUDA_VISIBLE_DEVICES``, given as ``visible``, leaves it). ``cpu``: ``/cpu:0``, GPUs or
    not (a NumPy program gets NumPy back). ``gpu``: local rank r takes GPU r, one task per GPU;
    with more tasks than GPUs, GPU ``r % gpus`` (tasks share GPUs, which the reason says).

    Raises:
        TaskConfigError: ``gpu`` asked and CuPy sees no GPU.
    """
    if not 0 <= local_rank < local_size:
        raise ValueError(f"local rank {local_rank} is not in [0, {local_size})")
    if mode == "cpu":
        if gpus == 0:
            return DeviceChoice("/cpu:0", "one CPU replica per task (no GPU visible to CuPy)", "")
        return DeviceChoice(
            "/cpu:0", f"CLUSTER_DEVICES=cpu (the default) though CuPy sees {gpus} GPU(s): NumPy "
            "values stay NumPy",
            "set CLUSTER_DEVICES=gpu for one GPU per task, or pass CuPy/torch CUDA values or "
            "device strings")
    if mode != "gpu":
        raise ValueError(f"mode must be 'cpu' or 'gpu', got {mode!r}")
    if gpus == 0:
        raise TaskConfigError(
            "CLUSTER_DEVICES=gpu but CuPy sees no GPU: install CuPy (cupy-cuda12x, or "
            "cupy-cuda13x for CUDA 13 drivers), check CUDA_VISIBLE_DEVICES, or set "
            "CLUSTER_DEVICES=cpu")
    index = local_rank % gpus
    where = _physical(index, visible)
    if local_size <= gpus:
        return DeviceChoice(f"/gpu:{index}", f"CLUSTER_DEVICES=gpu: local rank {local_rank} of "
                            f"{local_size} takes {where}, one task per GPU",
                            "set CUDA_VISIBLE_DEVICES per task to choose other GPUs")
    return DeviceChoice(
        f"/gpu:{index}", f"CLUSTER_DEVICES=gpu: {local_size} tasks on this host share {gpus} "
        f"GPU(s), so local rank {local_rank} takes {where} (rank % GPUs); tasks sharing a GPU "
        "reduce through host memory, without NCCL",
        f"run {gpus} task(s) per host for one GPU each")


_LOOPBACK = ("", "localhost", "::1", "[::1]")


def _host(address: str) -> str:
    host = address.rsplit(":", 1)[0] if address.count(":") == 1 or address.startswith("[") \
        else address
    return "loopback" if host in _LOOPBACK or host.startswith("127.") else host


def local_rank_of(addresses: Sequence[str], rank: int) -> tuple[int, int]:
    """``(local rank, local size)`` of ``rank`` among the tasks at ``addresses`` (in rank order)
    that share its host, by the host part of the address (loopback names and in-process peers,
    ``""``, are one host)."""
    hosts = [_host(a) for a in addresses]
    mine = hosts[rank]
    local = [r for r, h in enumerate(hosts) if h == mine]
    return local.index(rank), len(local)


_logged: set[str] = set()
_logged_lock = threading.Lock()


def log_choice(line: str) -> None:
    """Log ``line`` at INFO, once per process (every strategy of the process decides alike)."""
    with _logged_lock:
        if line in _logged:
            return
        _logged.add(line)
    log.info("%s", line)
