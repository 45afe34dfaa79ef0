"""Where the strategies must behave as TensorFlow does, and their siblings in the other
strategies and contexts. Every expectation was checked against TF 2.21 (MirroredStrategy on two
logical CPUs, OneDeviceStrategy, the default strategy, CentralStorageStrategy); where TF raises,
the same exception type is expected here."""

from __future__ import annotations

import numpy as np
import pytest

import cluster
from cluster import VariableAggregation, VariableSynchronization
from cluster.values import PerReplica

pytestmark = pytest.mark.timeout(60)


def two() -> cluster.Strategy:
    return cluster.MirroredStrategy(["/cpu:0", "/cpu:1"])


def central() -> cluster.Strategy:
    return cluster.CentralStorageStrategy(["/cpu:0", "/cpu:1"])


def multi_worker() -> cluster.Strategy:
    # No TF_CONFIG: a one-task strategy with two local replicas (TF's _from_local_devices).
    return cluster.MultiWorkerMirroredStrategy._from_local_devices(["/cpu:0", "/cpu:1"])


def one() -> cluster.Strategy:
    return cluster.OneDeviceStrategy("/cpu:0")


def default() -> cluster.Strategy:
    return cluster.get_strategy()


@pytest.fixture(autouse=True)
def _no_tf_config(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("TF_CONFIG", raising=False)


MULTI = [two, central, multi_worker]
SINGLE = [one, default]
ALL = MULTI + SINGLE


def ctx() -> cluster.ReplicaContext:
    return cluster.get_replica_context()


def local(strategy, value) -> tuple:
    return strategy.experimental_local_results(value)


# -- item 3: a plain value in a replica's all_reduce is that replica's value ----------------------

@pytest.mark.parametrize("make", ALL)
def test_all_reduce_of_a_plain_value_counts_it_once_per_replica(make):
    strategy = make()
    n = strategy.num_replicas_in_sync
    summed = local(strategy, strategy.run(lambda: ctx().all_reduce("SUM", 1.5)))
    assert summed == (1.5 * n,) * n
    mean = local(strategy, strategy.run(lambda: ctx().all_reduce("MEAN", 1.5)))
    assert mean == (1.5,) * n
    mixed = strategy.run(lambda: ctx().all_reduce(
        "SUM", {"count": 1, "id": np.float32(ctx().replica_id_in_sync_group)}))
    assert local(strategy, mixed) == ({"count": n, "id": n * (n - 1) / 2},) * n


def test_batch_reduce_to_of_a_plain_value_follows_tensorflow():
    strategy = two()
    # TF's reduce_non_distributed_value: MEAN returns the value, SUM needs one replica.
    assert strategy.extended.reduce_to("MEAN", 1.5) == 1.5
    assert strategy.extended.batch_reduce_to(
        "MEAN", [(2.5, None), (PerReplica([1.0, 3.0]), None)])[0] == 2.5
    with pytest.raises(ValueError, match="non-DistributedValues"):
        strategy.extended.reduce_to("SUM", 1.5)
    assert one().extended.reduce_to("SUM", 1.5) == 1.5


# -- item 4: cross-replica methods outside every strategy, and refused inside run ----------------

@pytest.mark.parametrize("make", SINGLE)
def test_reduce_and_gather_after_run_on_one_replica_strategies(make):
    strategy = make()
    assert strategy.reduce("SUM", strategy.run(lambda: np.float32(2.0)), axis=None) == 2.0
    assert strategy.reduce(cluster.ReduceOp.MEAN, strategy.run(lambda: 2.0), axis=None) == 2.0
    np.testing.assert_array_equal(
        strategy.gather(strategy.run(lambda: np.array([2.0])), axis=0), [2.0])
    assert strategy.extended.reduce_to("SUM", 1.5) == 1.5


@pytest.mark.parametrize("make", ALL)
@pytest.mark.parametrize("call", [
    lambda s: s.reduce("SUM", 1.0, axis=None),
    lambda s: s.gather(np.array([1.0]), axis=0),
    lambda s: s.extended.reduce_to("SUM", 1.0),
    lambda s: s.extended.batch_reduce_to("SUM", [(1.0, None)]),
    lambda s: s.run(lambda: 1),
], ids=["reduce", "gather", "reduce_to", "batch_reduce_to", "run"])
def test_cross_replica_methods_inside_run_raise_runtime_error(make, call):
    strategy = make()
    with pytest.raises(RuntimeError, match="cross-replica context"):
        strategy.run(lambda: call(strategy))


def test_cross_replica_methods_under_another_strategys_scope_raise_runtime_error():
    mine, other = two(), one()
    value = mine.run(lambda: np.float32(1.0))
    with other.scope(), pytest.raises(RuntimeError, match="Mixing different Strategy"):
        mine.reduce("SUM", value, axis=None)
    with pytest.raises(RuntimeError, match="Mixing different Strategy"):
        other.run(lambda: mine.gather(np.array([1.0]), axis=0))
    with pytest.raises(RuntimeError, match="Mixing different Strategy"):
        default().run(lambda: mine.reduce("MEAN", value, axis=None))


def test_merge_call_runs_in_cross_replica_context_where_reduce_is_allowed():
    strategy = two()
    def step():
        mine = np.float32(1.0 + ctx().replica_id_in_sync_group)
        return ctx().merge_call(lambda s, v: s.reduce("SUM", v, axis=None), args=(mine,))

    result = strategy.run(step)
    assert local(strategy, result) == (3.0,)


def test_merge_call_from_outside_its_replica_raises_instead_of_hanging():
    strategy = two()
    contexts = []

    def merge_fn(s, context):
        context.values[0].merge_call(lambda s: 1)  # a replica's merge_call from cross-replica

    with pytest.raises(RuntimeError, match="must be called from that replica"):
        strategy.run(lambda: ctx().merge_call(merge_fn, args=(ctx(),)))
    strategy.run(lambda: contexts.append(ctx()))
    with pytest.raises(RuntimeError, match="must be called from that replica"):
        contexts[0].all_reduce("SUM", 1.0)


# -- item 5: entering a scope inside run ---------------------------------------------------------

def _enter(strategy):
    with strategy.scope():
        return 1


@pytest.mark.parametrize("make", [two, central, multi_worker, one])
def test_scope_inside_run_raises_runtime_error(make):
    strategy = make()
    with pytest.raises(RuntimeError, match="cross-replica context"):
        strategy.run(lambda: _enter(strategy))
    with strategy.scope(), strategy.scope():  # re-entering in cross-replica context is fine
        assert cluster.get_strategy() is strategy and cluster.in_cross_replica_context()


def test_default_scope_nests_only_outside_other_strategies():
    strategy, ds = two(), default()
    assert ds.run(lambda: _enter(ds)) == 1  # as TF
    assert ds.run(lambda: _enter(strategy)) == 1  # the default run is not a strategy's
    with strategy.scope(), pytest.raises(RuntimeError, match="default strategy's scope"):
        _enter(ds)
    with pytest.raises(RuntimeError, match="default strategy's scope"):
        strategy.run(lambda: _enter(ds))


def test_default_run_is_a_replica_context_of_its_own():
    strategy = default()
    outside = cluster.get_replica_context()
    inside = strategy.run(cluster.get_replica_context)
    assert inside is not outside and inside.num_replicas_in_sync == 1
    assert not cluster.has_strategy() and strategy.run(cluster.has_strategy) is False


# -- item 6: unknown reduce ops ------------------------------------------------------------------

@pytest.mark.parametrize("make", ALL)
@pytest.mark.parametrize("call", [
    lambda s: s.run(lambda: ctx().all_reduce("NOT_AN_OP", 1.0)),
    lambda s: s.run(lambda: ctx().all_reduce("NOT_AN_OP", [])),
    lambda s: s.reduce("NOT_AN_OP", 1.0, axis=None),
    lambda s: s.reduce("MAX", 1.0, axis=None),  # MAX/MIN exist, but not for strategy.reduce
    lambda s: s.extended.reduce_to("NOT_AN_OP", 1.0),
    lambda s: s.extended.batch_reduce_to("NOT_AN_OP", [(1.0, None)]),
], ids=["all_reduce", "all_reduce_empty", "reduce", "reduce_max", "reduce_to", "batch"])
def test_unknown_reduce_op_raises_value_error(make, call):
    with pytest.raises(ValueError, match="reduce op|ReduceOp.SUM and MEAN"):
        call(make())


def test_unknown_reduce_op_in_the_default_replica_context_raises_value_error():
    with pytest.raises(ValueError, match="unknown reduce op 'NOT_AN_OP'"):
        ctx().all_reduce("NOT_AN_OP", 1.0)
    assert ctx().all_reduce("sum", 1.0) == 1.0  # any case, as TF
    with pytest.raises(ValueError, match="SUM and ReduceOp.MEAN"):  # as tf.distribute.ReduceOp
        ctx().all_reduce(cluster.ReduceOp.MIN, 2.0)


# -- item 7: run's args must be a tuple or list --------------------------------------------------

@pytest.mark.parametrize("make", ALL)
@pytest.mark.parametrize("args", [np.array([1.0, 2.0]), {"a": 1}, "ab", 5])
def test_run_with_args_not_a_list_or_tuple_raises_value_error(make, args):
    with pytest.raises(ValueError, match="args must be a tuple or list"):
        make().run(lambda *a: 1, args=args)


# -- item 8: aggregation=MEAN needs a floating dtype for mirrored variables ----------------------

@pytest.mark.parametrize("make", [two, multi_worker])
@pytest.mark.parametrize("sync", list(VariableSynchronization)[2:], ids=["on_write", "on_read"])
@pytest.mark.parametrize("initial", [1, np.int64(1), True], ids=["int32", "int64", "bool"])
def test_integer_mean_mirrored_variable_raises_value_error(make, sync, initial):
    strategy = make()
    with strategy.scope(), pytest.raises(ValueError, match="aggregation=MEAN and a non-floating"):
        cluster.Variable(initial, aggregation=VariableAggregation.MEAN, synchronization=sync)


def test_integer_mean_variable_created_inside_run_raises_value_error():
    strategy = two()
    with pytest.raises(ValueError, match="aggregation=MEAN and a non-floating"):
        strategy.run(lambda: cluster.Variable(1, aggregation="MEAN"))


@pytest.mark.parametrize("make", [one, central, default])
def test_integer_mean_is_allowed_where_tf_makes_no_mirrored_variable(make):
    strategy = make()
    with strategy.scope():
        v = cluster.Variable(1, aggregation=VariableAggregation.MEAN)
    assert v.dtype == np.int32 and v.numpy() == 1


@pytest.mark.parametrize("initial, aggregation", [
    (1, VariableAggregation.SUM),
    (1, VariableAggregation.ONLY_FIRST_REPLICA),
    (np.float16(1), VariableAggregation.MEAN),
    (1.0, VariableAggregation.MEAN),
])
def test_other_aggregations_and_floating_means_are_created(initial, aggregation):
    strategy = two()
    with strategy.scope():
        v = cluster.Variable(initial, aggregation=aggregation)
    assert isinstance(v, cluster.strategies.MirroredVariable) and v.aggregation is aggregation


# -- item 3's sibling: a plain value written to a mirrored variable inside run --------------------

@pytest.mark.parametrize("make", [two, central, multi_worker])
@pytest.mark.parametrize("aggregation", ["MEAN", "ONLY_FIRST_REPLICA"])
def test_plain_value_writes_follow_tensorflow(make, aggregation):
    strategy = make()
    with strategy.scope():
        v = cluster.Variable(1.0, aggregation=aggregation)
    strategy.run(lambda: v.assign_add(1.0))  # TF: the mean (or first) of 1.0 everywhere is 1.0
    assert float(v.numpy()) == 2.0
    strategy.run(lambda: v.assign(0.0))
    assert float(v.numpy()) == 0.0


def test_plain_value_sum_write_over_two_replicas_raises_value_error():
    strategy = two()
    with strategy.scope():
        v = cluster.Variable(1.0, aggregation="SUM")
    with pytest.raises(ValueError, match="non-DistributedValues"):  # as TF
        strategy.run(lambda: v.assign_add(1.0))
