"""A synchronous function re-run after its worker died mid-push, on two stores directly.

The race behind a flaky end-to-end test: worker:1 pushes its contribution to step ``s`` to ps:0
(where it completes the step) and is killed before its push reaches ps:1. The coordinator re-runs
the function; the re-run must read the values *as of step s* on every ps, or it computes a
different gradient for ps:1 from a mix of updated (ps:0) and old (ps:1) values, and training no
longer equals the run without the failure (it ended ~1e-3 off on every weight).
"""

from __future__ import annotations

import numpy as np
import pytest

from cluster.ps import OptimizerSpec, VariableStore

pytestmark = pytest.mark.timeout(60)

F32 = np.float32
SGD = OptimizerSpec.sgd(0.1, momentum=0.9)
ROWS = 6  # w (12 x 3) is split over the two stores: rows 0-5 on ps:0, 6-11 on ps:1
STEPS, WORKERS = 4, 2

rng = np.random.default_rng(7)
X = rng.normal(size=(256, 12)).astype(F32)
Y = (X @ rng.normal(size=(12, 3)).astype(F32) + 0.5).astype(F32)
W0 = (0.1 * rng.normal(size=(12, 3))).astype(F32)


def _stores() -> list[VariableStore]:
    stores = [VariableStore(f"ps:{i}") for i in range(2)]
    for i, store in enumerate(stores):
        store.create("w", W0[i * ROWS:(i + 1) * ROWS], optimizer=SGD)
    return stores


def _read(stores: list[VariableStore], step: int | None) -> np.ndarray:
    return np.concatenate([s.pull(["w"], step=step)[0].value for s in stores])


def _gradient(w: np.ndarray, i: int) -> np.ndarray:
    x, y = X[i * 16:(i + 1) * 16], Y[i * 16:(i + 1) * 16]
    return (x.T @ (x @ w - y) / F32(16)).astype(F32)


def _push(store: VariableStore, part: int, grad: np.ndarray, step: int, contributor: int) -> None:
    store.push({"w": grad[part * ROWS:(part + 1) * ROWS]}, step=step,
               num_contributors=WORKERS, contributor=contributor, wait=False)


def _run(stores, step: int, contributor: int, *, reach: tuple[int, ...] = (0, 1)) -> None:
    """One scheduled function: read w as of its step, push its gradient to the ps in ``reach``."""
    grad = _gradient(_read(stores, step), step * WORKERS + contributor)
    for part in reach:
        _push(stores[part], part, grad, step, contributor)


def _train(killed_at: int | None = None, chief_reads: bool = False) -> np.ndarray:
    stores = _stores()
    for step in range(STEPS):
        _run(stores, step, 0)
        if step == killed_at:
            _run(stores, step, 1, reach=(0,))  # completes the step on ps:0, then dies
            if chief_reads:
                _read(stores, None)  # the chief reads w meanwhile (applies ps:0's step)
        _run(stores, step, 1)  # the (re-)run
    return _read(stores, None)


def test_a_rerun_after_a_partial_push_gives_the_same_result_bitwise() -> None:
    reference = _train()
    assert not np.array_equal(reference, W0), "training must change w"
    for step in range(STEPS):
        assert _train(killed_at=step).tobytes() == reference.tobytes(), f"killed at step {step}"


def test_a_chief_read_between_the_push_and_the_rerun_changes_nothing() -> None:
    reference = _train()
    assert _train(killed_at=1, chief_reads=True).tobytes() == reference.tobytes()


def test_a_complete_step_is_applied_on_next_use_and_reads_as_of_it_see_the_old_value() -> None:
    store = VariableStore("ps:0")
    store.create("w", np.array([1.0, 2.0], F32), optimizer=OptimizerSpec.sgd(1.0))
    for k in range(2):
        store.push({"w": np.ones(2, F32)}, step=0, num_contributors=2, contributor=k,
                   wait=False)
    (as_of_0,) = store.pull(["w"], step=0)
    assert as_of_0.version == 1 and as_of_0.value.tolist() == [1.0, 2.0]
    (latest,) = store.pull(["w"])  # a read not tagged with the step applies it
    assert latest.version == 2 and latest.value.tolist() == [0.0, 1.0]
    (again,) = store.pull(["w"], step=0)  # a late re-run still reads as of its step
    assert again.version == 1 and again.value.tolist() == [1.0, 2.0]
    assert store.pull(["w"], step=1)[0].version == 2
    # The next step applies and forgets the value kept for step 0.
    for k in range(2):
        store.push({"w": np.ones(2, F32)}, step=1, num_contributors=2, contributor=k,
                   wait=False)
    assert store.pull(["w"], step=2)[0].value.tolist() == [-1.0, 0.0]
    assert store._vars["w"].before is None and store._vars["w"].due is None


def test_every_other_use_applies_a_complete_step_first() -> None:
    uses = {
        "version": lambda s: s.version("w"),
        "slot": lambda s: s.slot("w", "momentum"),
        "read_slots": lambda s: s.read_slots("w"),
        "assign_add": lambda s: s.assign("w", np.zeros(2, F32), mode=1),
        "async push": lambda s: s.push({"w": np.zeros(2, F32)}),
        "next step": lambda s: s.push({"w": np.zeros(2, F32)}, step=1, num_contributors=2,
                                      contributor=0, wait=False),
    }
    for what, use in uses.items():
        store = VariableStore("ps:0")
        store.create("w", np.array([1.0, 2.0], F32),
                     optimizer=OptimizerSpec.sgd(1.0, momentum=0.5))
        for k in range(2):
            store.push({"w": np.ones(2, F32)}, step=0, num_contributors=2, contributor=k,
                       wait=False)
        use(store)
        var = store._vars["w"]
        assert var.sync_step == 1 and var.due is None and var.iterations >= 1, what


def test_a_waiting_pusher_gets_its_step_applied_at_once() -> None:
    store = VariableStore("ps:0")
    store.create("w", np.array([1.0, 2.0], F32), optimizer=OptimizerSpec.sgd(1.0))
    store.push({"w": np.ones(2, F32)}, step=0, num_contributors=2, contributor=0, wait=False)
    assert store.push({"w": np.ones(2, F32)}, step=0, num_contributors=2, contributor=1) == [2]
    assert store._vars["w"].due is None


def test_a_push_that_fails_midway_is_withdrawn_and_uncompletes_its_step(monkeypatch) -> None:
    store = VariableStore("ps:0")
    for name in ("a", "b"):
        store.create(name, np.zeros(2, F32), optimizer=OptimizerSpec.sgd(1.0))
    store.push({"a": np.ones(2, F32), "b": np.ones(2, F32)}, step=0, num_contributors=2,
               contributor=0, wait=False)
    real_array = np.array
    copies = []

    def failing_copy(*args, **kwargs):
        copies.append(1)
        if len(copies) == 2:  # the second gradient's private copy: after "a" completed
            raise MemoryError("no memory for the copy")
        return real_array(*args, **kwargs)

    import cluster.ps._sync_accumulator as accumulator
    monkeypatch.setattr(accumulator.np, "array", failing_copy)
    with pytest.raises(MemoryError):
        store.push({"a": np.ones(2, F32), "b": np.ones(2, F32)}, step=0, num_contributors=2,
                   contributor=1, wait=False)
    monkeypatch.undo()
    var = store._vars["a"]
    assert var.due is None and sorted(var.pending[0].grads) == [0]
    assert store.version("a") == 1 and store.version("b") == 1  # nothing applied
