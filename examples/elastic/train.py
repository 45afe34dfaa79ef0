"""Elastic training: a worker can die, or be replaced, mid-run, and the result does not change.

Run it on a chief and three workers, any one of which may be lost (down to two), with
``uv run clusterctl launch examples/elastic/cluster.yaml``; kill a worker meanwhile
(``kill -9 PID``): the others train on without restarting, clusterctl restarts the dead one, and
it rejoins at the next commit with the state the others broadcast to it.

The model is linear regression in float64 with SGD and momentum. Every step trains on one fixed
global batch (``global_batch(step)``), split among the replicas there are now, with the loss
scaled by the global batch: so each step's update does not depend on how many replicas computed
it, and the run ends with the weights of the same training done in one process, which the
program checks at the end (``exact: ...``). Alone (``uv run python examples/elastic/train.py``,
no TF_CONFIG) it trains as one local replica.
"""

from __future__ import annotations

import argparse
import time

import numpy as np

import cluster

FEATURES, GLOBAL_BATCH = 16, 64


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=300)
    parser.add_argument("--learning-rate", type=float, default=0.02)
    parser.add_argument("--momentum", type=float, default=0.9)
    parser.add_argument("--step-time", type=float, default=0.02,
                        help="seconds of pretend compute per step (time to kill a worker)")
    parser.add_argument("--log-every", type=int, default=20)
    return parser.parse_args(argv)


def global_batch(step: int) -> tuple[np.ndarray, np.ndarray]:
    """The global batch of ``step``: the same on every task, whatever the membership."""
    rng = np.random.default_rng(step)
    x = rng.standard_normal((GLOBAL_BATCH, FEATURES))
    y = x @ np.linspace(-2.0, 2.0, FEATURES) + 0.1 * rng.standard_normal(GLOBAL_BATCH)
    return x, y


def gradient(w: np.ndarray, x: np.ndarray, y: np.ndarray) -> np.ndarray:
    """The gradient of the mean squared error over the *global* batch, from some of its rows."""
    return 2.0 * x.T @ (x @ w - y) / GLOBAL_BATCH


def one_process(args: argparse.Namespace) -> np.ndarray:
    """The same training in one process (Keras' SGD rule), to check the elastic run against."""
    w, velocity = np.zeros(FEATURES), np.zeros(FEATURES)
    for step in range(args.steps):
        velocity = args.momentum * velocity - args.learning_rate * gradient(w, *global_batch(step))
        w = w + velocity
    return w


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    strategy = cluster.MultiWorkerMirroredStrategy()
    with strategy.scope():
        w = cluster.Variable(np.zeros(FEATURES), name="w")
        optimizer = cluster.optimizers.SGD(args.learning_rate, momentum=args.momentum)
    state = cluster.elastic.State(w=w, optimizer=optimizer, step=0)

    def replica_step(x, y):
        ctx = cluster.get_replica_context()
        rows = np.array_split(np.arange(GLOBAL_BATCH), ctx.num_replicas_in_sync)
        mine = rows[ctx.replica_id_in_sync_group]
        optimizer.apply_gradients([(gradient(w.numpy(), x[mine], y[mine]), w)])

    @cluster.elastic.run(strategy, state)
    def train(state):
        while state.step < args.steps:
            x, y = global_batch(state.step)
            strategy.run(replica_step, args=(x, y))
            state.step += 1
            state.commit()
            time.sleep(args.step_time)
            # Chief duties go to the group's first rank: whoever it is now.
            if strategy.extended.should_save_summary and state.step % args.log_every == 0:
                loss = float(np.mean((x @ w.numpy() - y) ** 2))
                print(f"step {state.step}: loss {loss:.6f} on "
                      f"{strategy.num_replicas_in_sync} replica(s)", flush=True)

    train(state)
    if strategy.extended.should_save_summary:
        error = float(np.max(np.abs(w.numpy() - one_process(args))))
        print(f"done: {state.step} steps; exact: max |w - one process| = {error:.1e}", flush=True)


if __name__ == "__main__":
    main()
