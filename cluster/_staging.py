"""Host staging of GPU values: pinned host buffers, reused, and copies on a stream of their own.

The collectives' host algorithms (shared memory, the network ring) read and write host memory,
so a CuPy value that takes them is copied to the host and its result copied back onto its GPU
(:func:`cluster._family.stage`). Where those copies land decides their cost: on an H200, a
64 MiB device-to-host copy into fresh pageable memory (``ndarray.get()``) took 25.6 ms, into a
pinned buffer 1.23 ms, and host-to-device from pinned memory 1.23 ms, against 33.5 ms for the
whole 64 MiB all-reduce of two tasks. A :class:`Staging` keeps pinned buffers and hands them out
again, so a training loop that reduces the same sizes every step pays the pinned copies only.

Contract:

- :meth:`Staging.to_host` returns a C-contiguous NumPy array holding a CuPy array's bytes,
  ready to read and write on return. It is a pinned buffer of the pool when one fits, else
  fresh pageable memory (same bytes, slower copy). Nobody else sees it until it is dropped: a
  collective may reduce into it in place.
- :meth:`Staging.to_device` returns a fresh CuPy array on the given GPU holding a host array's
  bytes, ready for any stream on return; the host array may be reused at once.
- Stream order: each copy runs on the staging stream of its GPU (non-blocking, one per GPU and
  :class:`Staging`), after the work queued so far on the calling thread's current CuPy stream
  of that GPU (an event recorded there; CuPy's default current stream, the legacy null stream,
  is itself ordered after every blocking stream of the device). The host then waits for an
  event recorded after its own copies (and whatever other threads queued before them: a
  stream runs in order), not for the whole device.
- Reuse: buffers are pooled per GPU and size class (a power of two, at least
  :data:`MIN_CLASS_BYTES`). A buffer is handed out again once nothing refers to it: every NumPy
  view of a buffer, however derived, holds a reference to the one object NumPy collapses its
  ``.base`` chain to, which the pool keeps, so a buffer whose object has only the pool's
  references is unreachable (as :class:`~cluster.collectives._buffers.BufferPool` reasons).
  At most ``max_bytes`` are kept; idle buffers of other classes are dropped (oldest first) to
  make room, and a value that still does not fit is staged through pageable memory.
- :meth:`Staging.close` drops the pool: buffers nobody holds go back to CuPy's pinned memory pool
  (``cupy.get_default_pinned_memory_pool().free_all_blocks()`` returns them to the system);
  the object stays usable and allocates again on demand.
- Thread-safety: any thread may call any method; the pool and the streams are guarded by a lock.

Overlap: the copies of several values (:meth:`Staging.to_host_many`,
:meth:`Staging.to_device_many`) are all queued on the stream before the host waits once, so
they run back to back on the copy engine while the host is still queueing. Overlapping a copy
with the host algorithm itself (reducing chunk k while chunk k+1 copies) would need the
algorithms to wait for each chunk's readiness; they take whole arrays, and at pinned speed the
two copies of a 64 MiB value cost about 2.5 ms, under a tenth of its all-reduce.

CuPy is never imported here: a CuPy array exists only once the user imported ``cupy``.
"""

from __future__ import annotations

import sys
import threading
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

__all__ = ["DEFAULT_MAX_BYTES", "MIN_CLASS_BYTES", "Staging", "size_class"]

MIN_CLASS_BYTES = 64 << 10
"""The smallest pinned buffer (smaller values share this class)."""

DEFAULT_MAX_BYTES = 512 << 20
"""Pinned bytes a :class:`Staging` keeps at most (page-locked memory is the system's to lose)."""


def size_class(nbytes: int) -> int:
    """The pinned buffer size serving ``nbytes``: the next power of two, at least
    :data:`MIN_CLASS_BYTES`."""
    return max(MIN_CLASS_BYTES, 1 << max(nbytes - 1, 0).bit_length())


@dataclass(eq=False)
class _Slab:
    """One pinned buffer of the pool: ``owner`` (uint8, its whole size) and ``anchor``, the
    object every view of it refers to; ``idle_refs`` is ``anchor``'s reference count when only
    the pool holds it."""

    device: int
    owner: np.ndarray
    anchor: Any
    idle_refs: int = 0

    @property
    def nbytes(self) -> int:
        return self.owner.nbytes

    def idle(self) -> bool:
        return sys.getrefcount(self.anchor) <= self.idle_refs


class Staging:
    """Pinned, reused host buffers and per-GPU copy streams for CuPy values (see the module)."""

    def __init__(self, max_bytes: int = DEFAULT_MAX_BYTES) -> None:
        if isinstance(max_bytes, bool) or not isinstance(max_bytes, int) or max_bytes < 0:
            raise ValueError(f"Staging max_bytes must be an int >= 0, got {max_bytes!r}")
        self._max = max_bytes
        self._lock = threading.Lock()
        self._slabs: list[_Slab] = []  # least recently handed out first
        self._streams: dict[int, Any] = {}

    @property
    def pinned_bytes(self) -> int:
        """Bytes of pinned memory the pool holds now."""
        with self._lock:
            return sum(s.nbytes for s in self._slabs)

    def is_pooled(self, array: np.ndarray) -> bool:
        """Whether ``array`` is (a view of) one of the pool's pinned buffers."""
        with self._lock:
            return any(np.shares_memory(array, s.owner) for s in self._slabs)

    # -- copies ------------------------------------------------------------------------------------

    def to_host(self, array: Any) -> np.ndarray:
        """A host copy of CuPy ``array``, ready on return (see the module's contract)."""
        return self.to_host_many([array])[0]

    def to_host_many(self, arrays: Sequence[Any]) -> list[np.ndarray]:
        """Host copies of CuPy ``arrays`` (any GPUs), queued together, waited for once."""
        if not arrays:
            return []
        cupy = sys.modules["cupy"]
        outs, done = [], {}
        for array in arrays:
            device = array.device.id
            out = self._host_buffer(device, array.shape, array.dtype)
            if array.size:
                with cupy.cuda.Device(device):
                    stream = self._ordered_stream(cupy, device)
                    array.get(stream=stream, out=out, blocking=False)
                    done[device] = stream
            outs.append(out)
        _wait_for(cupy, done)
        return outs

    def to_device(self, host: np.ndarray, device: int) -> Any:
        """A fresh CuPy array on ``device`` holding ``host``'s bytes, ready on return."""
        return self.to_device_many([host], [device])[0]

    def to_device_many(self, hosts: Sequence[np.ndarray], devices: Sequence[int]) -> list[Any]:
        """Fresh CuPy arrays of ``hosts``, one on each of ``devices``, queued together, waited
        for once; every host array may be reused on return."""
        if not hosts:
            return []
        cupy = sys.modules["cupy"]
        outs, done = [], {}
        for host, device in zip(hosts, devices, strict=True):
            host = host if host.flags.c_contiguous else np.ascontiguousarray(host)
            with cupy.cuda.Device(device):
                out = cupy.empty(host.shape, host.dtype)
                if host.size:
                    # After the current stream's queued work: ``out`` may reuse device memory
                    # that work still reads (CuPy's pool recycles a block once it is freed).
                    stream = self._ordered_stream(cupy, device)
                    out.set(host, stream=stream)
                    done[device] = stream
            outs.append(out)
        _wait_for(cupy, done)
        return outs

    def close(self) -> None:
        """Drop the pool (see the module); later calls allocate again."""
        with self._lock:
            self._slabs.clear()
            self._streams.clear()

    # -- streams and buffers -----------------------------------------------------------------------

    def _ordered_stream(self, cupy: Any, device: int) -> Any:
        """``device``'s staging stream (current device: ``device``), made to wait for the work
        queued so far on this thread's current stream."""
        with self._lock:
            stream = self._streams.get(device)
            if stream is None:
                stream = self._streams[device] = cupy.cuda.Stream(non_blocking=True)
        queued = cupy.cuda.Event(disable_timing=True)
        queued.record(cupy.cuda.get_current_stream())
        stream.wait_event(queued)
        return stream

    def _host_buffer(self, device: int, shape: tuple[int, ...], dtype: Any) -> np.ndarray:
        """An uninitialised C-contiguous host array: a pinned pool buffer when one fits."""
        dtype = np.dtype(dtype)
        nbytes = int(np.prod(shape, dtype=np.int64)) * dtype.itemsize
        if nbytes == 0:
            return np.empty(shape, dtype)
        slab = self._acquire(device, size_class(nbytes))
        if slab is None:
            return np.empty(shape, dtype)
        return slab.owner[:nbytes].view(dtype).reshape(shape)

    def _acquire(self, device: int, nbytes: int) -> _Slab | None:
        """An idle slab of ``device`` and ``nbytes``, marked most recently used; a new one if
        there is room (after dropping idle slabs of other sizes); ``None`` if there is none."""
        with self._lock:
            for i, slab in enumerate(self._slabs):
                if slab.device == device and slab.nbytes == nbytes and slab.idle():
                    self._slabs.append(self._slabs.pop(i))
                    return slab
            held = sum(s.nbytes for s in self._slabs)
            for slab in [s for s in self._slabs if s.idle()]:  # oldest first
                if held + nbytes <= self._max:
                    break
                self._slabs.remove(slab)
                held -= slab.nbytes
            if held + nbytes > self._max:
                return None
            slab = _new_slab(device, nbytes)
            self._slabs.append(slab)
            slab.idle_refs = sys.getrefcount(slab.anchor)  # the pool's own references only
            return slab


def _new_slab(device: int, nbytes: int) -> _Slab:
    cupy = sys.modules["cupy"]
    with cupy.cuda.Device(device):
        # Documented use of the pinned allocator (``cupyx.empty_pinned`` does the same): the
        # allocation may be larger than asked, so view exactly ``nbytes``.
        owner = np.frombuffer(cupy.cuda.alloc_pinned_memory(nbytes), np.uint8, nbytes)
    # What views of ``owner`` refer to: ``owner`` itself, or the array it views when NumPy
    # collapses the chain further (a view's ``.base`` is computed the same way).
    anchor = owner[0:].base
    return _Slab(device, owner, anchor)


def _wait_for(cupy: Any, streams: dict[int, Any]) -> None:
    """Block until the copies queued so far on ``streams`` (by GPU) are done."""
    for device, stream in streams.items():
        with cupy.cuda.Device(device):
            done = cupy.cuda.Event(disable_timing=True)
            done.record(stream)
            done.synchronize()
