"""What the stall check costs a collective that does not stall (cluster.collectives._stall).

Times ``watch`` alone (enter and exit), and a 4 KiB all-reduce between two in-process ranks
(threads, shared memory) with the check and with it replaced by a no-op::

    uv run python bench/stall.py [--calls 2000]
"""

from __future__ import annotations

import argparse
import contextlib
import statistics
import threading
import time
from types import SimpleNamespace

import numpy as np

from cluster.collectives import CollectiveGroup, _stall
from cluster.transport.inproc import InProcessHub


def _watch_alone(calls: int) -> float:
    call, transport = SimpleNamespace(kind="all_reduce", seq=0), object()
    value = np.ones(1024, np.float32)
    start = time.perf_counter()
    for _ in range(calls):
        with _stall.watch(call, "default", transport, value):
            pass
    return (time.perf_counter() - start) / calls


def _all_reduce(calls: int) -> float:
    hub = InProcessHub(2)
    groups = [CollectiveGroup(t) for t in hub.transports]
    value = np.ones(1024, np.float32)  # 4 KiB
    times: list[float] = []

    def rank(r: int) -> None:
        for _ in range(calls):
            start = time.perf_counter()
            groups[r].all_reduce(value)
            if r == 0:
                times.append(time.perf_counter() - start)

    threads = [threading.Thread(target=rank, args=(r,)) for r in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(300)
    hub.close() if hasattr(hub, "close") else None
    return statistics.median(times[calls // 10:])


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--calls", type=int, default=2000)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    print(f"watch enter+exit alone: {_watch_alone(100_000) * 1e6:.2f} µs")
    real = _stall.watch
    rows = []
    for _ in range(args.repeats):
        on = _all_reduce(args.calls)
        _stall.watch = lambda *a, **k: contextlib.nullcontext()
        try:
            off = _all_reduce(args.calls)
        finally:
            _stall.watch = real
        rows.append((on, off))
    print("| 4 KiB all-reduce, 2 ranks (median) | with check | without | difference |")
    print("|---|---|---|---|")
    for on, off in rows:
        print(f"| shared memory, threads | {on * 1e6:.1f} µs | {off * 1e6:.1f} µs | "
              f"{(on - off) * 1e6:+.1f} µs |")


if __name__ == "__main__":
    main()
