"""A fake CuPy and ``cupy.cuda.nccl`` over host memory, for tests without a GPU.

Shared by the NCCL tests (``test_nccl.py``, ``test_host_nccl.py``, the CuPy cases elsewhere):
NumPy arrays with a ``.device`` and real ``.data.ptr`` addresses; communicators that follow
CuPy's signatures and reduce through the pointers once every rank has posted a call. Install it
with ``FakeCuda().install(monkeypatch)``.
"""

from __future__ import annotations

import ctypes
import sys
import threading
import types
from typing import Any

import numpy as np
import pytest

__all__ = [
    "NCCL_CONSTANTS", "FakeArray", "FakeCopyStream", "FakeCuda", "FakeDevice", "FakePinnedMemory",
    "assert_same_bits", "host",
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
        """Device to host, as ``cupy.ndarray.get`` (see "pinned memory and copy streams")."""
        return _copy_to_host(self, stream, order, out, blocking)

    def set(self, arr: np.ndarray, stream: Any = None) -> None:
        """Host to device, as ``cupy.ndarray.set`` (see "pinned memory and copy streams")."""
        _copy_from_host(self, arr, stream)

    @property
    def data(self) -> Any:  # shadows ndarray.data, as cupy.ndarray.data is a MemoryPointer
        return types.SimpleNamespace(ptr=self.ctypes.data)


class FakeStream:
    def __init__(self, ptr: int, device: int) -> None:
        self.ptr, self.device, self.syncs = ptr, device, 0

    def synchronize(self) -> None:
        self.syncs += 1


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


class FakeCuda:
    """``cupy``, ``cupy.cuda`` and ``cupy.cuda.nccl`` modules over host memory."""

    def __init__(self, gpus: int = 3, *, char_signed: bool = True) -> None:
        self.gpus, self.char_signed = gpus, char_signed
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
        self.cuda.runtime = types.SimpleNamespace(getDeviceCount=lambda: self.gpus)
        self.cuda.nccl = self.nccl
        self.cupy = types.ModuleType("cupy")
        self.cupy.ndarray = FakeArray
        self.cupy.cuda = self.cuda
        self.cupy.empty = self.empty
        self.cupy.asnumpy = lambda a: np.array(a, copy=True).view(np.ndarray)
        self.cupy.asarray = lambda a: self.array(a, _current_device())
        for name in ["add", "multiply", "floor_divide", "true_divide", "less", "not_equal",
                     "logical_and"]:
            setattr(self.cupy, name, getattr(np, name))
        _add_copy_streams(self)

    def install(self, monkeypatch: pytest.MonkeyPatch) -> FakeCuda:
        monkeypatch.setitem(sys.modules, "cupy", self.cupy)
        monkeypatch.setitem(sys.modules, "cupy.cuda", self.cuda)
        monkeypatch.setitem(sys.modules, "cupy.cuda.nccl", self.nccl)
        return self

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

    def _nccl_module(self) -> types.ModuleType:
        fake = self
        nccl = types.ModuleType("cupy.cuda.nccl")
        for name, value in NCCL_CONSTANTS.items():
            setattr(nccl, name, value)
        nccl.available = True
        rng = np.random.default_rng(7)
        nccl.get_unique_id = lambda: tuple(int(v) for v in rng.integers(-128, 128, 128))

        def group_start() -> None:
            fake.group.depth = getattr(fake.group, "depth", 0) + 1

        def group_end() -> None:
            fake.group.depth -= 1

        nccl.groupStart, nccl.groupEnd = group_start, group_end

        class NcclCommunicator:
            def __init__(self, ndev: int, commId: tuple, rank: int) -> None:  # noqa: N803
                if not isinstance(commId, tuple):  # a Cython ``tuple`` argument
                    raise TypeError("Argument 'commId' has incorrect type (expected tuple)")
                assert len(commId) == 128
                low, high = (-128, 127) if fake.char_signed else (0, 255)
                if not all(low <= v <= high for v in commId):
                    raise OverflowError("value too large to convert to char")
                key = bytes(v & 0xFF for v in commId)
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


# -- pinned memory and copy streams ------------------------------------------------------------
#
# What ``cluster._staging`` uses, as CuPy 13/14 document it: ``cupy.cuda.alloc_pinned_memory``
# (page-locked host memory with the buffer protocol, possibly larger than asked),
# ``cupy.cuda.Stream(non_blocking=...)`` with ``wait_event``/``synchronize``, ``Event.record``/
# ``synchronize``/``done``, ``ndarray.get(stream, order, out, blocking)`` and
# ``ndarray.set(arr, stream)``. An asynchronous copy between pinned memory and a GPU (``set``
# from pinned memory; ``get(blocking=False)`` into pinned memory) on a ``Stream`` runs only when
# that stream's work is waited for (``synchronize``, an event recorded after it, or a stream
# made to wait for such an event): the latest moment CUDA allows, so code that reads a buffer
# before waiting, or reuses one too early, sees it. Copies from or to pageable memory, and on
# the current stream, complete before the call returns (CUDA stages pageable copies).


class FakePinnedMemory(np.ndarray):
    """``cupy.cuda.PinnedMemoryPointer``: page-locked bytes, usable through the buffer protocol
    (``np.frombuffer``; NumPy keeps no trace of this type in the arrays it makes, so the fake
    knows pinned memory by its addresses: ``FakeCuda.is_pinned``)."""


class FakeCopyStream:
    """``cupy.cuda.Stream``: a stream of the current device; asynchronous copies queued on it
    run when its work is waited for. ``copies`` lists ``(direction, pinned)`` per copy;
    ``waits`` counts ``wait_event`` calls."""

    def __init__(self, fake: FakeCuda, null: bool = False, non_blocking: bool = False,
                 ptds: bool = False) -> None:
        self.fake = fake
        self.device, self.non_blocking = _current_device(), non_blocking
        self.queued: list[Any] = []
        self.issued = 0  # operations ever queued (run or not)
        self.copies: list[tuple[str, bool]] = []
        self.waits = 0
        with fake.lock:
            self.ptr = 0x8000 + len(fake.copy_streams)
            fake.copy_streams.append(self)

    def enqueue(self, op: Any) -> None:
        self.queued.append(op)
        self.issued += 1

    def run_until(self, issued: int) -> None:
        """Run the queued operations among the first ``issued`` ever queued."""
        while self.queued and self.issued - len(self.queued) < issued:
            self.queued.pop(0)()

    def synchronize(self) -> None:
        self.run_until(self.issued)

    def wait_event(self, event: Any) -> None:
        self.waits += 1
        if not self.fake.hung:  # the host never blocks here; a hung GPU shows at a later wait
            event.synchronize()  # the work it waits for comes first: run it now (legal order)


def _add_copy_streams(fake: FakeCuda) -> None:
    fake.copy_streams = []
    fake.pinned_allocations = []  # the sizes asked of alloc_pinned_memory, in order
    fake.pinned_regions = []  # (address, nbytes, memory): every pinned allocation, kept alive

    def alloc_pinned_memory(size: int) -> FakePinnedMemory:
        memory = np.empty(-(-max(size, 1) // 1024) * 1024, np.uint8).view(FakePinnedMemory)
        with fake.lock:
            fake.pinned_allocations.append(size)
            fake.pinned_regions.append((memory.ctypes.data, memory.nbytes, memory))
        return memory

    def is_pinned(array: np.ndarray) -> bool:
        start = array.ctypes.data
        return any(s <= start and start + array.nbytes <= s + n
                   for s, n, _ in fake.pinned_regions)

    fake.is_pinned = is_pinned

    fake.cuda.alloc_pinned_memory = alloc_pinned_memory
    fake.cuda.Stream = lambda *args, **kwargs: FakeCopyStream(fake, *args, **kwargs)
    base_event = fake.cuda.Event

    class Event(base_event):  # type: ignore[misc, valid-type]
        """``cupy.cuda.Event``: recorded on a copy stream, it is done once the work queued
        there before it has run."""

        def record(self, stream: Any = None) -> None:
            super().record(stream)
            self.issued = stream.issued if isinstance(stream, FakeCopyStream) else 0

        def synchronize(self) -> None:
            if fake.hung:
                raise AssertionError("Event.synchronize would hang: the fake's GPU is hung")
            if isinstance(self.stream, FakeCopyStream):
                self.stream.run_until(self.issued)

        @property
        def done(self) -> bool:
            if fake.hung:
                return False
            self.synchronize()
            return True

    fake.cuda.Event = Event


def _check_copy(what: str, device: FakeArray, host: Any) -> None:
    if not isinstance(host, np.ndarray) or isinstance(host, FakeArray):
        raise TypeError(f"Only numpy.ndarray can be {what} cupy.ndarray")
    if host.dtype != device.dtype:
        raise TypeError(f"{host.dtype} array cannot be {what} {device.dtype} array")
    if host.shape != device.shape:
        raise ValueError(f"Shape mismatch. Expected shape: {device.shape}, "
                         f"actual shape: {host.shape}")


def _copy_to_host(array: FakeArray, stream: Any, order: str, out: np.ndarray | None,
                  blocking: bool) -> np.ndarray:
    if out is None:
        out = np.empty(array.shape, array.dtype, order="F" if order == "F" else "C")
    _check_copy("obtained from", array, out)
    source = array.view(np.ndarray)

    def copy() -> None:
        out[...] = source

    if isinstance(stream, FakeCopyStream):
        pinned = stream.fake.is_pinned(out)
        stream.copies.append(("d2h", pinned))
        if not blocking and pinned:
            stream.enqueue(copy)
            return out
        stream.synchronize()
    copy()
    return out


def _copy_from_host(array: FakeArray, host: np.ndarray, stream: Any) -> None:
    _check_copy("set to", array, host)
    target = array.view(np.ndarray)

    def copy() -> None:
        target[...] = host  # reads ``host`` when the copy runs, as the DMA engine would

    if isinstance(stream, FakeCopyStream):
        pinned = stream.fake.is_pinned(host)
        stream.copies.append(("h2d", pinned))
        if pinned:
            stream.enqueue(copy)
            return
    copy()


def host(array: Any) -> np.ndarray:
    return np.asarray(array).view(np.ndarray)


def assert_same_bits(results: list[Any], want: np.ndarray) -> None:
    for r in results:
        got = host(r)
        assert got.dtype == want.dtype and got.shape == want.shape
        assert got.tobytes() == want.tobytes()
