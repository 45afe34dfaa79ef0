"""One collective call's view of the transport: message keys, deadline, signatures, handshake.

Mismatch detection. Every message of a collective is keyed ``(group, seq, step, chunk)`` and the
first message a rank sends to each peer carries the collective's *signature* (kind, op, dtype,
shape, algorithm, chunk size); a receiver compares it with its own and raises
:class:`CollectiveMismatchError` on a difference. Checking only the messages an algorithm happens
to exchange is not enough: ranks running different algorithms (because their sizes differ) may
each wait for a key the other never sends, and nobody ever looks at the mismatching messages.

So every algorithm, on every rank, also obeys the *ring handshake*: the first message it sends to
its right neighbour ``(rank + 1) % size`` is keyed ``(step 0, chunk 0)`` and signed, and before it
uses any received data it checks the ``(0, 0)`` message from its left neighbour. The ring's own
first message is exactly that (``piggyback``); other algorithms send an empty one first and use
steps >= 1 for data. The handshakes form a cycle through all ranks, so if any two ranks disagree,
some adjacent pair does, and its right-hand rank raises before waiting for anything else, then
aborts the group so every rank fails. A received ``(0, 0)`` message whose meaning differs
(data vs. handshake) always carries a different signature, so even that is caught.
"""

from __future__ import annotations

import contextlib
import threading

import numpy as np

from cluster.deadline import Deadline
from cluster.errors import CollectiveMismatchError, CollectiveTimeoutError
from cluster.transport.api import MessageKey, Received, Transport

__all__ = ["Exchange"]

_EMPTY = b""
_NOT_GUARDED = contextlib.nullcontext()


class Exchange:
    """Sends and receives the messages of collective ``seq`` of ``group`` under one deadline.

    Algorithms call :meth:`begin` first, then :meth:`send` / :meth:`recv` with (peer, step,
    chunk); the caller ends with :meth:`end`. ``recv`` returns a read-only NumPy view of the
    received bytes (no copy), to be reduced or copied from at once.
    """

    def __init__(
        self,
        transport: Transport,
        *,
        group: str,
        seq: int,
        kind: str,
        signature: str,
        deadline: Deadline,
    ) -> None:
        self.transport = transport
        self.rank = transport.rank
        self.size = transport.world_size
        self.left = (self.rank - 1) % self.size
        self.right = (self.rank + 1) % self.size
        self.group = group
        self.seq = seq
        self.kind = kind
        self.signature = signature
        self.deadline = deadline
        self._signed: set[int] = set()
        self._posted: dict[tuple[int, int, int], memoryview] = {}
        self._begun = False
        self._piggyback_recv = False
        self._handshake_checked = False
        self._handshake_lock = threading.Lock()
        self._handshake_error: BaseException | None = None

    # -- the handshake ---------------------------------------------------------------------------

    def begin(self, *, piggyback_send: bool, piggyback_recv: bool) -> None:
        """Start the handshake (see the module docstring); later calls do nothing.

        ``piggyback_send``: this rank's first message to its right neighbour is data keyed
        ``(0, 0)``, sent before this rank blocks on anything. ``piggyback_recv``: its first
        ``recv`` is the ``(0, 0)`` data message from its left neighbour. Otherwise an empty
        handshake is sent now / received before the first ``recv``, and data uses steps >= 1.
        """
        if self._begun:
            return
        self._begun = True
        if not piggyback_send:
            self._send_bytes(self.right, 0, 0, _EMPTY)
        self._piggyback_recv = piggyback_recv

    def end(self) -> None:
        """Complete the handshake if the algorithms did not (a broadcast root, no data at all)."""
        self.begin(piggyback_send=False, piggyback_recv=False)
        self._ensure_handshake()

    # -- messages --------------------------------------------------------------------------------

    def send(self, dst: int, step: int, chunk: int, data: np.ndarray) -> None:
        """Send the bytes of the contiguous 1-D array ``data``; it may be reused on return."""
        assert self._begun, "Exchange.begin() must come first"
        payload = memoryview(data.view(np.uint8)) if data.size else _EMPTY
        self._send_bytes(dst, step, chunk, payload)

    def recv(self, src: int, step: int, chunk: int, dtype: np.dtype, count: int) -> np.ndarray:
        """Wait for the message ``src`` sent under (step, chunk): ``count`` items of ``dtype``."""
        assert self._begun, "Exchange.begin() must come first"
        if not self._handshake_checked:
            piggybacked = (src, step, chunk) == (self.left, 0, 0)
            if self._piggyback_recv:
                # An algorithm that declares piggyback_recv receives (left, 0, 0) first.
                assert piggybacked, f"{self.kind}: first recv {(src, step, chunk)} is not (0, 0)"
                received = self._recv_raw(src, 0, 0)
                self._check_handshake(received)
                return self._as_array(src, step, chunk, received, dtype, count)
            self._ensure_handshake()
        received = self._recv_raw(src, step, chunk)
        if received.signature:
            self._check_signature(src, received.signature)
        return self._as_array(src, step, chunk, received, dtype, count)

    def post(self, src: int, step: int, chunk: int, out: np.ndarray) -> None:
        """Offer ``out`` (contiguous, 1-D) as where ``src``'s (step, chunk) data may land; then
        receive it with :meth:`recv_into`, and leave ``out`` alone until then."""
        if out.size:
            view = memoryview(out.view(np.uint8))
            self._posted[(src, step, chunk)] = view
            self.transport.post_recv(src, self._key(step, chunk), view)

    def recv_into(self, src: int, step: int, chunk: int, out: np.ndarray) -> None:
        """:meth:`recv` into ``out`` (contiguous, 1-D): no copy when the transport used the
        buffer offered with :meth:`post`."""
        incoming = self.receive_for(src, step, chunk, out)
        if incoming is not None:
            np.copyto(out, incoming)

    def receive_for(self, src: int, step: int, chunk: int, out: np.ndarray) -> np.ndarray | None:
        """Wait for the message :meth:`recv_into` would put in ``out``: ``None`` when it landed
        there already (the buffer offered with :meth:`post`), else the received values, for
        the caller to copy into ``out``."""
        view = self._posted.pop((src, step, chunk), None)
        if self._handshake_checked and view is not None:
            received = self._recv_raw(src, step, chunk)
            if received.signature:
                self._check_signature(src, received.signature)
            if received.payload is view:
                return None
            return self._as_array(src, step, chunk, received, out.dtype, out.size)
        return self.recv(src, step, chunk, out.dtype, out.size)

    def writing(self) -> contextlib.AbstractContextManager[None]:
        """Held by an algorithm while it writes to the call's arrays (a lane's writes are
        guarded, see :mod:`~cluster.collectives.lanes`; the exchange's own are not)."""
        return _NOT_GUARDED

    # -- internals -------------------------------------------------------------------------------

    def _key(self, step: int, chunk: int) -> MessageKey:
        return MessageKey(self.group, self.seq, step, chunk)

    def _send_bytes(self, dst: int, step: int, chunk: int, payload: bytes | memoryview) -> None:
        signature = ""
        if dst not in self._signed:
            self._signed.add(dst)
            signature = self.signature
        self.transport.send(
            dst, self._key(step, chunk), payload, deadline=self.deadline, signature=signature
        )

    def _recv_raw(self, src: int, step: int, chunk: int) -> Received:
        return self.transport.recv(src, self._key(step, chunk), deadline=self.deadline)

    def _ensure_handshake(self) -> None:
        """Check the left neighbour's handshake once, whichever thread receives first; a thread
        that finds another one checking waits for its verdict (within the deadline)."""
        if self._handshake_checked:
            return
        timeout = self.deadline.timeout()
        if not self._handshake_lock.acquire(timeout=-1 if timeout is None else timeout):
            raise CollectiveTimeoutError(
                f"collective #{self.seq} of group {self.group!r}: no handshake from "
                f"{self.transport.peers[self.left]} before the deadline")
        try:
            if self._handshake_error is not None:
                raise self._handshake_error
            if not self._handshake_checked:
                try:
                    self._check_handshake(self._recv_raw(self.left, 0, 0))
                except BaseException as e:
                    self._handshake_error = e
                    raise
        finally:
            self._handshake_lock.release()

    def _check_handshake(self, received: Received) -> None:
        # The handshake is always the first message the left neighbour sends us, hence signed;
        # an unsigned one means it runs a different message pattern.
        self._check_signature(self.left, received.signature)
        self._handshake_checked = True

    def _check_signature(self, src: int, theirs: str) -> None:
        if theirs == self.signature:
            return
        peers = self.transport.peers
        raise CollectiveMismatchError(
            f"collective #{self.seq} of group {self.group!r} differs between ranks: "
            f"{peers[self.rank]} (rank {self.rank}) runs {self.signature!r} but "
            f"{peers[src]} (rank {src}) runs {theirs or '<unsigned message>'!r}. Every rank "
            "must make the same collective calls in the same order, with the same op, dtype, "
            "shape and options"
        )

    def _as_array(
        self, src: int, step: int, chunk: int, received: Received, dtype: np.dtype, count: int
    ) -> np.ndarray:
        expected = count * dtype.itemsize
        payload = received.payload
        size = payload.nbytes if isinstance(payload, memoryview) else len(payload)
        if size != expected:
            peers = self.transport.peers
            raise CollectiveMismatchError(
                f"collective #{self.seq} of group {self.group!r} ({self.signature!r}): "
                f"{peers[src]} (rank {src}) sent {size} bytes at step {step} "
                f"chunk {chunk}, {peers[self.rank]} (rank {self.rank}) expected {expected}"
            )
        return np.frombuffer(payload, dtype=dtype, count=count)
