"""The chief of ``bench/ps_checkpoint.py`` (``mode: coordinator``): times checkpoint saves of
ParameterServerStrategy variables, the coordinator pulling every shard and writing one
checkpoint. Prints ``RESULT {json}``.

    _ps_ckpt_chief.py --dir DIR --bytes N --runs R
"""

from __future__ import annotations

import argparse
import json
import time

import numpy as np

import cluster
import cluster.runtime
from cluster.checkpoint import Checkpoint, CheckpointManager
from cluster.ps import FixedShardsPartitioner

parser = argparse.ArgumentParser()
parser.add_argument("--dir", required=True)
parser.add_argument("--bytes", type=int, required=True)
parser.add_argument("--runs", type=int, default=3)
opts = parser.parse_args()

resolver = cluster.runtime.current().resolver
num_ps = len(resolver.cluster_spec().as_dict()["ps"])
strategy = cluster.ParameterServerStrategy(
    resolver, variable_partitioner=FixedShardsPartitioner(num_ps))
rows = opts.bytes // 4 // 1024
with strategy.scope():  # four variables, each split over every ps task
    variables = [cluster.Variable(np.random.default_rng(i).random((rows // 4, 1024), np.float32),
                                  name=f"v{i}") for i in range(4)]
manager = CheckpointManager(Checkpoint(model=variables), opts.dir, max_to_keep=1)
times = []
for run in range(opts.runs):
    started = time.perf_counter()
    manager.save(checkpoint_number=run)
    times.append(time.perf_counter() - started)
nbytes = sum(v.numpy().nbytes for v in variables[:1]) * 4
print("RESULT " + json.dumps({"ps": num_ps, "bytes": nbytes, "times": times}), flush=True)
