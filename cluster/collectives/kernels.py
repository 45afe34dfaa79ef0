"""The owner's step of a fused all-reduce in one pass over memory: numba on the host, one CuPy
elementwise kernel on a GPU.

Where a segment's reduction completes, its owner sums the ranks' parts in rank order and applies
the update (:mod:`cluster.collectives.epilogue`). In NumPy that is four passes over the part:
the sum into scratch, the scale, the add into the parameter, and (shared memory, staged) the copy
of the new parameter back for the peers to gather. For ResNet-50's gradients at two ranks on
one host those passes were most of the step. :func:`sum_add_scaled` does all of it in one
compiled loop, for the update the optimizers fuse (:class:`~epilogue.AddScaled`, SGD).

Why numba: it compiles this loop to the vectorised code a C compiler would emit, from Python,
with no build step; its loop keeps IEEE semantics (no ``fastmath``: no reassociation and no
fused multiply-add), so every element gets exactly the operations NumPy's passes give it, in
the same order, and the bytes are identical (tested against NumPy).

Compiled on first use and cached on disk by numba (``cache=True``); importing numba and
loading the loops costs a process 1-3 s once, so only a fused call of :data:`LOAD_ITEMS`
elements or more loads them (:func:`load_for`, before the collective starts), and jobs with
small models never pay it. Until then, and where numba cannot load or cache (or for other
dtypes, updates and ops), callers keep NumPy's passes: :func:`sum_add_scaled` returns
``False``.

On a GPU, :func:`sum_add_scaled_on_gpu` is the same step as one ``cupy.ElementwiseKernel`` (sum
the operands in order, scale, add into the parameter), compiled once per operand count and
device. Its additions and multiplications are ``__fadd_rn``/``__fmul_rn`` (``__dadd_rn``/
``__dmul_rn`` for float64), which the compiler never contracts into a fused multiply-add, so the
bytes are NumPy's.
"""

from __future__ import annotations

import logging
import sys
import threading
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from cluster.collectives.epilogue import AddScaled

__all__ = ["LOAD_ITEMS", "gpu_fusable", "gpu_kernel_source", "load_for", "sum_add_scaled",
           "sum_add_scaled_on_gpu"]

log = logging.getLogger(__name__)

LOAD_ITEMS = 1 << 22
"""A fused call of this many elements or more (16 MiB of float32) loads the loops: at that
size the one pass saves milliseconds every step; below it, less than loading numba costs once
(1-3 s). Once loaded, parts of every size take it (a call costs a few microseconds, against
five NumPy calls)."""

_DTYPES = (np.dtype(np.float32), np.dtype(np.float64))


def sum_add_scaled(update: Any, operands: Sequence[np.ndarray], target: np.ndarray,
                   copy_to: np.ndarray | None = None) -> bool:
    """If it applies, ``target += (((operands[0] + operands[1]) + ...) * scale)`` and
    ``copy_to[:] = target``, elementwise in one pass, bitwise as NumPy; return ``True``.

    It applies when ``update`` is an :class:`AddScaled`, the arrays are flat, C-contiguous,
    aligned float32 or float64 of one dtype and length, there are two operands or more, and
    the loops are loaded (:func:`load_for`). Otherwise nothing is written and it returns
    ``False``: the caller reduces and updates with NumPy. ``target`` may not alias an operand;
    ``copy_to`` may not alias anything.
    """
    if not isinstance(update, AddScaled) or len(operands) < 2:
        return False
    dtype = target.dtype
    arrays = [*operands, target] if copy_to is None else [*operands, target, copy_to]
    if dtype not in _DTYPES or not all(_plain(a, dtype, target.size) for a in arrays):
        return False
    if not (target.flags.writeable and (copy_to is None or copy_to.flags.writeable)):
        return False
    kernels = _loaded
    if not kernels:
        return False
    scale = dtype.type(update.scale)  # rounded as NumPy rounds a Python float for this dtype
    # One array type for every operand (numba types a read-only array apart), so they make a
    # homogeneous tuple the loop can index.
    ops = tuple(_read_only(a) for a in operands)
    if copy_to is None:
        kernels[0](ops, scale, target)
    else:
        kernels[1](ops, scale, target, copy_to)
    return True


def _plain(a: np.ndarray, dtype: np.dtype, size: int) -> bool:
    return (a.ndim == 1 and a.dtype == dtype and a.size == size and a.flags.c_contiguous
            and a.flags.aligned)


def _read_only(a: np.ndarray) -> np.ndarray:
    view = a.view()
    view.flags.writeable = False
    return view


_Loops = tuple[Callable[..., None], Callable[..., None]]

_loaded: _Loops | bool | None = None
"""The compiled loops ``(update, update and copy)`` once loaded; ``False`` where numba cannot
load; ``None`` until a call large enough asks (:func:`load_for`)."""


def load_for(update: Any, items: int) -> bool:
    """Load the loops (once per process) if a fused call of ``items`` elements with ``update``
    would use them and is worth it; whether they are loaded."""
    global _loaded
    if _loaded is None and isinstance(update, AddScaled) and items >= LOAD_ITEMS:
        try:
            from cluster.collectives import _loops as loops
        # ImportError: no numba for this platform or NumPy; RuntimeError: numba found no
        # writable place for its cache. NumPy's passes give the same bytes.
        except (ImportError, RuntimeError) as e:
            log.warning("fused all-reduce updates run on NumPy: numba did not load (%s)", e)
            _loaded = False
        else:
            _loaded = (loops.add_scaled, loops.add_scaled_copy)
    return bool(_loaded)


# -- the GPU step: one CuPy elementwise kernel ---------------------------------------------------

GPU_PREAMBLE = r"""
__device__ __forceinline__ float add_rn(float a, float b) { return __fadd_rn(a, b); }
__device__ __forceinline__ double add_rn(double a, double b) { return __dadd_rn(a, b); }
__device__ __forceinline__ float mul_rn(float a, float b) { return __fmul_rn(a, b); }
__device__ __forceinline__ double mul_rn(double a, double b) { return __dmul_rn(a, b); }
"""
"""Rounded operations the compiler may not contract: ``w + s * scale`` must not become an FMA,
whose single rounding would differ from NumPy's two."""


def gpu_kernel_source(operands: int) -> tuple[str, str, str]:
    """``(in_params, out_params, operation)`` of the kernel for ``operands`` summed values:
    ``w = w + (((g0 + g1) + ...) * scale)``, each step rounded as NumPy rounds it."""
    if operands < 1:
        raise ValueError(f"the kernel sums one operand or more, got {operands}")
    ins = ", ".join([*(f"T g{i}" for i in range(operands)), "T scale"])
    body = "T s = g0; " + "".join(f"s = add_rn(s, g{i}); " for i in range(1, operands))
    return ins, "T w", body + "w = add_rn(w, mul_rn(s, scale));"


_gpu_kernels: dict[tuple[Any, int], Any] = {}
_gpu_lock = threading.Lock()


def _gpu_kernel(cupy: Any, operands: int) -> Any:
    with _gpu_lock:
        kernel = _gpu_kernels.get((cupy, operands))
        if kernel is None:
            ins, outs, body = gpu_kernel_source(operands)
            # CuPy compiles on first call, once per device, and caches the binary on disk.
            kernel = _gpu_kernels[cupy, operands] = cupy.ElementwiseKernel(
                ins, outs, body, name=f"cluster_sum{operands}_add_scaled",
                preamble=GPU_PREAMBLE, no_return=True)
        return kernel


def gpu_fusable(update: Any, operands: Sequence[Any], target: Any) -> bool:
    """Whether :func:`sum_add_scaled_on_gpu` applies: ``update`` is an :class:`AddScaled`,
    ``target`` a C-contiguous float32 or float64 CuPy array and every operand (one or more) a
    CuPy array of its dtype and shape on its GPU."""
    cupy = sys.modules.get("cupy")
    if cupy is None or not isinstance(update, AddScaled) or not operands \
            or not isinstance(target, cupy.ndarray):
        return False
    dtype, device = target.dtype, target.device.id
    return dtype in _DTYPES and target.flags.c_contiguous and all(
        isinstance(g, cupy.ndarray) and g.dtype == dtype and g.shape == target.shape
        and g.device.id == device for g in operands)


def sum_add_scaled_on_gpu(update: Any, operands: Sequence[Any], target: Any) -> bool:
    """If it applies (:func:`gpu_fusable`), ``target += ((operands[0] + operands[1]) + ...) *
    scale`` in one kernel on ``target``'s GPU, bitwise as NumPy on the host; return ``True``.
    Otherwise nothing is written and it returns ``False``. Operands are only read.
    """
    if not gpu_fusable(update, operands, target):
        return False
    cupy = sys.modules["cupy"]
    with cupy.cuda.Device(target.device.id):
        _gpu_kernel(cupy, len(operands))(*operands, target.dtype.type(update.scale), target)
    return True
