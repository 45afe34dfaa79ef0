"""A stand-in for ``cupy.ElementwiseKernel`` over the fake CuPy's host memory, for tests.

The fake CuPy (``tests/_fakegpu/fakecuda.py``) has no kernels. This one runs the CUDA body
that :mod:`cluster.collectives.kernels` generates by reading it as a sequence of assignments
(``T s = g0; s = add_rn(s, g1); w = add_rn(w, mul_rn(s, scale));``) with ``add_rn``/``mul_rn``
as NumPy's ``add``/``multiply``: each step rounded once, in the dtype of the arrays, as the CUDA
intrinsics ``__fadd_rn``/``__fmul_rn`` round. It reads arrays with ``.get()`` and writes
output parameters in place with ``.set()``, CuPy's own copies. Every call is recorded in
``calls`` (the kernel's name).
"""

from __future__ import annotations

import re
from typing import Any

import numpy as np

__all__ = ["ElementwiseKernel", "calls", "install"]

calls: list[str] = []

_FUNCTIONS = {"add_rn": np.add, "mul_rn": np.multiply}


def _names(params: str) -> list[str]:
    return [p.split()[-1] for p in params.split(",") if p.strip()]


class ElementwiseKernel:
    """``cupy.ElementwiseKernel(in_params, out_params, operation, name, ..., preamble=...)``."""

    def __init__(self, in_params: str, out_params: str, operation: str, name: str = "kernel",
                 reduce_dims: bool = True, preamble: str = "", no_return: bool = False,
                 **kwargs: Any) -> None:
        self.ins, self.outs = _names(in_params), _names(out_params)
        self.operation, self.name, self.preamble = operation, name, preamble
        self.no_return = no_return

    def __call__(self, *args: Any) -> Any:
        if len(args) != len(self.ins) + len(self.outs):
            raise TypeError(f"{self.name}: wrong number of arguments ({len(args)})")
        calls.append(self.name)
        env: dict[str, Any] = {}
        arrays = dict(zip([*self.ins, *self.outs], args, strict=True))
        for name, arg in arrays.items():
            env[name] = arg.get() if hasattr(arg, "get") else arg
        for statement in filter(None, (s.strip() for s in self.operation.split(";"))):
            target, expression = (part.strip() for part in statement.split("=", 1))
            target = re.sub(r"^T\s+", "", target)
            env[target] = eval(expression, {"__builtins__": {}, **_FUNCTIONS}, env)  # noqa: S307
        for name in self.outs:
            arrays[name].set(np.asarray(env[name], dtype=arrays[name].dtype))
        return None if self.no_return else args[-1]


def install(cupy: Any) -> None:
    """Give the fake ``cupy`` module this ``ElementwiseKernel``."""
    cupy.ElementwiseKernel = ElementwiseKernel
