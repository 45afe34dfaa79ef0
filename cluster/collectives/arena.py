"""The shared-memory arena of the co-located ranks of one group: buffers, progress, waiting.

One :class:`~cluster.collectives.shm_segment.Segment` per host and group, created by the host's
leader during set-up (:mod:`~cluster.collectives.topology`). Layout::

    header   4 KiB   nonce (set-up proof), layout, abort flag and reason
    slots    L x 512 B, one per local rank: futex word, progress, identity, pid, a number per
             staging buffer, signature text
    data     L x nbuf x round_bytes, one double-buffered staging area per local rank

Synchronisation. Every local rank owns one *progress* counter and only it writes it (a plain
aligned 8-byte store: atomic, and ordered after the data it publishes under x86 TSO). Local
collectives advance in lockstep through numbered *rounds* (one use of a staging buffer);
``progress(t, phase) = 4 t + phase``. Posting bumps the rank's futex word and wakes its
sleepers; waiters sleep on the word of the rank they wait for, so waiting costs no CPU.

Buffer reuse rule: a rank writes its round-``t`` buffer only once every peer's progress has
reached ``progress(t - nbuf + 1, 0)``; every algorithm posts ``progress(u + 1, ...)`` only after
it has finished reading round ``u``, so that buffer (last used in round ``t - nbuf``) is free.
This holds across collectives too, since rounds are numbered per arena, not per call.

Identity: each collective writes ``seq << 32 | crc32(signature)`` (one atomic store) into the
rank's slot before its first post. Waiting on a peer compares it with ours whenever both are in
the same collective, so ranks that disagree on kind, shape, dtype, op or path raise
:class:`~cluster.errors.CollectiveMismatchError` instead of reading each other's buffers. Every
algorithm waits on every peer at least once per collective, so every pair is compared by one
side before either can move on.
"""

from __future__ import annotations

import os
import time
import zlib
from collections.abc import Callable

import numpy as np

from cluster.collectives import shm_segment
from cluster.deadline import Deadline
from cluster.errors import (
    CollectiveAbortedError,
    CollectiveMismatchError,
    CollectiveTimeoutError,
    PeerUnavailableError,
)
from cluster.transport.api import PeerInfo

__all__ = ["Arena", "ArenaLayout", "progress"]

HEADER_BYTES = 4096
SLOT_BYTES = 512
_SIG_OFFSET = 64  # signature text inside a slot
_SIG_BYTES = SLOT_BYTES - _SIG_OFFSET
_REASON_OFFSET, _REASON_BYTES = 1024, 2048
_ABORT_WORD = 64  # header offset of the int32 abort flag
HEALTH_INTERVAL = 0.05
"""Seconds between liveness checks (the peer's process, the group's transport) while waiting."""


def progress(t: int, phase: int) -> int:
    """The progress value of ``phase`` (0..3) of round ``t``."""
    return 4 * t + phase


class ArenaLayout:
    """Sizes and offsets of an arena for ``local_size`` ranks (same on every rank)."""

    def __init__(self, local_size: int, round_bytes: int, nbuf: int = 2) -> None:
        if round_bytes % 64 or round_bytes < 64 * local_size:
            raise ValueError(f"round_bytes must be a multiple of 64 and >= 64 per rank, "
                             f"got {round_bytes}")
        self.local_size = local_size
        self.round_bytes = round_bytes
        self.nbuf = nbuf
        self.slots = HEADER_BYTES
        self.data = _align(self.slots + SLOT_BYTES * local_size, 4096)
        self.per_rank = round_bytes * nbuf
        self.size = self.data + self.per_rank * local_size

    def describe(self) -> str:
        return f"shm/{self.local_size}x{self.nbuf}x{self.round_bytes}"


def _align(n: int, to: int) -> int:
    return (n + to - 1) // to * to


class Arena:
    """One rank's view of its host's arena.

    ``peers`` are the group's :class:`PeerInfo` of the local ranks, in local-rank order (for
    error messages); ``check`` raises the group's failure (``Transport.check``) and is called
    while waiting, with the pid of every peer, so a dead co-located peer is reported within
    :data:`HEALTH_INTERVAL` of its death.
    """

    def __init__(
        self,
        segment: shm_segment.Segment,
        layout: ArenaLayout,
        local_rank: int,
        peers: list[PeerInfo],
        check: Callable[[], None],
        *,
        group: str = "default",
        spin_seconds: float = 0.0,
    ) -> None:
        self.group = group
        self.segment = segment
        self.layout = layout
        self.local_rank = local_rank
        self.local_size = layout.local_size
        self.peers = peers
        self._check = check
        self._spin = spin_seconds
        raw = np.frombuffer(segment.buf, np.uint8)
        self._raw = raw
        self._base = raw.ctypes.data
        slots = raw[layout.slots : layout.slots + SLOT_BYTES * self.local_size]
        self._words = slots.view(np.int32).reshape(self.local_size, -1)[:, 0]
        table = slots.view(np.int64).reshape(self.local_size, -1)
        self._progress = table[:, 1]
        self._ident = table[:, 2]
        self._pid = table[:, 3]
        self._aux = table[:, 4 : 4 + layout.nbuf]
        self._sigtext = slots.reshape(self.local_size, SLOT_BYTES)[:, _SIG_OFFSET:]
        self._abort = raw[_ABORT_WORD : _ABORT_WORD + 4].view(np.int32)
        self._reason = raw[_REASON_OFFSET : _REASON_OFFSET + _REASON_BYTES]
        self._pids: list[int] = []
        self._seq = -1
        self._sig = ""
        self._my_ident = 0
        self._last_health = 0.0

    # -- set-up ----------------------------------------------------------------------------------

    def register(self) -> None:
        """Publish this rank's pid (before the set-up's last network exchange)."""
        self._pid[self.local_rank] = os.getpid()

    def registered(self) -> None:
        """Read the peers' pids (after that exchange)."""
        self._pids = [int(p) for p in self._pid]

    def pid(self, local_rank: int) -> int:
        """The process id that local rank ``local_rank`` registered (0 before set-up)."""
        return self._pids[local_rank] if self._pids else 0

    # -- data ------------------------------------------------------------------------------------

    def buffer(self, local_rank: int, t: int) -> np.ndarray:
        """Local rank ``local_rank``'s staging buffer of round ``t`` (``round_bytes`` bytes)."""
        lay = self.layout
        start = lay.data + lay.per_rank * local_rank + lay.round_bytes * (t % lay.nbuf)
        return self._raw[start : start + lay.round_bytes]

    # -- progress --------------------------------------------------------------------------------

    def announce(self, seq: int, signature: str) -> None:
        """Enter collective ``seq`` running ``signature`` (before this rank's first post in it)."""
        if seq == self._seq and signature == self._sig:
            return
        me = self.local_rank
        text = signature.encode()[: _SIG_BYTES - 1]
        self._sigtext[me, : len(text)] = np.frombuffer(text, np.uint8)
        self._sigtext[me, len(text)] = 0
        self._seq, self._sig = seq, signature
        self._my_ident = _ident(seq, signature)
        self._ident[me] = self._my_ident

    def set_aux(self, t: int, value: int) -> None:
        """Publish a number with round ``t`` (posted with it; kept as long as its buffer)."""
        self._aux[self.local_rank, t % self.layout.nbuf] = value

    def aux(self, local_rank: int, t: int) -> int:
        """The number ``local_rank`` published with round ``t`` (after waiting for its post)."""
        return int(self._aux[local_rank, t % self.layout.nbuf])

    def post(self, value: int) -> None:
        """Publish this rank's progress ``value`` and wake whoever waits on it."""
        me = self.local_rank
        self._progress[me] = value
        self._words[me] += 1
        shm_segment.futex_wake(self._word_address(me))

    def wait(self, local_rank: int, value: int, deadline: Deadline) -> None:
        """Return once ``local_rank``'s progress is at least ``value``.

        Raises ``CollectiveMismatchError`` if it runs another collective under our sequence
        number, ``CollectiveAbortedError`` if the group was aborted, ``PeerUnavailableError``
        if its process died, ``CollectiveTimeoutError`` at the deadline.
        """
        spin_until = time.perf_counter() + self._spin if self._spin else 0.0
        address = self._word_address(local_rank)
        while True:
            word = int(self._words[local_rank])
            # Progress before identity: the identity is stored before the progress it comes
            # with, so a progress seen here is checked against the identity it was posted under.
            reached = self._progress[local_rank] >= value
            self._verify(local_rank)
            if reached:
                return
            if self._abort[0]:
                raise self._aborted()
            if spin_until and time.perf_counter() < spin_until:
                continue
            now = time.monotonic()
            if now - self._last_health >= HEALTH_INTERVAL:
                self._last_health = now
                self._health()
            remaining = deadline.remaining()
            if remaining <= 0:
                raise CollectiveTimeoutError(
                    f"{self.peers[local_rank]} did not reach step {value} of collective "
                    f"#{self._seq} ({self._sig!r}) in shared memory in time"
                )
            shm_segment.futex_wait(address, word, min(HEALTH_INTERVAL, remaining))

    def wait_all(self, value: int, deadline: Deadline) -> None:
        """:meth:`wait` for every other local rank."""
        for k in range(self.local_size):
            if k != self.local_rank:
                self.wait(k, value, deadline)

    def abort(self, reason: str) -> None:
        """Fail every local rank's pending and later waits with ``reason``; idempotent."""
        if self._abort[0]:
            return
        text = f"{self.peers[self.local_rank].task}\n{reason}".encode()[: _REASON_BYTES - 1]
        self._reason[: len(text)] = np.frombuffer(text, np.uint8)
        self._reason[len(text)] = 0
        self._abort[0] = 1
        for k in range(self.local_size):
            shm_segment.futex_wake(self._word_address(k))

    def close(self) -> None:
        """Drop this rank's views and unmap the segment."""
        for name in ("_words", "_progress", "_ident", "_pid", "_aux", "_sigtext", "_abort",
                     "_reason", "_raw"):
            setattr(self, name, None)
        self.segment.close()

    # -- internals -------------------------------------------------------------------------------

    def _word_address(self, local_rank: int) -> int:
        return self._base + self.layout.slots + SLOT_BYTES * local_rank

    def _verify(self, k: int) -> None:
        theirs = int(self._ident[k])
        if theirs == self._my_ident or (theirs >> 32) != (self._my_ident >> 32):
            return  # same collective, or the peer is in another one (before or after ours)
        text = bytes(self._sigtext[k]).split(b"\0", 1)[0].decode(errors="replace")
        me = self.local_rank
        raise CollectiveMismatchError(
            f"collective #{self._seq} of group {self.group!r} differs between ranks: "
            f"{self.peers[me]} (local rank {me}) runs "
            f"{self._sig!r} but {self.peers[k]} (local rank {k}) runs {text!r}. Every rank must "
            "make the same "
            "collective calls in the same order, with the same op, dtype, shape and options"
        )

    def _aborted(self) -> CollectiveAbortedError:
        text = bytes(self._reason).split(b"\0", 1)[0].decode(errors="replace")
        task, _, reason = text.partition("\n")
        return CollectiveAbortedError(f"{task} aborted: {reason}", task=task)

    def _health(self) -> None:
        self._check()
        for k, pid in enumerate(self._pids):
            if k != self.local_rank and pid and not shm_segment.pid_alive(pid):
                peer = self.peers[k]
                raise PeerUnavailableError(
                    f"{peer} is unavailable: its process (pid {pid}) exited",
                    task=peer.task, address=peer.address,
                )


def _ident(seq: int, signature: str) -> int:
    # int64 storage: keep the sequence number to 31 bits so the value stays positive; + 1 so a
    # fresh slot (all zeros) never looks like collective #0.
    return (((seq + 1) & 0x7FFFFFFF) << 32) | zlib.crc32(signature.encode())

