"""Quickstart: an MLP classifier on handwritten digits, trained with MultiWorkerMirroredStrategy.

Run it on a chief and two workers with
``uv run clusterctl launch examples/quickstart/cluster.yaml``, or alone
(``uv run python examples/quickstart/train.py``: no TF_CONFIG, one local replica).
``--strategy`` picks another strategy (mirrored, central_storage, one_device, default) to train the
same model the same way; every layout computes the same parameters as one process on the same
global batch. The model is plain NumPy with hand-written gradients: bring your own math (or a
framework's gradients) and let the strategy do the distribution.

``--checkpoint-dir DIR`` makes the run resumable: it restores the newest checkpoint in DIR at
start (parameters, Adam's state, the metrics, the epoch and the position in the epoch's data),
saves at the end of every epoch (or every ``--checkpoint-every`` steps), and on SIGTERM (a
preemption notice) saves at the next step and exits 204, which ``clusterctl`` restarts. A resumed
run ends with the same parameters, bit for bit, as one that was never interrupted.
"""

from __future__ import annotations

import argparse
import math
import os
import sys
import time
from pathlib import Path

import numpy as np
from tqdm import tqdm

import cluster
from cluster.checkpoint import Checkpoint, CheckpointManager, PreemptionCheckpointHandler
from cluster.curves import Curves

HERE = Path(__file__).resolve().parent


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--epochs", type=int, default=10)
    parser.add_argument("--batch-size", type=int, default=64, help="global batch size")
    parser.add_argument("--hidden", type=int, default=64)
    parser.add_argument("--learning-rate", type=float, default=0.005)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--strategy", default="multi_worker",
                        choices=["multi_worker", "mirrored", "central_storage", "one_device",
                                 "default"])
    parser.add_argument("--replicas", type=int, default=2,
                        help="CPU replicas for mirrored/central_storage")
    parser.add_argument("--save", type=Path, help="the chief writes the final parameters here")
    parser.add_argument("--checkpoint-dir", type=Path,
                        help="resume from the newest checkpoint here, save checkpoints here")
    parser.add_argument("--checkpoint-every", type=int, metavar="STEPS",
                        help="save every STEPS steps (default: at the end of every epoch)")
    parser.add_argument("--log-dir", type=Path, default=os.environ.get("CLUSTER_RUN_DIR"),
                        help="the chief writes the loss and accuracy curves here (TensorBoard "
                             "events, curves.png; default: clusterctl's run directory)")
    return parser.parse_args(argv)


def make_strategy(name: str, replicas: int):
    devices = [f"/cpu:{i}" for i in range(replicas)]
    if name == "multi_worker":
        return cluster.MultiWorkerMirroredStrategy()
    if name == "mirrored":
        return cluster.MirroredStrategy(devices)
    if name == "central_storage":
        return cluster.CentralStorageStrategy(devices)
    if name == "one_device":
        return cluster.OneDeviceStrategy("/cpu:0")
    return cluster.get_strategy()


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


def loss_and_grads(params, x, y, global_batch: float):
    """Cross-entropy summed over this replica's rows / the global batch size, and its gradients:
    summed over replicas they are the gradients of the global batch's mean loss."""
    w1, b1, w2, b2 = params
    h, probs = forward(params, x)
    rows = np.arange(len(y))
    loss = -np.log(probs[rows, y] + 1e-12).sum() / global_batch
    d_logits = probs.copy()
    d_logits[rows, y] -= 1.0
    d_logits /= global_batch
    d_h = (d_logits @ w2.T) * (h > 0)
    grads = [x.T @ d_h, d_h.sum(axis=0), h.T @ d_logits, d_logits.sum(axis=0)]
    return np.float32(loss), [g.astype(np.float32) for g in grads], probs.argmax(axis=1)


def epoch_batches(x, y, batch_size: int, seed: int, epoch: int):
    # Every worker shuffles with the same seed, so global batch i is the same everywhere.
    order = np.random.default_rng(seed * 7919 + epoch).permutation(len(x))
    return [(x[order[i:i + batch_size]], y[order[i:i + batch_size]])
            for i in range(0, len(x), batch_size)]


class TrainingSet:
    """The training set in global batches, reshuffled every epoch: iterating it yields the
    batches of the current epoch (``epochs_done`` + 1; ``epochs_done`` is a variable the
    checkpoint holds). Every pass over one epoch yields the same batches, on every worker, so
    a checkpointed iterator restores by skipping the batches it had taken."""

    def __init__(self, x, y, batch_size: int, seed: int, epochs_done) -> None:
        self.x, self.y, self.batch_size, self.seed = x, y, batch_size, seed
        self.epochs_done = epochs_done

    def __len__(self) -> int:
        return math.ceil(len(self.x) / self.batch_size)

    def __iter__(self):
        epoch = int(self.epochs_done) + 1
        return iter(epoch_batches(self.x, self.y, self.batch_size, self.seed, epoch))

    def rows(self, step: int) -> float:
        """The size of global batch ``step`` of an epoch (the last one may be smaller)."""
        return float(min(self.batch_size, len(self.x) - step * self.batch_size))


def save(manager: CheckpointManager, step: int, chief: bool) -> None:
    path = manager.save(checkpoint_number=step)  # every task calls it; the chief writes
    if chief:
        print(f"saved {path}", flush=True)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    data = np.load(HERE / "digits.npz")
    x_train, y_train, x_test, y_test = (data[k] for k in ("x_train", "y_train", "x_test", "y_test"))
    strategy = make_strategy(args.strategy, args.replicas)
    chief = strategy.extended.is_chief  # the chief, else worker 0 (TensorFlow's rule)
    sizes = [x_train.shape[1], args.hidden, 10]

    with strategy.scope():
        # Every task draws its own initial values; the strategy broadcasts the chief's.
        rng = np.random.default_rng(args.seed)
        variables = [cluster.Variable(p, name=n) for p, n in
                     zip(initial_params(rng, sizes), ["w1", "b1", "w2", "b2"], strict=True)]
        optimizer = cluster.optimizers.Adam(args.learning_rate)
        accuracy = cluster.metrics.Accuracy()
        mean_loss = cluster.metrics.Sum()
        epochs_done = cluster.Variable(0, name="epochs_done", trainable=False)

    def replica_step(x, y, global_batch):
        params = [v.value() for v in variables]
        loss, grads, predicted = loss_and_grads(params, x, y, global_batch)
        optimizer.apply_gradients(zip(grads, variables, strict=True))
        accuracy.update_state(y, predicted)
        mean_loss.update_state(loss)

    training_set = TrainingSet(x_train, y_train, args.batch_size, args.seed, epochs_done)
    iterator = iter(strategy.experimental_distribute_dataset(training_set))

    def train_step():
        rows = training_set.rows(iterator.position)
        x, y = next(iterator)
        strategy.run(replica_step, args=(x, y, rows))

    manager = handler = None
    if args.checkpoint_dir:
        # Every task makes the same objects and calls save; the chief writes (a shared directory).
        checkpoint = Checkpoint(model=variables, optimizer=optimizer,
                                metrics=[accuracy, mean_loss], epochs_done=epochs_done,
                                data=iterator)
        manager = CheckpointManager(checkpoint, args.checkpoint_dir, max_to_keep=3)
        # Restores the newest checkpoint, if any; from now on SIGTERM saves and exits 204.
        handler = PreemptionCheckpointHandler(strategy.cluster_resolver, manager)
        if chief and manager.latest_checkpoint:
            print(f"resumed from {manager.latest_checkpoint} at epoch {int(epochs_done) + 1} "
                  f"step {handler.total_run_calls}", flush=True)
    run = handler.run if handler else (lambda step: step())

    if chief:
        print(f"training on {len(x_train)} digits with {type(strategy).__name__}, "
              f"{strategy.num_replicas_in_sync} replica(s) in sync, global batch "
              f"{args.batch_size}", flush=True)
    curves = Curves(args.log_dir, enabled=chief, title="quickstart (MLP on digits)")
    started = time.monotonic()
    while int(epochs_done) < args.epochs:
        epoch = int(epochs_done) + 1
        bar = tqdm(total=len(training_set), initial=iterator.position,
                   desc=f"epoch {epoch}/{args.epochs}", disable=not chief, file=sys.stdout,
                   ncols=80, mininterval=0.5)
        while iterator.position < len(training_set):  # a resumed epoch starts mid-way
            run(train_step)  # on a preemption notice: saves here and exits 204
            bar.update(1)
            if handler and args.checkpoint_every \
                    and handler.total_run_calls % args.checkpoint_every == 0:
                save(manager, handler.total_run_calls, chief)
        bar.close()
        # result() sums every replica of every worker: all tasks call it.
        loss = float(mean_loss.result()) / len(training_set)
        acc = float(accuracy.result())
        if chief:
            print(f"epoch {epoch}/{args.epochs}  loss {loss:.4f}  accuracy {acc:.4f}", flush=True)
        curves.add(epoch, loss=loss, accuracy=acc)  # the chief's only
        epochs_done.assign_add(1)
        iterator.seek(0)  # the next epoch's batches, from its first
        accuracy.reset_state()
        mean_loss.reset_state()
        if handler and not args.checkpoint_every:
            save(manager, handler.total_run_calls, chief)
    if handler:  # not in a `finally`: after a preemption save it stays until the process exits
        handler.close()

    params = [v.numpy() for v in variables]
    _, probs = forward(params, x_test)
    test_accuracy = float((probs.argmax(axis=1) == y_test).mean())
    if chief:
        print(f"test accuracy {test_accuracy:.4f} on {len(x_test)} held-out digits "
              f"({time.monotonic() - started:.1f} s)", flush=True)
        png = curves.close()
        if png:
            print(f"curves: {png} (and TensorBoard events: tensorboard --logdir "
                  f"{args.log_dir})", flush=True)
        if args.save:
            tmp = args.save.with_name(args.save.name + f".tmp{os.getpid()}")
            with open(tmp, "wb") as f:
                np.savez(f, *params, test_accuracy=test_accuracy)
                f.flush()
                os.fsync(f.fileno())
            os.replace(tmp, args.save)
    return 0


if __name__ == "__main__":
    sys.exit(main())
