"""The skip reasons of the optional packages say what is missing and how to install it."""

from __future__ import annotations

import sys
import types

import pytest

from tests import _requires

pytestmark = pytest.mark.timeout(30)


@pytest.fixture(autouse=True)
def _fresh_answer():
    _requires.cupy_missing.cache_clear()
    yield
    _requires.cupy_missing.cache_clear()


def _fake_cupy(count=None, error=None) -> types.ModuleType:
    def get_device_count():
        if error is not None:
            raise error
        return count

    cupy = types.ModuleType("cupy")
    cupy.cuda = types.SimpleNamespace(runtime=types.SimpleNamespace(
        getDeviceCount=get_device_count))
    return cupy


def test_cupy_not_installed_is_told_apart_from_no_device(monkeypatch):
    monkeypatch.setitem(sys.modules, "cupy", None)  # import cupy -> ImportError
    reason = _requires.cupy_missing()
    assert reason.startswith("CuPy is not installed: uv sync --inexact --extra gpu")
    assert "gpu-cuda13" in reason


@pytest.mark.parametrize("count, error", [(0, None), (None, RuntimeError("no CUDA driver"))])
def test_installed_cupy_without_a_device_says_so(monkeypatch, count, error):
    monkeypatch.setitem(sys.modules, "cupy", _fake_cupy(count, error))
    reason = _requires.cupy_missing()
    assert reason.startswith("CuPy is installed but sees no CUDA device")
    assert "not installed" not in reason
    if error is not None:
        assert "no CUDA driver" in reason


def test_a_visible_device_needs_no_skip(monkeypatch):
    monkeypatch.setitem(sys.modules, "cupy", _fake_cupy(1))
    assert _requires.cupy_missing() is None


@pytest.mark.parametrize("module, extra", [("torch", "torch"), ("jax.numpy", "jax"),
                                           ("ml_dtypes", "torch")])
def test_a_missing_framework_skips_naming_the_command(monkeypatch, module, extra):
    # None in sys.modules makes `import` fail as for a package that is not installed.
    monkeypatch.setitem(sys.modules, module.partition(".")[0], None)
    monkeypatch.setitem(sys.modules, module, None)
    with pytest.raises(pytest.skip.Exception) as skipped:
        _requires.require(module)
    package = module.partition(".")[0]
    assert str(skipped.value) == (f"{package} is not installed: "
                                  f"uv sync --inexact --extra {extra}")
