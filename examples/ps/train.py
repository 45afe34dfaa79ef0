"""Parameter-server training: the quickstart's MLP on 2 workers, its variables on 2 ps tasks.

Run it with ``uv run clusterctl launch examples/ps/cluster.yaml`` (``mode: coordinator``): only
the chief runs this script. It creates a ``ParameterServerStrategy`` and, under its scope, the
variables (placed round-robin on the parameter servers; ``dense1/kernel`` split over both by the
partitioner) and the optimizer (its slots and updates live on the parameter servers). A
``ClusterCoordinator`` then schedules training steps on the workers: each step pulls the
variables, computes gradients on its worker's shard of the data (plain NumPy, the quickstart's
math) and pushes them, and the parameter servers apply them. Asynchronous by default (each
worker's gradients are applied on arrival, as TF 2 does); ``--sync`` runs rounds of one step per
worker and applies the mean of their gradients. The chief reads the trained variables back and
evaluates them on the test split.

``--checkpoint-dir DIR``: the chief restores the newest checkpoint in DIR at start (the
variables, Adam's state on the parameter servers, and the epoch counter) and saves one after
every epoch, between steps (after ``coordinator.join()``). With ``restart: {max_restarts: N}`` in
the cluster file, a parameter server that dies restarts the whole cluster and training resumes
at the last completed epoch. Each worker's data cannot seek (it comes from
``distribute_datasets_from_function``): a resumed run reshuffles from the restored epoch on,
so it sees the same kind of data, not the very batches the interrupted epoch would have.
"""

from __future__ import annotations

import argparse
import itertools
import math
import os
import sys
import time
from pathlib import Path

import numpy as np

import cluster
import cluster.runtime
from cluster.checkpoint import Checkpoint, CheckpointManager
from cluster.coordinator import ClusterCoordinator
from cluster.curves import Curves
from cluster.ps import MinSizePartitioner

# The quickstart's data, read by the chief and by every worker (the same path on every host).
DATA = Path(__file__).resolve().parent.parent / "quickstart" / "digits.npz"
NAMES = ["dense1/kernel", "dense1/bias", "dense2/kernel", "dense2/bias"]


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--epochs", type=int, default=20)
    parser.add_argument("--batch-size", type=int, default=32, help="batch size of each step")
    parser.add_argument("--hidden", type=int, default=64)
    parser.add_argument("--learning-rate", type=float, default=0.003)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--sync", action="store_true",
                        help="synchronous rounds: the mean of one step per worker, applied once")
    parser.add_argument("--checkpoint-dir", type=Path,
                        help="resume from the newest checkpoint here; save one every epoch")
    parser.add_argument("--log-dir", type=Path, default=os.environ.get("CLUSTER_RUN_DIR"),
                        help="write the loss and accuracy curves here (TensorBoard events, "
                             "curves.png; default: clusterctl's run directory)")
    return parser.parse_args(argv)


# The quickstart's model (examples/quickstart/train.py), copied so that the functions sent to the
# workers travel by value with this script and the workers import nothing from examples/.

def initial_params(rng: np.random.Generator, sizes: list[int]) -> list[np.ndarray]:
    params = []
    for fan_in, fan_out in zip(sizes[:-1], sizes[1:], strict=True):
        limit = np.sqrt(6.0 / (fan_in + fan_out))  # Glorot uniform, Keras' default
        params.append(rng.uniform(-limit, limit, (fan_in, fan_out)).astype(np.float32))
        params.append(np.zeros(fan_out, np.float32))
    return params


def forward(params, x):
    w1, b1, w2, b2 = params
    h = np.maximum(x @ w1 + b1, 0.0)
    logits = h @ w2 + b2
    logits = logits - logits.max(axis=1, keepdims=True)
    probs = np.exp(logits)
    probs /= probs.sum(axis=1, keepdims=True)
    return h, probs


def loss_and_grads(params, x, y):
    """Mean cross-entropy over the batch and its gradients. Each worker's gradients are applied
    on their own (or averaged with the round's, with --sync): scale by this batch, not a global
    one."""
    w1, b1, w2, b2 = params
    h, probs = forward(params, x)
    rows = np.arange(len(y))
    loss = -np.log(probs[rows, y] + 1e-12).mean()
    d_logits = probs.copy()
    d_logits[rows, y] -= 1.0
    d_logits /= len(y)
    d_h = (d_logits @ w2.T) * (h > 0)
    grads = [x.T @ d_h, d_h.sum(axis=0), h.T @ d_logits, d_logits.sum(axis=0)]
    return float(loss), [g.astype(np.float32) for g in grads], probs.argmax(axis=1)


def worker_batches(path: Path, index: int, count: int, batch_size: int, seed: int,
                   first_pass: int = 0):
    """Worker ``index`` of ``count``: batches of its shard of the training set, reshuffled on
    every pass, forever (the coordinator decides how many steps run). A resumed run starts at
    pass ``first_pass`` (the epochs done), so it does not replay the first epochs' order: a
    worker takes about one pass per epoch, but not exactly (asynchronous steps go to whichever
    worker is free), so the interrupted epoch's very batches cannot be found again."""
    with np.load(path) as data:
        x, y = data["x_train"][index::count], data["y_train"][index::count]
    for repeat in itertools.count(first_pass):
        order = np.random.default_rng([seed, index, repeat]).permutation(len(x))
        for i in range(0, len(x), batch_size):
            yield x[order[i:i + batch_size]], y[order[i:i + batch_size]]


def placement(variable) -> str:
    """``dense1/kernel on ps:0+ps:1``: where the variable's shards live."""
    tasks = []
    for shard in getattr(variable, "variables", [variable]):  # a ShardedVariable has several
        parts = dict(p.split(":", 1) for p in shard.device.strip("/").split("/"))
        tasks.append(f"{parts['job']}:{parts['task']}")
    return f"{variable.name.split(':')[0]} on {'+'.join(tasks)}"


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    runtime = cluster.runtime.current()
    if runtime is None:
        sys.exit("examples/ps/train.py is the chief of a parameter-server cluster; run it with "
                 "`uv run clusterctl launch examples/ps/cluster.yaml`")
    jobs = runtime.cluster_spec.as_dict()
    num_workers, num_ps = len(jobs["worker"]), len(jobs["ps"])
    with np.load(DATA) as data:
        x_train, x_test, y_test = data["x_train"], data["x_test"], data["y_test"]

    # Variables of 8 KiB or more are split over the parameter servers: here dense1/kernel.
    strategy = cluster.ParameterServerStrategy(
        runtime.resolver, synchronous=args.sync,
        variable_partitioner=MinSizePartitioner(min_shard_bytes=8 << 10, max_shards=num_ps))
    coordinator = ClusterCoordinator(strategy)
    with strategy.scope():
        rng = np.random.default_rng(args.seed)
        sizes = [x_train.shape[1], args.hidden, 10]
        variables = [cluster.Variable(p, name=n) for p, n in
                     zip(initial_params(rng, sizes), NAMES, strict=True)]
        optimizer = cluster.optimizers.Adam(args.learning_rate)  # applied on the ps tasks
    epochs_done = cluster.Variable(0, name="epochs_done")  # outside the scope: the chief's own

    # One epoch: as many steps as cover the training set once (a whole number of rounds).
    steps = math.ceil(math.ceil(len(x_train) / args.batch_size) / num_workers) * num_workers
    manager = None
    if args.checkpoint_dir:
        manager = CheckpointManager(
            Checkpoint(model=variables, optimizer=optimizer, epochs_done=epochs_done),
            args.checkpoint_dir, max_to_keep=3)
        restored = manager.restore_or_initialize()  # the variables go back to the ps tasks
        if restored:
            print(f"resumed from {restored} at epoch {int(epochs_done) + 1} "
                  f"step {int(epochs_done) * steps}", flush=True)
    first_pass = int(epochs_done)

    def dataset_fn():
        # Runs on each worker (again on a worker that restarts): ctx says which shard is its own.
        return strategy.distribute_datasets_from_function(
            lambda ctx: worker_batches(DATA, ctx.input_pipeline_id, ctx.num_input_pipelines,
                                       args.batch_size, args.seed, first_pass))

    per_worker_iterator = iter(coordinator.create_per_worker_dataset(dataset_fn))

    def step_fn(iterator):  # pickled with cloudpickle and run on whichever worker is free
        x, y = next(iterator)

        def replica_fn(x, y):
            params = [v.numpy() for v in variables]  # pulled from the ps once per step
            loss, grads, predicted = loss_and_grads(params, x, y)
            optimizer.apply_gradients(zip(grads, variables, strict=True))  # pushed to the ps
            return loss, int((predicted == y).sum()), len(y)

        return strategy.run(replica_fn, args=(x, y))

    mode = "synchronous" if args.sync else "asynchronous"
    print(f"training on {len(x_train)} digits with ParameterServerStrategy ({mode}): "
          f"{num_workers} workers, {num_ps} parameter servers, batch {args.batch_size} per step, "
          f"{steps} steps per epoch", flush=True)
    print("variables: " + ", ".join(placement(v) for v in variables), flush=True)
    curves = Curves(args.log_dir, title=f"examples/ps ({mode})")  # only the chief runs this
    started = time.monotonic()
    for epoch in range(int(epochs_done) + 1, args.epochs + 1):
        results = [coordinator.schedule(step_fn, args=(per_worker_iterator,))
                   for _ in range(steps)]
        coordinator.join()
        losses, correct, seen = zip(*(r.fetch() for r in results), strict=True)
        loss, accuracy = float(np.mean(losses)), sum(correct) / sum(seen)
        print(f"epoch {epoch}/{args.epochs}  loss {loss:.4f}  accuracy {accuracy:.4f}",
              flush=True)
        curves.add(epoch, loss=loss, accuracy=accuracy)
        epochs_done.assign(epoch)
        if manager:  # between steps: every scheduled step has been applied
            print(f"saved {manager.save(checkpoint_number=epoch * steps)}", flush=True)

    params = [v.numpy() for v in variables]  # read back from the parameter servers
    _, probs = forward(params, x_test)
    test_accuracy = float((probs.argmax(axis=1) == y_test).mean())
    print(f"test accuracy {test_accuracy:.4f} on {len(x_test)} held-out digits "
          f"({time.monotonic() - started:.1f} s)", flush=True)
    png = curves.close()
    if png:
        print(f"curves: {png} (and TensorBoard events: tensorboard --logdir {args.log_dir})",
              flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
