"""Checkpoints under MultiWorkerMirroredStrategy (2 processes x 2 CPU replicas): every task
calls save, the chief writes, save returns everywhere only once the checkpoint is complete; every
task restores; the chief's failure is raised on every task."""

from __future__ import annotations

import os

import numpy as np
import pytest

from cluster.testing import run_group

pytestmark = [pytest.mark.multiprocess, pytest.mark.timeout(120)]


def _save_and_restore(transport, directory: str):
    import cluster
    from cluster.checkpoint import Checkpoint, CheckpointManager, _format, latest_checkpoint
    from cluster.metrics import Sum
    from cluster.optimizers import Adam
    from cluster.strategies.multi_worker import MultiWorkerMirroredStrategy

    strategy = MultiWorkerMirroredStrategy._from_transport(
        transport, devices=["/cpu:0", "/cpu:1"],
        communication_options=cluster.CommunicationOptions(timeout_seconds=30))
    with strategy.scope():
        w = cluster.Variable(np.arange(4, dtype=np.float32), name="w")
        total = Sum()
    opt = Adam(0.1)

    def step():
        rid = cluster.get_replica_context().replica_id_in_sync_group
        opt.apply_gradients([(np.full(4, rid + 1.0, np.float32), w)])
        total.update_state(1.0)

    out = {"rank": transport.rank, "saves": []}
    manager = CheckpointManager(Checkpoint(model=[w], optimizer=opt, metric=total), directory,
                                max_to_keep=2)
    for k in range(1, 4):
        strategy.run(step)
        path = manager.save(checkpoint_number=k)
        # Complete on return, on every task: the index names it and it reads back.
        _format.read_checkpoint(path)
        out["saves"].append((os.path.basename(path), latest_checkpoint(directory) == path,
                             sorted(e for e in os.listdir(directory))))
    saved = {"w": w.values[0].numpy(), "m": opt.get_slot(w, "m").values[0].numpy(),
             "total": float(total.result()), "iterations": opt.iterations}

    with strategy.scope():
        w2 = cluster.Variable(np.zeros(4, np.float32), name="w")
        total2 = Sum()
    opt2 = Adam(0.1)
    restored = CheckpointManager(Checkpoint(model=[w2], optimizer=opt2, metric=total2),
                                 directory).restore_or_initialize()
    out["restored"] = os.path.basename(restored)
    out["equal"] = (all(np.array_equal(c.numpy(), saved["w"]) for c in w2.values)
                    and all(np.array_equal(c.numpy(), saved["m"])
                            for c in opt2.get_slot(w2, "m").values)
                    and float(total2.result()) == saved["total"]
                    and opt2.iterations == saved["iterations"])
    out["total"] = saved["total"]
    out["w"], out["m"] = saved["w"].tolist(), saved["m"].tolist()

    if transport.rank == 0:  # the chief's write fails: every task must raise, none hang
        def broken(*args, **kwargs):
            raise OSError("injected: disk full")
        _format.write_checkpoint = broken
    try:
        manager.save(checkpoint_number=99)
        out["failure"] = None
    except Exception as e:  # noqa: BLE001 - the type is what is checked
        out["failure"] = type(e).__name__
    return out


def test_every_task_saves_the_chief_writes_every_task_restores(tmp_path):
    outcomes = run_group(_save_and_restore, 2, args=(os.fspath(tmp_path),), timeout=100)
    assert all(o.ok for o in outcomes), [(o.error_type, o.error, o.traceback) for o in outcomes]
    for o in outcomes:
        r = o.result
        assert r["saves"] == [
            ("ckpt-1", True, ["checkpoint", "ckpt-1"]),
            ("ckpt-2", True, ["checkpoint", "ckpt-1", "ckpt-2"]),
            ("ckpt-3", True, ["checkpoint", "ckpt-2", "ckpt-3"]),
        ], r["saves"]
        assert r["restored"] == "ckpt-3" and r["equal"]
        assert r["total"] == 3 * 4  # 3 steps x 4 replicas, restored exactly on every task
    assert [o.result["failure"] for o in outcomes] == ["OSError", "PeerFailedError"]
    assert not [e for e in os.listdir(tmp_path) if e.startswith(".")]


def _restore_on(transport, directory: str, replicas: int):
    import cluster
    from cluster.checkpoint import Checkpoint, CheckpointManager
    from cluster.metrics import Sum
    from cluster.optimizers import Adam
    from cluster.strategies.multi_worker import MultiWorkerMirroredStrategy

    strategy = MultiWorkerMirroredStrategy._from_transport(
        transport, devices=[f"/cpu:{i}" for i in range(replicas)],
        communication_options=cluster.CommunicationOptions(timeout_seconds=30))
    with strategy.scope():
        w = cluster.Variable(np.zeros(4, np.float32), name="w")
        total = Sum()
    opt = Adam(0.1)
    path = CheckpointManager(Checkpoint(model=[w], optimizer=opt, metric=total),
                             directory).restore_or_initialize()
    return {"restored": os.path.basename(path),
            "w": [c.numpy().tolist() for c in w.values],
            "m": [c.numpy().tolist() for c in opt.get_slot(w, "m").values],
            "total": float(total.result()), "iterations": int(opt.iterations)}


@pytest.mark.parametrize(("workers", "replicas"), [(3, 1), (1, 3)])
def test_a_checkpoint_of_2_workers_restores_on_another_number_of_workers(tmp_path, workers,
                                                                         replicas):
    saved = run_group(_save_and_restore, 2, args=(os.fspath(tmp_path),), timeout=100)
    assert all(o.ok for o in saved), [(o.error_type, o.error) for o in saved]
    outcomes = run_group(_restore_on, workers, args=(os.fspath(tmp_path), replicas),
                         timeout=100)
    assert all(o.ok for o in outcomes), [(o.error_type, o.error, o.traceback) for o in outcomes]
    chief = saved[0].result
    for o in outcomes:
        r = o.result
        assert r["restored"] == "ckpt-3"
        assert r["iterations"] == 3
        # Every replica of every worker holds the saved values (2 workers x 2 replicas -> M).
        assert len(r["w"]) == replicas and len({tuple(c) for c in r["w"]}) == 1
        assert len(r["m"]) == replicas and len({tuple(c) for c in r["m"]}) == 1
        # The SUM metric's aggregate over every replica of every worker is the saved one.
        assert r["total"] == chief["total"] == 12.0
        assert r["w"][0] == chief["w"] and r["m"][0] == chief["m"]
