"""Training used by test_preemption: a small model with SGD + momentum, one step per ``run``.

As a script (run by ``clusterctl launch`` on every task, MultiWorkerMirroredStrategy):
``_preempt_train.py CKPT_DIR OUT STEPS SIGTERM_AT``. On the first attempt, worker 1 sends itself
SIGTERM during step ``SIGTERM_AT`` (a real signal, in the middle of a step); the handler saves at
the next ``run`` call on every task and they exit 204. The restarted cluster resumes there.
Worker 0 writes the final parameters to OUT (``.npy``). Every task prints ``run <k>`` for each
step it runs, so the test can count steps redone. The dataset iterator is in the checkpoint, so
the resumed epoch continues with the next batch.
"""

from __future__ import annotations

import json
import os
import signal
import sys

import numpy as np

import cluster
from cluster.optimizers import SGD


def build(strategy, steps: int):
    """The model, its optimizer and an iterator over one epoch of ``steps`` global batches."""
    with strategy.scope():
        w = cluster.Variable(np.linspace(-1.0, 1.0, 16, dtype=np.float32), name="w")
    rng = np.random.default_rng(7)  # the same batches on every task
    batches = [rng.standard_normal((2, 16)).astype(np.float32) for _ in range(steps)]
    iterator = iter(strategy.experimental_distribute_dataset(batches))
    return w, SGD(0.05, momentum=0.9), iterator


def make_step(w, opt, signal_at: int | None = None):
    """The step: a gradient that depends on the parameters, the step and the replica's batch."""

    def step(x, k: int) -> None:
        if signal_at is not None and k == signal_at:
            os.kill(os.getpid(), signal.SIGTERM)  # mid-step: the step must still complete
        value = np.asarray(w.value(), np.float32)
        grad = (np.sin(value * (k + 1)) + np.float32(0.1) * x[0]).astype(np.float32)
        opt.apply_gradients([(grad, w)])

    return step


def main(directory: str, out: str, steps: int, signal_at: int) -> None:
    from cluster.checkpoint import Checkpoint, CheckpointManager, PreemptionCheckpointHandler

    strategy = cluster.MultiWorkerMirroredStrategy()
    task = json.loads(os.environ["TF_CONFIG"])["task"]
    first_attempt = os.environ.get("CLUSTER_RESTART_COUNT", "0") == "0"
    victim = first_attempt and task["index"] == 1
    w, opt, iterator = build(strategy, steps)
    manager = CheckpointManager(Checkpoint(model=[w], optimizer=opt, data=iterator), directory,
                                max_to_keep=2)
    handler = PreemptionCheckpointHandler(strategy.cluster_resolver, manager)
    print(f"resumed at {handler.total_run_calls}", flush=True)
    step = make_step(w, opt, signal_at if victim else None)

    def train_step(k: int) -> None:
        # next() inside run: on the call that saves, no batch is taken (the position is exact).
        strategy.run(step, args=(next(iterator), k))

    while handler.total_run_calls < steps:
        k = handler.total_run_calls
        handler.run(train_step, k)
        print(f"run {k}", flush=True)
    if task["index"] == 0:
        np.save(out, w.values[0].numpy())
    print("done", flush=True)


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4]))
