"""``MirroredStrategy`` and ``CentralStorageStrategy``: several replicas in one process."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from cluster import _context
from cluster.cross_device_ops import CrossDeviceOps, NcclAllReduce, ReductionToOneDevice
from cluster.strategies._devices import Device, gpu_count, log_choice, parse_devices
from cluster.strategies._variables import CentralVariable
from cluster.strategies.base import Strategy, StrategyExtended
from cluster.values import select_replica
from cluster.variables import Variable, VariableSynchronization, component_variable

__all__ = ["CentralStorageStrategy", "MirroredStrategy", "default_local_devices"]


def default_local_devices(who: str = "MirroredStrategy()") -> list[str]:
    """Every GPU CuPy sees, or one CPU replica when there is none (TF's default); the choice is
    logged once per process, naming ``who`` asked."""
    count = gpu_count()
    if count:
        devices = [f"/gpu:{i}" for i in range(count)]
        log_choice(f"{who} takes {', '.join(devices)}: every GPU CuPy sees (TF's default); pass "
                   "devices, e.g. ['/cpu:0'], to keep NumPy values on the host")
        return devices
    log_choice(f"{who} takes /cpu:0: no GPU visible to CuPy")
    return ["/cpu:0"]


def _default_ops(devices: Sequence[Device]) -> CrossDeviceOps:
    return NcclAllReduce() if any(d.is_gpu for d in devices) else ReductionToOneDevice()


class MirroredStrategy(Strategy):
    """Synchronous replicas on the local devices, variables mirrored on each.

    >>> strategy = MirroredStrategy(["/cpu:0", "/cpu:1"])
    >>> strategy.num_replicas_in_sync
    2

    ``devices``: e.g. ``["/cpu:0", "/cpu:1"]`` (CPU replicas run concurrently in threads, TF's
    logical CPU devices) or ``["/gpu:0", "/gpu:1"]`` (CuPy, one replica per GPU). Default: every
    visible GPU, or one CPU replica. ``cross_device_ops``: how values are reduced (default NCCL
    among GPUs, host reduction for CPU replicas).
    """

    def __init__(self, devices: Sequence[str] | None = None,
                 cross_device_ops: CrossDeviceOps | None = None) -> None:
        parsed = parse_devices(default_local_devices() if devices is None else devices,
                               what="MirroredStrategy(devices)")
        ops = _default_ops(parsed) if cross_device_ops is None else cross_device_ops
        super().__init__(StrategyExtended(self, parsed, ops))


class _CentralExtended(StrategyExtended):
    def __init__(self, container, devices, ops, parameter_device: Device) -> None:
        super().__init__(container, devices, ops)
        self._parameter_device = parameter_device

    @property
    def parameter_devices(self) -> tuple[str, ...]:
        return (str(self._parameter_device),)

    def _check_aggregation_dtype(self, aggregation, dtype, name) -> None:
        pass  # TF's CentralStorageStrategy makes AggregatingVariables: MEAN of ints allowed

    def _make_variable(self, value: Any, **options: Any) -> Variable:
        if options["synchronization"] is VariableSynchronization.ON_READ:
            return super()._make_variable(value, **options)
        placed = value
        if self._parameter_device.is_gpu:
            import cupy  # optional (extra 'gpu'): only a GPU parameter device needs it

            with cupy.cuda.Device(self._parameter_device.index):
                placed = cupy.array(value, copy=True)
        else:
            placed = self._place_host(value)
        return CentralVariable(self._container, [component_variable(placed, options["name"])],
                               **options)

    @staticmethod
    def _place_host(value: Any) -> Any:
        return np.array(value.get() if hasattr(value, "get") else value, copy=True)

    def update(self, var, fn, args=(), kwargs=None, group=True):
        if isinstance(var, CentralVariable):
            kwargs = {} if kwargs is None else kwargs
            with _context.push(self._container, None):
                return fn(var.values[0], *select_replica(0, args), **select_replica(0, kwargs))
        return super().update(var, fn, args, kwargs, group)


class CentralStorageStrategy(Strategy):
    """Replicas on the compute devices; each variable has one copy on the parameter device.

    ``compute_devices`` default as MirroredStrategy; ``parameter_device`` defaults to the only
    compute device, or the CPU (TF's rule).
    """

    def __init__(self, compute_devices: Sequence[str] | None = None,
                 parameter_device: str | None = None) -> None:
        parsed = parse_devices(
            default_local_devices("CentralStorageStrategy()") if compute_devices is None
            else compute_devices,
            what="CentralStorageStrategy(compute_devices)")
        if parameter_device is None:
            param = parsed[0] if len(parsed) == 1 else parse_devices(["/cpu:0"], what="")[0]
        else:
            param = parse_devices([parameter_device],
                                  what="CentralStorageStrategy(parameter_device)")[0]
        super().__init__(_CentralExtended(self, parsed, _default_ops(parsed), param))
