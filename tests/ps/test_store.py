"""The parameter-server store as a pure state machine: no sockets, no processes."""

from __future__ import annotations

import threading

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from cluster import optimizers
from cluster.deadline import Deadline
from cluster.errors import (
    StaleStepError,
    SyncTimeoutError,
    VariableExistsError,
    VariableMismatchError,
    VariableNotFoundError,
)
from cluster.ps import AssignMode, OptimizerSpec, VariableStore
from cluster.variables import Variable

pytestmark = pytest.mark.timeout(60)

F32 = np.float32


def _store(value=(1.0, 2.0, 3.0), optimizer=None, name="w") -> VariableStore:
    store = VariableStore("ps:0")
    store.create(name, np.array(value, F32), optimizer=optimizer or OptimizerSpec.sgd(1.0))
    return store


def _join(threads: list[threading.Thread]) -> None:
    for t in threads:
        t.join(timeout=20)
        assert not t.is_alive(), "a pusher hung"


# ---- create / pull / assign ---------------------------------------------------------------------

def test_create_pull_returns_private_copies_and_versions() -> None:
    store = VariableStore("ps:0")
    init = np.arange(6, dtype=F32).reshape(2, 3)
    assert store.create("w", init, trainable=False) == 1
    init[0, 0] = 99  # the store kept its own copy
    (pulled,) = store.pull(["w"])
    assert pulled.name == "w" and pulled.version == 1
    assert pulled.value[0, 0] == 0
    pulled.value[0, 0] = 42  # and hands out copies
    assert store.pull(["w"])[0].value[0, 0] == 0


def test_pull_newer_than_filters_per_name() -> None:
    store = _store()
    store.create("b", np.zeros(2, F32))
    store.assign("b", np.ones(2, F32))
    assert [p.name for p in store.pull(["w", "b"], newer_than=1)] == ["b"]
    assert [p.name for p in store.pull(["w", "b"], newer_than=[0, 2])] == ["w"]
    assert store.pull(["w", "b"], newer_than=0)[1].version == 2
    with pytest.raises(ValueError, match="2 names but 1"):
        store.pull(["w", "b"], newer_than=[0])


def test_pull_with_reads_each_value_under_its_lock_in_the_order_asked() -> None:
    store = _store()
    store.create("b", np.zeros(2, F32))
    store.assign("b", np.ones(2, F32))
    seen = []

    def read(name, version, value):
        var = store._vars[name]
        assert var.lock.locked()  # the live value, read while no update can run
        seen.append(name)
        return name, version, value.tobytes()

    got = store.pull_with(["b", "w"], [0, 1], read)
    assert got == [("b", 2, np.ones(2, F32).tobytes())] and seen == ["b"]
    with pytest.raises(VariableNotFoundError):
        store.pull_with(["w", "nope"], None, read)
    assert seen == ["b"]  # every name checked before any value is read


def test_create_twice() -> None:
    store = _store()
    assert store.create("w", np.zeros(3, F32), optimizer=OptimizerSpec.sgd(1.0),
                        exist_ok=True) == 1
    assert store.pull(["w"])[0].value.tolist() == [1, 2, 3]  # kept, not overwritten
    with pytest.raises(VariableExistsError, match="w on ps:0 already exists") as e:
        store.create("w", np.zeros(3, F32), optimizer=OptimizerSpec.sgd(1.0))
    assert e.value.variable == "w"
    with pytest.raises(VariableExistsError, match="shape=\\(3,\\)"):
        store.create("w", np.zeros(4, F32), optimizer=OptimizerSpec.sgd(1.0), exist_ok=True)
    with pytest.raises(VariableExistsError):
        store.create("w", np.zeros(3, F32), optimizer=OptimizerSpec.adam(), exist_ok=True)


def test_unknown_variable_and_mismatches_name_the_variable() -> None:
    store = _store()
    with pytest.raises(VariableNotFoundError, match="'nope' on ps:0") as e:
        store.pull(["w", "nope"])
    assert e.value.variable == "nope"
    with pytest.raises(VariableMismatchError, match=r"shape \(2,\).*variable w"):
        store.push({"w": np.zeros(2, F32)})
    with pytest.raises(VariableMismatchError, match="dtype float64.*variable w"):
        store.push({"w": np.zeros(3)})
    with pytest.raises(VariableNotFoundError):
        store.push({"w": np.zeros(3, F32), "nope": np.zeros(3, F32)})
    assert store.version("w") == 1  # a bad push changed nothing
    store.create("frozen", np.zeros(2, F32), trainable=False)
    with pytest.raises(VariableMismatchError, match="frozen.*not trainable"):
        store.push({"frozen": np.zeros(2, F32)})
    with pytest.raises(ValueError, match="floating-point"):
        store.create("i", np.zeros(2, np.int32), optimizer=OptimizerSpec.sgd())


def test_assign_modes() -> None:
    store = _store()
    assert store.assign("w", np.array([1, 1, 1], F32), AssignMode.ASSIGN_ADD) == 2
    assert store.assign("w", [1.0, 1.0, 1.0], AssignMode.ASSIGN_SUB) == 3  # Python values cast
    assert store.assign("w", np.array([5, 6, 7], F32)) == 4
    assert store.pull(["w"])[0].value.tolist() == [5, 6, 7]
    with pytest.raises(VariableMismatchError):
        store.assign("w", np.zeros(3, np.float64))


# ---- optimizers: bitwise equal to cluster.optimizers -----------------------------------------

@pytest.mark.parametrize("make", [
    lambda: optimizers.SGD(0.1),
    lambda: optimizers.SGD(0.05, momentum=0.9),
    lambda: optimizers.SGD(0.05, momentum=0.9, nesterov=True),
    lambda: optimizers.Adam(0.01),
])
def test_store_updates_equal_cluster_optimizers_bitwise(make) -> None:
    rng = np.random.default_rng(0)
    init = rng.standard_normal((4, 3)).astype(F32)
    grads = [rng.standard_normal((4, 3)).astype(F32) for _ in range(5)]
    optimizer = make()
    variable = Variable(init.copy())
    store = VariableStore()
    store.create("w", init, optimizer=OptimizerSpec.from_optimizer(optimizer))
    for grad in grads:
        optimizer.apply_gradients([(grad, variable)])  # default strategy: one replica
        store.push({"w": grad})
    assert store.pull(["w"])[0].value.tobytes() == variable.numpy().tobytes()
    for slot in OptimizerSpec.from_optimizer(optimizer).slot_names:
        expected = optimizer.get_slot(variable, slot).numpy()
        assert store.slot("w", slot).tobytes() == expected.tobytes()


# ---- asynchronous concurrency ------------------------------------------------------------------

@settings(max_examples=15, deadline=None)
@given(pushers=st.integers(1, 8), pushes_each=st.integers(1, 5))
def test_concurrent_async_pushes_apply_exactly_n_updates(pushers: int, pushes_each: int) -> None:
    # SGD with lr=1 on integer-valued floats: the result is exact whatever the order.
    store = _store(value=[0.0] * 8)
    seen: list[list[int]] = [[] for _ in range(pushers)]
    start = threading.Barrier(pushers, timeout=10)

    def push(i: int) -> None:
        start.wait()
        for _ in range(pushes_each):
            (version,) = store.push({"w": np.full(8, 1.0, F32)})
            seen[i].append(version)

    threads = [threading.Thread(target=push, args=(i,)) for i in range(pushers)]
    for t in threads:
        t.start()
    _join(threads)
    total = pushers * pushes_each
    assert store.version("w") == 1 + total
    assert store.pull(["w"])[0].value.tolist() == [-float(total)] * 8
    all_versions = sorted(v for vs in seen for v in vs)
    assert all_versions == list(range(2, total + 2))  # each update got its own version
    assert all(vs == sorted(vs) for vs in seen)  # monotonic as each pusher sees them


# ---- synchronous mode --------------------------------------------------------------------------

def test_sync_mode_applies_the_mean_once() -> None:
    n = 3
    grads = [np.array([1.0, 2.0, 4.0], F32) * (i + 1) for i in range(n)]
    store = _store(optimizer=OptimizerSpec.sgd(0.5, momentum=0.9))
    reference = _store(optimizer=OptimizerSpec.sgd(0.5, momentum=0.9))
    versions: list[list[int]] = []

    def push(grad) -> None:
        versions.append(store.push({"w": grad}, step=0, num_contributors=n,
                                   deadline=Deadline.after(10)))

    threads = [threading.Thread(target=push, args=(g,)) for g in grads]
    for t in threads:
        t.start()
    _join(threads)
    # Unindexed pushes are summed in arrival order; these integer-valued sums are exact in any.
    reference.push({"w": (grads[0] + grads[1] + grads[2]) / F32(n)})
    assert versions == [[2]] * n  # every pusher returns after the one update
    assert store.pull(["w"])[0].value.tobytes() == reference.pull(["w"])[0].value.tobytes()


def test_sync_mode_stale_and_future_steps() -> None:
    store = _store()
    grad = np.ones(3, F32)
    assert store.push({"w": grad}, step=5, num_contributors=2, wait=False) == [1]
    assert store.push({"w": grad}, step=5, num_contributors=2, wait=False) == [2]
    with pytest.raises(StaleStepError, match="step 4 of variable w on ps:0.*accepts step 6") as e:
        store.push({"w": grad}, step=4, num_contributors=2)
    assert (e.value.step, e.value.current_step, e.value.variable) == (4, 6, "w")


def test_sync_pushers_of_an_overtaken_step_get_stale_step_error() -> None:
    store = _store()
    grad = np.ones(3, F32)
    errors: list[BaseException] = []
    waiting = threading.Thread(target=lambda: _catch(errors, lambda: store.push(
        {"w": grad}, step=0, num_contributors=2, deadline=Deadline.after(10))))
    waiting.start()
    # Two pushes for step 1 complete it first: step 0's lone contribution is dropped.
    _wait_until(lambda: store._vars["w"].pending.get(0))
    store.push({"w": grad}, step=1, num_contributors=2, wait=False)
    store.push({"w": grad}, step=1, num_contributors=2, wait=False)
    _join([waiting])
    assert len(errors) == 1 and isinstance(errors[0], StaleStepError)
    assert store.version("w") == 2  # only step 1 was applied


def test_sync_timeout_withdraws_the_contribution() -> None:
    store = _store()
    grad = np.ones(3, F32)
    with pytest.raises(SyncTimeoutError, match="step 0 on ps:0.*w"):
        store.push({"w": grad}, step=0, num_contributors=2, deadline=Deadline.after(0.2))
    # Withdrawn: a retry of step 0 plus one other contributor applies exactly one mean of two
    # (a leftover third contribution would make the mean differ from the gradients pushed).
    store.push({"w": grad}, step=0, num_contributors=2, wait=False)
    store.push({"w": 3 * grad}, step=0, num_contributors=2, wait=False)
    assert store.pull(["w"])[0].value.tolist() == [-1.0, 0.0, 1.0]


def test_bad_push_arguments() -> None:
    store = _store()
    with pytest.raises(ValueError, match="needs a step"):
        store.push({"w": np.ones(3, F32)}, num_contributors=2)
    with pytest.raises(ValueError, match="num_contributors"):
        store.push({"w": np.ones(3, F32)}, num_contributors=0)
    with pytest.raises(ValueError, match="no gradients"):
        store.push({})


def _catch(errors: list, fn) -> None:
    try:
        fn()
    except BaseException as e:  # noqa: BLE001 - handed to the test thread
        errors.append(e)


def _wait_until(predicate, timeout: float = 10.0) -> None:
    # Polls a condition of another thread's progress (the store has no hook for "contributed").
    deadline = Deadline.after(timeout)
    event = threading.Event()
    while not predicate():
        assert not deadline.expired, "condition never became true"
        event.wait(0.005)
