"""The store driven by a coordinator: optimizer adoption, contributor indices, mean, re-runs."""

from __future__ import annotations

import itertools
import logging
import threading

import numpy as np
import pytest

from cluster.deadline import Deadline
from cluster.errors import (
    StaleStepError,
    VariableExistsError,
    VariableMismatchError,
    VariableNotFoundError,
)
from cluster.ps import OptimizerSpec, VariableStore

pytestmark = pytest.mark.timeout(60)

F32 = np.float32
SGD1 = OptimizerSpec.sgd(1.0)


def _store(value=(1.0, 2.0, 3.0), optimizer=SGD1) -> VariableStore:
    store = VariableStore("ps:0")
    store.create("w", np.array(value, F32), optimizer=optimizer)
    return store


def _value(store: VariableStore, name: str = "w") -> np.ndarray:
    return store.pull([name])[0].value


def _wait_until(predicate, timeout: float = 10.0) -> None:
    # Polls another thread's progress (the store has no hook for "contributed").
    deadline = Deadline.after(timeout)
    event = threading.Event()
    while not predicate():
        assert not deadline.expired, "condition never became true"
        event.wait(0.005)


# ---- the optimizer arrives with the first push -------------------------------------------------

@pytest.mark.parametrize("spec", [OptimizerSpec.sgd(0.1, momentum=0.9), OptimizerSpec.adam(0.01)])
def test_first_push_sets_the_optimizer_and_creates_its_slots(spec: OptimizerSpec) -> None:
    rng = np.random.default_rng(1)
    init = rng.standard_normal(4).astype(F32)
    grads = [rng.standard_normal(4).astype(F32) for _ in range(3)]
    store = _store(init, optimizer=None)
    reference = _store(init, optimizer=spec)
    with pytest.raises(VariableMismatchError, match="w on ps:0, which has no optimizer"):
        store.push({"w": grads[0]})
    for slot in spec.slot_names:
        with pytest.raises(VariableNotFoundError, match="no slot"):
            store.slot("w", slot)
    assert store.push({"w": grads[0]}, optimizer=spec) == [2]
    for slot in spec.slot_names:
        assert store.slot("w", slot).shape == (4,)
    store.push({"w": grads[1]})  # adopted: later pushes need not repeat it
    store.push({"w": grads[2]}, optimizer=spec)  # but may
    for grad in grads:
        reference.push({"w": grad})
    assert _value(store).tobytes() == _value(reference).tobytes()
    for slot in spec.slot_names:
        assert store.slot("w", slot).tobytes() == reference.slot("w", slot).tobytes()


def test_synchronous_push_adopts_the_optimizer_too() -> None:
    store = _store(optimizer=None)
    spec = OptimizerSpec.sgd(1.0, momentum=0.5)
    store.push({"w": np.ones(3, F32)}, step=0, num_contributors=2, contributor=1,
               optimizer=spec, wait=False)
    assert store.slot("w", "momentum").tolist() == [0.0, 0.0, 0.0]
    assert store.push({"w": np.ones(3, F32)}, step=0, num_contributors=2, contributor=0,
                      optimizer=spec) == [2]
    assert _value(store).tolist() == [0.0, 1.0, 2.0]


def test_a_different_optimizer_is_refused_and_changes_nothing() -> None:
    store = _store(optimizer=None)
    store.create("b", np.zeros(2, F32))
    store.push({"w": np.ones(3, F32)}, optimizer=OptimizerSpec.sgd(0.5))
    adam = OptimizerSpec.adam()
    with pytest.raises(VariableMismatchError) as e:
        store.push({"b": np.ones(2, F32), "w": np.ones(3, F32)}, optimizer=adam)
    message = str(e.value)
    assert "variable w on ps:0" in message and e.value.variable == "w"
    assert "rule='adam'" in message and "rule='sgd'" in message and "0.5" in message
    # Checked before any change: "b", listed first, did not adopt Adam.
    with pytest.raises(VariableMismatchError, match="b on ps:0, which has no optimizer"):
        store.push({"b": np.ones(2, F32)})
    assert store.version("w") == 2
    with pytest.raises(VariableMismatchError, match="rule='adam'"):
        store.push({"w": np.ones(3, F32)}, step=0, num_contributors=2, contributor=0,
                   optimizer=adam, wait=False)
    assert not store._vars["w"].pending  # the refused synchronous push contributed nothing


def test_a_non_float_variable_cannot_take_an_optimizer() -> None:
    store = VariableStore("ps:0")
    store.create("count", np.zeros(2, np.int32))
    with pytest.raises(VariableMismatchError, match="count on ps:0 of dtype int32.*floating"):
        store.push({"count": np.ones(2, np.int32)}, optimizer=SGD1)
    with pytest.raises(VariableMismatchError, match="count.*no optimizer"):
        store.push({"count": np.ones(2, np.int32)})


def test_create_again_after_adoption() -> None:
    store = _store(optimizer=None)
    store.push({"w": np.ones(3, F32)}, optimizer=SGD1)
    # A restarted coordinator creates its variables again, still without the optimizer.
    assert store.create("w", np.zeros(3, F32), exist_ok=True) == 2
    assert store.create("w", np.zeros(3, F32), optimizer=SGD1, exist_ok=True) == 2
    with pytest.raises(VariableExistsError, match="optimizer=OptimizerSpec"):
        store.create("w", np.zeros(3, F32), optimizer=OptimizerSpec.adam(), exist_ok=True)
    # create(exist_ok) with an optimizer gives one to a variable that has none.
    store.create("b", np.zeros(2, F32))
    store.create("b", np.zeros(2, F32), optimizer=SGD1, exist_ok=True)
    assert store.push({"b": np.ones(2, F32)}) == [2]


# ---- synchronous steps: the mean, keyed by contributor ---------------------------------------

def test_the_mean_of_two_contributions_is_applied() -> None:
    g1, g2 = np.array([1.0, 2.0, 6.0], F32), np.array([3.0, 0.0, -2.0], F32)
    store = _store()
    store.push({"w": g1}, step=0, num_contributors=2, contributor=0, wait=False)
    assert store.push({"w": g2}, step=0, num_contributors=2, contributor=1) == [2]
    assert _value(store).tolist() == (np.array([1, 2, 3], F32) - (g1 + g2) / 2).tolist()
    assert _value(store).tolist() == [-1.0, 1.0, 1.0]


def test_the_result_is_bitwise_independent_of_arrival_order() -> None:
    # float32 values for which the order of summation changes the sum.
    grads = [np.array([1e8, 1.0, 3.0, 0.1], F32),
             np.array([1.0, -1e8, 1e-3, 0.2], F32),
             np.array([-1e8, 1e8, 7.0, 0.3], F32)]
    sums = {((grads[a] + grads[b]) + grads[c]).tobytes()
            for a, b, c in itertools.permutations(range(3))}
    assert len(sums) > 1, "the test values must make summation order matter"
    init = np.array([0.5, -0.25, 2.0, 1.0], F32)
    expected = init - ((grads[0] + grads[1]) + grads[2]) / F32(3)  # SGD lr=1: w - mean
    results = set()
    for order in itertools.permutations(range(3)):
        store = _store(init)
        for k in order:
            store.push({"w": grads[k]}, step=0, num_contributors=3, contributor=k, wait=False)
        assert store.version("w") == 2
        results.add(_value(store).tobytes())
    assert results == {expected.tobytes()}


def test_a_second_push_by_a_contributor_replaces_its_first() -> None:
    store = _store()
    store.push({"w": np.full(3, 100.0, F32)}, step=0, num_contributors=2, contributor=0,
               wait=False)
    store.push({"w": np.full(3, 2.0, F32)}, step=0, num_contributors=2, contributor=0,
               wait=False)
    assert store.version("w") == 1  # one contributor, twice: not yet complete
    assert store.push({"w": np.full(3, 4.0, F32)}, step=0, num_contributors=2,
                      contributor=1) == [2]
    assert _value(store).tolist() == [-2.0, -1.0, 0.0]  # mean of 2 and 4, not of 100


def test_a_superseded_waiting_push_gets_stale_step_error() -> None:
    store = _store()
    errors: list[BaseException] = []

    def first() -> None:
        try:
            store.push({"w": np.ones(3, F32)}, step=0, num_contributors=2, contributor=0,
                       deadline=Deadline.after(10))
        except StaleStepError as e:
            errors.append(e)

    thread = threading.Thread(target=first)
    thread.start()
    _wait_until(lambda: store._vars["w"].pending.get(0))
    store.push({"w": np.ones(3, F32)}, step=0, num_contributors=2, contributor=0, wait=False)
    thread.join(timeout=20)
    assert not thread.is_alive()
    assert len(errors) == 1 and "superseded" in str(errors[0]) and errors[0].step == 0


def test_rerun_of_the_step_just_applied_changes_nothing(caplog) -> None:
    store = _store()
    for k in range(2):
        store.push({"w": np.full(3, 2.0, F32)}, step=0, num_contributors=2, contributor=k,
                   wait=False)
    before = _value(store).tobytes()
    with caplog.at_level(logging.DEBUG, logger="cluster.ps.store"):
        # A coordinator re-runs contributor 1's function: waiting or not, nothing changes.
        assert store.push({"w": np.full(3, 50.0, F32)}, step=0, num_contributors=2,
                          contributor=1, deadline=Deadline.after(5)) == [2]
        assert store.push({"w": np.full(3, 50.0, F32)}, step=0, num_contributors=2,
                          contributor=0, wait=False) == [2]
    assert "re-pushed step 0" in caplog.text
    assert _value(store).tobytes() == before and store.version("w") == 2
    assert not store._vars["w"].pending
    # Step 1 still needs both contributors.
    store.push({"w": np.ones(3, F32)}, step=1, num_contributors=2, contributor=1, wait=False)
    assert store.version("w") == 2
    assert store.push({"w": np.ones(3, F32)}, step=1, num_contributors=2, contributor=0) == [3]


def test_other_old_steps_are_still_stale() -> None:
    store = _store()
    for step in (0, 1):
        for k in range(2):
            store.push({"w": np.ones(3, F32)}, step=step, num_contributors=2, contributor=k,
                       wait=False)
    assert store.version("w") == 3
    with pytest.raises(StaleStepError, match="step 0 of variable w.*accepts step 2") as e:
        store.push({"w": np.ones(3, F32)}, step=0, num_contributors=2, contributor=0)
    assert (e.value.step, e.value.current_step) == (0, 2)
    # The step just applied, but pushed without a contributor index: not a known re-run.
    with pytest.raises(StaleStepError, match="step 1"):
        store.push({"w": np.ones(3, F32)}, step=1, num_contributors=2)
    unindexed = _store()
    for _ in range(2):
        unindexed.push({"w": np.ones(3, F32)}, step=0, num_contributors=2, wait=False)
    with pytest.raises(StaleStepError):  # applied unindexed: nobody's re-run is recognised
        unindexed.push({"w": np.ones(3, F32)}, step=0, num_contributors=2, contributor=0)
    assert store.version("w") == 3 and unindexed.version("w") == 2


def test_wait_false_returns_before_the_step_completes() -> None:
    store = _store()
    done = threading.Event()

    def push() -> None:
        store.push({"w": np.ones(3, F32)}, step=0, num_contributors=2, contributor=0,
                   wait=False, deadline=Deadline.after(10))
        done.set()

    thread = threading.Thread(target=push)
    thread.start()
    assert done.wait(10), "a push with wait=False waited for the step"
    thread.join(timeout=10)
    assert store.version("w") == 1 and 0 in store._vars["w"].pending
    # Completed the step by pushes that do not wait: applied on the variable's next use.
    assert store.push({"w": np.ones(3, F32)}, step=0, num_contributors=2, contributor=1,
                      wait=False) == [1]
    assert store.version("w") == 2 and not store._vars["w"].pending


def test_a_contributor_makes_a_single_contributor_push_synchronous() -> None:
    store = _store()
    with pytest.raises(ValueError, match="needs a step"):
        store.push({"w": np.ones(3, F32)}, contributor=0)
    assert store.push({"w": np.ones(3, F32)}, step=0, contributor=0) == [2]
    assert store.push({"w": np.ones(3, F32)}, step=0, contributor=0) == [2]  # a re-run
    assert _value(store).tolist() == [0.0, 1.0, 2.0]


def test_bad_contributor_arguments() -> None:
    store = _store()
    for bad in (-1, 2, True, 1.0):
        with pytest.raises(ValueError, match=f"contributor must be .*got {bad!r}"):
            store.push({"w": np.ones(3, F32)}, step=0, num_contributors=2, contributor=bad)
    store.push({"w": np.ones(3, F32)}, step=0, num_contributors=2, contributor=0, wait=False)
    with pytest.raises(ValueError, match="without a contributor index for step 0 of variable w"):
        store.push({"w": np.ones(3, F32)}, step=0, num_contributors=2, wait=False)
    store.push({"w": np.ones(3, F32)}, step=1, num_contributors=2, wait=False)
    with pytest.raises(ValueError, match="with a contributor index for step 1"):
        store.push({"w": np.ones(3, F32)}, step=1, num_contributors=2, contributor=1)
    assert store.version("w") == 1


def test_dropping_an_overtaken_step_is_logged(caplog) -> None:
    store = _store()
    store.push({"w": np.ones(3, F32)}, step=0, num_contributors=2, contributor=0, wait=False)
    with caplog.at_level(logging.WARNING, logger="cluster.ps.store"):
        for k in range(2):
            store.push({"w": np.ones(3, F32)}, step=1, num_contributors=2, contributor=k,
                       wait=False)
    assert store.version("w") == 2 and not store._vars["w"].pending
    (record,) = [r for r in caplog.records if r.levelno == logging.WARNING]
    assert "variable w on ps:0" in record.getMessage()
    assert "to step 0" in record.getMessage() and "step 1 completed" in record.getMessage()
