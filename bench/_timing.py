"""The timed all-reduce loop every ``bench/allreduce.py`` row runs on each rank.

Kept apart from ``allreduce.py`` so that a rank script started as ``python -m worker
bench/_netns_rank.py`` (whose directory is on ``sys.path``) can import it without the bench's
command line and baselines.
"""

from __future__ import annotations

import time

import numpy as np

__all__ = ["time_all_reduce"]


def time_all_reduce(group, sizes: list[int], iters: int, warmup: int,
                    expected: float) -> dict[int, list[float]]:
    """``{size: [seconds per iteration, ...]}`` of ``group.all_reduce`` (SUM of float32 ones)
    over ``sizes`` bytes, after ``warmup`` untimed iterations; each iteration starts after a
    barrier. Raises ``AssertionError`` when the result is not ``expected`` (the world size)."""
    from cluster.collectives import ReduceOp

    times: dict[int, list[float]] = {}
    for size in sizes:
        x = np.ones(size // 4, dtype=np.float32)
        per_iter: list[float] = []
        for i in range(warmup + iters):
            group.barrier()
            start = time.perf_counter()
            out = group.all_reduce(x, ReduceOp.SUM)
            elapsed = time.perf_counter() - start
            if i >= warmup:
                per_iter.append(elapsed)
        if out.size and float(out.flat[0]) != expected:
            raise AssertionError(f"all-reduce gave {out.flat[0]}, expected {expected}")
        times[size] = per_iter
    return times
