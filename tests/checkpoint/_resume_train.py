"""Training used by test_resume (MWMS) and test_chaos: checkpoints every few steps, resumes.

As a script (run by ``clusterctl launch`` on every task, MultiWorkerMirroredStrategy)::

    _resume_train.py --dir CKPT_DIR --out OUT_DIR --steps N --save-every S
                     --optimizer momentum|adam [--kill-at K] [--keep M] [--pace SECONDS]

Tracked: the model, the optimizer (slots and iteration count), the dataset iterator's position
and a step counter variable. On start every task restores the newest checkpoint
(``restore_or_initialize``) and prints ``resumed at <step>``; it prints ``step <k>`` after each
step it completes and ``saved ckpt-<n>`` after each save (``manager.save(checkpoint_number=n)``
every ``S`` steps), then writes its final parameters to ``OUT_DIR/<type>-<index>.npy``.
With ``--kill-at K``, worker 1 SIGKILLs itself at the start of step ``K`` on the first attempt
only (``CLUSTER_RESTART_COUNT`` is 0): its peers cannot complete that step either.

The gradient is quantised to multiples of 2**-10 (values of a few units), so the all-reduce
sum is exact in float32 whatever order any reduction adds the replicas' contributions in: the
uninterrupted reference (:func:`reference`, in one process) is bitwise the multi-process run
for any number of replicas. The update itself (momentum, Adam) is not quantised.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import time

import numpy as np

import cluster
from cluster.optimizers import SGD, Adam

__all__ = ["build", "make_step", "reference"]

_QUANTUM = np.float32(2.0 ** -10)
_WIDTH = 16


def _optimizer(name: str):
    if name == "momentum":
        return SGD(0.05, momentum=0.9)
    if name == "adam":
        return Adam(0.02)
    raise ValueError(f"unknown optimizer {name!r} (momentum or adam)")


def build(strategy, steps: int, replicas: int, optimizer: str):
    """The model ``w``, a step counter, the optimizer and an iterator over one epoch of
    ``steps`` global batches (``replicas`` rows each, the same batches on every task)."""
    with strategy.scope():
        w = cluster.Variable(np.linspace(-1.0, 1.0, _WIDTH, dtype=np.float32), name="w")
        step = cluster.Variable(np.int64(0), name="step", trainable=False)
    rng = np.random.default_rng(11)
    batches = [(np.round(rng.standard_normal((replicas, _WIDTH)) * 64) * _QUANTUM)
               .astype(np.float32) for _ in range(steps)]
    iterator = iter(strategy.experimental_distribute_dataset(batches))
    return w, step, _optimizer(optimizer), iterator


def make_step(w, opt):
    """The replica step: a quantised gradient depending on the parameters, the step index and
    the replica's batch row."""

    def replica_step(x, k: int) -> None:
        value = np.asarray(w.value(), np.float32)
        grad = np.round(np.sin(value * np.float32(k % 7 + 1)) * 256) * _QUANTUM + x[0]
        opt.apply_gradients([(grad.astype(np.float32), w)])

    return replica_step


def reference(steps: int, replicas: int, optimizer: str) -> np.ndarray:
    """The uninterrupted run's final parameters: the same replicas in one process."""
    strategy = cluster.MirroredStrategy([f"/cpu:{i}" for i in range(replicas)])
    w, _, opt, iterator = build(strategy, steps, replicas, optimizer)
    replica_step = make_step(w, opt)
    for k in range(steps):
        strategy.run(replica_step, args=(next(iterator), k))
    return w.values[0].numpy()


def main() -> None:
    from cluster.checkpoint import Checkpoint, CheckpointManager

    parser = argparse.ArgumentParser()
    parser.add_argument("--dir", required=True)
    parser.add_argument("--out", required=True)
    parser.add_argument("--steps", type=int, required=True)
    parser.add_argument("--save-every", type=int, required=True)
    parser.add_argument("--optimizer", choices=("momentum", "adam"), required=True)
    parser.add_argument("--kill-at", type=int)
    parser.add_argument("--keep", type=int, default=3)
    parser.add_argument("--pace", type=float, default=0.0)
    args = parser.parse_args()

    strategy = cluster.MultiWorkerMirroredStrategy()
    config = json.loads(os.environ["TF_CONFIG"])
    task = config["task"]
    first_attempt = os.environ.get("CLUSTER_RESTART_COUNT", "0") == "0"
    victim = (args.kill_at is not None and first_attempt
              and (task["type"], task["index"]) == ("worker", 1))
    w, step, opt, iterator = build(strategy, args.steps, strategy.num_replicas_in_sync,
                                   args.optimizer)
    manager = CheckpointManager(Checkpoint(model=[w], optimizer=opt, data=iterator, step=step),
                                args.dir, max_to_keep=args.keep)
    manager.restore_or_initialize()
    print(f"resumed at {int(step.values[0].numpy())}", flush=True)
    replica_step = make_step(w, opt)
    while (k := int(step.values[0].numpy())) < args.steps:
        if victim and k == args.kill_at:
            os.kill(os.getpid(), signal.SIGKILL)
        if args.pace:
            time.sleep(args.pace)  # simulated compute, so a chaos run lasts long enough
        strategy.run(replica_step, args=(next(iterator), k))
        step.assign_add(1)
        print(f"step {k}", flush=True)
        if (k + 1) % args.save_every == 0:
            path = manager.save(checkpoint_number=k + 1)
            print(f"saved {os.path.basename(path)}", flush=True)
    os.makedirs(args.out, exist_ok=True)
    np.save(os.path.join(args.out, f"{task['type']}-{task['index']}.npy"), w.values[0].numpy())
    print("done", flush=True)


if __name__ == "__main__":
    main()
