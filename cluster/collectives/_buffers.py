"""Reuse of large result buffers across collective calls.

Every all-reduce returns a fresh array. Above glibc's largest ``mmap`` threshold (32 MiB) each one
is a fresh mapping whose pages the kernel must fault in and zero on first touch, then unmap when
the caller drops it: measured here, ~5 ms per 64 MiB, an eighth of a whole 64 MiB all-reduce.
Training loops all-reduce the same sizes every step and drop last step's results, so a group keeps
a few such buffers and hands one out again once nothing refers to it any more.

"Nothing refers to it" is exact, not a heuristic: every NumPy view of a buffer, however derived
(slices, reshapes, dtype views, memoryviews and DLPack exports of those), holds a reference to the
array that owns the memory (NumPy collapses ``.base`` chains to the owner), so a buffer whose only
references are the pool's own is unreachable from user code. Smaller buffers come from malloc's
heap, which already reuses them (see ``cluster.transport._malloc``).
"""

from __future__ import annotations

import sys
import threading

import numpy as np

__all__ = ["BufferPool", "working_copy"]

MIN_POOLED_BYTES = 32 << 20
DEFAULT_MAX_BYTES = 256 << 20


def _refs(slabs: list[np.ndarray], i: int) -> int:
    slab = slabs[i]
    return sys.getrefcount(slab)


class BufferPool:
    """Hands out uninitialised flat arrays; large ones may be buffers callers have dropped.

    At most ``max_bytes`` are kept (idle buffers are evicted oldest first; a request that
    cannot fit is served unpooled).
    """

    def __init__(self, max_bytes: int = DEFAULT_MAX_BYTES) -> None:
        self._max = max_bytes
        self._slabs: list[np.ndarray] = []
        self._lock = threading.Lock()
        # References a slab has when only the pool holds it, measured through the same path
        # (the exact count differs between Python versions).
        probe = [np.empty(1, np.uint8)]
        self._idle_refs = _refs(probe, 0)

    def empty(self, size: int, dtype: np.dtype) -> np.ndarray:
        dtype = np.dtype(dtype)
        nbytes = size * dtype.itemsize
        if nbytes < MIN_POOLED_BYTES or self._max <= 0:
            return np.empty(size, dtype)
        with self._lock:
            idle = [i for i in range(len(self._slabs)) if self._idle(i)]
            for i in idle:
                if self._slabs[i].nbytes == nbytes:
                    slab = self._slabs.pop(i)
                    self._slabs.append(slab)  # most recently used last
                    return slab.view(dtype)
            held = sum(s.nbytes for s in self._slabs)
            evict = []
            for i in idle:  # oldest first
                if held + nbytes <= self._max:
                    break
                evict.append(i)
                held -= self._slabs[i].nbytes
            for i in reversed(evict):
                del self._slabs[i]
            slab = np.empty(nbytes, np.uint8)
            if held + nbytes <= self._max:
                self._slabs.append(slab)
            return slab.view(dtype)

    def output_for(self, array: np.ndarray, owned: bool) -> tuple[np.ndarray, np.ndarray | None]:
        """``(work, source)`` for an algorithm that reads its input once and writes each result
        byte once (the ring, the shared-memory reductions): reduce in place (``source`` is
        ``None``) when the array is the caller's to give (``owned``, or copied anyway to become
        contiguous), else read flat ``source`` and write a ``work`` buffer from this pool."""
        if owned or not array.flags.c_contiguous:
            return np.ascontiguousarray(array).reshape(-1), None
        return self.empty(array.size, array.dtype), array.reshape(-1)

    def _idle(self, i: int) -> bool:
        return _refs(self._slabs, i) <= self._idle_refs

    def clear(self) -> None:
        with self._lock:
            self._slabs.clear()


def working_copy(array: np.ndarray, owned: bool) -> np.ndarray:
    """A flat C-contiguous array to reduce into: ``array`` itself if owned, else one copy."""
    if owned:
        return np.ascontiguousarray(array).reshape(-1)
    return np.array(array, order="C", copy=True).reshape(-1)
