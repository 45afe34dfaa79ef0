"""Test task: all-reduce 1 MiB through MultiWorkerMirroredStrategy in a loop until stopped.

Prints ``ready`` after the first all-reduce, so a test signals a task that is mid-collective.
"""

import numpy as np

import cluster

strategy = cluster.MultiWorkerMirroredStrategy()
x = np.ones(1 << 18, np.float32)
first = True
while True:
    strategy.run(lambda: cluster.get_replica_context().all_reduce(cluster.ReduceOp.SUM, x))
    if first:
        print("ready", flush=True)
        first = False
