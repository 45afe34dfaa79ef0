"""One task of ``bench/elastic.py``, run as ``python -m worker bench/_elastic_task.py ARGS``.

A small model trained through the public API: linear regression on ``--features`` float64
weights, SGD with momentum, a fixed global batch of ``--batch`` rows per step split among the
current replicas (loss scaled by the global batch), then ``--step-time`` s of pretend compute
(an accelerator's, which leaves the CPU free), under ``cluster.elastic.run`` with a commit per
step. It trains until it is stopped (SIGTERM).

Two modes:

- ``elastic`` (the job has ``CLUSTER_ELASTIC``): a lost peer or a joiner regroups the job;
- ``restart`` (a job without it, as today): the state is also saved every ``--checkpoint-every``
  steps with ``cluster.checkpoint.CheckpointManager`` in ``--checkpoint-dir``, and restored
  from there when the task starts, so the launcher can restart the whole job from it.

What the bench reads, on stdout: ``IMPORTED <time>`` (``time.time()`` right after ``import
cluster``: under ``python -m worker`` the task's server is up and its peers answered by then)
and, per completed step, ``STEP <step> <time> n=<replicas>`` (after the step's commit).
"""

from __future__ import annotations

import argparse
import os
import time

import numpy as np

import cluster

IMPORTED = time.time()
FOREVER = 1 << 62
LEARNING_RATE, MOMENTUM = 0.01, 0.9


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--mode", choices=("elastic", "restart"), required=True)
    parser.add_argument("--features", type=int, default=4096)
    parser.add_argument("--batch", type=int, default=64)
    parser.add_argument("--step-time", type=float, default=0.05)
    parser.add_argument("--checkpoint-dir", default="")
    parser.add_argument("--checkpoint-every", type=int, default=10)
    args = parser.parse_args(argv)
    if args.mode == "restart" and not args.checkpoint_dir:
        parser.error("--mode restart needs --checkpoint-dir")
    return args


def global_batch(step: int, features: int, batch: int) -> tuple[np.ndarray, np.ndarray]:
    """The global batch of ``step``: the same on every task whatever the membership."""
    rng = np.random.default_rng(step)
    x = rng.standard_normal((batch, features))
    return x, x @ np.linspace(-1.0, 1.0, features) + 0.1 * rng.standard_normal(batch)


def main(args: argparse.Namespace) -> None:
    print(f"IMPORTED {IMPORTED:.6f}", flush=True)
    strategy = cluster.MultiWorkerMirroredStrategy()
    with strategy.scope():
        w = cluster.Variable(np.zeros(args.features))
        optimizer = cluster.optimizers.SGD(LEARNING_RATE, momentum=MOMENTUM)
    manager = None
    step = 0
    if args.mode == "restart":
        manager = cluster.checkpoint.CheckpointManager(
            cluster.checkpoint.Checkpoint(w=w, optimizer=optimizer), args.checkpoint_dir,
            max_to_keep=2)
        restored = manager.restore_or_initialize()
        if restored is not None:  # saved as ckpt-<step>
            step = int(os.path.basename(restored).rpartition("-")[2])
    state = cluster.elastic.State(w=w, optimizer=optimizer, step=step)

    def replica_step(x: np.ndarray, y: np.ndarray) -> None:
        ctx = cluster.get_replica_context()
        rows = np.array_split(np.arange(args.batch),
                              ctx.num_replicas_in_sync)[ctx.replica_id_in_sync_group]
        xs, ys = x[rows], y[rows]
        grad = 2.0 * xs.T @ (xs @ w.numpy() - ys) / args.batch  # a share of the global gradient
        optimizer.apply_gradients([(grad, w)])

    @cluster.elastic.run(strategy, state)
    def train(state: cluster.elastic.State) -> None:
        while state.step < FOREVER:
            strategy.run(replica_step, args=global_batch(state.step, args.features, args.batch))
            time.sleep(args.step_time)
            state.step += 1
            state.commit()
            if manager is not None and state.step % args.checkpoint_every == 0:
                manager.save(checkpoint_number=state.step)
            print(f"STEP {state.step} {time.time():.6f} n={strategy.num_replicas_in_sync}",
                  flush=True)

    train(state)


if __name__ == "__main__":
    main(parse_args())
