"""Results a user holds are never overwritten by a later call: MultiWorkerMirrored-
Strategy over N=2 real processes, on the shared-memory and the network path, for
``get_replica_context().all_reduce``, ``strategy.reduce`` and ``apply_gradients``, at a size the
collectives' buffer pool recycles (32 MiB) and with small fused tensors."""

from __future__ import annotations

import numpy as np
import pytest

from cluster.testing import run_group

pytestmark = [pytest.mark.multiprocess, pytest.mark.timeout(120)]

BIG = (32 << 20) // 4  # float32 elements: the smallest size the buffer pool recycles


def _hold_and_reuse(transport, implementation: str):
    import cluster
    from cluster.strategies.multi_worker import MultiWorkerMirroredStrategy

    strategy = MultiWorkerMirroredStrategy._from_transport(
        transport, communication_options=cluster.CommunicationOptions(
            timeout_seconds=60, implementation=implementation))
    rank = transport.rank
    ctx = cluster.get_replica_context

    def all_reduce(op, value):
        return strategy.run(lambda: ctx().all_reduce(op, value))

    x = np.full(BIG, rank + 1.0, np.float32)   # sum over 2 ranks: 3
    y = np.full(BIG, 10.0 * (rank + 1), np.float32)  # sum: 30
    r1 = all_reduce("SUM", x)
    m1 = all_reduce("MEAN", x)
    small1 = all_reduce("SUM", {"a": np.full(3, rank + 1.0), "b": np.full(2, rank + 1.0)})
    s1 = strategy.reduce("SUM", strategy.run(lambda: x), axis=None)
    with strategy.scope():
        var = cluster.Variable(np.zeros(BIG, np.float32))
    opt = cluster.optimizers.SGD(1.0)
    for _ in range(2):  # gradients go through the same pooled sizes
        strategy.run(lambda: opt.apply_gradients([(y, var)]))
        all_reduce("SUM", y)
        all_reduce("MEAN", y)
        strategy.reduce("SUM", strategy.run(lambda: y), axis=None)
        all_reduce("SUM", {"a": np.full(3, 7.0), "b": np.full(2, 7.0)})
    return {
        "r1": (float(r1.min()), float(r1.max())),
        "m1": (float(m1.min()), float(m1.max())),
        "s1": (float(s1.min()), float(s1.max())),
        "small1": (small1["a"].tolist(), small1["b"].tolist()),
        "x": float(x.max()),
        "var": (float(var.numpy().min()), float(var.numpy().max())),
        "distinct": len({id(r1), id(m1), id(s1), id(x)}),
    }


@pytest.mark.parametrize("implementation", ["AUTO", "RING"], ids=["shm", "network"])
def test_results_held_by_the_user_are_never_overwritten(implementation: str) -> None:
    outcomes = run_group(_hold_and_reuse, 2, args=(implementation,), timeout=110)
    assert all(o.ok for o in outcomes), [(o.error_type, o.error, o.traceback) for o in outcomes]
    for o in outcomes:
        out = o.result
        assert out["r1"] == (3.0, 3.0) and out["m1"] == (1.5, 1.5) and out["s1"] == (3.0, 3.0)
        assert out["small1"] == ([3.0] * 3, [3.0] * 2)
        assert out["x"] == o.rank + 1.0  # the user's input is never written
        assert out["var"] == (-60.0, -60.0)  # two SGD(1.0) steps of the summed gradient 30
        assert out["distinct"] == 4
