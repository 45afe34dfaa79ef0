"""The fake ``cupy.ndarray``: host memory that refuses to be taken for a NumPy array.

As strict as CuPy where code could go wrong on a GPU machine:

- ``numpy.asarray(x)``, ``numpy.float32(x)``, ``numpy.array([x])`` raise CuPy's ``TypeError:
  Implicit conversion to a NumPy array is not allowed. ...`` (``__array__`` raises); host copies
  are ``x.get()`` or ``cupy.asnumpy(x)``;
- ``float(x)``, ``int(x)``, ``bool(x)`` work as CuPy's do (``float(self.get())``: a device sync
  in CuPy), so a 0-d or one-element array converts and a larger one fails as NumPy's would;
- NumPy ufuncs and functions on CuPy arrays give CuPy arrays (``__array_ufunc__``,
  ``__array_function__``), and refuse a NumPy array among the inputs (``TypeError: Unsupported
  type <class 'numpy.ndarray'>``); reductions and scalar indexing give 0-d arrays, not scalars;
- an array used on another GPU than the current one warns as CuPy does with peer access
  (``PerformanceWarning``).

Arrays keep real ``.data.ptr`` addresses (the fake NCCL reduces through them) and know their
device. :func:`live_arrays` lists those alive, so NCCL can refuse pointers outside them.
"""

from __future__ import annotations

import threading
import warnings
import weakref
from collections.abc import Iterator
from typing import Any

import numpy as np
from numpy.lib.mixins import NDArrayOperatorsMixin

__all__ = ["FakeArray", "FakeDevice", "MemoryPointer", "PerformanceWarning", "current_device",
           "live_arrays", "unwrap", "wrap"]

IMPLICIT = ("Implicit conversion to a NumPy array is not allowed. "
            "Please use `.get()` to construct a NumPy array explicitly.")

_LOCAL = threading.local()
_LIVE: dict[int, weakref.ref] = {}  # id -> the array (arrays are unhashable, as NumPy's)


class PerformanceWarning(RuntimeWarning):
    """``cupy._util.PerformanceWarning``."""


def current_device() -> int:
    """The id of this thread's current GPU (``cupy.cuda.Device().id``)."""
    stack = getattr(_LOCAL, "devices", None)
    if stack:
        return stack[-1]
    return getattr(_LOCAL, "used", 0)


class FakeDevice:
    """``cupy.cuda.Device``: a context manager making ``id`` current in this thread; ``use()``
    makes it current until another ``use()``."""

    def __init__(self, device: int | None = None) -> None:
        self.id = current_device() if device is None else int(device)

    def __repr__(self) -> str:
        return f"<CUDA Device {self.id}>"

    def __eq__(self, other: object) -> bool:
        return isinstance(other, FakeDevice) and other.id == self.id

    def __hash__(self) -> int:
        return hash(self.id)

    def __enter__(self) -> FakeDevice:
        if not hasattr(_LOCAL, "devices"):
            _LOCAL.devices = []
        _LOCAL.devices.append(self.id)
        return self

    def __exit__(self, *exc: object) -> None:
        _LOCAL.devices.pop()

    def use(self) -> None:
        _LOCAL.used = self.id

    def synchronize(self) -> None:
        pass  # the fake's work is done when it returns


class MemoryPointer:
    """``cupy.cuda.MemoryPointer``: an address on a device."""

    def __init__(self, ptr: int, device_id: int) -> None:
        self.ptr, self.device_id = ptr, device_id

    @property
    def device(self) -> FakeDevice:
        return FakeDevice(self.device_id)


def wrap(value: Any, device: int) -> Any:
    """NumPy results as CuPy gives them: arrays and scalars become arrays on ``device``."""
    if isinstance(value, np.ndarray):
        return FakeArray.over(value, device)
    if isinstance(value, np.generic):
        return FakeArray.over(np.array(value), device)
    if isinstance(value, tuple):
        return tuple(wrap(v, device) for v in value)
    if isinstance(value, list):
        return [wrap(v, device) for v in value]
    return value


def unwrap(value: Any, *, host_ok: bool = False) -> Any:
    """The host memory behind fake arrays (in lists and tuples too); NumPy arrays raise
    CuPy's ``TypeError`` unless ``host_ok`` (where CuPy copies host data in)."""
    if isinstance(value, FakeArray):
        return value._host
    if isinstance(value, np.ndarray) and not host_ok:
        raise TypeError(f"Unsupported type {type(value)}")
    if isinstance(value, tuple | list):
        return type(value)(unwrap(v, host_ok=host_ok) for v in value)
    return value


def _devices(values: Any) -> Iterator[int]:
    for value in values:
        if isinstance(value, FakeArray):
            yield value._device_id
        elif isinstance(value, tuple | list):
            yield from _devices(value)


def check_peer_access(values: Any, device: int) -> None:
    """CuPy's warning when an array of another GPU is used on ``device`` (peer access)."""
    for other in _devices(values):
        if other != device:
            warnings.warn(
                f"The device where the array resides ({other}) is different from the current "
                f"device ({device}). Peer access has been activated automatically.",
                PerformanceWarning, stacklevel=3)


def live_arrays() -> list[FakeArray]:
    """The fake arrays alive now."""
    return [a for a in (ref() for ref in list(_LIVE.values())) if a is not None]


# ndarray's methods and attributes that a cupy.ndarray has too; results come back as arrays
# on the array's device, except these, which CuPy also returns as host values.
_HOST_RESULTS = frozenset({"item", "tolist", "tobytes"})
_NOT_IN_CUPY = frozenset({"ctypes", "tofile", "dump", "dumps", "setflags", "getfield",
                          "setfield", "resize", "newbyteorder", "itemset", "base"})


class FakeArray(NDArrayOperatorsMixin):
    """A ``cupy.ndarray`` over host memory (see the module docstring for what it refuses).

    ``FakeArray(shape, dtype=float, order="C")`` allocates on the current device, as
    ``cupy.ndarray(shape, dtype)`` does.
    """

    __hash__ = None  # type: ignore[assignment]

    def __init__(self, shape: Any, dtype: Any = float, memptr: Any = None, strides: Any = None,
                 order: str = "C") -> None:
        if memptr is not None or strides is not None:
            raise NotImplementedError("the fake allocates its own memory")
        self._init(np.empty(shape, dtype, order), current_device())

    @classmethod
    def over(cls, host: np.ndarray, device: int) -> FakeArray:
        """An array on ``device`` whose memory is ``host``'s (no copy)."""
        out = cls.__new__(cls)
        out._init(host, device)
        return out

    def __reduce__(self) -> tuple[Any, ...]:
        return (FakeArray.over, (self.get(), self._device_id))  # CuPy pickles a host copy

    def _init(self, host: np.ndarray, device: int) -> None:
        self._host, self._device_id = host, device
        key = id(self)
        _LIVE[key] = weakref.ref(self, lambda _, key=key: _LIVE.pop(key, None))

    # -- what CuPy refuses --------------------------------------------------------------------

    def __array__(self, dtype: Any = None, copy: Any = None) -> np.ndarray:
        raise TypeError(IMPLICIT)

    def __array_ufunc__(self, ufunc: np.ufunc, method: str, *inputs: Any, **kwargs: Any) -> Any:
        device = current_device()
        check_peer_access([*inputs, *kwargs.get("out", ())], device)
        if "out" in kwargs:
            outs = kwargs["out"]
            if not all(isinstance(o, FakeArray) for o in outs):
                raise TypeError("Output arguments must be cupy.ndarray")
            kwargs["out"] = tuple(o._host for o in outs)
        result = getattr(ufunc, method)(*unwrap(list(inputs)), **kwargs)
        if "out" in kwargs and method in ("__call__", "reduce", "accumulate"):
            return outs[0] if len(outs) == 1 else outs
        return wrap(result, device)

    def __array_function__(self, func: Any, types: Any, args: Any, kwargs: Any) -> Any:
        if not all(issubclass(t, FakeArray | np.ndarray) for t in types):
            return NotImplemented
        device = current_device()
        check_peer_access([args, list(kwargs.values())], device)
        result = func(*unwrap(list(args)), **{k: unwrap(v) for k, v in kwargs.items()})
        return wrap(result, device)

    def __dlpack__(self, **kwargs: Any) -> Any:
        raise BufferError("the fake GPU's memory cannot be exported: copy it with .get()")

    def __dlpack_device__(self) -> tuple[int, int]:
        return (2, self._device_id)  # kDLCUDA

    # -- what CuPy allows, with a device sync -------------------------------------------------

    def get(self, stream: Any = None, order: str = "C", out: np.ndarray | None = None,
            blocking: bool = True) -> np.ndarray:
        """Device to host, as ``cupy.ndarray.get``: a new NumPy array, or into ``out`` (a NumPy
        array of this shape and dtype, e.g. a pinned one), with CuPy's errors."""
        if out is None:
            if order == "A":
                order = "F" if self._host.flags.f_contiguous else "C"
            return np.array(self._host, copy=True, order=order)
        if not isinstance(out, np.ndarray):
            raise TypeError("Only numpy.ndarray can be obtained fromcupy.ndarray")
        if self.dtype != out.dtype:
            raise TypeError(f"{out.dtype} array cannot be obtained from {self.dtype} array")
        if self.shape != out.shape:
            raise ValueError(f"Shape mismatch. Expected shape: {self.shape}, "
                             f"actual shape: {out.shape}")
        out[...] = self._host
        return out

    def set(self, arr: np.ndarray, stream: Any = None) -> None:
        """Host to device, as ``cupy.ndarray.set``: ``arr`` a NumPy array of this shape and
        dtype, copied in, with CuPy's errors."""
        if not isinstance(arr, np.ndarray):
            raise TypeError("Only numpy.ndarray can be set to cupy.ndarray")
        if self.dtype != arr.dtype:
            raise TypeError(f"{arr.dtype} array cannot be set to {self.dtype} array")
        if self.shape != arr.shape:
            raise ValueError(f"Shape mismatch. Old shape: {self.shape}, new shape: {arr.shape}")
        if not (self.flags.c_contiguous or self.flags.f_contiguous):
            raise RuntimeError("Cannot set to non-contiguous array")
        self._host[...] = arr

    def __int__(self) -> int:
        return int(self.get())

    def __float__(self) -> float:
        return float(self.get())

    def __complex__(self) -> complex:
        return complex(self.get())

    def __bool__(self) -> bool:
        return bool(self.get())

    def __len__(self) -> int:
        if not self.ndim:
            raise TypeError("len() of unsized object")
        return self.shape[0]

    def __iter__(self) -> Iterator[FakeArray]:
        if not self.ndim:
            raise TypeError("iteration over a 0-d array")
        return (self[i] for i in range(self.shape[0]))

    def __repr__(self) -> str:
        return repr(self.get())

    # -- the array ----------------------------------------------------------------------------

    @property
    def device(self) -> FakeDevice:
        return FakeDevice(self._device_id)

    @property
    def data(self) -> MemoryPointer:
        return MemoryPointer(self._host.ctypes.data, self._device_id)

    @property
    def __cuda_array_interface__(self) -> dict[str, Any]:
        host = self._host
        return {"shape": host.shape, "typestr": host.dtype.str, "descr": host.dtype.descr,
                "data": (host.ctypes.data, False), "version": 3,
                "strides": None if host.flags.c_contiguous else host.strides}

    def __getitem__(self, key: Any) -> FakeArray:
        check_peer_access([key], self._device_id)
        return wrap(self._host[unwrap(key, host_ok=True)], self._device_id)

    def __setitem__(self, key: Any, value: Any) -> None:
        check_peer_access([key, value], self._device_id)
        self._host[unwrap(key, host_ok=True)] = unwrap(value, host_ok=True)

    def __getattr__(self, name: str) -> Any:
        if name.startswith("_") or name in _NOT_IN_CUPY:  # NumPy's protocols included
            raise AttributeError(f"'cupy.ndarray' object has no attribute '{name}'")
        value = getattr(self._host, name)
        if name in _HOST_RESULTS:
            return value
        if not callable(value):
            return wrap(value, self._device_id)
        device = self._device_id

        def method(*args: Any, **kwargs: Any) -> Any:
            out = value(*unwrap(list(args)), **{k: unwrap(v) for k, v in kwargs.items()})
            return self if out is self._host else wrap(out, device)  # astype(copy=False) & co

        return method

    # attributes read often enough, and never arrays, to be worth spelling out
    shape = property(lambda self: self._host.shape)
    dtype = property(lambda self: self._host.dtype)
    size = property(lambda self: self._host.size)
    ndim = property(lambda self: self._host.ndim)
    nbytes = property(lambda self: self._host.nbytes)
    itemsize = property(lambda self: self._host.itemsize)
    strides = property(lambda self: self._host.strides)
    flags = property(lambda self: self._host.flags)
