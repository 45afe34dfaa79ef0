"""The fake ``cupy.cuda.nccl``: communicators that follow CuPy's signatures and reduce through
the arrays' pointers once every rank has posted a call.

Ranks meet in one process (threads, or ``initAll``), or, on the fake GPU machine
(``FakeCuda(across_processes=True)``), in several: its unique ids name a root in the process
that made them (:mod:`.bootstrap`). What differs between CuPy versions (the unique id's type) is
the machine's to say: see ``FakeCuda.id_key``.
"""

from __future__ import annotations

import ctypes
import threading
import types
from typing import TYPE_CHECKING, Any

import numpy as np

from .arrays import current_device, live_arrays
from .bootstrap import RemoteWorld, combine, make_id, parse_id

if TYPE_CHECKING:
    from . import FakeCuda

__all__ = ["NCCL_CONSTANTS", "nccl_module"]

# The constants of cupy_backends/cuda/libs/nccl.pxd.
NCCL_CONSTANTS = {
    "NCCL_SUM": 0, "NCCL_PROD": 1, "NCCL_MAX": 2, "NCCL_MIN": 3, "NCCL_AVG": 4,
    "NCCL_INT8": 0, "NCCL_CHAR": 0, "NCCL_UINT8": 1, "NCCL_INT32": 2, "NCCL_INT": 2,
    "NCCL_UINT32": 3, "NCCL_INT64": 4, "NCCL_UINT64": 5, "NCCL_FLOAT16": 6, "NCCL_HALF": 6,
    "NCCL_FLOAT32": 7, "NCCL_FLOAT": 7, "NCCL_FLOAT64": 8, "NCCL_DOUBLE": 8, "NCCL_BFLOAT16": 9,
}
NP_OF_NCCL = {0: "int8", 1: "uint8", 2: "int32", 3: "uint32", 4: "int64", 5: "uint64",
              6: "float16", 7: "float32", 8: "float64"}


def device_buffer(ptr: int, count: int, dtype: int) -> np.ndarray:
    """The ``count`` elements of NCCL type ``dtype`` at ``ptr``, which must lie in a live array."""
    assert isinstance(ptr, int) and isinstance(count, int), (ptr, count)
    np_dtype = np.dtype(NP_OF_NCCL[dtype])
    nbytes = count * np_dtype.itemsize
    spans = [(a.data.ptr, a.nbytes) for a in live_arrays()]
    if not any(s <= ptr and ptr + nbytes <= s + n for s, n in spans):
        raise AssertionError(f"NCCL would touch {nbytes} bytes at {ptr:#x}, outside arrays")
    raw = (ctypes.c_uint8 * nbytes).from_address(ptr)
    return np.ctypeslib.as_array(raw).view(np_dtype)


class World:
    """The ranks of one fake communicator: a collective runs once every rank has posted it."""

    def __init__(self, size: int) -> None:
        self.size = size
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
        sends = [device_buffer(calls[r][1][0], count, dtype) for r in range(self.size)]
        result = combine(kind, sends, rest[0] if rest else None)
        for r in range(self.size):
            device_buffer(calls[r][1][1], result.size, dtype)[:] = result


def nccl_module(fake: FakeCuda) -> types.ModuleType:
    """``cupy.cuda.nccl`` of ``fake``."""
    nccl = types.ModuleType("cupy.cuda.nccl")
    for name, value in NCCL_CONSTANTS.items():
        setattr(nccl, name, value)
    nccl.available = True
    rng = np.random.default_rng(7)

    def get_unique_id() -> tuple[int, ...] | bytes:
        if fake.across_processes:
            raw = make_id()
        else:
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
            root = parse_id(key) if fake.across_processes else None
            if root is not None:
                world: World | RemoteWorld = RemoteWorld(*root, ndev, rank, device_buffer)
            else:
                with fake.lock:
                    world = fake.worlds.setdefault(key, World(ndev))
            self._setup(world, rank, current_device())

        def _setup(self, world: World | RemoteWorld, rank: int, device: int) -> None:
            self.world, self.rank, self.device, self.state = world, rank, device, "open"

        @staticmethod
        def initAll(devices: Any) -> list:  # noqa: N802
            if isinstance(devices, int):
                devices = list(range(devices))
            if not isinstance(devices, list):
                raise ValueError('"devices" should be an int or a list of int.')
            world = World(len(devices))
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
            assert fake.streams[stream].device_id == self.device, "a stream of another GPU"
            assert all(type(a) is int for a in args), f"{kind} takes ints: {args}"
            fake.calls.append((kind, self.rank, self.device))
            wait = getattr(fake.group, "depth", 0) == 0
            self.world.post(self.rank, kind, args, wait=wait)

        def destroy(self) -> None:
            self._leave("destroyed")

        def abort(self) -> None:
            self._leave("aborted")

        def _leave(self, state: str) -> None:
            if self.state == "open" and isinstance(self.world, RemoteWorld):
                self.world.close()
            self.state = state

        def check_async_error(self) -> None:
            if fake.async_error:
                raise RuntimeError(fake.async_error)

    nccl.NcclCommunicator = NcclCommunicator
    return nccl
