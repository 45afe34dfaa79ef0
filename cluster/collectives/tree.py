"""Binomial-tree all-reduce: reduce to rank 0 up the tree, then broadcast the result down.

The schedule is :func:`~cluster.collectives.schedule.tree_plan`. Each rank waits for its
children in increasing order, folds each child's partial result after its own (lower ranks
first, so the evaluation order is fixed), sends the sum to its parent, then waits for the
result and forwards it to its children, largest subtree first. Only the root computes the
final value (and applies ``MEAN``'s division); every other rank receives its bytes, so every
rank ends with bitwise-identical results whatever the op or the data.

Against recursive doubling (:mod:`~cluster.collectives.doubling`) it takes twice the message
latencies on the critical path (``2 ceil(log2 N)`` against ``log2 N``, plus two for doubling's
non-power-of-two fix-up) but sends ``2 (N - 1)`` messages in all instead of about
``N log2 N``: the better trade where the ranks share CPUs (many ranks per host on the network
route), the worse one with a rank per host. :func:`~cluster.collectives.route.network_algorithm`
decides.

Message steps: every rank sends the explicit ring handshake (step 0, see ``_exchange``); the
reduction travels up at step ``s`` and the result down at step ``s + 1``, ``s`` being
``first_step`` (or 1 when that is 0). A pair of ranks exchanges at most one message each way.
"""

from __future__ import annotations

import numpy as np

from cluster.collectives._exchange import Exchange
from cluster.collectives.ops import ReduceOp, finalize, reduce_into
from cluster.collectives.schedule import tree_plan

__all__ = ["all_reduce"]


def all_reduce(ex: Exchange, work: np.ndarray, op: ReduceOp | None, first_step: int = 0) -> int:
    """Reduce the flat contiguous ``work`` in place across ranks; ``op=None`` only synchronises
    (a barrier: nobody leaves before everyone arrived).

    Returns the first message step left unused.
    """
    if ex.size == 1:
        return first_step
    plan = tree_plan(ex.rank, ex.size)
    # A child's data is never the handshake (children may sit to our right, and the root's
    # first message is a result it can only send after everything arrived).
    ex.begin(piggyback_send=False, piggyback_recv=False)
    up = first_step if first_step > 0 else 1
    down = up + 1
    dtype, count = work.dtype, work.size

    for child in plan.children:
        incoming = ex.recv(child, up, 0, dtype, count)
        if op is not None:
            reduce_into(op, work, incoming)  # our block of ranks precedes the child's
    if plan.parent is None:
        if op is not None:
            finalize(op, work, ex.size)
    else:
        ex.send(plan.parent, up, 0, work)
        np.copyto(work, ex.recv(plan.parent, down, 0, dtype, count))
    # Largest subtree first: it has the longest way down.
    for child in reversed(plan.children):
        ex.send(child, down, 0, work)
    return down + 1
