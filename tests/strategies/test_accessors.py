"""Who this process is in its strategy: worker_index,
num_workers, num_local_replicas, is_chief by TensorFlow's rule, and the collective group."""

from __future__ import annotations

import numpy as np
import pytest

import cluster
from cluster.runtime import chief_rule
from resolver import ClusterSpec, SimpleClusterResolver


@pytest.mark.parametrize(
    ("spec", "task_type", "task_id", "chief"),
    [
        ({"chief": ["c:1"], "worker": ["w:1", "w:2"]}, "chief", 0, True),
        ({"chief": ["c:1"], "worker": ["w:1", "w:2"]}, "worker", 0, False),
        ({"worker": ["w:1", "w:2"]}, "worker", 0, True),
        ({"worker": ["w:1", "w:2"]}, "worker", 1, False),
        ({"worker": ["w:1"], "ps": ["p:1"]}, "ps", 0, False),
        ({"chief": ["c:1"], "evaluator": ["e:1"]}, "evaluator", 0, True),
        ({}, None, None, True),
    ],
)
def test_chief_rule_is_tensorflows(spec, task_type, task_id, chief) -> None:
    assert chief_rule(spec, task_type, task_id) is chief


def test_runtime_is_chief_reads_the_resolver_without_a_runtime() -> None:
    spec = ClusterSpec({"worker": ["127.0.0.1:1", "127.0.0.1:2"]})
    assert cluster.runtime.is_chief(SimpleClusterResolver(spec, task_type="worker", task_id=0))
    assert not cluster.runtime.is_chief(SimpleClusterResolver(spec, task_type="worker", task_id=1))


@pytest.mark.parametrize(
    ("make", "local", "has_group"),
    [
        (lambda: cluster.MirroredStrategy(["/cpu:0", "/cpu:1"]), 2, False),
        (lambda: cluster.MirroredStrategy(["/cpu:0"]), 1, True),
        (lambda: cluster.OneDeviceStrategy("/cpu:0"), 1, True),
        (lambda: cluster.CentralStorageStrategy(["/cpu:0", "/cpu:1"]), 2, False),
        (cluster.get_strategy, 1, True),
    ],
)
def test_local_strategies_are_their_own_chief(make, local: int, has_group: bool) -> None:
    ext = make().extended
    assert (ext.worker_index, ext.num_workers, ext.num_local_replicas) == (0, 1, local)
    assert ext.is_chief and ext.should_checkpoint and ext.should_save_summary and ext.should_init
    group = ext.collective_group
    assert (group is not None) is has_group
    if group is not None:
        assert group.all_reduce_async(np.float32(2.0)).wait(timeout=10) == 2.0


def _worker(transport):
    from cluster.strategies.multi_worker import MultiWorkerMirroredStrategy

    strategy = MultiWorkerMirroredStrategy._from_transport(
        transport, devices=["/cpu:0", "/cpu:1"],
        communication_options=cluster.CommunicationOptions(timeout_seconds=30))
    ext = strategy.extended
    group = ext.collective_group
    # An async call on the strategy's own group, then the strategy's collectives: one order.
    work = group.all_reduce_async(np.full(3, transport.rank + 1, np.float32))
    total = strategy.reduce("SUM", strategy.run(lambda: np.float32(1.0)), axis=None)
    return {"index": ext.worker_index, "workers": ext.num_workers,
            "local": ext.num_local_replicas, "chief": ext.is_chief,
            "checkpoint": ext.should_checkpoint, "replicas": strategy.num_replicas_in_sync,
            "work": work.wait(timeout=30).tolist(), "total": float(total)}


@pytest.mark.multiprocess
@pytest.mark.timeout(120)
def test_multi_worker_accessors_and_its_group_across_processes() -> None:
    from cluster.testing import run_group

    outcomes = run_group(_worker, 3, timeout=100)
    assert all(o.ok for o in outcomes), [o.traceback for o in outcomes if not o.ok]
    results = [o.result for o in outcomes]
    assert [r["index"] for r in results] == [0, 1, 2]
    assert [r["chief"] for r in results] == [True, False, False]
    assert [r["checkpoint"] for r in results] == [True, False, False]
    for r in results:
        assert (r["workers"], r["local"], r["replicas"]) == (3, 2, 6)
        assert r["work"] == [6.0, 6.0, 6.0] and r["total"] == 6.0


@pytest.mark.parametrize("coordinator", [True, False])
def test_parameter_server_coordinator_is_chief_and_workers_are_not(coordinator: bool) -> None:
    """Built without a cluster (no connection is made by the constructor): the coordinator is the
    chief; a worker running closures under the same strategy is not; no collective group."""
    from cluster.strategies.parameter_server import (
        ParameterServerExtended,
        ParameterServerStrategy,
        StrategyConfig,
    )

    config = StrategyConfig("uid", (("ps:0", "127.0.0.1:1"),), (("worker:0", "127.0.0.1:2"),),
                            synchronous=False)
    container = ParameterServerStrategy.__new__(ParameterServerStrategy)
    ext = ParameterServerExtended(container, config, connections=None, partitioner=None,
                                  coordinator=coordinator)
    assert ext.is_chief is coordinator and ext.should_checkpoint is coordinator
    assert ext.collective_group is None
