"""A strict fake CuPy (``cupy``, ``cupy.cuda``, ``cupy.cuda.nccl``, ``cupyx``) over host memory.

Used in-process by the NCCL tests (``FakeCuda().install(monkeypatch)``) and, through the
``cupy`` package beside this one, by processes on the fake GPU machine (``tests/_fakegpu``). It
is as strict as CuPy where our code could go wrong on a GPU machine (:mod:`.arrays` says how:
no implicit NumPy conversion, NumPy arrays refused by CuPy functions), keeps real addresses
behind ``.data.ptr`` (the fake NCCL reduces through them), and models the CuPy versions the
project supports: ``FakeCuda(version="13.6.0")`` or ``"14.2.0"`` (the default). They differ in
the NCCL unique id: ``nccl.get_unique_id()`` returns a tuple of 128 C ``char`` values on CuPy 13
and 128 ``bytes`` on CuPy 14, and ``NcclCommunicator(ndev, commId, rank)`` takes exactly that
type (``TypeError`` otherwise, in Cython's words).

Copies between host and device are real NumPy copies; pinned host memory is NumPy memory the
fake marks as pinned (:func:`is_pinned`); streams and events complete at once.
"""

from __future__ import annotations

import os
import sys
import threading
import types
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

import numpy as np

from .arrays import (
    FakeArray,
    FakeDevice,
    MemoryPointer,
    PerformanceWarning,
    current_device,
    unwrap,
    wrap,
)
from .memory import (
    Event,
    PinnedMemoryPointer,
    PinnedMemoryPool,
    Stream,
    current_stream,
    is_pinned,
    pinned_array,
)
from .nccl import NCCL_CONSTANTS, nccl_module

if TYPE_CHECKING:
    import pytest

__all__ = [
    "GPUS_ENV",
    "NCCL_CONSTANTS",
    "VERSIONS",
    "VERSION_ENV",
    "CUDARuntimeError",
    "FakeArray",
    "FakeCuda",
    "FakeDevice",
    "PerformanceWarning",
    "assert_same_bits",
    "host",
    "is_pinned",
    "machine_from_env",
    "visible_devices",
]

VERSIONS = ("13.6.0", "14.2.0")
"""The CuPy versions the fake models (the newest release of each supported major)."""


class CUDARuntimeError(RuntimeError):
    """``cupy_backends.cuda.api.runtime.CUDARuntimeError``."""


class FakeCuda:
    """One fake GPU machine as CuPy shows it: ``cupy``, ``cupy.cuda``, ``cupy.cuda.nccl`` and
    ``cupyx`` (:meth:`modules`), with what tests look at (``calls``, ``worlds``, ``streams``).

    ``gpus`` devices are visible (``getDeviceCount()``; none: CUDA's ``cudaErrorNoDevice``);
    ``version`` is ``cupy.__version__`` (13.x or 14.x); ``char_signed`` is the platform's C
    ``char`` (signed on x86-64, unsigned on aarch64), which CuPy 13's tuple ids depend on.
    ``across_processes``: unique ids name a root in this process, so NCCL ranks in other
    processes of the machine can join (``machine_from_env`` sets it; in-process tests join
    ranks by the id's bytes). Set ``hung`` to make events never complete, ``async_error`` to
    make NCCL report one.
    """

    def __init__(self, gpus: int = 3, *, version: str = VERSIONS[-1],
                 char_signed: bool = True, across_processes: bool = False) -> None:
        major = int(version.split(".")[0])
        if major not in (13, 14):
            raise ValueError(f"the fake models CuPy 13 and 14, not {version}")
        self.gpus, self.version, self.major, self.char_signed = gpus, version, major, char_signed
        self.across_processes = across_processes
        self.physical = list(range(gpus))  # the installed GPU each visible device is
        self.hung = False
        self.async_error: str | None = None
        self.worlds: dict[bytes, Any] = {}
        self.streams: dict[int, Stream] = {}  # every stream NCCL may be handed, by pointer
        self.calls: list[tuple[str, int, int]] = []  # NCCL calls: (kind, rank, device)
        self.pinned_bytes = 0  # pinned host memory allocated, in all
        self.group = threading.local()
        self.lock = threading.Lock()
        self._pinned_allocator: Any = None
        self.nccl = nccl_module(self)
        self.cuda = self._cuda_module()
        self.cupy = self._cupy_module()
        self.cupyx = types.ModuleType("cupyx")
        self.cupyx.empty_pinned = self.empty_pinned
        self.cupyx.zeros_pinned = self.zeros_pinned

    def modules(self) -> dict[str, types.ModuleType]:
        """The modules by the names ``import`` finds them under."""
        return {"cupy": self.cupy, "cupy.cuda": self.cuda, "cupy.cuda.nccl": self.nccl,
                "cupyx": self.cupyx}

    def install(self, monkeypatch: pytest.MonkeyPatch) -> FakeCuda:
        """Make ``import cupy`` (and its submodules, and ``cupyx``) give this fake for a test."""
        for name, module in self.modules().items():
            monkeypatch.setitem(sys.modules, name, module)
        return self

    # -- the modules --------------------------------------------------------------------------

    def _cupy_module(self) -> types.ModuleType:
        cupy = types.ModuleType("cupy")
        cupy.__version__ = self.version
        cupy.ndarray = FakeArray
        cupy.cuda = self.cuda
        cupy.asnumpy = asnumpy
        cupy.asarray = self.asarray
        cupy.array = self.array_function
        cupy.ascontiguousarray = ascontiguousarray
        cupy.from_dlpack = from_dlpack
        cupy.get_array_module = get_array_module
        cupy.__getattr__ = numpy_function
        return cupy

    def _cuda_module(self) -> types.ModuleType:
        cuda = types.ModuleType("cupy.cuda")
        fake = self

        class Device(FakeDevice):
            @property
            def pci_bus_id(self) -> str:
                return f"0000:{0x10 + fake.physical[self.id]:02X}:00.0"

            def __enter__(self) -> Device:
                fake.check_device(self.id)
                return super().__enter__()

        class HangingEvent(Event):
            hung = staticmethod(lambda: fake.hung)

        class MachineStream(Stream):
            event_class = HangingEvent

        cuda.Device = Device
        cuda.Stream = MachineStream
        cuda.Event = HangingEvent
        cuda.MemoryPointer = MemoryPointer
        cuda.get_current_stream = self.get_current_stream
        cuda.get_device_id = current_device
        cuda.runtime = types.SimpleNamespace(
            getDeviceCount=self.device_count, getDevice=current_device,
            deviceSynchronize=lambda: None, CUDARuntimeError=CUDARuntimeError)
        cuda.PinnedMemoryPointer = PinnedMemoryPointer
        cuda.PinnedMemoryPool = PinnedMemoryPool
        cuda.set_pinned_memory_allocator = self.set_pinned_memory_allocator
        cuda.alloc_pinned_memory = self.alloc_pinned_memory
        cuda.nccl = self.nccl
        return cuda

    # -- devices and streams ------------------------------------------------------------------

    def device_count(self) -> int:
        """``cupy.cuda.runtime.getDeviceCount()``: ``CUDARuntimeError`` when there is none."""
        if not self.gpus:
            raise CUDARuntimeError("cudaErrorNoDevice: no CUDA-capable device is detected")
        return self.gpus

    def check_device(self, device: int) -> None:
        """CUDA's error for a device that is not visible."""
        if not 0 <= device < self.gpus:
            raise CUDARuntimeError("cudaErrorInvalidDevice: invalid device ordinal")

    def get_current_stream(self, device_id: int | None = None) -> Stream:
        """``cupy.cuda.get_current_stream()``: the stream this thread made current on this
        device, else its default stream for the device (one per thread and device, so a test
        can tell which GPU's stream NCCL was handed)."""
        device = current_device() if device_id is None else device_id
        stream = current_stream()
        with self.lock:
            if stream is None or stream.device_id != device:
                ident = threading.get_ident()
                stream = next((s for s in self.streams.values()
                               if getattr(s, "thread", None) == ident
                               and s.device_id == device), None)
                if stream is None:
                    with FakeDevice(device):
                        stream = self.cuda.Stream()
                    stream.thread = ident
            self.streams[stream.ptr] = stream
            return stream

    # -- arrays -------------------------------------------------------------------------------

    def array(self, values: Any, device: int, dtype: Any = None, order: str = "C") -> FakeArray:
        """A new array on ``device`` holding ``values`` (host data or a fake array)."""
        self.check_device(device)
        host = np.array(unwrap(values, host_ok=True), dtype=dtype, order=order)
        return FakeArray.over(host, device)

    def empty(self, shape: Any, dtype: Any = float, order: str = "C") -> FakeArray:
        return FakeArray.over(np.empty(shape, dtype, order), current_device())

    def asarray(self, a: Any, dtype: Any = None, order: Any = None, *,
                blocking: bool = False) -> FakeArray:
        """``cupy.asarray``: ``a`` itself when it is on the current device in ``dtype``; else a
        copy on the current device (host data is copied in)."""
        device = current_device()
        if (isinstance(a, FakeArray) and a._device_id == device
                and (dtype is None or np.dtype(dtype) == a.dtype)):
            return a
        return self.array(a, device, dtype, "C" if order in (None, "K", "A") else order)

    def array_function(self, obj: Any, dtype: Any = None, copy: bool = True, order: str = "K",
                       subok: bool = False, ndmin: int = 0, *,
                       blocking: bool = False) -> FakeArray:
        """``cupy.array``: a copy on the current device (host data is copied in)."""
        if not copy:
            return self.asarray(obj, dtype)
        out = self.array(obj, current_device(), dtype, "C" if order in ("K", "A") else order)
        return out.reshape((1,) * (ndmin - out.ndim) + out.shape) if ndmin > out.ndim else out

    # -- pinned host memory -------------------------------------------------------------------

    def set_pinned_memory_allocator(self, allocator: Any = None) -> None:
        """``cupy.cuda.set_pinned_memory_allocator``: ``None`` allocates without a pool."""
        self._pinned_allocator = allocator

    def alloc_pinned_memory(self, size: int) -> PinnedMemoryPointer:
        """``cupy.cuda.alloc_pinned_memory``: through the current pinned allocator."""
        self.pinned_bytes += int(size)
        if self._pinned_allocator is None:
            return PinnedMemoryPointer(int(size))
        return self._pinned_allocator(int(size))

    def empty_pinned(self, shape: Any, dtype: Any = float, order: str = "C") -> np.ndarray:
        """``cupyx.empty_pinned``: a NumPy array over pinned memory."""
        return pinned_array(self.alloc_pinned_memory, shape, dtype, order)

    def zeros_pinned(self, shape: Any, dtype: Any = float, order: str = "C") -> np.ndarray:
        """``cupyx.zeros_pinned``."""
        out = self.empty_pinned(shape, dtype, order)
        out.fill(0)
        return out

    # -- NCCL ---------------------------------------------------------------------------------

    def id_key(self, comm_id: Any) -> bytes:
        """The bytes of ``comm_id`` if this CuPy version's ``NcclCommunicator`` takes it.

        CuPy 13: ``def __init__(self, int ndev, tuple commId, int rank)``, each value converted
        to a C ``char``; CuPy 14: ``bytes commId``, its length checked.
        """
        want = bytes if self.major >= 14 else tuple
        if not isinstance(comm_id, want):  # what Cython says of a typed argument
            raise TypeError(f"Argument 'commId' has incorrect type (expected {want.__name__}, "
                            f"got {type(comm_id).__name__})")
        if want is bytes:
            if len(comm_id) != 128:
                raise ValueError(f"commId length {len(comm_id)} != 128.")
            return comm_id
        assert len(comm_id) == 128
        low, high = (-128, 127) if self.char_signed else (0, 255)
        if not all(low <= v <= high for v in comm_id):
            raise OverflowError("value too large to convert to char")
        return bytes(v & 0xFF for v in comm_id)


# -- module functions that need no machine ---------------------------------------------------


def asnumpy(a: Any, stream: Any = None, order: str = "C", out: np.ndarray | None = None, *,
            blocking: bool = True) -> np.ndarray:
    """``cupy.asnumpy``: ``a.get(...)`` for a CuPy array, else ``numpy.asarray``."""
    if isinstance(a, FakeArray):
        return a.get(stream=stream, order=order, out=out, blocking=blocking)
    temp = np.asarray(a, order=order)
    if out is None:
        return temp
    out[...] = temp
    return out


def ascontiguousarray(a: Any, dtype: Any = None) -> FakeArray:
    """``cupy.ascontiguousarray``: CuPy arrays only (Cython's ``TypeError`` otherwise)."""
    if not isinstance(a, FakeArray):
        raise TypeError(f"Argument 'a' has incorrect type (expected cupy._core.core._ndarray_"
                        f"base, got {type(a).__name__})")
    return wrap(np.ascontiguousarray(a._host, dtype), a._device_id)


def from_dlpack(array: Any, *, device: Any = None, copy: Any = None) -> FakeArray:
    """``cupy.from_dlpack``: a CuPy array as itself; CPU producers get CuPy's ``TypeError``;
    other GPU producers (torch CUDA tensors) cannot exist on the fake machine."""
    if isinstance(array, FakeArray):
        return array
    if array.__dlpack_device__()[0] == 1:  # kDLCPU
        raise TypeError("CPU arrays cannot be directly imported to CuPy. Use "
                        "`cupy.array(numpy.from_dlpack(input))` instead.")
    raise BufferError("the fake GPU machine imports no DLPack tensor from outside it")


def get_array_module(*args: Any) -> types.ModuleType:
    """``cupy.get_array_module``: ``cupy`` when any argument is a CuPy array, else ``numpy``."""
    if any(isinstance(a, FakeArray) for a in args):
        return sys.modules["cupy"]
    return np


def numpy_function(name: str, namespace: Any = np) -> Any:
    """``cupy.NAME`` for the rest of NumPy's namespace: dtypes and constants as they are,
    functions run by NumPy on the arrays' memory with results on the current device, modules
    (``cupy.linalg``, ``cupy.random``) wrapped alike. Like CuPy's, the functions refuse NumPy
    arrays (``TypeError: Unsupported type``). ``cupy.testing`` compares host copies."""
    if namespace is np and name == "testing":
        return _testing()
    value = getattr(namespace, name)  # AttributeError, as for a missing module attribute
    if isinstance(value, types.ModuleType):
        module = types.ModuleType(f"cupy.{name}")
        module.__getattr__ = lambda attr: numpy_function(attr, value)
        return module
    if not callable(value) or isinstance(value, type):
        return value

    def function(*args: Any, **kwargs: Any) -> Any:
        out = value(*unwrap(list(args)), **{k: unwrap(v) for k, v in kwargs.items()})
        return wrap(out, current_device())

    function.__name__ = name
    return function


def _testing() -> types.ModuleType:
    """``cupy.testing``: NumPy's assertions on host copies of CuPy (or NumPy) arrays."""
    module = types.ModuleType("cupy.testing")
    for name in ("assert_array_equal", "assert_allclose", "assert_array_almost_equal",
                 "assert_array_less"):
        check = getattr(np.testing, name)

        def assertion(x: Any, y: Any, *args: Any, check: Any = check, **kwargs: Any) -> None:
            check(asnumpy(x), asnumpy(y), *args, **kwargs)

        setattr(module, name, assertion)
    return module


# -- the fake GPU machine of a process -------------------------------------------------------

GPUS_ENV = "CLUSTER_FAKE_GPUS"
VERSION_ENV = "CLUSTER_FAKE_CUPY"
_MACHINE: list[FakeCuda] = []


def visible_devices(installed: int, visible: str | None) -> list[int]:
    """The installed GPUs ``CUDA_VISIBLE_DEVICES`` leaves, in its order, as the driver reads it.

    Unset: all of them. Otherwise a comma-separated list of indices, cut at the first entry
    that is not an installed, not yet listed index (so ``""`` and ``"-1"`` hide every GPU).
    """
    if visible is None:
        return list(range(installed))
    kept: list[int] = []
    for entry in visible.split(","):
        entry = entry.strip()
        if not entry.isdigit() or int(entry) >= installed or int(entry) in kept:
            break
        kept.append(int(entry))
    return kept


def machine_from_env(environ: Mapping[str, str] | None = None) -> FakeCuda:
    """This process's fake GPU machine, made once from the environment.

    ``CLUSTER_FAKE_GPUS`` GPUs are installed (default 1), ``CUDA_VISIBLE_DEVICES`` selects
    among them; ``CLUSTER_FAKE_CUPY`` is CuPy's version ("13" or "14" pick the modelled
    release of that major; default the newest). ``fake.physical[i]`` is the installed GPU that
    device ``i`` of this process is.
    """
    if not _MACHINE:
        env = os.environ if environ is None else environ
        installed = int(env.get(GPUS_ENV, "1"))
        physical = visible_devices(installed, env.get("CUDA_VISIBLE_DEVICES"))
        version = env.get(VERSION_ENV, VERSIONS[-1])
        version = {v.split(".")[0]: v for v in VERSIONS}.get(version, version)
        fake = FakeCuda(gpus=len(physical), version=version, across_processes=True)
        fake.physical = physical
        _MACHINE.append(fake)
    return _MACHINE[0]


# -- for tests -------------------------------------------------------------------------------


def host(array: Any) -> np.ndarray:
    """A host copy of a fake (or NumPy) array, for assertions."""
    return array.get() if isinstance(array, FakeArray) else np.asarray(array)


def assert_same_bits(results: list[Any], want: np.ndarray) -> None:
    for r in results:
        got = host(r)
        assert got.dtype == want.dtype and got.shape == want.shape
        assert got.tobytes() == want.tobytes()
