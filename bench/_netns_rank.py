"""One rank of ``bench/allreduce.py --netns-hosts``: run as ``python -m worker`` on an emulated
host; all-reduces through the public API (the task's runtime, a CollectiveGroup), prints
``TIMES {"size": [[wall seconds, process CPU seconds], ...]}`` and the routes the group took.

Usage: python -m worker bench/_netns_rank.py SIZES ITERS WARMUP   (SIZES: comma list of bytes)
"""

import json
import sys

from _timing import time_all_reduce_cpu  # bench/ is on sys.path: this script's directory

import cluster.runtime
from cluster.collectives import CollectiveGroup, CommunicationOptions

sizes = [int(s) for s in sys.argv[1].split(",")]
iters, warmup = int(sys.argv[2]), int(sys.argv[3])
rt = cluster.runtime.current() or cluster.runtime.start()
group = CollectiveGroup(rt.collective_transport(), "bench",
                        CommunicationOptions(timeout_seconds=120),
                        settings=rt.settings.collectives)
group.barrier()
times = time_all_reduce_cpu(group, sizes, iters, warmup, group.world_size)
print("TIMES " + json.dumps(times), flush=True)
print("ROUTES " + json.dumps(group.route_counts, sort_keys=True), flush=True)
