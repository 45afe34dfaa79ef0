"""JAX: the quickstart's digits MLP, with gradients from ``jax.grad``, trained data-parallel.

Run it on a chief and two workers with ``uv run clusterctl launch examples/jax/cluster.yaml``, or
alone (``uv run python examples/jax/train.py``: one replica). Two ways to update the parameters
(``--update``), both SGD with momentum (Keras' rule), both ending with the parameters of one
process on the same global batch:

- ``optimizer`` (default): the parameters are ``cluster.Variable``s in the strategy's scope and
  ``cluster.optimizers.SGD.apply_gradients`` sums the ``jax.grad`` gradients over every replica
  (one fused all-reduce) and updates every copy. Works under every strategy (MirroredStrategy's
  replica threads included), and the variables and optimizer slots checkpoint with
  ``cluster.checkpoint``.
- ``jax``: the parameters stay a JAX pytree; ``cluster.jax.broadcast_tree`` gives every worker the
  chief's initial values, ``cluster.jax.all_reduce_tree`` sums each step's gradient tree in one
  call, and a jitted SGD step updates it (where an optax update would go). One replica per
  process (MultiWorkerMirroredStrategy, OneDeviceStrategy, the default strategy).

Every task draws its initial parameters from ``--seed`` + its worker index: the strategy (or
``broadcast_tree``) makes them the chief's. The loss of a replica's rows is divided by the *global*
batch size, so the gradients summed over replicas are those of the global batch's mean loss.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np

import cluster
import cluster.jax

HERE = Path(__file__).resolve().parent
DIGITS = HERE.parent / "quickstart" / "digits.npz"
NAMES = ("w1", "b1", "w2", "b2")


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--epochs", type=int, default=10)
    parser.add_argument("--steps", type=int, help="stop after this many steps (default: all)")
    parser.add_argument("--batch-size", type=int, default=64, help="global batch size")
    parser.add_argument("--hidden", type=int, default=64)
    parser.add_argument("--learning-rate", type=float, default=0.1)
    parser.add_argument("--momentum", type=float, default=0.9)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--update", default="optimizer", choices=["optimizer", "jax"])
    parser.add_argument("--strategy", default="multi_worker",
                        choices=["multi_worker", "mirrored", "one_device", "default"])
    parser.add_argument("--replicas", type=int, default=2, help="CPU replicas for mirrored")
    parser.add_argument("--save-dir", type=Path,
                        help="every worker writes its final parameters to rank<i>.npz here")
    return parser.parse_args(argv)


def make_strategy(name: str, replicas: int):
    if name == "multi_worker":
        return cluster.MultiWorkerMirroredStrategy()
    if name == "mirrored":
        return cluster.MirroredStrategy([f"/cpu:{i}" for i in range(replicas)])
    if name == "one_device":
        return cluster.OneDeviceStrategy("/cpu:0")
    return cluster.get_strategy()


def initial_params(key: jax.Array, sizes: list[int]) -> dict[str, jax.Array]:
    params = {}
    for i, (fan_in, fan_out) in enumerate(zip(sizes[:-1], sizes[1:], strict=True), start=1):
        key, sub = jax.random.split(key)
        limit = np.sqrt(6.0 / (fan_in + fan_out))  # Glorot uniform, Keras' default
        params[f"w{i}"] = jax.random.uniform(sub, (fan_in, fan_out), jnp.float32, -limit, limit)
        params[f"b{i}"] = jnp.zeros(fan_out, jnp.float32)
    return params


def logits_of(params, x):
    h = jax.nn.relu(x @ params["w1"] + params["b1"])
    return h @ params["w2"] + params["b2"]


def replica_loss(params, x, y, global_batch):
    """Cross-entropy summed over this replica's rows / the global batch size."""
    log_probs = jax.nn.log_softmax(logits_of(params, x))
    return -jnp.take_along_axis(log_probs, y[:, None], axis=1).sum() / global_batch


grad_fn = jax.jit(jax.value_and_grad(replica_loss))


@jax.jit
def sgd_momentum(params, velocity, grads, learning_rate, momentum):
    """Keras' SGD with momentum (as ``cluster.optimizers.SGD``): ``m = momentum * m - lr * g``;
    ``w += m``."""
    velocity = jax.tree.map(lambda m, g: momentum * m - learning_rate * g, velocity, grads)
    return jax.tree.map(jnp.add, params, velocity), velocity


def evaluate(params, x, y) -> tuple[float, float]:
    logits = logits_of(params, x)
    loss = -jnp.take_along_axis(jax.nn.log_softmax(logits), y[:, None], axis=1).mean()
    return float(loss), float((logits.argmax(axis=1) == y).mean())


def global_batches(x, y, batch_size: int, seed: int, epoch: int):
    # Every worker shuffles with the same seed, so global batch i is the same everywhere.
    order = np.random.default_rng(seed * 7919 + epoch).permutation(len(x))
    return [(x[order[i:i + batch_size]], y[order[i:i + batch_size]])
            for i in range(0, len(x), batch_size)]


class Trainer:
    """One of the two update styles (``--update``): ``step(x, y, rows)`` for each global batch
    (``x``, ``y`` as the distributed dataset yields them), ``params()`` as a JAX pytree."""

    def __init__(self, strategy, params, args) -> None:
        self.strategy, self.args = strategy, args
        if args.update == "optimizer":
            with strategy.scope():
                # Plain NumPy values: the variables live on the host; the strategy broadcasts
                # the chief's initial values.
                self.variables = {k: cluster.Variable(np.asarray(v), name=k)
                                  for k, v in params.items()}
                self.optimizer = cluster.optimizers.SGD(args.learning_rate, args.momentum)
        else:
            if strategy.extended.num_local_replicas != 1:
                raise SystemExit("--update jax needs one replica per process: use "
                                 "--strategy multi_worker (or --update optimizer)")
            self.tree = cluster.jax.broadcast_tree(params, strategy)  # the chief's parameters
            self.velocity = jax.tree.map(jnp.zeros_like, self.tree)

    def step(self, x, y, rows: float) -> None:
        if self.args.update == "optimizer":
            self.strategy.run(self._replica_step, args=(x, y, rows))
            return
        (x,), (y,) = (self.strategy.experimental_local_results(v) for v in (x, y))
        _, grads = grad_fn(self.tree, x, y, rows)
        # Already divided by the global batch: the SUM over workers is the global mean's gradient.
        grads = cluster.jax.all_reduce_tree(grads, self.strategy, op="SUM")
        self.tree, self.velocity = sgd_momentum(self.tree, self.velocity, grads,
                                                self.args.learning_rate, self.args.momentum)

    def _replica_step(self, x, y, rows: float) -> None:
        params = {k: v.value() for k, v in self.variables.items()}
        _, grads = grad_fn(params, x, y, rows)
        self.optimizer.apply_gradients((grads[k], self.variables[k]) for k in NAMES)

    def params(self) -> dict[str, jax.Array]:
        if self.args.update == "optimizer":
            return {k: jnp.asarray(v.numpy()) for k, v in self.variables.items()}
        return self.tree


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    data = np.load(DIGITS)
    x_train, y_train, x_test, y_test = (data[k] for k in ("x_train", "y_train", "x_test", "y_test"))
    strategy = make_strategy(args.strategy, args.replicas)
    ext = strategy.extended
    chief = ext.is_chief
    # Each worker its own draw: the chief's is the one every worker trains.
    params = initial_params(jax.random.PRNGKey(args.seed + ext.worker_index),
                            [x_train.shape[1], args.hidden, 10])
    trainer = Trainer(strategy, params, args)
    if chief:
        print(f"training on {len(x_train)} digits with {type(strategy).__name__} "
              f"(--update {args.update}), {strategy.num_replicas_in_sync} replica(s) in sync, "
              f"global batch {args.batch_size}", flush=True)

    started, steps = time.monotonic(), 0
    for epoch in range(1, args.epochs + 1):
        batches = global_batches(x_train, y_train, args.batch_size, args.seed, epoch)
        sizes = [float(len(b[1])) for b in batches]
        for step, (x, y) in enumerate(strategy.experimental_distribute_dataset(batches)):
            trainer.step(x, y, sizes[step])
            steps += 1
            if steps == args.steps:
                break
        loss, acc = evaluate(trainer.params(), x_train, y_train)
        if chief:
            print(f"epoch {epoch}/{args.epochs}  loss {loss:.4f}  accuracy {acc:.4f}", flush=True)
        if steps == args.steps:
            break

    params = trainer.params()
    _, test_accuracy = evaluate(params, x_test, y_test)
    if chief:
        print(f"test accuracy {test_accuracy:.4f} on {len(x_test)} held-out digits after "
              f"{steps} steps ({time.monotonic() - started:.1f} s)", flush=True)
    if args.save_dir:
        save(args.save_dir / f"rank{ext.worker_index}.npz", params, test_accuracy)
    return 0


def save(path: Path, params: dict[str, jax.Array], test_accuracy: float) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + f".tmp{os.getpid()}")
    with open(tmp, "wb") as f:
        np.savez(f, **{k: np.asarray(v) for k, v in params.items()},
                 test_accuracy=test_accuracy)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


if __name__ == "__main__":
    sys.exit(main())
