"""Checkpoints under ParameterServerStrategy on real ps processes: the coordinator saves the
logical variables read from the ps tasks; a restore puts them back on the ps tasks, through the
partitioner of the restoring cluster (2 ps -> 3 ps and 3 ps -> 1 ps), bit for bit, with the
optimizer state the ps tasks keep (SGD momentum, Adam), so training resumes bit for bit."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from tests.coordinator.conftest import PsCluster

pytestmark = [pytest.mark.multiprocess, pytest.mark.timeout(240)]

SCRIPT = str(Path(__file__).resolve().parent / "scripts" / "ps_checkpoint.py")
F32 = np.float32


@pytest.fixture
def clusters(tmp_path: Path, marker: str):
    """``clusters(ps=N)`` -> a started PsCluster (1 worker); every one stopped afterwards."""
    started: list[PsCluster] = []

    def make(ps: int) -> PsCluster:
        cluster = PsCluster(tmp_path / f"c{len(started)}", marker, 1, ps)
        cluster.tmp.mkdir()
        started.append(cluster)
        cluster.start_all()
        return cluster

    yield make
    for cluster in started:
        cluster.stop()


def _run(cluster: PsCluster, directory: Path, action: str, optimizer: str) -> dict:
    code, output, result = cluster.run_chief(SCRIPT, "--dir", str(directory), "--action", action,
                                             "--optimizer", optimizer, timeout=120)
    assert code == 0, output
    return result


@pytest.mark.parametrize(("save_ps", "restore_ps", "optimizer"),
                         [(2, 3, "momentum"), (3, 1, "adam")])
def test_ps_checkpoint_restores_on_another_number_of_ps_tasks(clusters, tmp_path, save_ps,
                                                              restore_ps, optimizer):
    directory = tmp_path / "ckpts"
    saved = _run(clusters(ps=save_ps), directory, "save", optimizer)
    assert len(set(saved["w_shards"])) == save_ps
    assert saved["steps"] == 3
    assert saved["saved"] == str(directory / "ckpt-3")
    # Optimizer state on the ps tasks that the checkpoint does not track is refused, not dropped.
    assert "no tracked optimizer" in saved["untracked_refused"]

    restored = _run(clusters(ps=restore_ps), directory, "restore", optimizer)
    assert restored["restored"] == str(directory / "ckpt-3")
    assert len(set(restored["w_shards"])) == restore_ps
    w = np.array(saved["w"], F32)
    assert np.array_equal(np.array(restored["w"], F32), w)
    assert np.array_equal(np.array(restored["b"], F32), np.array(saved["b"], F32))
    assert restored["steps"] == 3
    # The values are on the ps tasks themselves, split by the new partitioner.
    parts = [np.array(p, F32).reshape(-1, 3) for p in restored["w_parts"]]
    assert len(parts) == restore_ps
    assert np.array_equal(np.concatenate(parts), w)
    # Training continues from them and from the optimizer state (momentum, or Adam's m, v and
    # step count) restored on the new ps tasks: the next step equals the uninterrupted run's.
    assert not np.array_equal(np.array(restored["w_after"], F32), w)
    assert np.array_equal(np.array(restored["w_after"], F32), np.array(saved["w_continued"], F32))


def test_store_slots_round_trip_adopt_and_refuse():
    from cluster.errors import VariableMismatchError
    from cluster.ps import OptimizerSpec, VariableStore

    store = VariableStore("ps:0")
    store.create("w", np.zeros((2, 2), F32))
    adam = OptimizerSpec.adam(0.1)
    m = np.arange(4, dtype=F32).reshape(2, 2)
    store.write_slots("w", adam, iterations=7, slots={"m": m})  # adopts Adam: zero v
    spec, iterations, slots = store.read_slots("w")
    assert spec == adam and iterations == 7
    assert np.array_equal(slots["m"], m) and np.array_equal(slots["v"], np.zeros((2, 2), F32))
    assert store.version("w") == 1  # the value is untouched
    with pytest.raises(VariableMismatchError, match="optimizer"):
        store.write_slots("w", OptimizerSpec.sgd(0.1, momentum=0.9), slots={"momentum": m})
    with pytest.raises(VariableMismatchError, match="no slot"):
        store.write_slots("w", adam, slots={"momentum": m})
    with pytest.raises(VariableMismatchError, match="shape"):
        store.write_slots("w", adam, slots={"m": np.zeros(3, F32)})
