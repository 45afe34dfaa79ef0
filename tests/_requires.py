"""Skips for the optional packages, worded in one place: each names what is missing and the one
command that installs it into this project's environment.

torch and JAX are extras outside the default environment (``uv run`` = the project and the dev
group). ``uv sync --inexact --extra NAME`` adds one without removing what is already there, and
later ``uv run`` calls keep it. CuPy comes from the ``gpu`` extra (CUDA 12 builds: CUDA 12 and 13
drivers) or the ``gpu-cuda13`` extra (CUDA 13 builds); a CuPy that is installed but sees no CUDA
device is told apart from a CuPy that is not installed.
"""

from __future__ import annotations

import functools
from types import ModuleType

import pytest

__all__ = ["cupy_missing", "install_command", "require", "require_cupy", "skip_without_cupy"]

# The extra that installs each optional module (ml_dtypes comes with both; torch's names it).
_EXTRA = {"torch": "torch", "ml_dtypes": "torch", "jax": "jax"}

CUPY_INSTALL = ("uv sync --inexact --extra gpu (CUDA 12 and 13 drivers; --extra gpu-cuda13 "
                "for CUDA 13 builds)")


def install_command(extra: str) -> str:
    """The command that adds the optional dependencies ``extra`` to this project's environment."""
    return f"uv sync --inexact --extra {extra}"


def require(module: str) -> ModuleType:
    """Import ``module`` (torch, ml_dtypes, jax, or one of their submodules such as jax.numpy),
    or skip the test (at module level: the file) with ``<package> is not installed: <command>``.

    ``KeyError`` for a package that is not one of the optional ones above."""
    __tracebackhide__ = True  # the skip is reported at the caller's line, not this one
    package = module.partition(".")[0]
    command = install_command(_EXTRA[package])
    return pytest.importorskip(module, reason=f"{package} is not installed: {command}")


@functools.cache
def cupy_missing() -> str | None:
    """Why CuPy cannot run a test here (not installed, cannot be imported, or sees no CUDA
    device), or ``None`` when it sees at least one CUDA device. Never raises."""
    try:
        import cupy
    except ImportError:
        return f"CuPy is not installed: {CUPY_INSTALL}"
    except Exception as e:  # a broken CUDA install can fail CuPy's import with any error
        return f"CuPy is installed but cannot be imported: {e!r}"
    try:
        count = int(cupy.cuda.runtime.getDeviceCount())
    except Exception as e:  # no driver / no device: CuPy raises its own runtime error types
        return f"CuPy is installed but sees no CUDA device: {e}"
    if count == 0:
        return "CuPy is installed but sees no CUDA device"
    return None


def skip_without_cupy() -> pytest.MarkDecorator:
    """A ``skipif`` mark for tests that need CuPy and a CUDA device, with :func:`cupy_missing`'s
    reason."""
    reason = cupy_missing()
    return pytest.mark.skipif(reason is not None, reason=reason or "")


def require_cupy() -> ModuleType:
    """``cupy`` when it sees a CUDA device; otherwise skip the test with the reason why not."""
    __tracebackhide__ = True
    reason = cupy_missing()
    if reason is not None:
        pytest.skip(reason)
    import cupy

    return cupy
