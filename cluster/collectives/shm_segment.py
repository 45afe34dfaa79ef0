"""Shared memory between the processes of one host: identity, segments, futex wake-ups.

- :func:`host_key`: which tasks may share memory. Two tasks are co-located when they see the same
  kernel (boot id), the same ``/dev/shm`` mount, the same PID namespace and run as the same user;
  the same address is neither necessary nor sufficient (containers, network namespaces). The
  key is only a first filter: set-up then proves it by opening the leader's segment and reading a
  random nonce sent over the authenticated transport (``cluster.collectives.topology``).
- :class:`Segment`: a ``/dev/shm`` file mapped into memory, space reserved up front
  (``posix_fallocate``: a full tmpfs fails here with ``OSError``, not later with ``SIGBUS``).
  Segments are unlinked as soon as every co-located rank has mapped them, so nothing is left in
  ``/dev/shm`` however the processes end, ``kill -9`` included; :func:`sweep_stale` removes what
  a creator killed during that short window left behind.
- :func:`futex_wait` / :func:`futex_wake`: sleep until a 32-bit word in shared memory changes,
  and wake its sleepers (Linux ``futex(2)`` through ctypes; the call releases the GIL). Waiting
  costs no CPU, which matters when more ranks than cores share a machine.

Only Linux on x86-64 is supported (:func:`supported`): waiters read counters written by other
processes with plain loads, which is sound under x86's total store order; weaker memory models
would need fences Python cannot issue.
"""

from __future__ import annotations

import ctypes
import hashlib
import math
import mmap
import os
import platform
import re
import secrets
import socket
import sys

from cluster.collectives.cores import host_cores

__all__ = [
    "SHM_DIR",
    "Segment",
    "futex_wait",
    "futex_wake",
    "host_key",
    "pid_alive",
    "supported",
    "sweep_stale",
]

SHM_DIR = "/dev/shm"
PREFIX = "cluster-rt"
_NAME = re.compile(rf"^{PREFIX}\.(\d+)\.(\d+)\.(\d+)\.[0-9a-f]+$")  # uid, pidns, pid, random

_SYS_FUTEX = 202  # x86-64
_FUTEX_WAIT = 0
_FUTEX_WAKE = 1
_WAKE_ALL = 2**31 - 1


class _Timespec(ctypes.Structure):
    _fields_ = [("tv_sec", ctypes.c_long), ("tv_nsec", ctypes.c_long)]


_libc: ctypes.CDLL | None = None


def supported() -> bool:
    """Whether this platform has the shared-memory path (Linux, x86-64, a ``/dev/shm``)."""
    return (
        sys.platform == "linux"
        and platform.machine() in ("x86_64", "AMD64")
        and os.path.isdir(SHM_DIR)
        and os.access(SHM_DIR, os.W_OK)
    )


def _sys() -> ctypes.CDLL:
    global _libc
    if _libc is None:
        _libc = ctypes.CDLL(None, use_errno=True)
    return _libc


def futex_wait(address: int, expected: int, timeout: float) -> None:
    """Sleep while the int32 at ``address`` equals ``expected``, at most ``timeout`` seconds.

    Returns on a wake-up, a timeout, a signal, or at once if the word already differs; the
    caller re-checks its condition in every case.
    """
    timeout = max(0.0, timeout)
    ts = _Timespec(int(timeout), int(math.modf(timeout)[0] * 1e9))
    _sys().syscall(_SYS_FUTEX, ctypes.c_void_p(address), _FUTEX_WAIT,
                   ctypes.c_int(expected), ctypes.byref(ts), None, 0)


def futex_wake(address: int) -> None:
    """Wake every process or thread sleeping on the int32 at ``address``."""
    _sys().syscall(_SYS_FUTEX, ctypes.c_void_p(address), _FUTEX_WAKE, ctypes.c_int(_WAKE_ALL),
                   None, None, 0)


def host_key(host_id: str = "") -> bytes:
    """32 bytes equal for exactly the tasks that can share memory (see the module doc).

    ``host_id`` splits one machine into several logical hosts (tests of multi-host layouts); it
    can never join two machines.
    """
    # The host's cores (a CPU quota may cap them) too: every rank of a host decides its
    # algorithms from them, so ranks that see different counts must not share memory.
    parts = [_read("/proc/sys/kernel/random/boot_id"), socket.gethostname(), str(os.getuid()),
             host_id, str(host_cores())]
    try:
        st = os.stat(SHM_DIR)
        parts.append(f"{st.st_dev}:{st.st_ino}")
    except OSError:
        parts.append("no-shm")
    try:
        parts.append(os.readlink("/proc/self/ns/pid"))
    except OSError:
        parts.append("no-pidns")
    return hashlib.sha256("\0".join(parts).encode()).digest()


def _read(path: str) -> str:
    try:
        with open(path) as f:
            return f.read().strip()
    except OSError:
        return ""


class Segment:
    """A shared-memory file of ``size`` bytes mapped read-write (``buf`` is a memoryview).

    The creator names it ``cluster-rt.<uid>.<pid namespace>.<pid>.<random>`` with mode 0600;
    co-located ranks :meth:`attach` by name. :meth:`unlink` removes the name (mappings stay valid);
    :meth:`close` unmaps.
    """

    def __init__(self, name: str, size: int, mapping: mmap.mmap, *, owner: bool) -> None:
        self.name = name
        self.size = size
        self._mmap = mapping
        self.buf = memoryview(mapping)
        self.owner = owner
        self._linked = owner

    @classmethod
    def create(cls, size: int) -> Segment:
        """A new segment with ``size`` bytes reserved; ``OSError`` if the space is not there."""
        name = f"{PREFIX}.{os.getuid()}.{_pid_namespace()}.{os.getpid()}.{secrets.token_hex(8)}"
        path = os.path.join(SHM_DIR, name)
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o600)
        try:
            os.posix_fallocate(fd, 0, size)
            mapping = mmap.mmap(fd, size)
        except BaseException:
            os.unlink(path)
            raise
        finally:
            os.close(fd)
        return cls(name, size, mapping, owner=True)

    @classmethod
    def attach(cls, name: str, size: int) -> Segment:
        """Map the existing segment ``name`` (``size`` bytes). ``ValueError`` for a name that is
        not one of ours; ``OSError`` when it cannot be opened or is smaller than ``size``."""
        if not _NAME.match(name):
            raise ValueError(f"not a cluster-runtime segment name: {name!r}")
        fd = os.open(os.path.join(SHM_DIR, name), os.O_RDWR | os.O_NOFOLLOW)
        try:
            if os.fstat(fd).st_size < size:
                raise OSError(f"segment {name} is smaller than {size} bytes")
            mapping = mmap.mmap(fd, size)
        finally:
            os.close(fd)
        return cls(name, size, mapping, owner=False)

    def unlink(self) -> None:
        """Remove the name from ``/dev/shm`` (the creator's job; idempotent)."""
        if self._linked:
            self._linked = False
            try:
                os.unlink(os.path.join(SHM_DIR, self.name))
            except FileNotFoundError:
                pass

    def close(self) -> None:
        """Unlink (if ours) and unmap. Views into ``buf`` must be gone; if NumPy arrays still
        export it the mapping is left to the garbage collector instead of failing."""
        self.unlink()
        try:
            self.buf.release()
            self._mmap.close()
        except (BufferError, ValueError):
            pass


def sweep_stale() -> list[str]:
    """Unlink this user's segments whose creating process is gone; return their names.

    Only a creator killed between creating a segment and its co-located ranks attaching leaves
    one behind (a few milliseconds of set-up); every set-up sweeps first.
    """
    removed = []
    try:
        names = os.listdir(SHM_DIR)
    except OSError:
        return removed
    uid, pidns = os.getuid(), _pid_namespace()
    for name in names:
        m = _NAME.match(name)
        # A pid means something only in its own namespace: leave other namespaces' files alone.
        if not m or int(m.group(1)) != uid or int(m.group(2)) != pidns:
            continue
        if pid_alive(int(m.group(3))):
            continue
        try:
            os.unlink(os.path.join(SHM_DIR, name))
            removed.append(name)
        except FileNotFoundError:
            pass
    return removed


def _pid_namespace() -> int:
    try:
        return int(re.sub(r"\D", "", os.readlink("/proc/self/ns/pid")) or 0)
    except OSError:
        return 0


def pid_alive(pid: int) -> bool:
    """Whether process ``pid`` (of this PID namespace) exists."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True
