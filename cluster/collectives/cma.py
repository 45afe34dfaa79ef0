"""Single-copy reads of a co-located peer's memory (Linux cross-memory attach).

``process_vm_readv(2)`` copies bytes from another process's address space into ours in one
kernel copy, with no staging buffer between: what MPI implementations use for large messages
inside a host ("CMA"). The shared-memory collectives use it to read a peer's input and result
arrays where they lie (:mod:`~cluster.collectives.shared_memory`), instead of having the peer
copy them into the arena first and synchronising per round.

Who may read whom is the kernel's ptrace access check (same user; Yama's ``ptrace_scope``; a
container's seccomp profile or a missing ``CAP_SYS_PTRACE`` may forbid it). So a group proves
it works before relying on it: :func:`prove` reads a random token a peer holds at an address it
published, which also proves the pid names that peer and not another process.

Only addresses a peer published for the collective in progress are read, inside lengths this
rank computed from its own (signature-checked, hence identical) arrays: nothing a peer claims
sizes an allocation here, and a wrong address fails with ``EFAULT`` instead of reading outside
the peer.
"""

from __future__ import annotations

import ctypes
import errno
import os
import secrets
import sys

import numpy as np

__all__ = ["CmaError", "Token", "prove", "read", "supported"]

IOV_MAX = 1024
"""Most iovecs per side that one ``process_vm_readv`` takes (Linux ``UIO_MAXIOV``)."""


class CmaError(OSError):
    """A cross-memory read failed (``errno`` says why: ``ESRCH`` peer gone, ``EPERM`` not
    allowed, ``EFAULT`` an address not mapped in the peer)."""


class _Iovec(ctypes.Structure):
    _fields_ = [("base", ctypes.c_void_p), ("len", ctypes.c_size_t)]


_readv = None


def _syscall():
    global _readv
    if _readv is None:
        libc = ctypes.CDLL(None, use_errno=True)
        fn = libc.process_vm_readv
        fn.restype = ctypes.c_ssize_t
        fn.argtypes = [ctypes.c_int, ctypes.POINTER(_Iovec), ctypes.c_ulong,
                       ctypes.POINTER(_Iovec), ctypes.c_ulong, ctypes.c_ulong]
        _readv = fn
    return _readv


def supported() -> bool:
    """Whether this platform has ``process_vm_readv`` (Linux with a glibc that exports it)."""
    if sys.platform != "linux":
        return False
    try:
        _syscall()
    except (OSError, AttributeError):
        return False
    return True


def read(pid: int, pairs: list[tuple[int, int, int]]) -> None:
    """Copy ``n`` bytes from ``remote`` in process ``pid`` to ``local`` here, for every
    ``(local, remote, n)`` in ``pairs``; all of them or :class:`CmaError`.

    The copies are batched :data:`IOV_MAX` at a time; the call releases the GIL.
    """
    fn = _syscall()
    for first in range(0, len(pairs), IOV_MAX):
        batch = [p for p in pairs[first : first + IOV_MAX] if p[2]]
        if not batch:
            continue
        local = (_Iovec * len(batch))(*((lo, n) for lo, _, n in batch))
        remote = (_Iovec * len(batch))(*((ro, n) for _, ro, n in batch))
        want = sum(n for _, _, n in batch)
        got = fn(pid, local, len(batch), remote, len(batch), 0)
        if got != want:
            code = ctypes.get_errno() if got < 0 else errno.EFAULT
            raise CmaError(code, f"reading {want} bytes from process {pid}: "
                                 f"{os.strerror(code)} (got {got})")


class Token:
    """16 random bytes held at a fixed address of this process, for :func:`prove`."""

    def __init__(self) -> None:
        self.array = np.frombuffer(bytearray(secrets.token_bytes(16)), np.uint8)
        self.address = self.array.ctypes.data

    def value(self) -> bytes:
        return self.array.tobytes()


def prove(pid: int, address: int, expected: bytes) -> bool:
    """Whether reading ``len(expected)`` bytes at ``address`` in process ``pid`` works and gives
    ``expected``: cross-memory reads are allowed, and ``pid`` is the peer that published them."""
    got = np.zeros(len(expected), np.uint8)
    try:
        read(pid, [(got.ctypes.data, address, len(expected))])
    except CmaError:
        return False
    return got.tobytes() == expected
