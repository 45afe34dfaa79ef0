"""Pipelined chain broadcast: root -> root+1 -> ... -> root-1, in sub-chunks.

Each rank forwards a chunk as soon as it arrives, so for large values the time is about one
transfer of the value plus ``N - 2`` chunk latencies (bandwidth-optimal, like the ring); small
values pay ``N - 1`` latencies, acceptable for the rare broadcasts of a training run (initial
weights).
"""

from __future__ import annotations

import numpy as np

from cluster.collectives._exchange import Exchange
from cluster.collectives.schedule import chunk_ranges

__all__ = ["chain_broadcast"]

_DATA_STEP = 1  # step 0 carries the explicit handshake (see _exchange)


def chain_broadcast(ex: Exchange, work: np.ndarray, root: int, chunk_bytes: int) -> None:
    """Copy the root's flat contiguous ``work`` into ``work`` on every other rank.

    Every rank sends an explicit handshake: a rank in the middle of the chain blocks on its
    left before it sends data, so its data cannot be the handshake (ranks that disagree on the
    root could otherwise all wait on each other with no message sent).
    """
    if ex.size == 1:
        return
    ex.begin(piggyback_send=False, piggyback_recv=False)
    position = (ex.rank - root) % ex.size
    last = position == ex.size - 1
    dtype = work.dtype
    for c, (lo, hi) in enumerate(chunk_ranges(work.size, dtype.itemsize, chunk_bytes)):
        piece = work[lo:hi]
        if position != 0:
            np.copyto(piece, ex.recv(ex.left, _DATA_STEP, c, dtype, piece.size))
        if not last:
            ex.send(ex.right, _DATA_STEP, c, piece)
