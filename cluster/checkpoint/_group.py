"""Saving under MultiWorkerMirroredStrategy: every task calls save, the chief writes.

Protocol (every task runs it, in the same order, as any collective):

1. barrier: every task has finished what it did before (e.g. reading the checkpoint the chief is
   about to delete under ``max_to_keep``);
2. the chief (worker index 0) writes the checkpoint and the directory index; the other tasks
   write nothing;
3. barrier carrying the chief's outcome: ``save`` returns on every task only after the chief's
   write is complete, and raises :class:`~cluster.errors.PeerFailedError` on the other tasks
   when the chief's write failed (the chief raises its own error).

A barrier is a one-element MEAN all-reduce through the strategy (its deadline is the
strategy's collective timeout). Tasks see the same directory (a shared file system), as with TF.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, TypeVar

import numpy as np

from cluster import _context
from cluster.collectives.ops import ReduceOp
from cluster.errors import PeerFailedError
from cluster.strategies import DistributedVariable

__all__ = ["group_strategy", "is_writer", "write_as_group"]

T = TypeVar("T")


def group_strategy(variables: list[Any]) -> Any:
    """The multi-worker strategy owning ``variables`` (more than one worker), else ``None``."""
    for variable in variables:
        # A distributed variable, or an external trackable naming its strategy.
        if isinstance(variable, DistributedVariable) or hasattr(variable, "_checkpoint_save"):
            strategy = variable._distribute_strategy
            if strategy is not None and strategy.extended.num_workers > 1:
                return strategy
    return None


def is_writer(strategy: Any) -> bool:
    """Whether this task writes: no multi-worker strategy, or the chief (worker index 0)."""
    return strategy is None or strategy.extended.worker_index == 0


def _barrier(strategy: Any, flag: float) -> float:
    with _context.push(strategy, None):
        return float(strategy.extended.reduce_to_host(ReduceOp.MEAN,
                                                      np.array(flag, np.float32)))


def write_as_group(strategy: Any, write: Callable[[], T], skip: Callable[[], T],
                   what: str) -> T:
    """Run ``write`` on the chief and ``skip`` elsewhere, between two barriers (see above)."""
    _barrier(strategy, 0.0)
    if not is_writer(strategy):
        if _barrier(strategy, 0.0) != 0.0:
            raise PeerFailedError(
                f"worker:{strategy.extended.worker_index}: the chief (worker 0) failed to "
                f"write {what}; see its error", task="worker:0")
        return skip()
    try:
        result = write()
    except BaseException:
        _barrier(strategy, 1.0)  # let the others return (and raise) before raising here
        raise
    _barrier(strategy, 0.0)
    return result
