"""One task of ``bench/scale.py``, run as ``python -m worker bench/_scale_task.py ITERS WARMUP``.

Protocol with the benchmark (stdout lines, stdin lines; wall-clock ``time.time()`` stamps, which
are comparable between processes of one machine):

1. ``SCALE {json}``: ``script`` (when the script began: this task registered and its peers were
   awaited), ``first`` (when its first all-reduce returned), ``lat`` (seconds of each timed 4 KiB
   float32 SUM all-reduce, each after a barrier), ``exact`` (every result equalled N (N + 1) / 2
   exactly), then ``UP``; the task then blocks on stdin so
   the benchmark can read its /proc while the group is idle but alive (heartbeats go on).
2. On a ``go`` line: all-reduce in a loop; ``LOOP`` after the first one. When a collective
   fails (the benchmark SIGKILLed a task), ``FAILED {time} {error}`` and the error propagates
   (``python -m worker`` reports it and exits).
"""

import json
import sys
import time

import numpy as np

import cluster.runtime
from cluster.collectives import CollectiveGroup, ReduceOp

iters, warmup = int(sys.argv[1]), int(sys.argv[2])
script = time.time()
rt = cluster.runtime.current()
group = CollectiveGroup(rt.collective_transport(), settings=rt.settings.collectives)
# Exact: every rank adds its rank + 1 (integers in float32), so the sum is N (N + 1) / 2.
n = group.world_size
want = n * (n + 1) / 2
exact = bool(group.all_reduce(np.full(1, group.rank + 1, np.float32), ReduceOp.SUM)[0] == want)
first = time.time()
data = np.full(1024, group.rank + 1, np.float32)  # 4 KiB
lat = []
for i in range(warmup + iters):
    group.barrier()
    began = time.perf_counter()
    out = group.all_reduce(data, ReduceOp.SUM)
    if i >= warmup:
        lat.append(time.perf_counter() - began)
    exact = exact and bool(np.all(out == want))
print("SCALE " + json.dumps({"script": script, "first": first, "lat": lat, "exact": exact}),
      flush=True)
print("UP", flush=True)
if sys.stdin.readline().strip() != "go":
    sys.exit(0)
announced = False
try:
    while True:
        group.all_reduce(data, ReduceOp.SUM)
        if not announced:
            print("LOOP", flush=True)
            announced = True
except Exception as e:
    print(f"FAILED {time.time()} {type(e).__name__}: {e}", flush=True)
    raise
