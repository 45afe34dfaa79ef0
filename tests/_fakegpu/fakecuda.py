"""A fake CuPy and ``cupy.cuda.nccl`` over host memory, for tests without a GPU.

Used in-process by the NCCL tests (``FakeCuda().install(monkeypatch)``) and, through the
``cupy`` package beside this module, by processes started on the fake GPU machine (see
``tests/_fakegpu/__init__.py``). Arrays keep real ``.data.ptr`` addresses; communicators follow
CuPy's signatures and reduce through the pointers once every rank has posted a call.

``FakeCuda(version="13.6.0")`` or ``"14.2.0"`` (the default) models what differs between the two
CuPy versions: ``nccl.get_unique_id()`` returns a tuple of 128 C ``char`` values on CuPy 13 and
128 ``bytes`` on CuPy 14, and ``NcclCommunicator(ndev, commId, rank)`` takes exactly that type
(``TypeError`` otherwise, with Cython's message).
"""

from __future__ import annotations

import ctypes
import os
import sys
import threading
import types
from typing import TYPE_CHECKING, Any

import numpy as np

if TYPE_CHECKING:
    import pytest

__all__ = [
    "NCCL_CONSTANTS",
    "VERSIONS",
    "CUDARuntimeError",
    "FakeArray",
    "FakeCuda",
    "FakeDevice",
    "assert_same_bits",
    "host",
    "is_pinned",
    "machine_from_env",
]

# The constants of cupy_backends/cuda/libs/nccl.pxd.
NCCL_CONSTANTS = {
    "NCCL_SUM": 0, "NCCL_PROD": 1, "NCCL_MAX": 2, "NCCL_MIN": 3, "NCCL_AVG": 4,
    "NCCL_INT8": 0, "NCCL_CHAR": 0, "NCCL_UINT8": 1, "NCCL_INT32": 2, "NCCL_INT": 2,
    "NCCL_UINT32": 3, "NCCL_INT64": 4, "NCCL_UINT64": 5, "NCCL_FLOAT16": 6, "NCCL_HALF": 6,
    "NCCL_FLOAT32": 7, "NCCL_FLOAT": 7, "NCCL_FLOAT64": 8, "NCCL_DOUBLE": 8, "NCCL_BFLOAT16": 9,
}
NP_OF_NCCL = {0: "int8", 1: "uint8", 2: "int32", 3: "uint32", 4: "int64", 5: "uint64",
              6: "float16", 7: "float32", 8: "float64"}
UFUNC_OF_OP = {0: np.add, 1: np.multiply, 2: np.maximum, 3: np.minimum}


class CUDARuntimeError(RuntimeError):
    """``cupy_backends.cuda.api.runtime.CUDARuntimeError``."""


# -- a fake CuPy -----------------------------------------------------------------------------

_LOCAL = threading.local()


def _current_device() -> int:
    stack = getattr(_LOCAL, "devices", None)
    return stack[-1] if stack else 0


class FakeDevice:
    """``cupy.cuda.Device``: a context manager making ``id`` current in this thread."""

    def __init__(self, device: int | None = None) -> None:
        self.id = _current_device() if device is None else int(device)

    def __enter__(self) -> FakeDevice:
        if not hasattr(_LOCAL, "devices"):
            _LOCAL.devices = []
        _LOCAL.devices.append(self.id)
        return self

    def __exit__(self, *exc: object) -> None:
        _LOCAL.devices.pop()


class FakeArray(np.ndarray):
    """A ``cupy.ndarray`` stand-in: host memory, ``.device`` and ``.data.ptr`` (its address)."""

    _device_id = 0

    def __array_finalize__(self, obj: Any) -> None:
        self._device_id = getattr(obj, "_device_id", _current_device())

    @property
    def device(self) -> FakeDevice:
        return FakeDevice(self._device_id)

    def get(self, stream: Any = None, order: str = "C", out: np.ndarray | None = None,
            blocking: bool = True) -> np.ndarray:
        """Device to host, as ``cupy.ndarray.get``: a new array, or into ``out`` (a NumPy
        array of this shape and dtype, e.g. a pinned one) with CuPy's errors."""
        mine = self.view(np.ndarray)
        if out is None:
            if order == "A":
                order = "F" if mine.flags.f_contiguous else "C"
            return np.array(mine, copy=True, order=order)
        if not isinstance(out, np.ndarray) or isinstance(out, FakeArray):
            raise TypeError("Only numpy.ndarray can be obtained fromcupy.ndarray")
        if self.dtype != out.dtype:
            raise TypeError(f"{out.dtype} array cannot be obtained from {self.dtype} array")
        if self.shape != out.shape:
            raise ValueError(f"Shape mismatch. Expected shape: {self.shape}, "
                             f"actual shape: {out.shape}")
        out[...] = mine
        return out

    def set(self, arr: np.ndarray, stream: Any = None) -> None:
        """Host to device, as ``cupy.ndarray.set``: ``arr`` a NumPy array of this shape and
        dtype, copied in."""
        if not isinstance(arr, np.ndarray) or isinstance(arr, FakeArray):
            raise TypeError("Only numpy.ndarray can be set to cupy.ndarray")
        if self.dtype != arr.dtype:
            raise TypeError(f"{arr.dtype} array cannot be set to {self.dtype} array")
        if self.shape != arr.shape:
            raise ValueError(f"Shape mismatch. Old shape: {self.shape}, new shape: {arr.shape}")
        if not (self.flags.c_contiguous or self.flags.f_contiguous):
            raise RuntimeError("Cannot set to non-contiguous array")
        self.view(np.ndarray)[...] = arr

    @property
    def data(self) -> Any:  # shadows ndarray.data, as cupy.ndarray.data is a MemoryPointer
        return types.SimpleNamespace(ptr=self.ctypes.data)


class FakeStream:
    def __init__(self, ptr: int, device: int) -> None:
        self.ptr, self.device, self.syncs = ptr, device, 0

    def synchronize(self) -> None:
        self.syncs += 1


class PinnedMemoryPointer(bytearray):
    """``cupy.cuda.PinnedMemoryPointer``: page-locked host memory (here, plain host memory that
    the fake remembers as pinned). NumPy arrays made over it (``cupyx.empty_pinned``) keep it as
    their ``base``, which is how :func:`is_pinned` knows them."""

    @property
    def ptr(self) -> int:
        return np.frombuffer(self, np.uint8).ctypes.data if len(self) else 0

    @property
    def size(self) -> int:
        return len(self)


def is_pinned(array: Any) -> bool:
    """Whether ``array`` is a NumPy array over pinned memory (``cupyx.empty_pinned`` & co)."""
    base = array
    while base is not None:
        if isinstance(base, PinnedMemoryPointer):
            return True
        base = getattr(base, "base", None) if isinstance(base, np.ndarray) else getattr(
            base, "obj", None)  # a memoryview's exporter
    return False


class PinnedMemoryPool:
    """``cupy.cuda.PinnedMemoryPool``: reuses freed pinned blocks of the same size."""

    def __init__(self) -> None:
        self.allocated = 0  # blocks made, not reused: tests assert reuse with it

    def malloc(self, size: int) -> PinnedMemoryPointer:
        self.allocated += 1
        return PinnedMemoryPointer(int(size))

    def free_all_blocks(self) -> None:
        pass

    def n_free_blocks(self) -> int:
        return 0


class _World:
    """The ranks of one fake communicator: a collective runs once every rank has posted it."""

    def __init__(self, fake: FakeCuda, size: int) -> None:
        self.fake, self.size = fake, size
        self.cond = threading.Condition()
        self.posted: dict[int, dict[int, tuple]] = {}
        self.next = [0] * size
        self.done: dict[int, BaseException | None] = {}

    def post(self, rank: int, kind: str, args: tuple, *, wait: bool) -> None:
        with self.cond:
            seq = self.next[rank]
            self.next[rank] += 1
            calls = self.posted.setdefault(seq, {})
            calls[rank] = (kind, args)
            if len(calls) == self.size:
                try:
                    self._execute(calls)
                    self.done[seq] = None
                except BaseException as e:
                    self.done[seq] = e
                self.cond.notify_all()
            elif wait and not self.cond.wait_for(lambda: seq in self.done, timeout=10):
                raise AssertionError(f"rank {rank}'s {kind} would hang: other ranks never "
                                     "called it (calls from one thread need an NCCL group)")
            if wait and self.done.get(seq) is not None:
                raise self.done[seq]

    def _execute(self, calls: dict[int, tuple]) -> None:
        kinds = {kind for kind, _ in calls.values()}
        params = {args[2:] for _, args in calls.values()}  # all but the two pointers
        assert len(kinds) == 1 and len(params) == 1, f"ranks disagree: {calls}"
        kind, (_, _, count, dtype, *rest) = calls[0]
        buf = self.fake.buffer
        sends = [buf(calls[r][1][0], count, dtype) for r in range(self.size)]
        if kind == "allReduce":
            result = sends[0].copy()
            for other in sends[1:]:
                UFUNC_OF_OP[rest[0]](result, other, out=result)
        elif kind == "broadcast":
            result = sends[rest[0]].copy()
        else:
            result = np.concatenate(sends)
        for r in range(self.size):
            buf(calls[r][1][1], result.size, dtype)[:] = result


VERSIONS = ("13.6.0", "14.2.0")
"""The CuPy versions the fake models (the last minor of each major it supports)."""


class FakeCuda:
    """``cupy``, ``cupy.cuda`` and ``cupy.cuda.nccl`` modules over host memory.

    ``gpus`` devices are visible (``getDeviceCount()``); ``version`` is ``cupy.__version__``
    (one of :data:`VERSIONS`, or any "13.x"/"14.x"); ``char_signed`` is the platform's C
    ``char`` (signed on x86-64, unsigned on aarch64), which CuPy 13's tuple ids depend on.
    """

    def __init__(self, gpus: int = 3, *, version: str = VERSIONS[-1],
                 char_signed: bool = True) -> None:
        major = int(version.split(".")[0])
        if major not in (13, 14):
            raise ValueError(f"the fake models CuPy 13 and 14, not {version}")
        self.gpus, self.version, self.major, self.char_signed = gpus, version, major, char_signed
        self.physical = list(range(gpus))  # the installed GPU each visible device is
        self.hung = False  # events never complete
        self.async_error: str | None = None
        self.regions: list[tuple[int, int, np.ndarray]] = []
        self.worlds: dict[bytes, _World] = {}
        self.streams: dict[int, FakeStream] = {}
        self.calls: list[tuple[str, int, int]] = []  # (kind, rank, device)
        self.group = threading.local()
        self.lock = threading.Lock()
        self.nccl = self._nccl_module()
        self.cuda = types.ModuleType("cupy.cuda")
        self.cuda.Device = FakeDevice
        self.cuda.get_current_stream = self.get_current_stream
        self.cuda.Event = self._event_class()
        self.cuda.runtime = types.SimpleNamespace(getDeviceCount=self.device_count)
        self.cuda.nccl = self.nccl
        self.cupy = types.ModuleType("cupy")
        self.cupy.__version__ = version
        self.cupy.ndarray = FakeArray
        self.cupy.cuda = self.cuda
        self.cuda.PinnedMemoryPointer = PinnedMemoryPointer
        self.cuda.PinnedMemoryPool = PinnedMemoryPool
        self.pinned_allocator: Any = None
        self.cuda.set_pinned_memory_allocator = self.set_pinned_memory_allocator
        self.cuda.alloc_pinned_memory = self.alloc_pinned_memory
        self.cupyx = types.ModuleType("cupyx")
        self.cupyx.empty_pinned = self.empty_pinned
        self.cupyx.zeros_pinned = self.zeros_pinned
        self.pinned_bytes = 0  # total pinned memory allocated: tests assert reuse with it
        self.cupy.empty = self.empty
        self.cupy.asnumpy = self.asnumpy
        self.cupy.asarray = lambda a: self.array(a, _current_device())
        self.cupy.array = lambda a, dtype=None, copy=True, order="K": self.array(
            a.get() if isinstance(a, FakeArray) else a, _current_device(), dtype,
            "C" if order in ("K", "A") else order)
        self.cupy.__getattr__ = self._numpy_function

    def modules(self) -> dict[str, types.ModuleType]:
        """The modules by the names ``import`` finds them under."""
        return {"cupy": self.cupy, "cupy.cuda": self.cuda, "cupy.cuda.nccl": self.nccl,
                "cupyx": self.cupyx}

    def install(self, monkeypatch: pytest.MonkeyPatch) -> FakeCuda:
        """Make ``import cupy`` (and its submodules) give this fake for one test."""
        for name, module in self.modules().items():
            monkeypatch.setitem(sys.modules, name, module)
        return self

    def _numpy_function(self, name: str) -> Any:
        """``cupy.NAME`` for the rest of NumPy's namespace: dtypes as they are, functions run by
        NumPy on the arrays' memory; results on the current device. Like CuPy, functions refuse
        NumPy arrays (``TypeError: Unsupported type``) except where CuPy takes host data."""
        value = getattr(np, name)  # AttributeError, as a missing module attribute
        if not callable(value) or isinstance(value, type):
            return value
        takes_host = name in ("array", "asarray", "asanyarray", "ascontiguousarray")

        def function(*args: Any, **kwargs: Any) -> Any:
            for arg in [*args, *kwargs.values()]:
                items = arg if isinstance(arg, list | tuple) else [arg]
                for item in items:
                    if (isinstance(item, np.ndarray) and not isinstance(item, FakeArray)
                            and not takes_host):
                        raise TypeError(f"Unsupported type {type(item)}")
            out = value(*args, **kwargs)
            if isinstance(out, np.ndarray) and not isinstance(out, FakeArray):
                return self.array(out, _current_device())
            return out

        function.__name__ = name
        return function

    def device_count(self) -> int:
        """``cupy.cuda.runtime.getDeviceCount()``: ``CUDARuntimeError`` when there is none."""
        if not self.gpus:
            raise CUDARuntimeError("cudaErrorNoDevice: no CUDA-capable device is detected")
        return self.gpus

    # arrays and memory
    def array(self, values: Any, device: int, dtype: Any = None, order: str = "C") -> FakeArray:
        host = np.array(values, dtype=dtype, order=order)
        with FakeDevice(device):
            out = self.empty(host.shape, host.dtype, order)
        out[...] = host
        return out

    def empty(self, shape: Any, dtype: Any = float, order: str = "C") -> FakeArray:
        out = np.empty(shape, dtype, order).view(FakeArray)
        out._device_id = _current_device()
        self.regions.append((out.ctypes.data, out.nbytes, out))
        return out

    @staticmethod
    def asnumpy(a: Any, stream: Any = None, order: str = "C", out: np.ndarray | None = None,
                *, blocking: bool = True) -> np.ndarray:
        """``cupy.asnumpy``: ``a.get(...)`` for a CuPy array, else ``numpy.asarray``."""
        if isinstance(a, FakeArray):
            return a.get(stream=stream, order=order, out=out, blocking=blocking)
        temp = np.asarray(a, order=order)
        if out is None:
            return temp
        out[...] = temp
        return out

    def set_pinned_memory_allocator(self, allocator: Any = None) -> None:
        """``cupy.cuda.set_pinned_memory_allocator``: ``None`` allocates without a pool."""
        self.pinned_allocator = allocator

    def alloc_pinned_memory(self, size: int) -> PinnedMemoryPointer:
        """``cupy.cuda.alloc_pinned_memory``: through the current pinned allocator."""
        self.pinned_bytes += int(size)
        if self.pinned_allocator is None:
            return PinnedMemoryPointer(int(size))
        return self.pinned_allocator(int(size))

    def empty_pinned(self, shape: Any, dtype: Any = float, order: str = "C") -> np.ndarray:
        """``cupyx.empty_pinned``: a NumPy array over pinned memory."""
        shape = (shape,) if isinstance(shape, int | np.integer) else tuple(shape)
        nbytes = int(np.prod(shape, dtype=np.int64)) * np.dtype(dtype).itemsize
        mem = self.alloc_pinned_memory(nbytes)
        return np.ndarray(shape, dtype=dtype, buffer=mem, order=order)

    def zeros_pinned(self, shape: Any, dtype: Any = float, order: str = "C") -> np.ndarray:
        """``cupyx.zeros_pinned``."""
        out = self.empty_pinned(shape, dtype, order)
        out.fill(0)
        return out

    def buffer(self, ptr: int, count: int, dtype: int) -> np.ndarray:
        assert isinstance(ptr, int) and isinstance(count, int), (ptr, count)
        np_dtype = np.dtype(NP_OF_NCCL[dtype])
        nbytes = count * np_dtype.itemsize
        if not any(s <= ptr and ptr + nbytes <= s + n for s, n, _ in self.regions):
            raise AssertionError(f"NCCL would touch {nbytes} bytes at {ptr:#x}, outside arrays")
        raw = (ctypes.c_uint8 * nbytes).from_address(ptr)
        return np.ctypeslib.as_array(raw).view(np_dtype)

    def get_current_stream(self) -> FakeStream:
        key = (threading.get_ident(), _current_device())
        with self.lock:
            for stream in self.streams.values():
                if (stream.thread, stream.device) == key:
                    return stream
            stream = FakeStream(0x1000 + len(self.streams), key[1])
            stream.thread = key[0]
            self.streams[stream.ptr] = stream
            return stream

    def _event_class(self) -> type:
        fake = self

        class Event:
            def __init__(self, block: bool = False, disable_timing: bool = False,
                         interprocess: bool = False) -> None:
                self.stream = None

            def record(self, stream: FakeStream | None = None) -> None:
                self.stream = stream

            @property
            def done(self) -> bool:
                return not fake.hung

        return Event

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

    def _nccl_module(self) -> types.ModuleType:
        fake = self
        nccl = types.ModuleType("cupy.cuda.nccl")
        for name, value in NCCL_CONSTANTS.items():
            setattr(nccl, name, value)
        nccl.available = True
        rng = np.random.default_rng(7)

        def get_unique_id() -> tuple[int, ...] | bytes:
            raw = rng.integers(0, 256, 128, dtype=np.uint8).tobytes()
            if fake.major >= 14:
                return raw  # CuPy 14: ``uniqueId.internal[:NCCL_UNIQUE_ID_BYTES]``
            return tuple(v - 256 if fake.char_signed and v > 127 else v for v in raw)

        nccl.get_unique_id = get_unique_id

        def group_start() -> None:
            fake.group.depth = getattr(fake.group, "depth", 0) + 1

        def group_end() -> None:
            fake.group.depth -= 1

        nccl.groupStart, nccl.groupEnd = group_start, group_end

        class NcclCommunicator:
            def __init__(self, ndev: int, commId: Any, rank: int) -> None:  # noqa: N803
                key = fake.id_key(commId)
                with fake.lock:
                    world = fake.worlds.setdefault(key, _World(fake, ndev))
                self._setup(world, rank, _current_device())

            def _setup(self, world: _World, rank: int, device: int) -> None:
                self.world, self.rank, self.device, self.state = world, rank, device, "open"

            @staticmethod
            def initAll(devices: Any) -> list:  # noqa: N802
                if not isinstance(devices, list):
                    raise ValueError('"devices" should be an int or a list of int.')
                world = _World(fake, len(devices))
                comms = []
                for rank, device in enumerate(devices):
                    comm = NcclCommunicator.__new__(NcclCommunicator)
                    comm._setup(world, rank, device)
                    comms.append(comm)
                return comms

            def allReduce(self, sendbuf, recvbuf, count, datatype, op, stream):  # noqa: N802
                self._post("allReduce", stream, (sendbuf, recvbuf, count, datatype, op))

            def broadcast(self, sendbuff, recvbuff, count, datatype, root, stream):
                self._post("broadcast", stream, (sendbuff, recvbuff, count, datatype, root))

            def allGather(self, sendbuf, recvbuf, count, datatype, stream):  # noqa: N802
                self._post("allGather", stream, (sendbuf, recvbuf, count, datatype))

            def _post(self, kind: str, stream: int, args: tuple) -> None:
                assert self.state == "open", f"{kind} on a {self.state} communicator"
                assert fake.streams[stream].device == self.device, "a stream of another GPU"
                assert all(type(a) is int for a in args), f"{kind} takes ints: {args}"
                fake.calls.append((kind, self.rank, self.device))
                wait = getattr(fake.group, "depth", 0) == 0
                self.world.post(self.rank, kind, args, wait=wait)

            def destroy(self) -> None:
                self.state = "destroyed"

            def abort(self) -> None:
                self.state = "aborted"

            def check_async_error(self) -> None:
                if fake.async_error:
                    raise RuntimeError(fake.async_error)

        nccl.NcclCommunicator = NcclCommunicator
        return nccl


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


def machine_from_env(environ: dict[str, str] | None = None) -> FakeCuda:
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
        fake = FakeCuda(gpus=len(physical), version=version)
        fake.physical = physical
        _MACHINE.append(fake)
    return _MACHINE[0]


def host(array: Any) -> np.ndarray:
    return np.asarray(array).view(np.ndarray)


def assert_same_bits(results: list[Any], want: np.ndarray) -> None:
    for r in results:
        got = host(r)
        assert got.dtype == want.dtype and got.shape == want.shape
        assert got.tobytes() == want.tobytes()
