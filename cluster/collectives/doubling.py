"""Recursive doubling: the latency-optimal all-reduce for small messages (and the barrier).

``log2(core)`` rounds in which partners exchange their whole buffer and both reduce, plus one
fold-in and one fold-out message for the ranks beyond the largest power of two (see
:func:`~cluster.collectives.schedule.doubling_plan`). Partners evaluate each pair in the same
order (lower rank's value first), so every rank ends with bitwise-identical bytes.
"""

from __future__ import annotations

import numpy as np

from cluster.collectives._exchange import Exchange
from cluster.collectives.ops import ReduceOp, finalize, reduce_into
from cluster.collectives.schedule import doubling_plan

__all__ = ["all_reduce"]


def all_reduce(ex: Exchange, work: np.ndarray, op: ReduceOp | None, first_step: int = 0) -> int:
    """Reduce the flat contiguous ``work`` in place across ranks; ``op=None`` only synchronises.

    Returns the first message step left unused.
    """
    size, rank = ex.size, ex.rank
    if size == 1:
        return first_step
    plan = doubling_plan(rank, size)
    rounds = plan.core.bit_length() - 1
    # With two ranks the partner is both neighbours, so the only exchange doubles as the
    # handshake. Otherwise step 0 belongs to an explicit handshake and data starts at 1.
    piggyback = size == 2 and first_step == 0
    ex.begin(piggyback_send=piggyback, piggyback_recv=piggyback)
    fold_step = first_step if first_step > 0 or piggyback else 1
    round_step = fold_step if size == 2 else fold_step + 1
    unfold_step = round_step + rounds
    dtype, count = work.dtype, work.size

    if plan.extra:
        assert plan.fold is not None
        ex.send(plan.fold, fold_step, 0, work)
        np.copyto(work, ex.recv(plan.fold, unfold_step, 0, dtype, count))
        return unfold_step + 1
    if plan.fold is not None:
        incoming = ex.recv(plan.fold, fold_step, 0, dtype, count)
        if op is not None:
            reduce_into(op, work, incoming)  # the extra rank is the higher one
    for k, partner in enumerate(plan.partners):
        ex.send(partner, round_step + k, 0, work)
        incoming = ex.recv(partner, round_step + k, 0, dtype, count)
        if op is not None:
            reduce_into(op, work, incoming, other_first=partner < rank)
    if op is not None:
        finalize(op, work, size)
    if plan.fold is not None:
        ex.send(plan.fold, unfold_step, 0, work)
    return unfold_step + 1
