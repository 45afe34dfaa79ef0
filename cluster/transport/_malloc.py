"""Keep large payload buffers out of fresh ``mmap`` pages (glibc only; a no-op elsewhere).

Every frame sent or received is a new ``bytes`` of ~1-4 MiB. glibc serves allocations above
``M_MMAP_THRESHOLD`` (128 KiB by default, adapting upwards slowly) with a fresh ``mmap``, so
each frame pays a page fault per 4 KiB page and a ``munmap`` when freed: measured here, this was
the largest single cost on the send path. Raising the threshold to glibc's maximum and the trim
threshold with it makes such buffers come from, and return to, the heap, reusing warm pages
(measured here: 2-5x on large gRPC messages). Process-wide, so applied once, by the transport.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import sys

__all__ = ["tune_for_large_buffers"]

_M_TRIM_THRESHOLD = -1
_M_MMAP_THRESHOLD = -3
_M_ARENA_MAX = -8
_MMAP_THRESHOLD_MAX = 32 << 20  # glibc's ceiling on 64-bit (DEFAULT_MMAP_THRESHOLD_MAX)
_TRIM_THRESHOLD = 512 << 20
_done = False
_one_arena = False


def tune_for_large_buffers(*, one_arena: bool = False) -> bool:
    """Apply the settings once; True when glibc accepted them.

    ``one_arena``: also make every thread allocate from the main heap (``M_ARENA_MAX`` 1), for
    a server whose RPC threads build and drop tensor-sized replies (``python -m ps``). Spread
    over per-thread arenas, those buffers kept coming back as fresh pages: a 16 MiB pull
    measured 23.5-24.0 ms with per-thread arenas, 15.8-16.0 ms with one (page faults and
    ``clear_page`` were the largest costs of the serving thread). Call it before the threads
    start (a thread keeps the arena it has); workers leave it off, so as not to make user
    threads contend for one heap.
    """
    global _done, _one_arena
    if not sys.platform.startswith("linux"):
        return False
    if _done and (_one_arena or not one_arena):
        return True
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        mallopt = libc.mallopt
    except (OSError, AttributeError):
        return False  # not glibc (musl, ...): nothing to tune
    mallopt.argtypes = (ctypes.c_int, ctypes.c_int)
    ok = bool(mallopt(_M_MMAP_THRESHOLD, _MMAP_THRESHOLD_MAX))
    ok = bool(mallopt(_M_TRIM_THRESHOLD, _TRIM_THRESHOLD)) and ok
    if one_arena:
        _one_arena = bool(mallopt(_M_ARENA_MAX, 1))
        ok = _one_arena and ok
    _done = ok
    return ok
