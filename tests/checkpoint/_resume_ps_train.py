"""Chief script of test_resume's ParameterServerStrategy runs (``mode: coordinator``)::

    _resume_ps_train.py --dir CKPT_DIR --out OUT.npy --steps N --save-every S
                        --optimizer momentum|adam [--kill ps|worker --kill-at K --flag FILE]

``ParameterServerStrategy(synchronous=True)`` over every ps task (``w`` and ``b`` split over
them), a :class:`~cluster.coordinator.ClusterCoordinator`, one round (one function per worker)
per step, ``coordinator.join()`` after each; a step counter variable (on a ps task) counts the
steps. Every ``S`` steps, after the join, ``manager.save(checkpoint_number=step)``. On start
the chief restores the newest checkpoint and prints ``resumed at <step>``; it prints
``step <k>`` after each step and ``saved ckpt-<n>`` after each save, and writes the final
parameters to OUT (``w`` then ``b``, flattened).

The data of contributor ``j`` of step ``k`` depends on ``(k, j)`` only, never on the worker
that runs it, so a function re-run elsewhere contributes the same gradient.

Kills, at step ``K``, the first time only: ``--kill ps`` (first attempt, ``CLUSTER_RESTART_COUNT``
0): the chief SIGKILLs ps:0 before scheduling step ``K`` (found by its ``TF_CONFIG`` and this
run's token in its environment); the coordinator then fails and clusterctl restarts the whole
cluster. ``--kill worker``: the worker running contributor 1 of step ``K`` SIGKILLs itself
before pushing its gradient (``FILE``, created exclusively, makes it happen once); clusterctl
restarts that worker alone and the coordinator re-runs the function.
"""

from __future__ import annotations

import argparse
import os
import signal

import numpy as np

import cluster
from cluster.optimizers import SGD, Adam

__all__ = ["WORKERS", "contribution", "reference"]

WORKERS = 2
_SHAPE = (8, 4)


def _data(k: int, j: int) -> np.ndarray:
    return np.random.default_rng(1000 * k + j).standard_normal(_SHAPE).astype(np.float32)


def contribution(w: np.ndarray, b: np.ndarray, k: int, j: int) -> tuple[np.ndarray, np.ndarray]:
    """Contributor ``j``'s gradients of step ``k`` (elementwise math only: no BLAS, whose
    summation order may depend on the machine)."""
    x = _data(k, j)
    err = np.sin(w * np.float32(k % 5 + 1)) + x * b - np.float32(0.5) * x
    return err.astype(np.float32), (err * x).sum(axis=0, dtype=np.float32)


def _initial() -> tuple[np.ndarray, np.ndarray]:
    return (np.linspace(-1.0, 1.0, 32, dtype=np.float32).reshape(_SHAPE),
            np.full(_SHAPE[1], 0.25, np.float32))


def _optimizer(name: str):
    return SGD(0.05, momentum=0.9) if name == "momentum" else Adam(0.02)


def reference(steps: int, optimizer: str) -> np.ndarray:
    """The uninterrupted run in one process: each step applies the mean of the round's
    contributions, summed in contributor order and divided once (as the ps tasks do)."""
    w0, b0 = _initial()
    w, b = cluster.Variable(w0, name="w"), cluster.Variable(b0, name="b")
    opt = _optimizer(optimizer)
    for k in range(steps):
        grads = [contribution(w.numpy(), b.numpy(), k, j) for j in range(WORKERS)]
        gw, gb = grads[0][0].copy(), grads[0][1].copy()
        for extra_w, extra_b in grads[1:]:
            gw += extra_w
            gb += extra_b
        gw /= np.float32(WORKERS)
        gb /= np.float32(WORKERS)
        opt.apply_gradients([(gw, w), (gb, b)])
    return np.concatenate([w.numpy().ravel(), b.numpy().ravel()])


def _kill_ps0() -> None:
    from cluster.settings import ENV_TOKEN
    from cluster.testing import processes_with

    pids = processes_with(os.environ[ENV_TOKEN], '"task":{"type":"ps","index":0}')
    if not pids:
        raise RuntimeError("ps:0 not found")
    for pid in pids:
        os.kill(pid, signal.SIGKILL)
    print(f"killed ps:0 ({pids})", flush=True)


def main() -> None:
    import cluster.runtime
    from cluster.checkpoint import Checkpoint, CheckpointManager
    from cluster.coordinator import ClusterCoordinator
    from cluster.ps import FixedShardsPartitioner

    parser = argparse.ArgumentParser()
    parser.add_argument("--dir", required=True)
    parser.add_argument("--out", required=True)
    parser.add_argument("--steps", type=int, required=True)
    parser.add_argument("--save-every", type=int, required=True)
    parser.add_argument("--optimizer", choices=("momentum", "adam"), required=True)
    parser.add_argument("--kill", choices=("ps", "worker"))
    parser.add_argument("--kill-at", type=int)
    parser.add_argument("--flag")
    args = parser.parse_args()

    resolver = cluster.runtime.current().resolver
    jobs = resolver.cluster_spec().as_dict()
    assert len(jobs["worker"]) == WORKERS, jobs
    strategy = cluster.ParameterServerStrategy(
        resolver, variable_partitioner=FixedShardsPartitioner(len(jobs["ps"])),
        synchronous=True)
    coordinator = ClusterCoordinator(strategy)
    w0, b0 = _initial()
    with strategy.scope():
        w = cluster.Variable(w0, name="w")
        b = cluster.Variable(b0, name="b")
        step = cluster.Variable(np.int64(0), name="step", trainable=False)
    optimizer = _optimizer(args.optimizer)
    flag = args.flag if args.kill == "worker" else None
    kill_at = args.kill_at

    def train(k: int, j: int) -> None:
        def replica_fn() -> None:
            gw, gb = contribution(w.numpy(), b.numpy(), k, j)
            if flag is not None and k == kill_at and j == 1:
                try:
                    os.close(os.open(flag, os.O_CREAT | os.O_EXCL | os.O_WRONLY))
                except FileExistsError:
                    pass  # killed once already: this is the re-run
                else:
                    os.kill(os.getpid(), signal.SIGKILL)  # before pushing the gradient
            optimizer.apply_gradients([(gw, w), (gb, b)])

        strategy.run(replica_fn)

    manager = CheckpointManager(Checkpoint(model={"w": w, "b": b}, step=step,
                                           optimizer=optimizer), args.dir, max_to_keep=3)
    manager.restore_or_initialize()
    print(f"resumed at {int(step.numpy())}", flush=True)
    first_attempt = os.environ.get("CLUSTER_RESTART_COUNT", "0") == "0"
    while (k := int(step.numpy())) < args.steps:
        if args.kill == "ps" and first_attempt and k == kill_at:
            _kill_ps0()
        for j in range(WORKERS):
            coordinator.schedule(train, args=(k, j))
        coordinator.join()
        step.assign_add(1)
        print(f"step {k}", flush=True)
        if (k + 1) % args.save_every == 0:
            path = manager.save(checkpoint_number=k + 1)
            print(f"saved {os.path.basename(path)}", flush=True)
    np.save(args.out, np.concatenate([w.numpy().ravel(), b.numpy().ravel()]))
    print("done", flush=True)


if __name__ == "__main__":
    main()
