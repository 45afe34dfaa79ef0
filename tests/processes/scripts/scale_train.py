"""Test task for the scale tests: a few exact training steps with MultiWorkerMirroredStrategy.

Usage: scale_train.py [--steps K] [--forever] [--report-steps TASK]

Each step every replica (one per task) contributes gradient ``rank + 1`` (rank = the replica's
id in sync) to a float32 variable through ``optimizer.apply_gradients`` (SGD, learning rate 1:
the variable moves by minus the sum over replicas), and all-reduces ``[rank + 1, 1]`` with
``get_replica_context().all_reduce(SUM)``. Every value is a small integer, so the sums are exact
in float32: after K steps the variable is ``-K * N(N+1)/2`` on every task, bitwise.

Output: ``RESULT task=worker:3 n=64 steps=K var=-6240.0 sums=[2080.0, 64.0] digest=HEX`` where
the digest is a SHA-256 of the variable's and the last all-reduce's bytes. Task
``--report-steps`` prints ``STEP k`` after each step, so a test can wait for a line instead of
sleeping. ``--forever`` keeps stepping until an error (the SIGKILL test), which then propagates
(the process exits non-zero naming its cause).
"""

import argparse
import hashlib

import numpy as np

import cluster

parser = argparse.ArgumentParser()
parser.add_argument("--steps", type=int, default=3)
parser.add_argument("--report-steps", default="")
parser.add_argument("--forever", action="store_true")
args = parser.parse_args()

strategy = cluster.MultiWorkerMirroredStrategy()
n = strategy.num_replicas_in_sync
resolver = strategy.cluster_resolver
task = f"{resolver.task_type}:{resolver.task_id}"
with strategy.scope():
    variable = cluster.Variable(np.zeros(2, np.float32), name="v")
    optimizer = cluster.optimizers.SGD(1.0)


def step():
    ctx = cluster.get_replica_context()
    rank = ctx.replica_id_in_sync_group
    grad = np.full(2, rank + 1, np.float32)
    optimizer.apply_gradients([(grad, variable)])
    return ctx.all_reduce(cluster.ReduceOp.SUM, np.array([rank + 1, 1], np.float32))


done = 0
sums = None
while args.forever or done < args.steps:
    sums = strategy.run(step)
    done += 1
    if task == args.report_steps:
        print(f"STEP {done}", flush=True)

value = np.asarray(variable.numpy())
last = np.asarray(strategy.experimental_local_results(sums)[0])
digest = hashlib.sha256(value.tobytes() + last.tobytes()).hexdigest()[:16]
print(f"RESULT task={task} n={n} steps={done} var={float(value[0])} "
      f"sums={last.tolist()} digest={digest}", flush=True)
