"""Keras' optimizer update rules on single arrays, in place: the one copy of the math.

Used by :mod:`cluster.optimizers` (per replica component) and by the parameter-server store
(:mod:`cluster.ps.store`), so an update on a parameter server is bitwise the update a worker would
compute. Pure functions on NumPy or CuPy arrays (``xp`` is the array module); no strategy, no I/O.
Hyper-parameters are cast to the variable's dtype exactly as Keras does before multiplying.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

__all__ = ["adam_update", "check_rate", "sgd_update"]


def check_rate(name: str, value: Any, *, low: float = 0.0, high: float = math.inf,
               open_low: bool = False) -> float:
    """``value`` as a float in ``[low, high]`` (``(low, high]`` when ``open_low``).

    Raises ``TypeError`` for a non-number and ``ValueError`` naming ``name`` when out of range.
    """
    if isinstance(value, bool) or not isinstance(value, (int, float, np.floating, np.integer)):
        raise TypeError(f"{name} must be a number, got {value!r}")
    value = float(value)
    if not (low < value if open_low else low <= value) or not value <= high or math.isnan(value):
        raise ValueError(f"{name} must be in {'(' if open_low else '['}{low}, {high}], got {value}")
    return value


def sgd_update(value: Any, grad: Any, momentum_slot: Any, *, learning_rate: float,
               momentum: float, nesterov: bool) -> None:
    """Keras SGD, in place on ``value`` (and ``momentum_slot``, unused when ``momentum == 0``).

    ``m = momentum * m - lr * g``; ``w += m`` (Nesterov: ``w += momentum * m - lr * g``);
    without momentum ``w -= lr * g``. ``grad`` has ``value``'s shape and dtype.
    """
    lr = value.dtype.type(learning_rate)
    if not momentum:
        if _blockable(value, grad):
            _sgd_blocked(value, grad, lr)
        else:
            value -= lr * grad
        return
    mom = value.dtype.type(momentum)
    momentum_slot *= mom
    momentum_slot -= lr * grad
    if nesterov:
        value += mom * momentum_slot - lr * grad
    else:
        value += momentum_slot


_BLOCK_ITEMS = 1 << 16
"""Items per block of :func:`_sgd_blocked`: 256 KiB of float32, which stays in L2 cache."""


def _blockable(value: Any, grad: Any) -> bool:
    return (isinstance(value, np.ndarray) and isinstance(grad, np.ndarray)
            and value.size > 2 * _BLOCK_ITEMS and value.flags.c_contiguous
            and grad.flags.c_contiguous and grad.shape == value.shape
            and grad.dtype == value.dtype)


def _sgd_blocked(value: np.ndarray, grad: np.ndarray, lr: Any) -> None:
    """``value -= lr * grad`` a block at a time through one small scratch: the same roundings
    (``lr * g`` rounded, then subtracted), so bitwise the same, without a temporary as large as
    the variable (two passes over memory instead of three: a 16 MiB ps update measured 2.3-2.5
    ms against 3.0 ms)."""
    flat_w, flat_g = value.reshape(-1), grad.reshape(-1)
    scratch = np.empty(_BLOCK_ITEMS, value.dtype)
    for start in range(0, flat_w.size, _BLOCK_ITEMS):
        w = flat_w[start:start + _BLOCK_ITEMS]
        t = scratch[:w.size]
        np.multiply(flat_g[start:start + _BLOCK_ITEMS], lr, out=t)
        np.subtract(w, t, out=w)


def adam_update(value: Any, grad: Any, m: Any, v: Any, *, learning_rate: float, beta_1: float,
                beta_2: float, epsilon: float, iteration: int, xp: Any = np) -> None:
    """Keras Adam, in place on ``value``, ``m`` and ``v``; ``iteration`` counts from 1.

    ``m += (g - m) * (1 - beta_1)``; ``v += (g^2 - v) * (1 - beta_2)``;
    ``w -= lr * sqrt(1 - beta_2^t) / (1 - beta_1^t) * m / (sqrt(v) + epsilon)``.
    """
    cast = value.dtype.type
    t = iteration
    alpha = cast(learning_rate * math.sqrt(1 - beta_2 ** t) / (1 - beta_1 ** t))
    m += (grad - m) * cast(1 - beta_1)
    v += (grad * grad - v) * cast(1 - beta_2)
    value -= (m * alpha) / (xp.sqrt(v) + cast(epsilon))
