"""Chief of ``bench/ps.py``'s training benchmark (run as ``python -m worker bench/_ps_chief.py``).

    --mode async|sync   --bytes N (all variables together)   --steps K   --repeats R

Creates four float32 variables shaped like a two-layer MLP (``d x h``, ``h``, ``h x d``, ``d``;
``h`` chosen so they total about ``--bytes``), schedules a warm-up of two functions per worker,
then ``--repeats`` times ``--steps`` functions, each of which reads every variable (one pull of
all of them) and applies a constant gradient with SGD (one push), and joins after each repeat.
Prints ``RESULT {json}``: seconds per repeat, steps, bytes, and the error of one variable
against the value the updates must have produced (so a bench that skipped work shows it).
"""

import argparse
import json
import time

import numpy as np

import cluster
import cluster.runtime
from cluster.coordinator import ClusterCoordinator

LR, GRAD, DIM = 0.01, 1e-3, 256

parser = argparse.ArgumentParser()
parser.add_argument("--mode", choices=["async", "sync"], default="async")
parser.add_argument("--bytes", type=int, default=1 << 20)
parser.add_argument("--steps", type=int, default=40)
parser.add_argument("--repeats", type=int, default=3)
opts = parser.parse_args()

resolver = cluster.runtime.current().resolver
workers = len(resolver.cluster_spec().as_dict()["worker"])
strategy = cluster.ParameterServerStrategy(resolver, synchronous=opts.mode == "sync")
coordinator = ClusterCoordinator(strategy)
hidden = max(1, opts.bytes // (8 * DIM))
shapes = [(DIM, hidden), (hidden,), (hidden, DIM), (DIM,)]
with strategy.scope():
    variables = [cluster.Variable(np.zeros(s, np.float32), name=f"layer{i}")
                 for i, s in enumerate(shapes)]
    optimizer = cluster.optimizers.SGD(learning_rate=LR)


def step():
    def replica_fn():
        checksum = sum(float(v.numpy().flat[0]) for v in variables)  # reads every variable
        grads = [np.full(v.shape, GRAD, np.float32) for v in variables]
        optimizer.apply_gradients(zip(grads, variables, strict=True))
        return checksum

    return strategy.run(replica_fn)


def run(n: int) -> float:
    start = time.perf_counter()
    for _ in range(n):
        coordinator.schedule(step)
    coordinator.join()
    return time.perf_counter() - start


# Synchronous training runs in rounds of one function per worker: whole rounds only.
steps = -(-opts.steps // workers) * workers if opts.mode == "sync" else opts.steps
warmup = 2 * workers
run(warmup)
seconds = [run(steps) for _ in range(opts.repeats)]
functions = warmup + steps * opts.repeats
updates = functions // workers if opts.mode == "sync" else functions  # sync: mean per round
expected = -LR * GRAD * updates
got = float(variables[0].numpy().flat[0])
print("RESULT " + json.dumps({
    "mode": opts.mode, "workers": workers, "steps": steps, "seconds": seconds,
    "bytes": int(sum(v.numpy().nbytes for v in variables)), "shapes": shapes,
    "expected": expected, "got": got, "updates": updates,
}), flush=True)
