"""Pinned host memory, streams and events as CuPy documents them, over host memory.

A pinned array is an ordinary NumPy array over a :class:`PinnedMemoryPointer` (its ``base``, as
``cupyx.empty_pinned`` makes it), so :func:`is_pinned` can tell a test whether a buffer is
pinned. Streams and events do no work of their own: the fake's copies and kernels are done when
they return, so every event is complete once recorded (unless a test hangs the machine).
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

import numpy as np

from .arrays import current_device

__all__ = ["Event", "PinnedMemoryPointer", "PinnedMemoryPool", "Stream", "is_pinned",
           "pinned_array"]


class PinnedMemoryPointer(bytearray):
    """``cupy.cuda.PinnedMemoryPointer``: page-locked host memory (here, host memory that the
    fake remembers as pinned by its type)."""

    @property
    def ptr(self) -> int:
        return np.frombuffer(self, np.uint8).ctypes.data if len(self) else 0

    @property
    def size(self) -> int:
        return len(self)


def is_pinned(array: Any) -> bool:
    """Whether ``array`` is a NumPy array over pinned memory (``cupyx.empty_pinned`` & co, or a
    view of one)."""
    base = array
    while isinstance(base, np.ndarray):
        base = base.base
    if isinstance(base, memoryview):
        base = base.obj
    return isinstance(base, PinnedMemoryPointer)


def pinned_array(allocate: Callable[[int], PinnedMemoryPointer], shape: Any, dtype: Any,
                 order: str) -> np.ndarray:
    """``cupyx.empty_pinned``: a NumPy array over ``allocate(nbytes)``."""
    shape = (int(shape),) if isinstance(shape, int | np.integer) else tuple(shape)
    nbytes = int(np.prod(shape, dtype=np.int64)) * np.dtype(dtype).itemsize
    return np.ndarray(shape, dtype=dtype, buffer=allocate(nbytes), order=order)


class PinnedMemoryPool:
    """``cupy.cuda.PinnedMemoryPool``; ``malloc`` makes a new block every time (the fake keeps
    no free list), and counts them in ``allocated``."""

    def __init__(self, allocator: Any = None) -> None:
        self.allocated = 0

    def malloc(self, size: int) -> PinnedMemoryPointer:
        self.allocated += 1
        return PinnedMemoryPointer(int(size))

    def free_all_blocks(self) -> None:
        pass

    def n_free_blocks(self) -> int:
        return 0


_LOCAL = threading.local()


class Stream:
    """``cupy.cuda.Stream(null=False, non_blocking=False, ptds=False)``: ``use()`` or ``with``
    makes it this thread's current stream on its device; ``synchronize()`` counts the waits."""

    event_class: type[Event]  # what ``record()`` makes: the machine's events

    def __init__(self, null: bool = False, non_blocking: bool = False,
                 ptds: bool = False) -> None:
        self.non_blocking = non_blocking
        self.device_id = current_device()
        self.ptr = 0 if null else id(self)
        self.syncs = 0

    def __repr__(self) -> str:
        return f"<Stream {self.ptr:#x} (device {self.device_id})>"

    def synchronize(self) -> None:
        self.syncs += 1

    @property
    def done(self) -> bool:
        return True

    def use(self) -> Stream:
        _stack()[:] = [self]
        return self

    def __enter__(self) -> Stream:
        _stack().append(self)
        return self

    def __exit__(self, *exc: object) -> None:
        _stack().pop()

    def record(self, event: Event | None = None) -> Event:
        event = self.event_class() if event is None else event
        event.record(self)
        return event

    def wait_event(self, event: Event) -> None:
        pass


def _stack() -> list[Stream]:
    if not hasattr(_LOCAL, "streams"):
        _LOCAL.streams = []
    return _LOCAL.streams


def current_stream() -> Stream | None:
    """The stream this thread made current (``use()``/``with``), if any."""
    stack = _stack()
    return stack[-1] if stack else None


class Event:
    """``cupy.cuda.Event(block=False, disable_timing=False, interprocess=False)``; ``done`` is
    ``hung()``'s negation: the fake's work is complete unless a test hangs the machine."""

    hung: Callable[[], bool] = staticmethod(lambda: False)

    def __init__(self, block: bool = False, disable_timing: bool = False,
                 interprocess: bool = False) -> None:
        self.stream: Any = None
        self.recorded = False

    def record(self, stream: Any = None) -> None:
        self.stream, self.recorded = stream, True

    def synchronize(self) -> None:
        if self.hung():
            raise AssertionError("Event.synchronize() on a hung fake GPU would wait forever")

    @property
    def done(self) -> bool:
        return not self.hung()


Stream.event_class = Event
