"""``optimizer.apply_gradients`` under MultiWorkerMirroredStrategy fuses plain SGD's update into
the all-reduce (:mod:`cluster.collectives.epilogue`): two real processes, on the
shared-memory and the network path. Variables end bitwise equal on both ranks and to the update
computed in NumPy from the summed gradients; optimizers with slots take the unfused path."""

from __future__ import annotations

import numpy as np
import pytest

from cluster.testing import run_group

pytestmark = [pytest.mark.multiprocess, pytest.mark.timeout(120)]

SHAPES = [(512, 600), (3,), (7, 5), (70_001,)]  # one lone tensor (1.2 MB), the rest packed
LR = 0.25
STEPS = 3


def _grads(rank: int, step: int) -> list[np.ndarray]:
    rng = np.random.default_rng(100 * step + rank)
    return [rng.standard_normal(s).astype(np.float32) for s in SHAPES]


def _initial() -> list[np.ndarray]:
    rng = np.random.default_rng(1)
    return [rng.standard_normal(s).astype(np.float32) for s in SHAPES]


def _train(transport, implementation: str, momentum: float):
    import cluster
    from cluster.strategies.multi_worker import MultiWorkerMirroredStrategy

    # Host arrays mean the host route: pinned to the CPU, whatever GPUs the machine has (the
    # GPU route: test_gpu_fused.py).
    strategy = MultiWorkerMirroredStrategy._from_transport(
        transport, communication_options=cluster.CommunicationOptions(
            timeout_seconds=60, implementation=implementation), devices=["/cpu:0"])
    group = strategy.extended.collective_group
    fused_calls = []
    real = group.all_reduce_apply

    def counting(*args, **kwargs):
        fused_calls.append(1)
        return real(*args, **kwargs)

    group.all_reduce_apply = counting
    with strategy.scope():
        variables = [cluster.Variable(w) for w in _initial()]
    opt = cluster.optimizers.SGD(LR, momentum=momentum)
    for step in range(STEPS):
        grads = _grads(transport.rank, step)
        strategy.run(lambda g=grads: opt.apply_gradients(zip(g, variables, strict=True)))
    return {"values": [v.numpy().tobytes() for v in variables], "fused": len(fused_calls)}


@pytest.mark.parametrize("implementation", ["AUTO", "RING"], ids=["shm", "network"])
def test_plain_sgd_is_fused_and_exact(implementation: str) -> None:
    outcomes = run_group(_train, 2, args=(implementation, 0.0), timeout=110)
    assert all(o.ok for o in outcomes), [(o.error_type, o.error, o.traceback) for o in outcomes]
    want = _initial()
    for step in range(STEPS):
        for w, g0, g1 in zip(want, _grads(0, step), _grads(1, step), strict=True):
            w -= np.float32(LR) * (g0 + g1)
    for outcome in outcomes:
        assert outcome.result["fused"] == STEPS
        assert outcome.result["values"] == [w.tobytes() for w in want]


def test_sgd_with_momentum_takes_the_unfused_path() -> None:
    outcomes = run_group(_train, 2, args=("AUTO", 0.5), timeout=110)
    assert all(o.ok for o in outcomes), [(o.error_type, o.error, o.traceback) for o in outcomes]
    assert [o.result["fused"] for o in outcomes] == [0, 0]
    assert outcomes[0].result["values"] == outcomes[1].result["values"]
