"""``cluster.jax`` and JAX arrays through strategies: JAX in, JAX out, through
``ReplicaContext.all_reduce`` and ``strategy.reduce`` in real processes; a gradient tree
all-reduced in one collective; the chief's parameters broadcast; bad leaves refused before the
collective (the group survives); ``import cluster`` does not import JAX."""

from __future__ import annotations

import subprocess
import sys

import numpy as np
import pytest

import cluster
from cluster.testing import run_group
from tests._requires import require
from tests.conftest import REPO

jax = require("jax")
jnp = require("jax.numpy")

import cluster.jax as cluster_jax  # noqa: E402  (needs jax)


def tree_of(rank: int) -> dict:
    """A gradient-like tree whose leaves depend on the rank: mixed dtypes, a 0-d leaf, nesting."""
    return {"dense": {"w": jnp.full((3, 2), rank + 1.0), "b": jnp.arange(2.0) * rank},
            "scale": jnp.float32(rank + 0.5), "steps": jnp.array([rank, 10], jnp.int32),
            "layers": [jnp.ones(4, jnp.bfloat16) * (rank + 1)]}


def as_numpy(tree) -> tuple:
    """(structure, leaf types, leaves as NumPy): what a child sends back to the parent."""
    leaves, treedef = jax.tree_util.tree_flatten(tree)
    return (str(treedef), ["jax" if isinstance(x, jax.Array) else type(x).__name__
                           for x in leaves],
            [np.asarray(x) for x in leaves])


# -- in this process ---------------------------------------------------------------------------

def test_one_worker_gives_back_the_tree_as_jax() -> None:
    tree = {"w": np.ones((2, 2), np.float32), "b": [jnp.zeros(2), 1.5]}
    for strategy in (cluster.get_strategy(), cluster.OneDeviceStrategy("/cpu:0")):
        out = cluster_jax.all_reduce_tree(tree, strategy, op="MEAN")
        assert jax.tree_util.tree_structure(out) == jax.tree_util.tree_structure(tree)
        assert all(isinstance(x, jax.Array) for x in jax.tree_util.tree_leaves(out))
        np.testing.assert_array_equal(out["w"], tree["w"])
        assert out["b"][1] == 1.5 and out["w"].dtype == jnp.float32
        same = cluster_jax.broadcast_tree(tree, strategy)
        assert isinstance(same["w"], jax.Array) and float(same["b"][1]) == 1.5


def test_inside_run_the_tree_is_reduced_over_every_replica() -> None:
    strategy = cluster.MirroredStrategy(["/cpu:0", "/cpu:1"])

    def replica_fn():
        rid = cluster.get_replica_context().replica_id_in_sync_group
        return cluster_jax.all_reduce_tree(tree_of(rid), strategy, op="SUM")

    for out in strategy.experimental_local_results(strategy.run(replica_fn)):
        assert isinstance(out["dense"]["w"], jax.Array)
        np.testing.assert_array_equal(out["dense"]["w"], np.full((3, 2), 3.0))  # 1 + 2
        assert out["steps"].dtype == jnp.int32 and out["steps"].tolist() == [1, 20]
        assert out["layers"][0].dtype == jnp.bfloat16 and out["scale"].shape == ()


def test_inside_run_max_and_min_reach_every_replica() -> None:
    # ReplicaContext.all_reduce takes SUM/MEAN only (as TF); all_reduce_tree offers all four ops.
    strategy = cluster.MirroredStrategy(["/cpu:0", "/cpu:1"])

    def replica_fn(op):
        rid = cluster.get_replica_context().replica_id_in_sync_group
        return cluster_jax.all_reduce_tree({"x": jnp.asarray([rid, -rid], jnp.float32)},
                                           strategy, op=op)

    for op, want in (("MAX", [1.0, 0.0]), ("MIN", [0.0, -1.0])):
        for out in strategy.experimental_local_results(strategy.run(replica_fn, args=(op,))):
            np.testing.assert_array_equal(out["x"], want)


def test_misuse_is_refused_with_what_to_do() -> None:
    mirrored = cluster.MirroredStrategy(["/cpu:0", "/cpu:1"])
    other = cluster.OneDeviceStrategy("/cpu:0")
    with pytest.raises(ValueError, match="another strategy"):
        mirrored.run(lambda: cluster_jax.all_reduce_tree({"a": jnp.ones(1)}, other))
    with pytest.raises(RuntimeError, match="outside strategy.run"):
        mirrored.run(lambda: cluster_jax.broadcast_tree({"a": jnp.ones(1)}, mirrored))
    # One worker refuses what a group would (a bool leaf), so code moves to many unchanged.
    with pytest.raises(TypeError, match="bool"):
        cluster_jax.all_reduce_tree({"mask": jnp.ones(2, bool)}, other)
    with pytest.raises(TypeError, match="strategy"):
        cluster_jax.all_reduce_tree({"a": jnp.ones(1)}, "MEAN")


@pytest.mark.timeout(60)
def test_import_cluster_does_not_import_jax() -> None:
    code = ("import sys, cluster, cluster.optimizers, cluster.checkpoint; "
            "assert 'jax' not in sys.modules, 'jax imported'; "
            "import cluster.jax; assert 'jax' in sys.modules")
    proc = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True,
                          text=True, timeout=50)
    assert proc.returncode == 0, proc.stderr


# -- real processes ----------------------------------------------------------------------------

def _worker(transport, devices: list[str]) -> dict:
    import jax.numpy as jnp

    import cluster
    import cluster.jax as cluster_jax
    from cluster.strategies.multi_worker import MultiWorkerMirroredStrategy

    strategy = MultiWorkerMirroredStrategy._from_transport(transport, devices=devices)
    ext, rank = strategy.extended, transport.rank
    out: dict = {}

    def replica_fn():
        rid = cluster.get_replica_context().replica_id_in_sync_group
        value = jnp.full(3, float(rid + 1))  # global replica ids: 1 + 2 + ... over all of them
        return (cluster.get_replica_context().all_reduce("SUM", value),
                cluster_jax.all_reduce_tree({"v": value}, strategy, op="MEAN"), value)

    summed, tree_mean, per_replica = strategy.run(replica_fn)
    out["ctx"] = [as_numpy(x) for x in strategy.experimental_local_results(summed)]
    out["ctx_tree"] = [as_numpy(x) for x in strategy.experimental_local_results(tree_mean)]
    out["reduce"] = as_numpy(strategy.reduce("SUM", per_replica, axis=None))

    # Outside strategy.run: one tree per worker, one collective for the whole tree.
    before = sum(ext.collective_group.route_counts.values())
    out["tree"] = as_numpy(cluster_jax.all_reduce_tree(tree_of(rank), strategy, op="MEAN"))
    out["collectives"] = sum(ext.collective_group.route_counts.values()) - before
    out["max"] = as_numpy(cluster_jax.all_reduce_tree(tree_of(rank), strategy, op="MAX"))

    # Each worker its own draw; rank 0's wins (float32 and int32 leaves: two buffers).
    params = {"w": jnp.full((2, 3), rank + 0.25), "b": jnp.zeros(3) - rank,
              "count": jnp.array([rank, rank * 2], jnp.int32)}
    out["broadcast"] = as_numpy(cluster_jax.broadcast_tree(params, strategy))

    # A leaf every rank refuses is rejected before the collective: the group lives on.
    try:
        cluster_jax.all_reduce_tree({"mask": jnp.ones(2, bool)}, strategy)
    except TypeError as e:
        out["rejected"] = str(e)
    out["after"] = as_numpy(cluster_jax.all_reduce_tree({"x": jnp.ones(2)}, strategy, "SUM"))
    return out


@pytest.mark.multiprocess
@pytest.mark.timeout(150)
@pytest.mark.parametrize(("workers", "devices"), [(3, 1), (2, 2)], ids=["3x1", "2x2"])
def test_jax_round_trips_and_trees_in_real_processes(workers: int, devices: int) -> None:
    outcomes = run_group(_worker, workers, args=([f"/cpu:{i}" for i in range(devices)],),
                         timeout=120, env={"JAX_PLATFORMS": "cpu"})
    assert all(o.ok for o in outcomes), [(o.error_type, o.error, o.traceback) for o in outcomes]
    replicas = workers * devices
    total = replicas * (replicas + 1) / 2
    ranks = range(workers)
    for o in outcomes:
        out = o.result
        for _, kinds, (leaf,) in out["ctx"]:
            assert kinds == ["jax"] and leaf.tolist() == [total] * 3, out["ctx"]
        for _, kinds, (leaf,) in out["ctx_tree"]:
            assert kinds == ["jax"] and np.allclose(leaf, total / replicas), out["ctx_tree"]
        _, kinds, (reduced,) = out["reduce"]
        assert kinds == ["jax"] and reduced.tolist() == [total] * 3

        structure, kinds, leaves = out["tree"]
        want = jax.tree_util.tree_map(lambda *xs: np.mean(
            np.stack([np.asarray(x, np.float64) for x in xs]), axis=0),
            *[tree_of(r) for r in ranks])
        assert structure == str(jax.tree_util.tree_structure(tree_of(0)))
        assert kinds == ["jax"] * len(leaves) and out["collectives"] == 1
        expected = jax.tree_util.tree_leaves(want)
        dtypes = [np.asarray(x).dtype for x in jax.tree_util.tree_leaves(tree_of(0))]
        for got, exp, dtype in zip(leaves, expected, dtypes, strict=True):
            assert got.dtype == dtype
            if dtype.kind == "i":  # MEAN of integers truncates, as TF's collectives do
                exp = np.trunc(exp)
            np.testing.assert_allclose(np.asarray(got, np.float64), exp, rtol=1e-2)
        _, _, (b_max, w_max, *_) = out["max"]  # leaves in key order: dense/b, dense/w, ...
        assert b_max.tolist() == [0.0, workers - 1.0]
        np.testing.assert_array_equal(w_max, np.full((3, 2), float(workers)))

        _, kinds, (b, count, w) = out["broadcast"]  # leaves in key order: b, count, w
        assert kinds == ["jax"] * 3
        assert b.tolist() == [0.0] * 3 and count.tolist() == [0, 0] and count.dtype == np.int32
        np.testing.assert_array_equal(w, np.full((2, 3), 0.25, np.float32))

        assert "bool" in out["rejected"], out
        assert out["after"][2][0].tolist() == [float(workers)] * 2
    # Bitwise identical on every worker.
    for key in ("tree", "broadcast", "reduce"):
        first = [x.tobytes() for x in outcomes[0].result[key][2]]
        assert all([x.tobytes() for x in o.result[key][2]] == first for o in outcomes), key
