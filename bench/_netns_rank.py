"""One rank of ``bench/allreduce.py --netns-hosts``: run as ``python -m worker`` on an emulated
host; all-reduces through the public API (the task's runtime, a CollectiveGroup), prints
``TIMES {"size": [seconds, ...]}`` and the routes the group took.

Usage: python -m worker bench/_netns_rank.py SIZES ITERS WARMUP   (SIZES: comma list of bytes)
"""

import json
import sys
import time

import numpy as np

import cluster.runtime
from cluster.collectives import CollectiveGroup, CommunicationOptions, ReduceOp

sizes = [int(s) for s in sys.argv[1].split(",")]
iters, warmup = int(sys.argv[2]), int(sys.argv[3])
rt = cluster.runtime.current() or cluster.runtime.start()
group = CollectiveGroup(rt.collective_transport(), "bench",
                        CommunicationOptions(timeout_seconds=120),
                        settings=rt.settings.collectives)
group.barrier()
times = {}
for size in sizes:
    x = np.ones(size // 4, dtype=np.float32)
    per_iter = []
    for i in range(warmup + iters):
        group.barrier()
        start = time.perf_counter()
        out = group.all_reduce(x, ReduceOp.SUM)
        elapsed = time.perf_counter() - start
        if i >= warmup:
            per_iter.append(elapsed)
    if out.size and float(out.flat[0]) != group.world_size:
        raise AssertionError(f"{rt.task}: {out.flat[0]} != {group.world_size}")
    times[size] = per_iter
print("TIMES " + json.dumps(times), flush=True)
print("ROUTES " + json.dumps(group.route_counts, sort_keys=True), flush=True)
