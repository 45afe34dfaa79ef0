"""A ``kill -9`` injected between a checkpoint's write and its rename (the one moment a save
changes what is on disk): the previous checkpoint still restores, whether the save was a new
number or replaced the newest one (a preemption save at the step just saved)."""

from __future__ import annotations

import signal
import subprocess
import sys
import textwrap

import numpy as np
import pytest

import cluster
from cluster.checkpoint import Checkpoint, CheckpointManager, latest_checkpoint
from cluster.optimizers import Adam
from tests.conftest import REPO

pytestmark = [pytest.mark.multiprocess, pytest.mark.timeout(120)]

# Saves ckpt-1 (every value 1), then a second checkpoint (every value 2) whose rename, or
# directory exchange, SIGKILLs the process instead: the files are written and fsynced, the name
# not yet changed.
_CHILD = textwrap.dedent("""
    import os, signal, sys
    import numpy as np
    import cluster
    from cluster.checkpoint import Checkpoint, CheckpointManager, _format
    from cluster.optimizers import Adam

    directory, second = sys.argv[1], int(sys.argv[2])
    w = cluster.Variable(np.zeros(1024, np.float32), name="w")
    opt = Adam(0.1)
    manager = CheckpointManager(Checkpoint(w=w, optimizer=opt), directory, max_to_keep=2)
    opt.apply_gradients([(np.ones(1024, np.float32), w)])
    w.assign(np.full(1024, 1.0, np.float32))
    manager.save(checkpoint_number=1)

    def die(*args, **kwargs):
        print("killing myself at the rename", flush=True)
        os.kill(os.getpid(), signal.SIGKILL)

    os.rename = die
    _format._exchange = die
    w.assign(np.full(1024, 2.0, np.float32))
    manager.save(checkpoint_number=second)
    print("not reached", flush=True)
""")


@pytest.mark.parametrize("second", [2, 1], ids=["new-number", "same-number"])
def test_a_kill_between_write_and_rename_leaves_the_previous_checkpoint(tmp_path, second):
    proc = subprocess.run([sys.executable, "-c", _CHILD, str(tmp_path), str(second)],
                          cwd=REPO, capture_output=True, text=True, timeout=90)
    assert proc.returncode == -signal.SIGKILL, proc.stdout + proc.stderr
    assert "killing myself at the rename" in proc.stdout and "not reached" not in proc.stdout
    assert latest_checkpoint(tmp_path) == str(tmp_path / "ckpt-1")

    w = cluster.Variable(np.zeros(1024, np.float32))
    opt = Adam(0.1)
    manager = CheckpointManager(Checkpoint(w=w, optimizer=opt), tmp_path)
    assert manager.restore_or_initialize() == str(tmp_path / "ckpt-1")
    np.testing.assert_array_equal(w.numpy(), np.full(1024, 1.0, np.float32))
    assert opt.iterations == 1
    # Opening the manager removed the interrupted save's temporary directory.
    assert sorted(p.name for p in tmp_path.iterdir()) == ["checkpoint", "ckpt-1"]


def test_replacing_a_checkpoint_swaps_it_in_one_step(tmp_path, monkeypatch):
    from cluster.checkpoint import _format

    w = cluster.Variable(np.zeros(4, np.float32))
    manager = CheckpointManager(Checkpoint(w=w), tmp_path)
    manager.save(checkpoint_number=3)
    renames = []
    real_rename = _format.os.rename
    monkeypatch.setattr(_format.os, "rename", lambda *a: (renames.append(a), real_rename(*a)))
    w.assign(np.full(4, 5.0, np.float32))
    manager.save(checkpoint_number=3)  # replaces ckpt-3
    (tmp_path / "probe-a").mkdir()
    (tmp_path / "probe-b").mkdir()
    if not _format._exchange(str(tmp_path / "probe-a"), str(tmp_path / "probe-b")):
        pytest.skip("this file system cannot exchange paths (renameat2): the fallback renames")
    assert renames == []  # no moment without a ckpt-3
    fresh = cluster.Variable(np.zeros(4, np.float32))
    Checkpoint(w=fresh).read(tmp_path / "ckpt-3")
    np.testing.assert_array_equal(fresh.numpy(), np.full(4, 5.0, np.float32))
