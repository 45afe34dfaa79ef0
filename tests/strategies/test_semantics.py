"""tf.distribute semantics in one process: contexts, values, variables, reductions and the errors
TensorFlow raises (each expectation was checked against TensorFlow 2.21's MirroredStrategy with
two logical CPUs)."""

from __future__ import annotations

import numpy as np
import pytest

import cluster
from cluster import VariableAggregation, VariableSynchronization
from cluster.values import PerReplica
from tests._requires import require


@pytest.fixture
def two():
    return cluster.MirroredStrategy(["/cpu:0", "/cpu:1"])


def rid() -> np.float32:
    return np.float32(cluster.get_replica_context().replica_id_in_sync_group)


def per_replica(strategy, fn):
    return strategy.experimental_distribute_values_from_function(fn)


# -- contexts --

def test_default_context_outside_every_scope():
    assert not cluster.in_cross_replica_context()
    context = cluster.get_replica_context()
    assert context is not None and context.num_replicas_in_sync == 1
    assert context.all_reduce("SUM", 3.0) == 3.0
    assert context.merge_call(lambda strategy: 1) == 1
    assert not cluster.has_strategy()


def test_scope_is_cross_replica_and_run_is_replica(two):
    with two.scope():
        assert cluster.in_cross_replica_context()
        assert cluster.get_replica_context() is None
        assert cluster.get_strategy() is two
    seen = two.run(lambda: (cluster.get_strategy() is two, cluster.in_cross_replica_context()))
    assert seen == (True, False)  # the same objects on every replica stay plain, as in TF
    ids = two.experimental_local_results(
        two.run(lambda: cluster.get_replica_context().replica_id_in_sync_group))
    assert ids == (0, 1)


def test_mixing_strategies_raises(two):
    other = cluster.MirroredStrategy(["/cpu:0"])
    with two.scope(), pytest.raises(RuntimeError, match="Mixing different Strategy"):
        with other.scope():
            pass
    with two.scope():
        v = cluster.Variable(1.0)
    with pytest.raises(RuntimeError, match="Mixing different Strategy"):
        other.run(lambda: v.assign_add(1.0))


def test_cluster_resolver_is_none_for_local_strategies(two):
    assert two.cluster_resolver is None
    assert two.num_replicas_in_sync == 2
    assert two.extended.worker_devices == ("/job:localhost/replica:0/task:0/device:CPU:0",
                                           "/job:localhost/replica:0/task:0/device:CPU:1")


@pytest.mark.parametrize("devices, match", [
    (["/cpu:0", "/cpu:0"], "no duplicates"),
    (["/tpu:0"], "not a device string"),
    ([], "empty"),
    ("/cpu:0", "list of device strings"),
    (["/gpu:4096"], "not found"),  # more GPUs than any machine has
])
def test_bad_devices_raise_naming_the_entry(devices, match):
    with pytest.raises(ValueError, match=match):
        cluster.MirroredStrategy(devices)


# -- run --

def test_run_splits_per_replica_args_and_regroups(two):
    value = PerReplica([np.array([1.0]), np.array([2.0])])
    result = two.run(lambda x, k: x * k, args=(value,), kwargs={"k": 10.0})
    assert [r.tolist() for r in two.experimental_local_results(result)] == [[10.0], [20.0]]


def test_run_identical_results_stay_plain(two):
    marker = object()
    assert two.run(lambda: marker) is marker


@pytest.mark.parametrize("fn, args, kwargs, error, match", [
    (3, (), None, TypeError, "callable"),
    (lambda x: x, 5, None, ValueError, "tuple or list"),  # TF raises ValueError
    (lambda x: x, (PerReplica([1, 2, 3]),), None, ValueError, "3 components"),
    (lambda: None, (), [1], TypeError, "kwargs must be a dict"),
])
def test_run_refuses_bad_arguments(two, fn, args, kwargs, error, match):
    with pytest.raises(error, match=match):
        two.run(fn, args=args, kwargs=kwargs)


def test_run_with_mismatched_return_structures_raises(two):
    def fn():
        return (1.0,) if rid() == 0 else [1.0, 2.0]

    with pytest.raises(ValueError, match="same nested structure"):
        two.run(fn)


def test_an_exception_in_one_replica_reaches_the_caller_and_releases_the_other(two):
    def fn():
        if rid() == 1:
            raise KeyError("boom in replica 1")
        return cluster.get_replica_context().all_reduce("SUM", 1.0)

    with pytest.raises(KeyError, match="boom in replica 1"):
        two.run(fn)
    assert two.reduce("SUM", two.run(lambda: rid()), axis=None) == 1.0  # still usable


def test_replicas_that_skip_merge_call_are_an_error(two):
    def fn():
        if rid() == 0:
            cluster.get_replica_context().all_reduce("SUM", 1.0)

    with pytest.raises(RuntimeError, match="same merge_call"):
        two.run(fn)


def test_merge_call_runs_once_in_cross_replica_context(two):
    calls = []

    def merge(strategy, value):
        calls.append(cluster.in_cross_replica_context())
        return strategy.reduce("SUM", value, axis=None)

    result = two.run(lambda: cluster.get_replica_context().merge_call(merge, args=(rid() + 1,)))
    assert calls == [True]
    assert two.experimental_local_results(result) == (3.0,)


# -- reduce / gather / all_reduce / all_gather -----------------------------------------------------

def test_reduce_and_gather_match_tensorflow(two):
    value = per_replica(two, lambda ctx: np.array([1.0, 2.0, 3.0], np.float32)
                        * (ctx.replica_id_in_sync_group + 1))
    assert two.reduce("MEAN", value, axis=0) == np.float32(3.0)
    assert two.reduce("SUM", value, axis=0) == np.float32(18.0)
    np.testing.assert_array_equal(two.reduce("MEAN", value, axis=None), [1.5, 3.0, 4.5])
    np.testing.assert_array_equal(two.gather(value, axis=0), [1, 2, 3, 2, 4, 6])
    assert two.reduce(cluster.ReduceOp.SUM, [value, value], axis=0) == [18.0, 18.0]


def test_mean_with_axis_weights_uneven_batches(two):
    value = PerReplica([np.array([1.0, 2.0, 3.0]), np.array([10.0])])
    assert two.reduce("MEAN", value, axis=0) == pytest.approx(4.0)


def test_reduce_of_non_distributed_values_follows_tensorflow(two):
    assert two.reduce("MEAN", np.float32(2.0), axis=None) == 2.0
    with pytest.raises(ValueError, match="non-DistributedValues"):
        two.reduce("SUM", np.float32(2.0), axis=None)
    with pytest.raises(ValueError, match="unknown reduce op 'PROD'"):
        two.reduce("PROD", np.float32(2.0), axis=None)


def test_reduce_inside_run_is_refused(two):
    with pytest.raises(RuntimeError, match="cross-replica context"):
        two.run(lambda: two.reduce("SUM", 1.0, axis=None))


def test_replica_all_reduce_and_all_gather(two):
    result = two.run(lambda: cluster.get_replica_context().all_reduce(
        "SUM", {"a": rid(), "b": [rid() * 2]}))
    assert two.experimental_local_results(result) == ({"a": 1.0, "b": [2.0]},) * 2
    gathered = two.run(lambda: cluster.get_replica_context().all_gather(
        np.reshape(rid(), [1]), axis=0))
    for g in two.experimental_local_results(gathered):
        np.testing.assert_array_equal(g, [0.0, 1.0])
    # As tf.distribute.ReduceOp: a replica context reduces by SUM or MEAN only.
    with pytest.raises(ValueError, match="SUM and ReduceOp.MEAN"):
        two.run(lambda: cluster.get_replica_context().all_reduce("MAX", rid()))
    with pytest.raises(ValueError, match="unknown reduce op"):
        two.run(lambda: cluster.get_replica_context().all_reduce("PROD", 1.0))


def test_all_reduce_results_are_separate_copies(two):
    result = two.run(lambda: cluster.get_replica_context().all_reduce("SUM", np.ones(3)))
    a, b = two.experimental_local_results(result)
    assert a is not b and a.tobytes() == b.tobytes()


# -- variables --

def test_plain_variable_like_tf():
    v = cluster.Variable(1.0, name="w")
    assert (v.name, v.dtype, v.shape, v.trainable) == ("w:0", np.float32, (), True)
    assert cluster.Variable(3).dtype == np.int32
    assert cluster.Variable([1.0, 2]).dtype == np.float32
    assert cluster.Variable(np.zeros(2)).dtype == np.float64
    assert cluster.Variable(lambda: np.ones(2)).numpy().tolist() == [1.0, 1.0]
    v.assign_add(2.0).assign_sub(0.5)
    assert v.numpy() == 2.5 and float(v * 2) == 5.0
    with pytest.raises(ValueError, match="does not match the variable's shape"):
        cluster.Variable(np.zeros(2)).assign(np.zeros(3))
    with pytest.raises(ValueError, match="cannot cast"):
        cluster.Variable(1).assign(1.5)
    with pytest.raises(ValueError, match="only for non-trainable"):
        cluster.Variable(0.0, trainable=True, synchronization=VariableSynchronization.ON_READ)


def test_variables_under_scope_are_distributed(two):
    with two.scope():
        mirrored = cluster.Variable(1.0, name="w")
        on_read = cluster.Variable(0.0, synchronization="ON_READ", aggregation="SUM")
    assert type(mirrored).__name__ == "MirroredVariable" and mirrored.name == "w:0"
    assert type(on_read).__name__ == "SyncOnReadVariable" and not on_read.trainable
    assert len(two.experimental_local_results(mirrored)) == 2
    assert two.run(lambda: mirrored) is mirrored
    created = two.run(lambda: cluster.Variable(2.0))
    assert type(created).__name__ == "MirroredVariable"
    with pytest.raises(ValueError, match="synchronization=NONE is not supported"):
        with two.scope():
            cluster.Variable(1.0, synchronization=VariableSynchronization.NONE)


def test_mirrored_writes_in_replica_context_follow_aggregation(two):
    with two.scope():
        none = cluster.Variable(1.0)
        summed = cluster.Variable(1.0, aggregation=VariableAggregation.SUM)
        mean = cluster.Variable(1.0, aggregation=VariableAggregation.MEAN)
        first = cluster.Variable(1.0, aggregation=VariableAggregation.ONLY_FIRST_REPLICA)
    two.run(lambda: none.assign(rid()))
    two.run(lambda: summed.assign(rid() + 1))
    two.run(lambda: mean.assign(rid()))
    two.run(lambda: first.assign_add(rid() + 5))
    assert [c.numpy() for c in none.values] == [0.0, 1.0]  # TF 2 writes each replica's own
    assert [c.numpy() for c in summed.values] == [3.0, 3.0]
    assert [c.numpy() for c in mean.values] == [0.5, 0.5]
    assert [c.numpy() for c in first.values] == [6.0, 6.0]
    assert two.experimental_local_results(two.run(lambda: none.value())) == (0.0, 1.0)


def test_sync_on_read_variables_aggregate_in_cross_replica_context(two):
    with two.scope():
        total = cluster.Variable(0.0, synchronization="ON_READ", aggregation="SUM")
        first = cluster.Variable(0.0, synchronization="ON_READ",
                                 aggregation="ONLY_FIRST_REPLICA")
    two.run(lambda: total.assign_add(rid() + 1))
    two.run(lambda: first.assign(rid() + 7))
    assert total.numpy() == 3.0 and first.numpy() == 7.0
    total.assign(6.0)  # SUM: each replica gets 6 / 2, as TF
    assert [c.numpy() for c in total.values] == [3.0, 3.0]
    with pytest.raises(ValueError, match="does not support assign_add"):
        total.assign_add(1.0)


def test_central_storage_keeps_one_copy():
    strategy = cluster.CentralStorageStrategy(["/cpu:0", "/cpu:1"])
    with strategy.scope():
        v = cluster.Variable(1.0, aggregation="SUM")
        unaggregated = cluster.Variable(1.0)
    assert len(v.values) == 1
    strategy.run(lambda: v.assign_add(rid() + 1))
    assert v.numpy() == 4.0
    assert strategy.extended.parameter_devices == ("/job:localhost/replica:0/task:0/device:CPU:0",)
    with pytest.raises(ValueError, match="needs an aggregation"):
        strategy.run(lambda: unaggregated.assign(2.0))


# -- optimizers and metrics --

def test_sgd_and_adam_follow_keras_rules():
    g = np.array([0.5, -1.0])
    w0 = np.array([1.0, 2.0])
    sgd = cluster.optimizers.SGD(0.1, momentum=0.9, nesterov=True)
    w = cluster.Variable(w0.copy())
    m = np.zeros(2)
    expected = w0.copy()
    for _ in range(3):
        sgd.apply_gradients([(g, w)])
        m = 0.9 * m - 0.1 * g
        expected = expected + 0.9 * m - 0.1 * g
    np.testing.assert_allclose(w.numpy(), expected, rtol=1e-15)
    adam = cluster.optimizers.Adam(0.01)
    w = cluster.Variable(w0.copy())
    m = v = np.zeros(2)
    expected = w0.copy()
    for t in range(1, 4):
        adam.apply_gradients([(g * t, w)])
        m = m + (g * t - m) * 0.1
        v = v + ((g * t) ** 2 - v) * 0.001
        alpha = 0.01 * np.sqrt(1 - 0.999 ** t) / (1 - 0.9 ** t)
        expected = expected - m * alpha / (np.sqrt(v) + 1e-7)
    np.testing.assert_allclose(w.numpy(), expected, rtol=1e-12)
    np.testing.assert_allclose(adam.get_slot(w, "m").numpy(), m)


def test_optimizer_errors(two):
    with two.scope():
        v = cluster.Variable(1.0)
    opt = cluster.optimizers.SGD()
    with two.scope(), pytest.raises(RuntimeError, match="cross-replica context"):
        opt.apply_gradients([(1.0, v)])
    plain = cluster.Variable(1.0)
    with pytest.raises(ValueError, match="outside"):
        two.run(lambda: opt.apply_gradients([(1.0, plain)]))
    with pytest.raises(ValueError, match="learning_rate"):
        cluster.optimizers.SGD(-1.0)
    other = cluster.MirroredStrategy(["/cpu:0", "/cpu:1"])
    with other.scope():
        w = cluster.Variable(1.0)
    with pytest.raises(ValueError, match="created under the scope of"):
        other.run(lambda: cluster.optimizers.SGD().apply_gradients([(1.0, v), (1.0, w)]))


def test_metrics_are_sync_on_read(two):
    with two.scope():
        mean = cluster.metrics.Mean()
        acc = cluster.metrics.Accuracy()
        total = cluster.metrics.Sum()

    def step():
        r = cluster.get_replica_context().replica_id_in_sync_group
        mean.update_state(np.array([r, r + 1.0]))
        acc.update_state(np.array([1, 2]), np.array([1, r + 1]))
        total.update_state(np.float32(r))

    two.run(step)
    assert mean.result() == pytest.approx(1.0)  # (0+1+1+2)/4
    assert acc.result() == pytest.approx(0.75)
    assert total.result() == 1.0
    mean.reset_state()
    assert mean.result() == 0.0


# -- array families --

def test_python_scalars_and_numpy_scalars_come_back_as_scalars(two):
    result = two.reduce("SUM", two.run(lambda: float(rid()) + 1.0), axis=None)
    assert isinstance(result, np.floating) and result == 3.0 and result.dtype == np.float32


def test_dlpack_arrays_come_back_in_their_family(two):
    torch = require("torch")
    value = PerReplica([torch.ones(3), torch.full((3,), 2.0)])
    result = two.reduce("SUM", value, axis=None)
    assert isinstance(result, torch.Tensor) and result.tolist() == [3.0, 3.0, 3.0]
    gathered = two.run(lambda x: cluster.get_replica_context().all_gather(x, axis=0),
                       args=(value,))
    assert all(isinstance(g, torch.Tensor) and g.shape == (6,)
               for g in two.experimental_local_results(gathered))


def test_distribute_datasets_from_function_passes_an_input_context(two):
    contexts = []

    def dataset_fn(context: cluster.InputContext):
        contexts.append(context)
        batch = context.get_per_replica_batch_size(4)
        return [np.arange(i * batch, (i + 1) * batch) for i in range(4)]

    steps = [[p.tolist() for p in two.experimental_local_results(x)]
             for x in two.distribute_datasets_from_function(dataset_fn)]
    assert [(c.num_input_pipelines, c.input_pipeline_id, c.num_replicas_in_sync)
            for c in contexts] == [(1, 0, 2)]
    assert steps == [[[0, 1], [2, 3]], [[4, 5], [6, 7]]]
