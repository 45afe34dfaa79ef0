"""Run one function per rank in threads, bounded by a timeout, and collect each rank's outcome.

>>> hub, groups = make_groups(3)
>>> run_ranks(lambda r: groups[r].all_reduce(r), 3)
[np.int64(3), np.int64(3), np.int64(3)]
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Sequence
from typing import Any

from cluster.collectives import CollectiveGroup
from cluster.transport.api import Transport
from cluster.transport.inproc import InProcessHub

__all__ = ["RankFailed", "make_groups", "new_group", "run_ranks"]

_MISSING = object()


class RankFailed(AssertionError):
    """Raised by ``run_ranks`` when a rank raised (chained from the lowest failing rank's error)."""


GROUP_DEFAULTS: dict[str, Any] = {}
"""``CollectiveGroup`` arguments ``make_groups`` adds unless given (``conftest.py`` sets small
shared-memory rounds, so that modest test sizes span many rounds and both algorithms)."""


def new_group(transport: Transport, **kwargs: Any) -> CollectiveGroup:
    """A ``CollectiveGroup`` on this test's path (``GROUP_DEFAULTS["settings"]``), nothing else
    of ``GROUP_DEFAULTS`` added."""
    if "settings" in GROUP_DEFAULTS:
        kwargs.setdefault("settings", GROUP_DEFAULTS["settings"])
    return CollectiveGroup(transport, **kwargs)


def make_groups(world_size: int, **kwargs: Any) -> tuple[InProcessHub, list[CollectiveGroup]]:
    """An in-process hub of ``world_size`` ranks and one ``CollectiveGroup`` per rank."""
    hub = InProcessHub(world_size)
    return hub, [CollectiveGroup(t, **{**GROUP_DEFAULTS, **kwargs}) for t in hub.transports]


def run_ranks(
    fn: Callable[[int], Any],
    ranks: int | Sequence[int],
    *,
    timeout: float = 10.0,
    transports: Sequence[Transport] = (),
    return_exceptions: bool = False,
) -> list[Any]:
    """Call ``fn(rank)`` in one thread per rank; return the results in rank order.

    ``ranks`` is a count (ranks ``0..n-1``) or the ranks to run (the others stay idle, as if they
    never called). With ``return_exceptions`` a rank's exception is returned in its place;
    otherwise the first failing rank's error is raised as :class:`RankFailed`, listing all.
    If a rank is still running after ``timeout`` seconds, ``transports`` (when given) are
    aborted so the stuck threads end, and ``RankFailed`` names the stuck ranks.
    """
    chosen = list(range(ranks)) if isinstance(ranks, int) else list(ranks)
    outcomes: dict[int, Any] = {r: _MISSING for r in chosen}

    def body(rank: int) -> None:
        try:
            outcomes[rank] = fn(rank)
        except BaseException as error:  # reported to the test thread below
            outcomes[rank] = error

    threads = {
        r: threading.Thread(target=body, args=(r,), name=f"rank-{r}", daemon=True) for r in chosen
    }
    for t in threads.values():
        t.start()
    end = time.monotonic() + timeout
    for t in threads.values():
        t.join(max(0.0, end - time.monotonic()))
    stuck = [r for r, t in threads.items() if t.is_alive()]
    if stuck:
        for transport in transports:
            transport.abort("run_ranks: test timed out")
        for r in stuck:
            threads[r].join(2.0)
        raise RankFailed(f"ranks {stuck} still running after {timeout} s")
    results = [outcomes[r] for r in chosen]
    if not return_exceptions:
        failed = [
            (r, o) for r, o in zip(chosen, results, strict=True) if isinstance(o, BaseException)
        ]
        if failed:
            listing = "; ".join(f"rank {r}: {type(e).__name__}: {e}" for r, e in failed)
            raise RankFailed(f"{len(failed)} rank(s) failed: {listing}") from failed[0][1]
    return results
