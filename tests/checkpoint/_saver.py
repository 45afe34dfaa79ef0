"""A child for test_kill: resumes from DIRECTORY, then saves forever, one step per save.

Every tensor of step ``k`` holds ``k`` (the step variable, a 1 MiB array, an Adam optimizer's
slots and iteration count), so a reader can tell a torn checkpoint from a whole one. Prints
``saved <k>`` after each save.
"""

from __future__ import annotations

import sys

import numpy as np

import cluster
from cluster.checkpoint import Checkpoint, CheckpointManager
from cluster.optimizers import Adam


def main(directory: str) -> None:
    step = cluster.Variable(np.int64(0), name="step")
    big = cluster.Variable(np.zeros(1 << 18, np.float32), name="big")
    opt = Adam(0.1)
    strategy = cluster.get_strategy()
    manager = CheckpointManager(Checkpoint(step=step, big=big, optimizer=opt), directory,
                                max_to_keep=2)
    restored = manager.restore_or_initialize()
    print(f"resumed {int(step.numpy()) if restored else 'none'}", flush=True)
    while True:
        k = int(step.numpy()) + 1
        strategy.run(lambda: opt.apply_gradients([(np.zeros_like(big.numpy()), big)]))
        step.assign(k)
        big.assign(np.full(big.shape, k, np.float32))
        opt.get_slot(big, "m").assign(np.full(big.shape, k, np.float32))
        opt.get_slot(big, "v").assign(np.full(big.shape, k, np.float32))
        manager.save(checkpoint_number=k)
        print(f"saved {k}", flush=True)


if __name__ == "__main__":
    main(sys.argv[1])
