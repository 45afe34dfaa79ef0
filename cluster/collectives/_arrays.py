"""Array families in and out of the collectives: NumPy, Python/NumPy scalars, CuPy.

Collectives work on host NumPy arrays. :func:`stage` turns a caller's value into one and returns
how to give a result back in the caller's family; strategies reuse it for the same purpose.
CuPy arrays are staged through host memory (``cupy.asnumpy`` / ``cupy.asarray`` on the same
device) by every collective except an all-reduce that NCCL carries among a host's GPUs
(:mod:`~cluster.collectives.host_nccl`). CuPy is never imported here: a CuPy array can only
exist once the caller imported ``cupy``, so ``sys.modules`` is where to find it.
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

__all__ = ["Staged", "stage"]


@dataclass(frozen=True)
class Staged:
    """A value staged on the host.

    - ``array``: the value as a NumPy array (any memory layout).
    - ``owned``: True when ``array`` is a fresh copy nobody else can see, so a collective may
      reduce into it in place instead of making its own working copy.
    - ``restore``: turns a host result of the same family back into the caller's family.
    """

    array: np.ndarray
    owned: bool
    restore: Callable[[np.ndarray], Any]


def _identity(result: np.ndarray) -> np.ndarray:
    return result


def _scalar(result: np.ndarray) -> Any:
    # A 0-d result comes back as a NumPy scalar, as NumPy's own operations on scalars return.
    return result[()] if result.ndim == 0 else result


def stage(value: Any, what: str = "collective") -> Staged:
    """Stage ``value`` (NumPy array or scalar, Python int/float, CuPy array) on the host.

    Python scalars become NumPy's default dtype for them (``int64``, ``float64``), as
    ``np.asarray`` does, and results come back as NumPy scalars. Raises ``TypeError`` naming
    the supported families for anything else (lists included: pass ``np.asarray(value)``).
    """
    if isinstance(value, np.ndarray):
        return Staged(value, False, _identity)
    if isinstance(value, np.generic):
        return Staged(np.array(value), True, _scalar)
    if isinstance(value, int | float) and not isinstance(value, bool):
        return Staged(np.array(value), True, _scalar)
    cupy = sys.modules.get("cupy")
    if cupy is not None and isinstance(value, cupy.ndarray):
        return _stage_cupy(cupy, value)
    raise TypeError(
        f"{what} got a value of type {type(value).__module__}.{type(value).__qualname__}; "
        "supported: numpy.ndarray, NumPy scalars, Python int and float, cupy.ndarray. "
        "Convert it first, e.g. np.asarray(value)"
    )


def _stage_cupy(cupy: Any, value: Any) -> Staged:
    device_id = value.device.id
    host = cupy.asnumpy(value)

    def restore(result: np.ndarray) -> Any:
        with cupy.cuda.Device(device_id):
            return cupy.asarray(result)

    return Staged(host, True, restore)
