"""numba loops for :mod:`cluster.collectives.kernels` (imported only when first needed: numba
takes about a second to import). Module-level functions, so numba caches their machine code on
disk and later processes load it instead of compiling."""

from __future__ import annotations

from typing import Any

import numba

_jit = numba.njit(nogil=True, cache=True)


@_jit
def add_scaled(ops: Any, scale: Any, target: Any) -> None:  # pragma: no cover (compiled)
    """``target += sum(ops, in order) * scale``, elementwise."""
    for i in range(target.size):
        total = ops[0][i] + ops[1][i]
        for k in range(2, len(ops)):
            total = total + ops[k][i]
        target[i] = target[i] + total * scale


@_jit
def add_scaled_copy(ops: Any, scale: Any, target: Any,
                    copy_to: Any) -> None:  # pragma: no cover (compiled)
    """:func:`add_scaled`, also writing each new value to ``copy_to``."""
    for i in range(target.size):
        total = ops[0][i] + ops[1][i]
        for k in range(2, len(ops)):
            total = total + ops[k][i]
        value = target[i] + total * scale
        target[i] = value
        copy_to[i] = value
