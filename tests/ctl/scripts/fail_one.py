"""Test task: all-reduces once with every peer, then worker:1 raises ``ValueError`` while the
others go on all-reducing (so they fail with ``CollectiveAbortedError``: secondary failures).

With ``--linger``, worker:1's interpreter then waits (up to 60 s, at exit, after it reported its
failure) instead of exiting: its peers exit first, as a slow culprit's do.

Usage: fail_one.py [--linger]
"""

import atexit
import sys
import threading
import time

import numpy as np

import cluster.runtime
from cluster.collectives import CollectiveGroup, ReduceOp

rt = cluster.runtime.current() or cluster.runtime.start()
group = CollectiveGroup(rt.collective_transport(), settings=rt.settings.collectives)
group.all_reduce(np.ones(4, np.float32), ReduceOp.SUM)
if rt.task == "worker:1":
    if "--linger" in sys.argv:
        atexit.register(threading.Event().wait, 60)
    raise ValueError("the bug in worker 1")
end = time.monotonic() + 60
while time.monotonic() < end:
    group.all_reduce(np.ones(4, np.float32), ReduceOp.SUM)
    time.sleep(0.05)  # a light loop: 2 busy cores must still carry the heartbeats
