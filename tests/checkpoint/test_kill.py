"""kill -9 during saves: the checkpoint the index names is always whole and readable."""

from __future__ import annotations

import os
import random
import time
from pathlib import Path

import numpy as np
import pytest

import cluster
from cluster.checkpoint import Checkpoint, latest_checkpoint
from cluster.optimizers import Adam

pytestmark = [pytest.mark.multiprocess, pytest.mark.timeout(240)]

SAVER = Path(__file__).with_name("_saver.py")
KILLS = 12


def _check_latest(directory: Path) -> int:
    """Restore the latest checkpoint into fresh objects; every tensor must hold its step."""
    path = latest_checkpoint(directory)
    assert path is not None
    step = cluster.Variable(np.int64(-1))
    big = cluster.Variable(np.zeros(1 << 18, np.float32))
    opt = Adam(0.1)
    recorded = Checkpoint(step=step, big=big, optimizer=opt).read(path)
    k = int(step.numpy())
    assert recorded == k == opt.iterations
    for array in (big.numpy(), opt.get_slot(big, "m").numpy(), opt.get_slot(big, "v").numpy()):
        np.testing.assert_array_equal(array, np.full(1 << 18, k, np.float32))
    return k


def test_sigkill_during_saves_never_breaks_the_latest_checkpoint(tmp_path, task_processes,
                                                                 marker):
    rng = random.Random(1234)
    env = {**os.environ, "CLUSTER_TEST_MARKER": marker}
    last = 0
    for i in range(KILLS):
        child = task_processes.python(os.fspath(SAVER), os.fspath(tmp_path), env=env,
                                      name=f"saver-{i}")
        out = child.read_until("saved", timeout=60)
        resumed = out.splitlines()[0]
        assert resumed == (f"resumed {last}" if i else "resumed none"), out
        # A random moment during the following saves (each takes a few milliseconds).
        time.sleep(rng.uniform(0.0, 0.25))
        child.kill()
        child.wait(timeout=30)
        now = _check_latest(tmp_path)
        assert now > last  # progress: each run resumed and saved at least once more
        last = now
    leftovers = [e for e in os.listdir(tmp_path) if e.startswith(".")]
    names = sorted(e for e in os.listdir(tmp_path) if not e.startswith("."))
    # At most max_to_keep (2) checkpoints, plus one whose deletion a kill may have cut short.
    assert "checkpoint" in names and len(names) <= 4, names
    assert len(leftovers) <= 2, leftovers  # a kill mid-save leaves one temporary at most
