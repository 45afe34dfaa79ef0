"""Device strings: ``/cpu:0``, ``/gpu:1``, ``GPU:0``, ``/job:worker/replica:0/task:1/device:CPU:0``.

Parsed once at the edge into :class:`Device` and printed in TensorFlow's canonical form. CPU
indices are logical (any number of ``/cpu:k`` replicas run in one process, like TF's logical
CPU devices); GPU indices must name a GPU that CuPy sees.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass

__all__ = ["Device", "gpu_count", "parse_devices"]

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
