"""Test task for `srun ... python -m worker step.py` with no TF_CONFIG: an exact all-reduce of
rank + 1, then one line saying who and where this task is and which GPUs it was given."""

import os

import numpy as np

import cluster.runtime
from cluster.collectives import CollectiveGroup, ReduceOp

rt = cluster.runtime.current() or cluster.runtime.start()
group = CollectiveGroup(rt.collective_transport(), settings=rt.settings.collectives)
total = group.all_reduce(np.full(5, group.rank + 1, np.float64), ReduceOp.SUM)
print(f"{rt.task} rank {group.rank} of {group.world_size} on {os.environ['SLURMD_NODENAME']}: "
      f"sum {total.tolist()} gpus {os.environ.get('CUDA_VISIBLE_DEVICES', 'none')}", flush=True)
