"""Host test task: exact all-reduce, all_gather and broadcast, then the routes they took.

Usage: collectives.py [--big BYTES]   (also all-reduce BYTES of float32 once, timed: ``BIG s``)

Rank r contributes ``r + 1``: every value is a small integer, exact in float32, so every rank
checks the results bitwise. Prints ``RESULT task=... hosts=... routes={...}`` (the group's
topology and :attr:`CollectiveGroup.route_counts`), or raises (a non-zero exit).
"""

import argparse
import json
import time

import numpy as np

import cluster.runtime
from cluster.collectives import CollectiveGroup, ReduceOp

parser = argparse.ArgumentParser()
parser.add_argument("--big", type=int, default=0)
args = parser.parse_args()

rt = cluster.runtime.current() or cluster.runtime.start()
group = CollectiveGroup(rt.collective_transport(), "host_test", settings=rt.settings.collectives)
n, rank = group.world_size, group.rank
expected_sum = n * (n + 1) / 2
for size in (3, 1000, 300_000):  # small (doubling), medium, and ring-sized messages
    total = group.all_reduce(np.full(size, rank + 1, np.float32), ReduceOp.SUM)
    assert np.array_equal(total, np.full(size, expected_sum, np.float32)), (size, total[:4])
mean = group.all_reduce(np.full(8, 4 * (rank + 1), np.float32), ReduceOp.MEAN)
assert np.array_equal(mean, np.full(8, 2 * (n + 1), np.float32)), mean
gathered = group.all_gather(np.full((2, 3), rank, np.int64), axis=0)
assert np.array_equal(gathered, np.repeat(np.arange(n), 2)[:, None] * np.ones(3, np.int64))
for root in range(n):
    got = group.broadcast(np.arange(5, dtype=np.float64) * (root + 1) if rank == root
                          else np.zeros(5), root)
    assert np.array_equal(got, np.arange(5, dtype=np.float64) * (root + 1)), (root, got)
if args.big:
    group.barrier()
    start = time.monotonic()
    total = group.all_reduce(np.full(args.big // 4, rank + 1, np.float32), ReduceOp.SUM)
    elapsed = time.monotonic() - start
    assert np.array_equal(total, np.full(args.big // 4, expected_sum, np.float32))
    print(f"BIG {elapsed:.3f} s for {args.big} bytes", flush=True)
hosts = [list(h) for h in group.topology.hosts] if group.topology is not None else None
print(f"RESULT task={rt.task} rank={rank} n={n} hosts={json.dumps(hosts)} "
      f"routes={json.dumps(group.route_counts, sort_keys=True)}", flush=True)
