"""Test task: writes its pid to PIDDIR/TYPE-INDEX.pid, then all-reduces in a loop for up to
60 s (so a peer that stops answering is noticed inside a collective).

Usage: collective_loop.py PIDDIR
"""

import os
import sys
import time

import numpy as np

import cluster.runtime
from cluster.collectives import CollectiveGroup, ReduceOp

rt = cluster.runtime.current() or cluster.runtime.start()
path = os.path.join(sys.argv[1], f"{rt.task_type}-{rt.task_id}.pid")
with open(path + ".tmp", "w") as f:
    f.write(str(os.getpid()))
os.replace(path + ".tmp", path)
group = CollectiveGroup(rt.collective_transport(), settings=rt.settings.collectives)
total = group.all_reduce(np.ones(4, np.float32), ReduceOp.SUM)
print(f"{rt.task} all_reduce -> {total.tolist()}", flush=True)
end = time.monotonic() + 60
while time.monotonic() < end:
    group.all_reduce(np.ones(4, np.float32), ReduceOp.SUM)
    time.sleep(0.05)  # a light loop: 2 busy cores must still carry the heartbeats
