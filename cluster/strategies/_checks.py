"""The checks TensorFlow makes before a strategy's method runs: which context may call it, and
which variables a mirrored strategy refuses to create.

TF's ``_require_cross_replica_or_default_context_extended`` and ``DistributedVariable``'s dtype
check, as pure functions of the thread's context stack (:mod:`cluster._context`) and a dtype.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import numpy as np

from cluster import _context

if TYPE_CHECKING:
    from cluster.strategies.base import Strategy

__all__ = ["is_floating", "require_cross_replica"]


def is_floating(dtype: Any) -> bool:
    """TF's ``dtype.is_floating``: float16/32/64 and bfloat16 (an ``ml_dtypes`` type whose NumPy
    kind is not ``'f'``)."""
    dtype = np.dtype(dtype)
    return dtype.kind == "f" or dtype.name == "bfloat16"


def _mixing_error(strategy: Strategy, active: Strategy) -> RuntimeError:
    return RuntimeError(
        f"Mixing different Strategy objects: {_context.describe(strategy)} is not "
        f"{_context.describe(active)}, whose scope (or run) is active. Leave that scope first; "
        "use one strategy per program"
    )


def require_cross_replica(strategy: Strategy, what: str, hint: str) -> None:
    """Raise unless this thread may call ``strategy``'s cross-replica methods: in its scope
    outside ``run`` (or in a ``merge_call`` function), or outside every strategy (TF's
    ``_require_cross_replica_or_default_context_extended``).

    Raises:
      RuntimeError: inside ``strategy.run`` (the message names ``what`` and gives ``hint``), or
        inside another strategy's scope or run (mixing strategies).
    """
    frame = _context.current_frame()
    if frame.strategy is strategy and frame.replica_context is None:
        return
    if _context.in_default_context():
        return
    if frame.strategy is not strategy:
        raise _mixing_error(strategy, frame.strategy)
    raise RuntimeError(
        f"{what} must be called in cross-replica context (outside strategy.run); {hint}"
    )
