"""Chief script: checkpoints of ParameterServerStrategy variables on real ps processes.

    --dir DIR --action save|restore

``save``: create ``w`` (partitioned over every ps task) and ``b``, train 3 synchronous steps
(``--optimizer momentum|adam``: state kept on the ps tasks) through a ClusterCoordinator, save
with a CheckpointManager, then train one more step. ``restore``: create the variables with other
initial values (on however many ps tasks this cluster has), restore the latest checkpoint, then
train that same step.
Prints ``RESULT {json}``.
"""

import argparse
import json

import numpy as np

import cluster
import cluster.runtime
from cluster.checkpoint import Checkpoint, CheckpointManager
from cluster.coordinator import ClusterCoordinator
from cluster.ps import FixedShardsPartitioner

parser = argparse.ArgumentParser()
parser.add_argument("--dir", required=True)
parser.add_argument("--action", choices=["save", "restore"], required=True)
parser.add_argument("--optimizer", choices=["momentum", "adam"], default="momentum")
opts = parser.parse_args()

rng = np.random.default_rng(3)
X = rng.normal(size=(64, 10)).astype(np.float32)
Y = rng.normal(size=(64, 3)).astype(np.float32)

resolver = cluster.runtime.current().resolver
num_ps = len(resolver.cluster_spec().as_dict()["ps"])
strategy = cluster.ParameterServerStrategy(
    resolver, variable_partitioner=FixedShardsPartitioner(num_ps), synchronous=True)
coordinator = ClusterCoordinator(strategy)
seed = 0 if opts.action == "save" else 1  # restore must overwrite different initial values
with strategy.scope():
    w = cluster.Variable(np.random.default_rng(seed).normal(size=(10, 3)).astype(np.float32),
                         name="w")
    b = cluster.Variable(np.full(3, float(seed), np.float32), name="b")
    steps = cluster.Variable(np.int64(0), name="steps", trainable=False)
optimizer = (cluster.optimizers.SGD(learning_rate=0.05, momentum=0.9)
             if opts.optimizer == "momentum" else cluster.optimizers.Adam(learning_rate=0.05))


def train(i):
    def replica_fn(x, y):
        err = x @ w.numpy() + b.numpy() - y
        optimizer.apply_gradients([((x.T @ err / len(x)).astype(np.float32), w),
                                   ((err.sum(0) / len(x)).astype(np.float32), b)])

    start = (i * 8) % 56
    strategy.run(replica_fn, args=(X[start:start + 8], Y[start:start + 8]))


def run_steps(first, count):
    workers = len(resolver.cluster_spec().as_dict()["worker"])
    for i in range(first * workers, (first + count) * workers):
        coordinator.schedule(train, args=(i,))
    coordinator.join()
    steps.assign_add(count)


ckpt = Checkpoint(model={"w": w, "b": b}, steps=steps, optimizer=optimizer)
manager = CheckpointManager(ckpt, opts.dir, max_to_keep=2)
out = {"num_ps": num_ps, "w_shards": [v.device for v in getattr(w, "variables", [w])]}
if opts.action == "save":
    run_steps(0, 2)
    manager.save(checkpoint_number=int(steps.numpy()))
    run_steps(2, 1)
    out["saved"] = manager.save(checkpoint_number=int(steps.numpy()))
    out["w"], out["b"], out["steps"] = w.numpy().tolist(), b.numpy().tolist(), int(steps.numpy())
    try:  # optimizer state on the ps tasks that no tracked optimizer owns
        Checkpoint(model=[w]).write(opts.dir + "/untracked")
        out["untracked_refused"] = None
    except ValueError as e:
        out["untracked_refused"] = str(e)
    run_steps(3, 1)  # what the restored run must reproduce, bit for bit
    out["w_continued"] = w.numpy().tolist()
else:
    out["restored"] = manager.restore_or_initialize()
    out["w"], out["b"], out["steps"] = w.numpy().tolist(), b.numpy().tolist(), int(steps.numpy())
    out["w_parts"] = [p.numpy().tolist() for p in getattr(w, "variables", [w])]
    run_steps(3, 1)  # training continues from the restored values
    out["w_after"] = w.numpy().tolist()
print("RESULT " + json.dumps(out), flush=True)
