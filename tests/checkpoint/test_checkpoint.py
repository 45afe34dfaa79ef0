"""cluster.checkpoint in one process: round trips, bit-exact optimizer resume, distributed
variables, the on-disk format, corruption detection and fallback, atomicity under injected
failures, max_to_keep."""

from __future__ import annotations

import hashlib
import json
import os

import numpy as np
import pytest
import safetensors.numpy

import cluster
from cluster.checkpoint import (
    Checkpoint,
    CheckpointCorruptError,
    CheckpointManager,
    _format,
    latest_checkpoint,
)
from cluster.metrics import Mean, Sum
from cluster.optimizers import SGD, Adam

pytestmark = pytest.mark.timeout(60)


def _grads(step: int, shapes: list[tuple[int, ...]]) -> list[np.ndarray]:
    rng = np.random.default_rng(step)
    return [rng.standard_normal(s).astype(np.float32) for s in shapes]


def _model() -> list[cluster.Variable]:
    return [cluster.Variable(np.linspace(-1, 1, 12, dtype=np.float32).reshape(3, 4), name="w"),
            cluster.Variable(np.zeros(4, np.float32), name="b")]


@pytest.mark.parametrize("make_opt", [lambda: Adam(0.05), lambda: SGD(0.1, momentum=0.9),
                                      lambda: SGD(0.1, momentum=0.9, nesterov=True)],
                         ids=["adam", "sgd-momentum", "sgd-nesterov"])
def test_optimizer_resume_is_bit_exact(tmp_path, make_opt):
    # Reference: 10 uninterrupted steps.
    ref_model, ref_opt = _model(), make_opt()
    _train_default(ref_opt, ref_model, range(10))
    # Interrupted: 5 steps, save, then fresh objects restore and do the other 5.
    model, opt = _model(), make_opt()
    _train_default(opt, model, range(5))
    path = Checkpoint(model=model, optimizer=opt).save(tmp_path / "run")
    model2, opt2 = _model(), make_opt()
    Checkpoint(model=model2, optimizer=opt2).restore(path)
    assert opt2.iterations == 5
    _train_default(opt2, model2, range(5, 10))
    for got, want in zip(model2, ref_model, strict=True):
        np.testing.assert_array_equal(got.numpy(), want.numpy())
        assert got.numpy().tobytes() == want.numpy().tobytes()


def _train_default(opt, model, steps) -> None:
    strategy = cluster.get_strategy()  # the default strategy: apply_gradients inside run
    for step in steps:
        grads = _grads(step, [v.shape for v in model])
        strategy.run(lambda g=grads: opt.apply_gradients(zip(g, model, strict=True)))


def test_round_trip_of_nests_metrics_and_save_counter(tmp_path):
    step = cluster.Variable(np.int64(7), name="step")
    nest = {"a": [cluster.Variable(np.ones((2, 2), np.float64))],
            "b": (cluster.Variable(np.arange(3, dtype=np.int32)),)}
    metric = Mean()
    metric.update_state([1.0, 2.0, 6.0])
    ckpt = Checkpoint(step=step, nest=nest, metric=metric)
    first = ckpt.save(tmp_path / "c")
    second = ckpt.save(tmp_path / "c")
    assert (os.path.basename(first), os.path.basename(second)) == ("c-1", "c-2")
    assert latest_checkpoint(tmp_path) == second
    step.assign(0)
    nest["a"][0].assign(np.zeros((2, 2)))
    nest["b"][0].assign([9, 9, 9])
    metric.reset_state()
    fresh = Checkpoint(step=step, nest=nest, metric=metric)
    fresh.restore(first)
    assert int(step.numpy()) == 7 and fresh.save_counter == 1
    np.testing.assert_array_equal(nest["a"][0].numpy(), np.ones((2, 2)))
    np.testing.assert_array_equal(nest["b"][0].numpy(), [0, 1, 2])
    assert metric.result() == pytest.approx(3.0)
    # Names are the nest paths; the file is plain safetensors.
    tensors = safetensors.numpy.load_file(os.path.join(first, _format.TENSOR_FILE))
    assert set(tensors) == {"step", "nest/a/0", "nest/b/0", "metric/total", "metric/count",
                            "save_counter"}


def test_index_records_checksum_step_and_hyperparameters(tmp_path):
    model, opt = _model(), Adam(0.01, beta_1=0.8)
    _train_default(opt, model, range(2))
    manager = CheckpointManager(Checkpoint(model=model, optimizer=opt), tmp_path)
    path = manager.save(checkpoint_number=42)
    with open(os.path.join(path, _format.INDEX_FILE)) as f:
        index = json.load(f)
    assert index["format"] == "cluster-checkpoint" and index["version"] == 1
    assert index["step"] == 42
    assert index["objects"]["optimizer"]["hyperparameters"]["beta_1"] == 0.8
    assert index["tensors"]["optimizer/slots/model/0/m"] == {"dtype": "float32",
                                                             "shape": [3, 4]}
    with open(os.path.join(path, _format.TENSOR_FILE), "rb") as f:
        data = f.read()
    assert index["sha256"] == hashlib.sha256(data).hexdigest()
    assert b"pickle" not in data and not data.startswith(b"\x80")


def test_mirrored_variables_save_one_copy_and_restore_every_replica(tmp_path):
    strategy = cluster.MirroredStrategy(["/cpu:0", "/cpu:1"])
    with strategy.scope():
        w = cluster.Variable(np.arange(4, dtype=np.float32))
        total = Sum()
    strategy.run(lambda: total.update_state(1.0))  # 1 per replica: aggregate 2
    opt = Adam(0.1)
    strategy.run(lambda: opt.apply_gradients([(np.ones(4, np.float32), w)]))
    path = Checkpoint(w=w, opt=opt, total=total).write(tmp_path / "m")
    tensors = safetensors.numpy.load_file(os.path.join(path, _format.TENSOR_FILE))
    assert tensors["total/total"] == 2.0
    np.testing.assert_array_equal(tensors["w"], w.values[0].numpy())

    strategy2 = cluster.MirroredStrategy(["/cpu:0", "/cpu:1", "/cpu:2"])  # N -> M replicas
    with strategy2.scope():
        w2 = cluster.Variable(np.zeros(4, np.float32))
        total2 = Sum()
    opt2 = Adam(0.1)
    Checkpoint(w=w2, opt=opt2, total=total2).read(path)
    for component in w2.values:
        np.testing.assert_array_equal(component.numpy(), w.values[0].numpy())
    assert total2.result() == 2.0
    assert [c.numpy()[()] for c in total2.total.values] == [2.0, 0.0, 0.0]
    for component in opt2.get_slot(w2, "m").values:
        np.testing.assert_array_equal(component.numpy(), opt.get_slot(w, "m").values[0].numpy())


def _saved(tmp_path, n=3, keep=5):
    w = cluster.Variable(np.zeros(8, np.float32))
    manager = CheckpointManager(Checkpoint(w=w), tmp_path, max_to_keep=keep)
    for i in range(1, n + 1):
        w.assign(np.full(8, i, np.float32))
        manager.save(checkpoint_number=i)
    return w, manager


def _truncate(path):
    tensor_file = os.path.join(path, _format.TENSOR_FILE)
    os.truncate(tensor_file, os.path.getsize(tensor_file) - 5)
    return tensor_file


def _flip_byte(path):
    tensor_file = os.path.join(path, _format.TENSOR_FILE)
    with open(tensor_file, "r+b") as f:
        f.seek(-3, os.SEEK_END)
        byte = f.read(1)
        f.seek(-3, os.SEEK_END)
        f.write(bytes([byte[0] ^ 0x40]))
    return tensor_file


def _garble_index(path):
    index_file = os.path.join(path, _format.INDEX_FILE)
    with open(index_file, "w") as f:
        f.write('{"format": "cluster-che')
    return index_file


def _drop_index(path):
    index_file = os.path.join(path, _format.INDEX_FILE)
    os.unlink(index_file)
    return index_file


@pytest.mark.parametrize("damage", [_truncate, _flip_byte, _garble_index, _drop_index])
def test_corrupt_checkpoint_raises_naming_the_file_and_manager_falls_back(tmp_path, damage):
    w, manager = _saved(tmp_path)
    bad_file = damage(manager.latest_checkpoint)
    w.assign(np.full(8, -1, np.float32))
    with pytest.raises(CheckpointCorruptError) as info:
        Checkpoint(w=w).restore(manager.latest_checkpoint)
    assert info.value.path == bad_file and bad_file in str(info.value)
    np.testing.assert_array_equal(w.numpy(), np.full(8, -1))  # nothing changed
    reopened = CheckpointManager(Checkpoint(w=w), tmp_path)
    with pytest.warns(RuntimeWarning, match="falling back"):
        restored = reopened.restore_or_initialize()
    assert restored == os.path.join(str(tmp_path), "ckpt-2")
    np.testing.assert_array_equal(w.numpy(), np.full(8, 2))


def test_header_that_disagrees_with_the_index_is_refused_before_loading(tmp_path):
    w, manager = _saved(tmp_path, n=1)
    path = manager.latest_checkpoint
    # A well-formed safetensors file of another shape, with a matching checksum in the index:
    # only the header/index comparison can catch it.
    data = safetensors.numpy.save({"w": np.zeros(4, np.float64),
                                   "save_counter": np.array(1, np.int64)})
    with open(os.path.join(path, _format.TENSOR_FILE), "wb") as f:
        f.write(data)
    index_file = os.path.join(path, _format.INDEX_FILE)
    with open(index_file) as f:
        index = json.load(f)
    index.update(tensor_bytes=len(data), sha256=hashlib.sha256(data).hexdigest())
    with open(index_file, "w") as f:
        json.dump(index, f)
    with pytest.raises(CheckpointCorruptError, match="is F64 but the index says float32"):
        Checkpoint(w=w).read(path)


def test_every_checkpoint_corrupt_raises_rather_than_starting_over(tmp_path):
    w, manager = _saved(tmp_path, n=2)
    for path in manager.checkpoints:
        _truncate(path)
    with pytest.warns(RuntimeWarning), pytest.raises(CheckpointCorruptError):
        manager.restore_or_initialize()


def test_restore_or_initialize_with_nothing_keeps_initial_values(tmp_path):
    w = cluster.Variable(np.full(3, 5.0, np.float32))
    assert CheckpointManager(Checkpoint(w=w), tmp_path / "new").restore_or_initialize() is None
    np.testing.assert_array_equal(w.numpy(), np.full(3, 5.0))


def test_mismatch_raises_value_error_and_changes_nothing(tmp_path):
    w = cluster.Variable(np.ones(3, np.float32))
    b = cluster.Variable(np.ones(2, np.float32))
    path = Checkpoint(w=w, b=b).write(tmp_path / "x")
    w.assign(np.zeros(3))
    with pytest.raises(ValueError, match="float32"):
        Checkpoint(w=w, b=cluster.Variable(np.ones(5, np.float32))).read(path)
    np.testing.assert_array_equal(w.numpy(), np.zeros(3))
    with pytest.raises(ValueError, match="missing"):
        Checkpoint(w=w, b=b, c=cluster.Variable(1.0)).read(path)
    with pytest.raises(ValueError, match="not tracked"):
        Checkpoint(w=w).read(path)


def test_max_to_keep_deletes_old_ones_after_the_index(tmp_path):
    _, manager = _saved(tmp_path, n=5, keep=2)
    names = sorted(e for e in os.listdir(tmp_path))
    assert names == ["checkpoint", "ckpt-4", "ckpt-5"]
    assert [os.path.basename(p) for p in manager.checkpoints] == ["ckpt-4", "ckpt-5"]
    reopened = CheckpointManager(Checkpoint(w=cluster.Variable(np.zeros(8, np.float32))),
                                 tmp_path, max_to_keep=2)
    assert reopened.checkpoints == manager.checkpoints


def test_failure_between_write_and_rename_leaves_previous_checkpoint(tmp_path, monkeypatch):
    w, manager = _saved(tmp_path, n=2)
    real_rename = os.rename

    def failing_rename(src, dst):
        if os.path.basename(dst) == "ckpt-3":
            raise OSError("injected: crash between write and rename")
        return real_rename(src, dst)

    monkeypatch.setattr(_format.os, "rename", failing_rename)
    w.assign(np.full(8, 3, np.float32))
    with pytest.raises(OSError, match="injected"):
        manager.save(checkpoint_number=3)
    monkeypatch.undo()
    assert sorted(os.listdir(tmp_path)) == ["checkpoint", "ckpt-1", "ckpt-2"]
    assert latest_checkpoint(tmp_path) == os.path.join(str(tmp_path), "ckpt-2")
    w.assign(np.zeros(8, np.float32))
    assert CheckpointManager(Checkpoint(w=w), tmp_path).restore_or_initialize().endswith("ckpt-2")
    np.testing.assert_array_equal(w.numpy(), np.full(8, 2))


def test_leftover_temporaries_are_ignored_and_cleaned(tmp_path):
    w, manager = _saved(tmp_path, n=1)
    junk = tmp_path / ".ckpt-2.tmp-deadbeef0000"
    junk.mkdir()
    (junk / _format.TENSOR_FILE).write_bytes(b"half")
    CheckpointManager(Checkpoint(w=w), tmp_path)
    assert not junk.exists()


def test_untrackable_objects_are_refused():
    with pytest.raises(TypeError, match="trackables"):
        Checkpoint(x=3.0)
    with pytest.raises(ValueError, match="without '/'"):
        Checkpoint(x={"a/b": cluster.Variable(1.0)})
    v = cluster.Variable(1.0)
    with pytest.raises(ValueError, match="tracked twice"):
        Checkpoint(x=v, y=[v])


def test_checkpoints_dropped_from_the_index_but_not_deleted_are_removed_on_open(tmp_path):
    w, manager = _saved(tmp_path, n=3, keep=2)
    (tmp_path / "ckpt-1").mkdir()  # as if a kill hit between the index write and the delete
    (tmp_path / "other").mkdir()
    CheckpointManager(Checkpoint(w=w), tmp_path, max_to_keep=2)
    assert sorted(os.listdir(tmp_path)) == ["checkpoint", "ckpt-2", "ckpt-3", "other"]
