"""``cluster.elastic.State``: commit, restore and sync of trackables (variables, optimizer slots
and iterations, metrics, nests) and plain values; sync is bitwise and never takes a fresh
joiner's values while a task that trained is in the group."""

from __future__ import annotations

import numpy as np
import pytest

import cluster
from cluster.elastic import State
from cluster.optimizers import slots_of
from cluster.strategies.multi_worker import MultiWorkerMirroredStrategy
from cluster.transport.inproc import InProcessHub
from tests.elastic._double import in_threads

pytestmark = pytest.mark.timeout(90)


def _steps(optimizer, w, grads):
    for g in grads:
        optimizer.apply_gradients([(np.asarray(g, np.float64), w)])


@pytest.mark.parametrize("make", [lambda: cluster.optimizers.SGD(0.1, momentum=0.9),
                                  lambda: cluster.optimizers.Adam(0.01)])
def test_restore_puts_back_variables_slots_and_iterations_of_the_last_commit(make):
    w = cluster.Variable(np.array([1.0, -2.0, 3.0]))
    optimizer = make()
    state = State(model={"w": w}, optimizer=optimizer)
    _steps(optimizer, w, [[1.0, 2.0, 3.0], [0.5, -1.0, 2.0]])
    state.commit()
    committed = (w.numpy().copy(), optimizer.iterations,
                 {s: optimizer.get_slot(w, s).numpy().copy()
                  for s in ("momentum", "m", "v") if _has_slot(optimizer, w, s)})
    _steps(optimizer, w, [[9.0, 9.0, 9.0]])
    state.restore()
    assert np.array_equal(w.numpy(), committed[0])
    assert optimizer.iterations == committed[1]
    for slot, value in committed[2].items():
        assert np.array_equal(optimizer.get_slot(w, slot).numpy(), value), slot
    # The same steps again give the same result as the first time, bit for bit.
    _steps(optimizer, w, [[9.0, 9.0, 9.0]])
    again = w.numpy().copy()
    state.restore()
    _steps(optimizer, w, [[9.0, 9.0, 9.0]])
    assert np.array_equal(w.numpy(), again)


def _has_slot(optimizer, w, slot):
    try:
        optimizer.get_slot(w, slot)
        return True
    except KeyError:
        return False


@pytest.mark.parametrize("make", [lambda: cluster.optimizers.SGD(0.1, momentum=0.9),
                                  lambda: cluster.optimizers.Adam(0.01)])
def test_rollback_to_before_the_first_step_is_exact_though_the_slots_were_made_since(make):
    w = cluster.Variable(np.array([1.0, 2.0]))
    optimizer = make()
    state = State(w=w, optimizer=optimizer)     # no slot exists yet
    _steps(optimizer, w, [[1.0, 1.0], [2.0, -1.0]])
    first_run = w.numpy().copy()
    state.restore()
    assert optimizer.iterations == 0 and np.array_equal(w.numpy(), [1.0, 2.0])
    _steps(optimizer, w, [[1.0, 1.0], [2.0, -1.0]])
    assert np.array_equal(w.numpy(), first_run)


def test_plain_values_are_copies_reset_on_restore_and_assignable():
    arr = np.arange(3.0)
    state = State(step=0, lr=0.5, name="run", history=[1, (2, 3.5)],
                  table={"a": np.ones(2), 3: None}, arr=arr, scalar=np.float32(1.5))
    arr[0] = 99.0                      # the caller's array: the commit holds a copy
    state.step += 1
    state.history.append("x")          # in place
    state.table["a"][0] = -1.0
    state.lr = 0.25
    state.restore()
    assert state.step == 0 and state.lr == 0.5 and state.name == "run"
    assert state.history == [1, (2, 3.5)]
    assert state.table["a"].tolist() == [1.0, 1.0] and state.table[3] is None
    assert state.arr.tolist() == [0.0, 1.0, 2.0]
    assert type(state.scalar) is np.float32 and state.scalar == np.float32(1.5)
    state.step = 7
    state.commit()
    state.step = 8
    state.restore()
    assert state.step == 7


def test_metrics_and_nests_of_trackables_restore():
    a, b = cluster.Variable(np.float64(1.0)), cluster.Variable(np.zeros(2))
    metric = cluster.metrics.Mean()
    state = State(model=[a, {"b": b}], metric=metric)
    metric.update_state(np.array([2.0, 4.0]))
    a.assign(5.0)
    b.assign(np.ones(2))
    state.restore()
    assert float(a.numpy()) == 1.0 and b.numpy().tolist() == [0.0, 0.0]
    assert metric.count.numpy() == 0


def test_refusals_name_the_value_and_the_fix():
    w = cluster.Variable(1.0)
    state = State(w=w, step=0)
    with pytest.raises(AttributeError, match="pass it to State"):
        state.epoch = 1
    with pytest.raises(AttributeError, match="tracked in place"):
        state.w = cluster.Variable(2.0)
    with pytest.raises(TypeError, match="plain value"):
        state.step = object()
    with pytest.raises(TypeError, match="elastic.State: mixed/1"):
        State(mixed=[w, object()])
    with pytest.raises(ValueError, match="'commit' cannot name a value"):
        State(commit=1)
    with pytest.raises(AttributeError, match="has no value 'nope'"):
        _ = state.nope


# -- sync across an in-process group of 3 tasks ---------------------------------------------


def _group(n, devices=("/cpu:0",)):
    hub = InProcessHub(n)
    options = cluster.CommunicationOptions(timeout_seconds=20)
    return [MultiWorkerMirroredStrategy._from_transport(t, devices=list(devices),
                                                        communication_options=options)
            for t in hub.transports]


def _sync_task(strategy, rank, committed_ranks):
    """A task whose variables and plain values differ from every other's; the ranks in
    ``committed_ranks`` have committed (trained before), the others are fresh joiners."""
    with strategy.scope():
        w = cluster.Variable(np.zeros(3), name="w")
        total = cluster.metrics.Sum()
    optimizer = cluster.optimizers.Adam(0.1)

    def step():
        rid = cluster.get_replica_context().replica_id_in_sync_group
        optimizer.apply_gradients([(np.full(3, rid + 1.0), w)])
        total.update_state(1.0)

    strategy.run(step)
    # Every task's values now differ: its own variable component, slot, iterations, plain values.
    w.values[0].assign(np.full(3, 10.0 * rank))
    optimizer.get_slot(w, "m").values[0].assign(np.full(3, float(rank)))
    optimizer.iterations = 5 + rank
    bits = np.array([np.nan, -0.0, 1e-310, -np.inf])
    bits[0] = np.frombuffer(np.uint64(0x7FF8_0000_0000_0000 + rank).tobytes(), np.float64)[0]
    values = dict(w=w, optimizer=optimizer, total=total, step=rank,
                  data={"rows": [rank] * 2}, bits=bits)
    state = State(**values)
    if rank in committed_ranks:
        state.commit()
    else:
        # A fresh joiner: a state that never committed. Built a second time so that every task
        # makes the same collectives (a snapshot reads the metric's aggregate: a collective).
        state = State(**values)
    state.sync(strategy)
    return {"w": w.numpy().tolist(), "step": state.step, "data": state.data,
            "bits": state.bits.view(np.uint64).tolist(), "iterations": optimizer.iterations,
            "m": optimizer.get_slot(w, "m").numpy().tolist(), "total": float(total.result())}


@pytest.mark.parametrize("committed, root", [((1, 2), 1), ((2,), 2), ((), 0)])
def test_sync_takes_the_lowest_task_that_trained_and_never_a_fresh_joiner(committed, root):
    strategies = _group(3)
    out = in_threads({r: (lambda r=r: _sync_task(strategies[r], r, committed))
                      for r in range(3)})
    for r in range(3):
        assert not isinstance(out[r], BaseException), out[r]
    expected = out[root]
    assert expected["step"] == root and expected["data"] == {"rows": [root, root]}
    assert expected["w"] == [10.0 * root] * 3 and expected["iterations"] == 5 + root
    assert expected["m"] == [float(root)] * 3
    assert expected["total"] == 3.0       # the metric's aggregate, not 3 x 3
    for r in range(3):
        assert out[r] == expected, (r, out[r])   # bit for bit, NaN payload and -0.0 included


@pytest.mark.parametrize("devices", [["/cpu:0"], ["/cpu:0", "/cpu:1"]])
def test_a_fresh_joiner_receives_slots_it_never_made(devices):
    strategies = _group(2, devices)

    def task(rank):
        with strategies[rank].scope():
            w = cluster.Variable(np.zeros(2), name="w")
        optimizer = cluster.optimizers.SGD(0.1, momentum=0.9)
        state = State(w=w, optimizer=optimizer)
        if rank == 1:  # trained: slots made (without a collective here), then committed
            for component in slots_of(optimizer, w)["momentum"].values:
                component.assign(np.array([0.5, -0.5]))
            optimizer.iterations = 3
            state.commit()
        state.sync(strategies[rank])
        momentum = optimizer.get_slot(w, "momentum")
        assert all(np.array_equal(c.numpy(), momentum.values[0].numpy())
                   for c in momentum.values)      # every local replica's component
        return (w.numpy().tolist(), momentum.numpy().tolist(), optimizer.iterations)

    out = in_threads({0: lambda: task(0), 1: lambda: task(1)})
    assert out[0] == out[1], out
    assert out[0][1:] == ([0.5, -0.5], 3)
