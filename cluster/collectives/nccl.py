"""NCCL among the GPUs of one host, through CuPy (``cupy.cuda.nccl``).

Two ways to build communicators:

- one process per GPU: rank 0 calls :func:`unique_id` and sends the 128 bytes to the other ranks
  (over our transport, a queue, ...); every rank then builds ``NcclComm(size, uid, rank, device)``.
  Construction blocks until all ``size`` ranks have joined (``ncclCommInitRank`` has no deadline).
- one process, several GPUs: ``NcclComm.for_devices([0, 1, ...])`` (``ncclCommInitAll``), used
  with :func:`all_reduce_devices`, :func:`broadcast_devices` and :func:`all_gather_devices`,
  which enqueue every GPU's part inside one NCCL group (``groupStart``/``groupEnd``).

Every operation takes contiguous CuPy arrays on the communicator's GPU, leaves its input
untouched, runs on that GPU's current CuPy stream and synchronises it before returning, so the
result is ready for host code. Every rank receives bitwise-identical results. All ranks must call
the same operations in the same order with equally shaped arrays of one dtype (NCCL cannot check
this across processes: a mismatch hangs or corrupts; ``timeout_seconds`` bounds the hang).

CuPy is imported lazily: importing this module never needs it.

>>> if available():  # doctest: +SKIP
...     import cupy
...     comms = NcclComm.for_devices([0])
...     all_reduce_devices(comms, [cupy.arange(3.0)], "MEAN")
[array([0., 1., 2.])]
"""

from __future__ import annotations

import contextlib
import re
import struct
import time
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import numpy as np

from cluster.collectives.ops import ReduceOp, check_int, finalize
from cluster.errors import CollectiveAbortedError, CollectiveTimeoutError

__all__ = [
    "UNIQUE_ID_BYTES",
    "NcclComm",
    "all_gather_devices",
    "all_reduce_devices",
    "available",
    "broadcast_devices",
    "id_from_bytes",
    "id_to_bytes",
    "nccl_dtype",
    "nccl_op",
    "supported_dtypes",
    "unique_id",
]

UNIQUE_ID_BYTES = 128
"""Size of an NCCL unique id (``NCCL_UNIQUE_ID_BYTES``); :func:`unique_id` returns this many."""

# dtype name -> NCCL constant name; a dtype is supported when CuPy's nccl module has the constant.
_REDUCE_DTYPES = {
    "float16": "NCCL_FLOAT16",
    "float32": "NCCL_FLOAT32",
    "float64": "NCCL_FLOAT64",
    "int32": "NCCL_INT32",
    "int64": "NCCL_INT64",
    "bfloat16": "NCCL_BFLOAT16",
}
_REDUCE_OPS = {
    ReduceOp.SUM: "NCCL_SUM",
    ReduceOp.MEAN: "NCCL_SUM",  # then divided by the number of ranks, in the array's dtype
    ReduceOp.MAX: "NCCL_MAX",
    ReduceOp.MIN: "NCCL_MIN",
}

_INSTALL_HINT = (
    "install the 'gpu' extra, CuPy and NCCL for CUDA 12 drivers and newer (pip install "
    "'cluster-runtime[gpu]'; 'gpu-cuda13' for CUDA 13 builds), or NCCL's wheel for the CuPy "
    "you have (pip install nvidia-nccl-cu12, or nvidia-nccl-cu13 with cupy-cuda13x)"
)


# -- availability and ids --------------------------------------------------------------------


def available() -> bool:
    """True when CuPy, its NCCL binding and at least one visible GPU are there. Never raises."""
    try:
        import cupy
        from cupy.cuda import nccl
    except Exception:  # a broken CUDA install can fail CuPy's import with any error
        return False
    if not getattr(nccl, "available", False):  # CuPy keeps the module when libnccl is missing
        return False
    try:
        return int(cupy.cuda.runtime.getDeviceCount()) > 0
    except Exception:  # no driver / no device: CuPy raises its own runtime error types
        return False


def _import() -> tuple[Any, Any]:
    """``(cupy, cupy.cuda.nccl)``; ``ImportError`` saying what to install when either is missing."""
    try:
        import cupy
        from cupy.cuda import nccl
    except ImportError as e:
        raise ImportError(f"NCCL collectives need CuPy: {_INSTALL_HINT} ({e})") from e
    if not getattr(nccl, "available", False):
        raise ImportError(f"CuPy cannot load the NCCL library: {_INSTALL_HINT}")
    return cupy, nccl


def id_to_bytes(uid: bytes | Sequence[int]) -> bytes:
    """NCCL's unique id, as ``nccl.get_unique_id()`` gives it, as exactly 128 bytes.

    CuPy 14 gives the 128 bytes themselves (returned unchanged); CuPy 13 a tuple of 128 C
    ``char`` values, each stored as its two's-complement byte, so signed (-128..127, x86-64)
    and unsigned (0..255, aarch64) ``char`` give the same bytes. Raises ``ValueError`` for a
    wrong length or a value outside -128..255.
    """
    if isinstance(uid, bytes | bytearray):
        if len(uid) != UNIQUE_ID_BYTES:
            raise ValueError(f"an NCCL unique id has {UNIQUE_ID_BYTES} bytes, got {len(uid)}")
        return bytes(uid)
    values = tuple(uid)
    if len(values) != UNIQUE_ID_BYTES:
        raise ValueError(f"an NCCL unique id has {UNIQUE_ID_BYTES} values, got {len(values)}")
    if any(not isinstance(v, int) or not -128 <= v <= 255 for v in values):
        raise ValueError("an NCCL unique id holds C char values (-128..255)")
    return bytes(v & 0xFF for v in values)


def id_from_bytes(data: bytes, *, signed: bool = True) -> tuple[int, ...]:
    """The inverse of :func:`id_to_bytes`: 128 bytes as the tuple CuPy 13's
    ``NcclCommunicator`` takes (CuPy 14 takes the bytes themselves).

    ``signed=True`` gives -128..127 (C ``char`` on x86-64), ``signed=False`` 0..255 (aarch64,
    ppc64le). Raises ``TypeError`` for a non-bytes value, ``ValueError`` for a wrong length.
    """
    if not isinstance(data, bytes | bytearray | memoryview):
        raise TypeError(f"an NCCL unique id is {UNIQUE_ID_BYTES} bytes, got {type(data).__name__}")
    data = bytes(data)
    if len(data) != UNIQUE_ID_BYTES:
        raise ValueError(
            f"an NCCL unique id is {UNIQUE_ID_BYTES} bytes, got {len(data)}; pass the bytes "
            "from unique_id() unchanged"
        )
    return struct.unpack(f"{UNIQUE_ID_BYTES}{'b' if signed else 'B'}", data)


def _ids_are_bytes(cupy: Any) -> bool:
    """Whether this CuPy's ``NcclCommunicator`` takes the id as ``bytes`` (CuPy 14 and later;
    ``get_unique_id`` returns bytes there too) rather than a tuple of C chars (CuPy 13)."""
    major = re.match(r"\d+", str(getattr(cupy, "__version__", "")))
    return major is not None and int(major.group()) >= 14


def unique_id() -> bytes:
    """A fresh NCCL unique id as 128 bytes, made by rank 0 and sent to every other rank."""
    _, nccl = _import()
    return id_to_bytes(nccl.get_unique_id())


# -- dtype and op tables ---------------------------------------------------------------------


def supported_dtypes(nccl: Any) -> tuple[str, ...]:
    """Names of the dtypes ``all_reduce`` accepts with this ``nccl`` module (bfloat16 if known)."""
    return tuple(name for name, const in _REDUCE_DTYPES.items() if hasattr(nccl, const))


def nccl_dtype(nccl: Any, dtype: Any, what: str = "all_reduce") -> int:
    """NCCL's data-type constant for ``dtype``; ``TypeError`` naming it and the supported list."""
    name = np.dtype(dtype).name
    const = _REDUCE_DTYPES.get(name)
    if const is None or not hasattr(nccl, const):
        raise TypeError(
            f"NCCL {what} does not support dtype {name}; supported dtypes: "
            f"{', '.join(supported_dtypes(nccl))}. Cast the array first, e.g. "
            "x.astype(cupy.float32)"
        )
    return int(getattr(nccl, const))


def nccl_op(nccl: Any, op: ReduceOp | str) -> int:
    """NCCL's reduction constant for ``op`` (``MEAN`` maps to ``NCCL_SUM``; the caller divides).

    Raises ``ValueError`` for an unknown op name, ``TypeError`` for a non-op.
    """
    return int(getattr(nccl, _REDUCE_OPS[ReduceOp.parse(op)]))


# -- communicators ---------------------------------------------------------------------------


class NcclComm:
    """One rank of an NCCL communicator of ``size`` ranks, bound to GPU ``device``.

    ``NcclComm(size, uid, rank, device)`` joins the communicator named by ``uid`` (the bytes of
    :func:`unique_id`, the same on every rank) as ``rank``, one process per GPU; it blocks until
    all ranks have joined. ``timeout_seconds`` bounds every later operation: when it passes, the
    communicator is aborted and ``CollectiveTimeoutError`` is raised; when NCCL reports an
    asynchronous error meanwhile, it is aborted and ``CollectiveAbortedError`` is raised (both
    from :mod:`cluster.errors`); ``None`` waits without limit. Use it as a context manager (an
    exception leaving the block aborts it rather than waiting) or call :meth:`close`.

    Raises ``ImportError`` without CuPy/NCCL, ``ValueError``/``TypeError`` for bad arguments,
    CuPy's ``NcclError`` when NCCL fails to initialise.
    """

    def __init__(
        self,
        size: int,
        uid: bytes,
        rank: int,
        device: int,
        *,
        timeout_seconds: float | None = None,
    ) -> None:
        check_int("size", size, minimum=1)
        check_int("rank", rank, minimum=0)
        check_int("device", device, minimum=0)
        if rank >= size:
            raise ValueError(f"rank {rank} is not a rank of a communicator of size {size} "
                             f"(0..{size - 1})")
        size, rank, device = int(size), int(rank), int(device)
        signed = id_from_bytes(uid)  # checks the id whatever form CuPy takes it in
        timeout = _check_timeout(timeout_seconds)
        cupy, nccl = _import()
        with cupy.cuda.Device(device):  # NCCL binds the communicator to the current GPU
            if _ids_are_bytes(cupy):
                comm = nccl.NcclCommunicator(size, bytes(uid), rank)
            else:
                try:
                    comm = nccl.NcclCommunicator(size, signed, rank)
                except OverflowError:
                    # CuPy 13 converts each value to a C char, whose signedness is the
                    # platform's: the negative values overflow where char is unsigned (aarch64,
                    # ppc64le). CuPy raises this before calling NCCL, so retrying is safe.
                    comm = nccl.NcclCommunicator(size, id_from_bytes(uid, signed=False), rank)
        self._attach(cupy, nccl, comm, size, rank, device, timeout)

    @classmethod
    def for_devices(
        cls, devices: Sequence[int], *, timeout_seconds: float | None = None
    ) -> list[NcclComm]:
        """One communicator over ``devices`` in this process: rank ``i`` on ``devices[i]``.

        Use the returned list with :func:`all_reduce_devices` & co. Raises ``ValueError`` for an
        empty list or repeated devices, ``ImportError`` without CuPy/NCCL.
        """
        if isinstance(devices, str | bytes) or not isinstance(devices, Sequence):
            raise TypeError(f"devices must be a list of GPU ids, got {devices!r}")
        devices = list(devices)
        for d in devices:
            check_int("device", d, minimum=0)
        if not devices or len(set(devices)) != len(devices):
            raise ValueError(f"devices must be distinct GPU ids, at least one; got {devices}")
        timeout = _check_timeout(timeout_seconds)
        cupy, nccl = _import()
        raw = nccl.NcclCommunicator.initAll([int(d) for d in devices])
        comms = []
        for rank, (comm, device) in enumerate(zip(raw, devices, strict=True)):
            wrapped = cls.__new__(cls)
            wrapped._attach(cupy, nccl, comm, len(devices), rank, int(device), timeout)
            comms.append(wrapped)
        return comms

    def _attach(self, cupy: Any, nccl: Any, comm: Any, size: int, rank: int, device: int,
                timeout: float | None) -> None:
        self._cupy, self._nccl, self._comm = cupy, nccl, comm
        self.size, self.rank, self.device, self.timeout_seconds = size, rank, device, timeout

    def __repr__(self) -> str:
        state = "closed" if self._comm is None else "open"
        return f"NcclComm(rank {self.rank} of {self.size}, GPU {self.device}, {state})"

    def __enter__(self) -> NcclComm:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close(abort=exc[0] is not None)

    @property
    def closed(self) -> bool:
        return self._comm is None

    def close(self, *, abort: bool = False) -> None:
        """Destroy the communicator (``abort=True``: abort it, not waiting for pending work).

        Idempotent; later operations raise ``ValueError``.
        """
        comm, self._comm = self._comm, None
        if comm is None:
            return
        with self._cupy.cuda.Device(self.device):
            if abort:
                comm.abort()
            else:
                comm.destroy()

    def _live(self, what: str) -> Any:
        if self._comm is None:
            raise ValueError(f"{what} on a closed {self!r}; create a new communicator")
        return self._comm

    def all_reduce(self, array: Any, op: ReduceOp | str = ReduceOp.SUM) -> Any:
        """``op`` ("SUM", "MEAN", "MAX", "MIN") of ``array`` over all ranks, as a new array.

        ``MEAN`` is the SUM divided by ``size`` in the array's dtype (integers truncate toward
        zero, as :func:`cluster.collectives.ops.finalize`). dtypes: float16/32/64, int32/64,
        bfloat16 where CuPy's NCCL knows it; else ``TypeError``.
        """
        return _all_reduce([self], [array], op, "all_reduce")[0]

    def broadcast(self, array: Any, root: int = 0) -> Any:
        """``root``'s ``array`` on every rank, as a new array (any dtype; other ranks' ``array``
        gives only shape and dtype)."""
        return _broadcast([self], [array], root, "broadcast")[0]

    def all_gather(self, array: Any) -> Any:
        """Every rank's ``array`` concatenated along axis 0 in rank order (any dtype, rank >= 1,
        equal shapes on all ranks, C-contiguous)."""
        return _all_gather([self], [array], "all_gather")[0]


# -- several GPUs of one process -------------------------------------------------------------


def all_reduce_devices(
    comms: Sequence[NcclComm], arrays: Sequence[Any], op: ReduceOp | str = ReduceOp.SUM
) -> list[Any]:
    """:meth:`NcclComm.all_reduce` of ``arrays[i]`` on ``comms[i]``, every GPU of the
    communicator at once (``comms`` from :meth:`NcclComm.for_devices`). One result per GPU."""
    comms, arrays = _check_whole(comms, arrays, "all_reduce_devices")
    return _all_reduce(comms, arrays, op, "all_reduce_devices")


def broadcast_devices(comms: Sequence[NcclComm], arrays: Sequence[Any], root: int = 0) -> list[Any]:
    """:meth:`NcclComm.broadcast` on every GPU of the communicator at once: ``arrays[root]``
    copied to every GPU."""
    comms, arrays = _check_whole(comms, arrays, "broadcast_devices")
    return _broadcast(comms, arrays, root, "broadcast_devices")


def all_gather_devices(comms: Sequence[NcclComm], arrays: Sequence[Any]) -> list[Any]:
    """:meth:`NcclComm.all_gather` on every GPU of the communicator at once: the concatenation
    of ``arrays`` along axis 0 on every GPU."""
    comms, arrays = _check_whole(comms, arrays, "all_gather_devices")
    return _all_gather(comms, arrays, "all_gather_devices")


# -- implementation --------------------------------------------------------------------------

# launch(raw_comm, array, out, stream_ptr) enqueues one rank's NCCL call.
_Launch = Callable[[Any, Any, Any, int], None]


def _all_reduce(comms: Sequence[NcclComm], arrays: Sequence[Any], op: ReduceOp | str,
                what: str) -> list[Any]:
    nccl = comms[0]._nccl
    op = ReduceOp.parse(op)
    _check_arrays(comms, arrays, what, c_order=False)
    dtype, code = nccl_dtype(nccl, arrays[0].dtype, what), nccl_op(nccl, op)

    def launch(comm: Any, array: Any, out: Any, stream: int) -> None:
        comm.allReduce(array.data.ptr, out.data.ptr, array.size, dtype, code, stream)

    def finish(out: Any) -> None:
        if op is ReduceOp.MEAN:
            finalize(op, out, comms[0].size)  # on the GPU, enqueued after NCCL's SUM

    return _run(comms, arrays, what, lambda a: a.shape, launch, finish)


def _broadcast(comms: Sequence[NcclComm], arrays: Sequence[Any], root: int,
               what: str) -> list[Any]:
    check_int("broadcast root", root, minimum=0)
    if root >= comms[0].size:
        raise ValueError(f"{what} root {root} is not a rank of this communicator "
                         f"(0..{comms[0].size - 1})")
    _check_arrays(comms, arrays, what, c_order=False)
    count, unit = _as_words(comms[0]._nccl, arrays[0].nbytes)  # any dtype travels as its bytes

    def launch(comm: Any, array: Any, out: Any, stream: int) -> None:
        comm.broadcast(array.data.ptr, out.data.ptr, count, unit, root, stream)

    return _run(comms, arrays, what, lambda a: a.shape, launch)


def _all_gather(comms: Sequence[NcclComm], arrays: Sequence[Any], what: str) -> list[Any]:
    _check_arrays(comms, arrays, what, c_order=True)
    if arrays[0].ndim == 0:
        raise ValueError(f"{what} needs arrays of rank >= 1 (as tf.distribute does); gather "
                         "scalars as x.reshape(1)")
    size = comms[0].size
    count, unit = _as_words(comms[0]._nccl, arrays[0].nbytes)

    def launch(comm: Any, array: Any, out: Any, stream: int) -> None:
        comm.allGather(array.data.ptr, out.data.ptr, count, unit, stream)

    return _run(comms, arrays, what, lambda a: (a.shape[0] * size, *a.shape[1:]), launch)


def _as_words(nccl: Any, nbytes: int) -> tuple[int, int]:
    """``(count, NCCL type)`` moving ``nbytes`` bytes in the widest unsigned words that fit.

    Fewer, wider elements keep the count small: some CuPy versions take ``broadcast``'s count
    as a C ``int``.
    """
    for width, const in ((8, "NCCL_UINT64"), (4, "NCCL_UINT32")):
        if nbytes % width == 0:
            return nbytes // width, int(getattr(nccl, const))
    return nbytes, int(nccl.NCCL_UINT8)


def _run(comms: Sequence[NcclComm], arrays: Sequence[Any], what: str,
         out_shape: Callable[[Any], tuple[int, ...]], launch: _Launch,
         finish: Callable[[Any], None] | None = None) -> list[Any]:
    """Allocate outputs, enqueue every rank's call (one NCCL group for several), finish, wait."""
    cupy, nccl = comms[0]._cupy, comms[0]._nccl
    raw = [c._live(what) for c in comms]
    outs, streams = [], []
    for comm, array in zip(comms, arrays, strict=True):
        with cupy.cuda.Device(comm.device):
            order = "F" if array.flags.f_contiguous and not array.flags.c_contiguous else "C"
            outs.append(cupy.empty(out_shape(array), dtype=array.dtype, order=order))
            streams.append(cupy.cuda.get_current_stream())
    if arrays[0].size:  # NCCL is not called for empty arrays: every rank skips alike
        with _group(nccl, len(comms) > 1):
            for comm, c, array, out, stream in zip(raw, comms, arrays, outs, streams, strict=True):
                with cupy.cuda.Device(c.device):
                    launch(comm, array, out, stream.ptr)
    if finish is not None:
        for comm, out in zip(comms, outs, strict=True):
            with cupy.cuda.Device(comm.device):
                finish(out)  # enqueued after the NCCL call on the same stream
    _wait(comms, streams, what)
    return outs


@contextlib.contextmanager
def _group(nccl: Any, enabled: bool) -> Iterator[None]:
    # One thread driving several GPUs must group their calls, or the first call waits forever
    # for the others. groupEnd also runs after an error: NCCL then cancels the group's calls.
    if not enabled:
        yield
        return
    nccl.groupStart()
    try:
        yield
    finally:
        nccl.groupEnd()


def _wait(comms: Sequence[NcclComm], streams: Sequence[Any], what: str) -> None:
    """Wait until every stream has done its work, within the communicators' deadline."""
    cupy = comms[0]._cupy
    timeout = comms[0].timeout_seconds
    if timeout is None:
        for comm, stream in zip(comms, streams, strict=True):
            with cupy.cuda.Device(comm.device):
                stream.synchronize()
        return
    events = []
    for comm, stream in zip(comms, streams, strict=True):
        with cupy.cuda.Device(comm.device):
            event = cupy.cuda.Event(disable_timing=True)
            event.record(stream)
            events.append(event)
    deadline = time.monotonic() + timeout
    pause = 1e-5
    # CUDA has no wait-with-timeout on an event: poll it (and NCCL's async error state), backing
    # off to 1 ms, as NCCL's own watchdogs do.
    while not all(e.done for e in events):
        for comm in comms:
            raw = comm._live(what)
            try:
                raw.check_async_error()
            except Exception as e:  # CuPy's NcclError: a peer failed or the network broke
                _abort(comms)
                raise CollectiveAbortedError(
                    f"NCCL {what} failed on {comm!r}: {e}; the communicator was aborted"
                ) from e
        if time.monotonic() >= deadline:
            _abort(comms)
            raise CollectiveTimeoutError(
                f"NCCL {what} on GPU {comms[0].device} (rank {comms[0].rank} of "
                f"{comms[0].size}) did not complete within {timeout} s; a rank may have died "
                "or called another collective; the communicator was aborted"
            )
        time.sleep(pause)
        pause = min(2 * pause, 1e-3)


def _abort(comms: Sequence[NcclComm]) -> None:
    for comm in comms:
        comm.close(abort=True)


# -- validation ------------------------------------------------------------------------------


def _check_timeout(timeout: float | None) -> float | None:
    if timeout is None:
        return None
    if isinstance(timeout, bool) or not isinstance(timeout, int | float):
        raise TypeError(f"timeout_seconds must be a number of seconds or None, got {timeout!r}")
    if not timeout > 0:
        raise ValueError(f"timeout_seconds must be > 0 (or None for no limit), got {timeout}")
    return float(timeout)


def _check_arrays(comms: Sequence[NcclComm], arrays: Sequence[Any], what: str, *,
                  c_order: bool) -> None:
    """``TypeError``/``ValueError``, with the fix, unless ``arrays[i]`` suits ``comms[i]``."""
    ndarray = comms[0]._cupy.ndarray
    first = arrays[0]
    for comm, array in zip(comms, arrays, strict=True):
        _check_array(array, ndarray, comm.device, what, c_order=c_order)
        if array.shape != first.shape or array.dtype != first.dtype:
            raise ValueError(
                f"{what}: every GPU needs an array of one shape and dtype; got {first.shape} "
                f"{first.dtype} and {array.shape} {array.dtype}"
            )


def _check_array(array: Any, ndarray: type, device: int, what: str, *, c_order: bool) -> None:
    if not isinstance(array, ndarray):
        raise TypeError(
            f"{what} takes CuPy arrays on GPU {device}, got {type(array).__module__}."
            f"{type(array).__name__}; move it with `with cupy.cuda.Device({device}): "
            "x = cupy.asarray(x)`"
        )
    if array.device.id != device:
        raise ValueError(
            f"{what}: the array is on GPU {array.device.id} but this communicator's rank uses "
            f"GPU {device}; copy it with `with cupy.cuda.Device({device}): x = x.copy()`"
        )
    flags = array.flags
    if not (flags.c_contiguous or (not c_order and flags.f_contiguous)):
        layout = "C-contiguous" if c_order else "contiguous"
        raise ValueError(
            f"{what} needs a {layout} array, got a strided view of shape {array.shape}; "
            "copy it with cupy.ascontiguousarray(x)"
        )


def _check_whole(comms: Sequence[NcclComm], arrays: Sequence[Any],
                 what: str) -> tuple[list[NcclComm], list[Any]]:
    """The ``*_devices`` helpers drive every rank: ``comms`` must be all of one communicator."""
    comms, arrays = list(comms), list(arrays)
    if not comms or not all(isinstance(c, NcclComm) for c in comms):
        raise TypeError(f"{what} takes the list from NcclComm.for_devices(...), got {comms!r}")
    if len(arrays) != len(comms):
        raise ValueError(f"{what}: {len(comms)} communicators but {len(arrays)} arrays; "
                         "pass one array per GPU, in the communicators' order")
    ranks = [c.rank for c in comms]
    if ranks != list(range(comms[0].size)) or any(c.size != comms[0].size for c in comms):
        raise ValueError(
            f"{what} needs every rank of one communicator in rank order (the list from "
            f"NcclComm.for_devices), got ranks {ranks} of size {comms[0].size}"
        )
    return comms, arrays
