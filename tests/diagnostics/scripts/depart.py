"""Test task: one all-reduce on every task, then a second one on worker:0 only, while the
others finish their script (a clean departure in the middle of worker:0's collective)."""

import numpy as np

import cluster.runtime
from cluster.collectives import CollectiveGroup, CommunicationOptions

rt = cluster.runtime.current() or cluster.runtime.start()
group = CollectiveGroup(rt.collective_transport(), settings=rt.settings.collectives)
group.all_reduce(np.ones(4, np.float32))
print(f"{rt.task} first all_reduce done", flush=True)
if rt.task == "worker:0":
    group.all_reduce(np.ones(1024, np.float32), options=CommunicationOptions(timeout_seconds=60))
