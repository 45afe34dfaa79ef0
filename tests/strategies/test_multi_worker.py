"""MultiWorkerMirroredStrategy across real processes (gRPC on loopback): reductions, gathers,
variables, metrics and datasets span every replica of every worker."""

from __future__ import annotations

import numpy as np
import pytest

from cluster.testing import run_group

pytestmark = [pytest.mark.multiprocess, pytest.mark.timeout(90)]


def _exercise(transport, devices: list[str]):
    import cluster
    from cluster.strategies.multi_worker import MultiWorkerMirroredStrategy

    strategy = MultiWorkerMirroredStrategy._from_transport(
        transport, devices=devices,
        communication_options=cluster.CommunicationOptions(bytes_per_pack=64,
                                                           timeout_seconds=30))
    out = {"replicas": strategy.num_replicas_in_sync,
           "resolver": (strategy.cluster_resolver.task_type, strategy.cluster_resolver.task_id)}

    def rid():
        return np.float64(cluster.get_replica_context().replica_id_in_sync_group)

    ids = strategy.run(rid)
    out["sum_ids"] = float(strategy.reduce("SUM", ids, axis=None))
    # replica r holds r+1 rows: MEAN over axis 0 weights by rows across workers
    rows = strategy.run(lambda: np.full(int(rid()) + 1, rid()))
    out["mean_rows"] = float(strategy.reduce("MEAN", rows, axis=0))
    out["gather"] = strategy.gather(rows, axis=0).tolist()
    out["all_gather"] = [g.tolist() for g in strategy.experimental_local_results(strategy.run(
        lambda: cluster.get_replica_context().all_gather(np.full(int(rid()) + 1, rid()), 0)))]
    out["all_reduce_mean"] = [float(x) for x in strategy.experimental_local_results(strategy.run(
        lambda: cluster.get_replica_context().all_reduce("MEAN", rid())))]
    with strategy.scope():
        # different on every rank: rank 0's value must win everywhere
        v = cluster.Variable(np.float64(transport.rank + 10), name="v")
        summed = cluster.Variable(0.0, aggregation="SUM")
        metric = cluster.metrics.Mean()
    out["initial"] = [float(c.numpy()) for c in v.values]
    strategy.run(lambda: summed.assign(np.float32(rid() + 1)))
    out["summed"] = [float(c.numpy()) for c in summed.values]
    strategy.run(lambda: metric.update_state(np.array([rid()])))
    out["metric"] = float(metric.result())
    data = [np.arange(8.0).reshape(8, 1) + 10 * i for i in range(2)]
    seen = []
    for batch in strategy.experimental_distribute_dataset(data):
        seen.append([b.ravel().tolist() for b in strategy.experimental_local_results(batch)])
    out["data"] = seen
    return out


@pytest.mark.parametrize("world, devices", [(2, ["/cpu:0", "/cpu:1"]), (3, ["/cpu:0"])])
def test_multi_worker_reductions_variables_metrics_and_data(world, devices):
    outcomes = run_group(_exercise, world, args=(devices,), timeout=80)
    assert all(o.ok for o in outcomes), [(o.error_type, o.error, o.traceback) for o in outcomes]
    n = world * len(devices)
    results = [o.result for o in outcomes]
    for rank, r in enumerate(results):
        assert r["replicas"] == n
        assert r["resolver"] == ("worker", rank)
        assert r["sum_ids"] == sum(range(n))
        rows = [float(i) for i in range(n) for _ in range(i + 1)]
        assert r["mean_rows"] == pytest.approx(np.mean(rows))
        assert r["gather"] == rows
        assert r["all_gather"] == [rows] * len(devices)
        assert r["all_reduce_mean"] == [(n - 1) / 2] * len(devices)
        assert r["initial"] == [10.0] * len(devices)
        assert r["summed"] == [n * (n + 1) / 2] * len(devices)
        assert r["metric"] == pytest.approx((n - 1) / 2)
        k = len(devices)
        for step, pieces in enumerate(r["data"]):
            global_batch = list(np.arange(8.0) + 10 * step)
            split = np.array_split(global_batch, n) if 8 % n == 0 else None
            mine = pieces
            if split is not None:
                assert mine == [list(s) for s in split[rank * k:(rank + 1) * k]]
    # every worker's pieces together are the global batch, in replica order
    for step in range(2):
        together = [x for r in results for piece in r["data"][step] for x in piece]
        assert together == list(np.arange(8.0) + 10 * step)


def _fail_on_rank_one(transport):
    import cluster
    from cluster.strategies.multi_worker import MultiWorkerMirroredStrategy

    strategy = MultiWorkerMirroredStrategy._from_transport(
        transport, communication_options=cluster.CommunicationOptions(timeout_seconds=20))
    strategy.reduce("SUM", np.float32(1.0), axis=None)  # both ranks are up
    if transport.rank == 1:
        raise SystemExit(3)  # dies between steps without saying why
    return strategy.reduce("SUM", np.float32(1.0), axis=None)


def test_a_dead_worker_fails_the_survivor_naming_it():
    outcomes = run_group(_fail_on_rank_one, 2, timeout=60, heartbeat_timeout=3.0)
    survivor = outcomes[0]
    assert not survivor.ok
    assert survivor.error_type in {"PeerUnavailableError", "CollectiveAbortedError"}
    assert "worker:1" in survivor.error
