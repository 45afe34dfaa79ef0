"""``CollectiveGroup.all_reduce_apply``: an all-reduce with a fused elementwise update.

Every rank ends with the bytes of the unfused path (``all_reduce_many``, then the update on
every rank), the update of a lone tensor runs once in the group (split among the ranks that
completed its reduction), inputs are never written, and bad input is refused without harming the
group. Runs on both paths (see ``conftest.py``).
"""

from __future__ import annotations

import threading

import numpy as np
import pytest

from cluster._update_rules import sgd_update
from cluster.collectives.epilogue import AddScaled

from ._threads import make_groups, run_ranks

pytestmark = pytest.mark.timeout(60)

# Lone tensors (>= 1 MiB: ring or shared-memory direct) and small ones that share a pack.
SHAPES = [(512, 1024), (3,), (5, 7), (300_001,), (17,)]


def sgd(target: np.ndarray, reduced: np.ndarray) -> None:
    """Keras SGD as the optimizer fuses it: ``reduced`` is scribbled on (the collective's
    scratch), so a path that passed the caller's value would show in the inputs' check."""
    AddScaled(-0.125)(target, reduced)


@pytest.mark.parametrize("dtype", ["float16", "float32", "float64"])
def test_the_scratch_update_is_bitwise_keras_sgd(dtype: str) -> None:
    rng = np.random.default_rng(3)
    w, g = (rng.standard_normal(10_000).astype(dtype) for _ in range(2))
    want = w.copy()
    sgd_update(want, g, None, learning_rate=0.125, momentum=0.0, nesterov=False)
    sgd(w, g.copy())
    assert w.tobytes() == want.tobytes()


def _inputs(world: int, dtype: str = "float32") -> tuple[list, list]:
    rng = np.random.default_rng(7)
    grads = [[rng.standard_normal(s).astype(dtype) for s in SHAPES] for _ in range(world)]
    params = [rng.standard_normal(s).astype(dtype) for s in SHAPES]
    return grads, params


@pytest.mark.parametrize("world", [2, 3])
@pytest.mark.parametrize("op", ["SUM", "MEAN"])
def test_fused_update_gives_the_bytes_of_the_unfused_one(world: int, op: str) -> None:
    grads, params = _inputs(world, "float64" if op == "MEAN" else "float32")
    kept = [[g.copy() for g in gs] for gs in grads]
    hub, fused_groups = make_groups(world)
    hub2, plain_groups = make_groups(world)

    def fused(rank: int) -> list[np.ndarray]:
        mine = [p.copy() for p in params]
        fused_groups[rank].all_reduce_apply(grads[rank], mine, sgd, op)
        return mine

    def unfused(rank: int) -> list[np.ndarray]:
        mine = [p.copy() for p in params]
        for target, reduced in zip(mine, plain_groups[rank].all_reduce_many(grads[rank], op),
                                   strict=True):
            sgd(target.reshape(-1), reduced.reshape(-1))
        return mine

    got = run_ranks(fused, world, timeout=50)
    want = run_ranks(unfused, world, timeout=50)
    for rank in range(world):
        for a, b in zip(got[rank], want[rank], strict=True):
            assert a.tobytes() == b.tobytes()  # bitwise, on every rank
        for g, k in zip(grads[rank], kept[rank], strict=True):
            assert g.tobytes() == k.tobytes()  # values are never written
    moved = got[0][0] - params[0]
    assert np.abs(moved).max() > 0.01  # the update did happen


@pytest.mark.parametrize("world", [2, 3])
def test_a_lone_tensor_is_updated_once_in_the_group(world: int) -> None:
    """Counting the elements each rank's ``update`` touched: a lone tensor's updates add up to
    its size over the whole group (each rank does a share), not ``world`` times its size."""
    grads, params = _inputs(world)
    lone = [grads[r][:1] for r in range(world)]  # (512, 1024) alone: 2 MiB
    touched = [0] * world
    lock = threading.Lock()
    hub, groups = make_groups(world)

    def body(rank: int) -> np.ndarray:
        def counting(target: np.ndarray, reduced: np.ndarray) -> None:
            with lock:
                touched[rank] += target.size
            sgd(target, reduced)

        mine = params[0].copy()
        groups[rank].all_reduce_apply(lone[rank], [mine], counting)
        return mine

    results = run_ranks(body, world, timeout=50)
    assert sum(touched) == params[0].size, touched
    assert all(0 < t < params[0].size for t in touched), touched  # shared, not done by one
    assert all(r.tobytes() == results[0].tobytes() for r in results)


def test_one_rank_applies_the_update_to_its_own_values() -> None:
    hub, groups = make_groups(1)
    grads, params = _inputs(1)
    mine = [p.copy() for p in params]
    groups[0].all_reduce_apply(grads[0], mine, sgd)
    for target, param, grad in zip(mine, params, grads[0], strict=True):
        want = param.copy()
        sgd(want.reshape(-1), grad.reshape(-1))
        assert target.tobytes() == want.tobytes()


@pytest.mark.parametrize("bad", ["shape", "dtype", "alias", "count"])
def test_bad_targets_are_refused_and_the_group_goes_on(bad: str) -> None:
    hub, groups = make_groups(2)

    def body(rank: int) -> tuple[str, float]:
        grad = np.ones(8, np.float32)
        target = {"shape": np.zeros(9, np.float32), "dtype": np.zeros(8, np.float64),
                  "alias": grad, "count": np.zeros(8, np.float32)}[bad]
        targets = [target, target] if bad == "count" else [target]
        with pytest.raises((TypeError, ValueError)) as refused:
            groups[rank].all_reduce_apply([grad], targets, sgd)
        ok = np.zeros(8, np.float32)
        groups[rank].all_reduce_apply([grad], [ok], sgd)  # the group still works
        return str(refused.value), float(ok[0])

    for message, value in run_ranks(body, 2, timeout=50):
        assert "all_reduce_apply" in message
        assert value == -0.25  # 0 - 0.125 * (1 + 1)
