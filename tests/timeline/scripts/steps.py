"""A task of the timeline tests (``python -m worker steps.py [options]``): ``--steps`` steps of
``strategy.run(lambda: ctx.all_reduce(SUM, 4 KiB of float32))`` under
MultiWorkerMirroredStrategy, then ``cluster.timeline.recorder().flush()``.

``--kill TASK``: every task runs 2 more steps (left in the buffers), then TASK SIGKILLs itself.
``--hold SOCKET``: every task then connects to the Unix socket SOCKET and waits (60 s at most)
for a byte or the connection's end before it exits: the test looks at the run meanwhile.
"""

import argparse
import os
import signal
import socket
import sys

import numpy as np

import cluster
from cluster import timeline

parser = argparse.ArgumentParser()
parser.add_argument("--steps", type=int, default=5)
parser.add_argument("--kill")
parser.add_argument("--hold")
args = parser.parse_args()

strategy = cluster.MultiWorkerMirroredStrategy()
resolver = strategy.cluster_resolver
me = f"{resolver.task_type}:{resolver.task_id}"
x = np.ones((4, 256), np.float32)  # 4 rows: the step's samples


def step(batch):
    return cluster.get_replica_context().all_reduce(cluster.ReduceOp.SUM, batch)


for _ in range(args.steps):
    out = strategy.run(step, args=(x,))
assert float(np.asarray(out).flat[0]) == strategy.num_replicas_in_sync
timeline.recorder().flush()
if args.kill:
    for _ in range(2):  # every task, so the collectives match: left in the buffers
        strategy.run(step, args=(x,))
    if args.kill == me:
        os.kill(os.getpid(), signal.SIGKILL)
if args.hold:
    with socket.socket(socket.AF_UNIX) as s:
        s.settimeout(60)
        s.connect(args.hold)
        s.recv(1)
print(f"{me} done", flush=True)
sys.exit(0)
