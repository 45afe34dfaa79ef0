"""Chief script: linear regression with ParameterServerStrategy and a ClusterCoordinator.

    --mode sync|async   --steps N   --ready FILE (progress marker)   --slow SECONDS per function
    --momentum M (default: 0.9 synchronous, 0 asynchronous; see below)

Prints ``RESULT {json}``: the trained parameters, the single-process reference (sync), losses.
"""

import argparse
import json
import os
import time

import numpy as np

import cluster
import cluster.runtime
from cluster.coordinator import ClusterCoordinator
from cluster.errors import ClusterError
from cluster.ps import FixedShardsPartitioner

parser = argparse.ArgumentParser()
parser.add_argument("--mode", default="sync")
parser.add_argument("--steps", type=int, default=8)
parser.add_argument("--batch", type=int, default=16)
parser.add_argument("--ready", default="")
parser.add_argument("--slow", type=float, default=0.0)
# Asynchronous steps read parameters that the other workers' running steps are about to change
# (staleness 1 with 2 workers, more under load). With this problem's Hessian ~ I, momentum 0.9 at
# learning rate 0.1 (an effective step of 1.0) already diverges at a constant staleness of 1,
# while plain SGD converges with staleness up to 10 and more, so asynchronous runs use no
# momentum unless told.
parser.add_argument("--momentum", type=float, default=None)
# Keep scheduling rounds past --steps until this task has served functions from two processes.
# How long a restarted worker takes to start depends on the machine's load (tens of seconds on a
# loaded 2-core machine), so the 45 s the coordinator gets to use it again count from when the
# --restarted file appears (the test writes it once the new process accepts connections); 180 s
# after training at most if it never does.
parser.add_argument("--until-restarted", default="")
parser.add_argument("--restarted", default="")
opts = parser.parse_args()
if opts.momentum is None:
    opts.momentum = 0.9 if opts.mode == "sync" else 0.0

rng = np.random.default_rng(7)
FEATURES, OUT = 12, 3
X = rng.normal(size=(4096, FEATURES)).astype(np.float32)
TRUE_W = rng.normal(size=(FEATURES, OUT)).astype(np.float32)
Y = (X @ TRUE_W + 0.5).astype(np.float32)
W0 = (0.1 * rng.normal(size=(FEATURES, OUT))).astype(np.float32)


def batch(i):
    start = (i * opts.batch) % (len(X) - opts.batch)
    return X[start:start + opts.batch], Y[start:start + opts.batch]


def grads_of(w, b, x, y):
    err = x @ w + b - y  # loss = mean over the batch of sum of squares / 2
    n = x.shape[0]
    return (x.T @ err / n).astype(np.float32), (err.sum(axis=0) / n).astype(np.float32), \
        float((err ** 2).sum() / (2 * n))


resolver = cluster.runtime.current().resolver
strategy = cluster.ParameterServerStrategy(
    resolver, variable_partitioner=FixedShardsPartitioner(2), synchronous=opts.mode == "sync")
coordinator = ClusterCoordinator(strategy)
with strategy.scope():
    w = cluster.Variable(W0, name="w")
    b = cluster.Variable(np.zeros(OUT, np.float32), name="b")
    optimizer = cluster.optimizers.SGD(learning_rate=0.1, momentum=opts.momentum)


def step(i):
    def replica_fn(x, y):
        gw, gb, loss = grads_of(w.numpy(), b.numpy(), x, y)
        optimizer.apply_gradients([(gw, w), (gb, b)])
        return loss

    if opts.slow:
        time.sleep(opts.slow)
    x, y = batch(i)
    loss = strategy.run(replica_fn, args=(x, y))
    return {"i": i, "loss": loss, "task": cluster.runtime.current().task, "pid": os.getpid()}


workers = len(resolver.cluster_spec().as_dict()["worker"])
total = opts.steps * workers
t0 = time.time()
values = []
error = None
# --ready FILE tells the test that training is under way (it then kills a task). It is written
# once the first function finished and, with --until-restarted TASK, once a function that TASK
# ran finished: the test checks that TASK's first process served before it died, and under load
# TASK's dispatcher may connect only after the other workers ran the first functions. Until
# then scheduling runs at most `lag` functions ahead, and past --steps (up to 120 s) if need be.
lag = min(total - 1, 2 * workers)
announced = not opts.ready
target_served = not opts.until_restarted
announce_by = time.time() + 120
try:
    while len(values) < total or (not announced and time.time() < announce_by):
        i = len(values)
        values.append(coordinator.schedule(step, args=(i,)))
        if not announced and i >= lag:
            target_served |= values[i - lag].fetch()["task"] == opts.until_restarted
            if target_served:
                open(opts.ready, "w").write(str(time.time()))
                announced = True
    if not announced:  # TASK never served: announce anyway; the test reports what it saw
        open(opts.ready, "w").write(str(time.time()))
    coordinator.join()
    results = [v.fetch() for v in values]
    give_up = time.time() + 180
    while opts.until_restarted and time.time() < give_up and len(
            {r["pid"] for r in results if r["task"] == opts.until_restarted}) < 2:
        if opts.restarted and os.path.exists(opts.restarted):
            give_up = min(give_up, os.path.getmtime(opts.restarted) + 45)
        more = [coordinator.schedule(step, args=(len(values) + k,)) for k in range(workers)]
        values.extend(more)
        coordinator.join()
        results.extend(v.fetch() for v in more)
except ClusterError as e:
    error = {"type": type(e).__name__, "task": getattr(e, "task", ""), "message": str(e),
             "at": time.time()}
    results = []

out = {"error": error, "results": results, "seconds": time.time() - t0,
       "w_shards": [v.device for v in w.variables] if hasattr(w, "variables") else []}
def full_loss(wv, bv):
    return grads_of(wv, bv, X, Y)[2]


out["loss_initial"] = full_loss(W0, np.zeros(OUT, np.float32))
if error is None:
    out["loss_final"] = full_loss(w.numpy(), b.numpy())
    out["w"] = w.numpy().tolist()
    out["b"] = b.numpy().tolist()
if error is None and opts.mode == "sync":
    # One process, global batch = the round's batches together, same optimizer rule.
    rw, rb = cluster.Variable(W0), cluster.Variable(np.zeros(OUT, np.float32))
    ref_opt = cluster.optimizers.SGD(learning_rate=0.1, momentum=opts.momentum)
    for s in range(opts.steps):
        parts = [batch(s * workers + k) for k in range(workers)]
        x = np.concatenate([p[0] for p in parts])
        y = np.concatenate([p[1] for p in parts])
        gw, gb, _ = grads_of(rw.numpy(), rb.numpy(), x, y)
        ref_opt.apply_gradients([(gw, rw), (gb, rb)])
    out["ref_w"] = rw.numpy().tolist()
    out["ref_b"] = rb.numpy().tolist()
print("RESULT " + json.dumps(out), flush=True)
