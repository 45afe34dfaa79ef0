"""The timed all-reduce loop every ``bench/allreduce.py`` row runs on each rank.

Kept apart from ``allreduce.py`` so that a rank script started as ``python -m worker
bench/_netns_rank.py`` (whose directory is on ``sys.path``) can import it without the bench's
command line and baselines.
"""

from __future__ import annotations

import time

import numpy as np

__all__ = ["time_all_reduce", "time_all_reduce_cpu"]


def time_all_reduce(group, sizes: list[int], iters: int, warmup: int,
                    expected: float) -> dict[int, list[float]]:
    """``{size: [seconds per iteration, ...]}``: the wall times of :func:`time_all_reduce_cpu`."""
    timed = time_all_reduce_cpu(group, sizes, iters, warmup, expected)
    return {size: [wall for wall, _ in pairs] for size, pairs in timed.items()}


def time_all_reduce_cpu(group, sizes: list[int], iters: int, warmup: int,
                        expected: float) -> dict[int, list[tuple[float, float]]]:
    """``{size: [(wall seconds, process CPU seconds), ...]}`` per iteration of
    ``group.all_reduce`` (SUM of float32 ones) over ``sizes`` bytes, after ``warmup`` untimed
    iterations; each iteration starts after a barrier. The CPU time is this process's, every
    thread included (``time.process_time``). Raises ``AssertionError`` when the result is not
    ``expected`` (the world size)."""
    from cluster.collectives import ReduceOp

    times: dict[int, list[tuple[float, float]]] = {}
    for size in sizes:
        x = np.ones(size // 4, dtype=np.float32)
        per_iter: list[tuple[float, float]] = []
        for i in range(warmup + iters):
            group.barrier()
            cpu = time.process_time()
            start = time.perf_counter()
            out = group.all_reduce(x, ReduceOp.SUM)
            elapsed = time.perf_counter() - start
            cpu = time.process_time() - cpu
            if i >= warmup:
                per_iter.append((elapsed, cpu))
        if out.size and float(out.flat[0]) != expected:
            raise AssertionError(f"all-reduce gave {out.flat[0]}, expected {expected}")
        times[size] = per_iter
    return times
