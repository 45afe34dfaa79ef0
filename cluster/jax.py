"""``cluster.jax``: JAX pytrees through a strategy's collectives, one packed call per tree.

Imported only when used (``import cluster`` never imports JAX; ``import cluster.jax`` does).

- :func:`all_reduce_tree` all-reduces every leaf of a pytree (a gradient tree from ``jax.grad``)
  in **one** fused collective (``all_reduce_many``: the leaves travel in packs of
  ``bytes_per_pack``) and returns the same tree structure of ``jax.Array`` leaves.
- :func:`broadcast_tree` gives every worker rank 0's pytree (initial parameters drawn from
  different seeds become one model), one broadcast per dtype in the tree.

Where they run (``strategy`` defaults to ``cluster.get_strategy()``):

- **Outside** ``strategy.run`` (the usual JAX loop, one replica per process under
  ``MultiWorkerMirroredStrategy``): each worker passes one tree; the op runs over the workers
  through ``strategy.extended.collective_group``. ``MEAN`` divides by ``num_workers``.
- **Inside** ``strategy.run`` (:func:`all_reduce_tree` only): each replica passes its tree and the
  op runs over every replica of every worker through ``ReplicaContext.all_reduce``, as TF does.

Every worker must make the same calls, in the same order, with trees of the same structure,
shapes and dtypes (the group's contract; a mismatch raises ``CollectiveMismatchError``).

>>> import jax.numpy as jnp, cluster, cluster.jax
>>> grads = {"w": jnp.ones((2, 2)), "b": jnp.zeros(2)}
>>> cluster.jax.all_reduce_tree(grads, cluster.get_strategy())["w"].shape
(2, 2)
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from cluster import _context
from cluster._family import to_array
from cluster.collectives.ops import ReduceOp, check_reducible
from cluster.collectives.options import CommunicationOptions
from cluster.strategies.replica import all_reduce_any_op

__all__ = ["all_reduce_tree", "broadcast_tree"]


def all_reduce_tree(tree: Any, strategy: Any = None, op: ReduceOp | str = ReduceOp.MEAN, *,
                    options: CommunicationOptions | None = None) -> Any:
    """``op`` (SUM, MEAN, MAX, MIN) of every leaf of ``tree``, in one collective.

    Returns a pytree of the same structure (``jax.tree_util``) whose leaves are ``jax.Array``
    in each leaf's dtype (as ``jax.numpy.asarray`` makes them), bitwise identical on every
    worker. Leaves may be JAX or NumPy arrays or Python numbers. Inputs are not modified. See
    the module docstring for where the op runs and what ``MEAN`` divides by.

    Raises:
      TypeError/ValueError: a leaf the collectives refuse (bool, complex, an object); rejected on
        every rank before the collective, so the group stays usable.
      ValueError: outside ``strategy.run`` of a strategy with several workers and no collective
        group (``ParameterServerStrategy``).
      CollectiveMismatchError / CollectiveTimeoutError / PeerUnavailableError: from the group.
    """
    strategy = _strategy(strategy, "all_reduce_tree")
    parsed = ReduceOp.parse(op)
    leaves, treedef = jax.tree_util.tree_flatten(tree)
    if not leaves:
        return tree
    replica = _in_run(strategy, "all_reduce_tree")
    if replica is not None:
        # Inside strategy.run: one fused batch over every replica of every worker (the
        # strategy's own call, so its order with the strategy's other collectives is kept).
        reduced = all_reduce_any_op(replica, parsed, list(leaves), options=options)
    else:
        group = _group(strategy, "all_reduce_tree")
        if group is None:  # one worker: each leaf is already the op over the workers
            for leaf in leaves:  # but refuse what a group would, so one worker behaves as many
                check_reducible(to_array(leaf, "all_reduce_tree")[0].dtype, "all_reduce_tree")
            reduced = leaves
        else:
            reduced = group.all_reduce_many(list(leaves), parsed, options=options)
    return jax.tree_util.tree_unflatten(treedef, [jnp.asarray(r) for r in reduced])


def broadcast_tree(tree: Any, strategy: Any = None, *, root: int = 0,
                   options: CommunicationOptions | None = None) -> Any:
    """Worker ``root``'s ``tree`` on every worker (call it outside ``strategy.run``).

    Other workers' trees give only structure, shapes and dtypes. The leaves are packed into one
    host buffer per dtype, so a model's parameters cost one broadcast (two for a mixed
    float/int tree). Returns a pytree of the same structure with ``jax.Array`` leaves; with a
    single worker, the tree's leaves as ``jax.Array`` (no collective).

    Raises:
      RuntimeError: called inside ``strategy.run`` (replicas of one worker would each
        broadcast: do it once, before training).
      ValueError: a strategy with several workers and no collective group, or a bad ``root``.
      TypeError: a leaf that is not an array or a number.
    """
    strategy = _strategy(strategy, "broadcast_tree")
    if _in_run(strategy, "broadcast_tree") is not None:
        raise RuntimeError("broadcast_tree: call it outside strategy.run, once on every worker "
                           "(e.g. right after initialising the parameters)")
    leaves, treedef = jax.tree_util.tree_flatten(tree)
    group = _group(strategy, "broadcast_tree")
    if group is None or not leaves:
        return jax.tree_util.tree_unflatten(treedef, [jnp.asarray(leaf) for leaf in leaves])
    hosts = [_host_array(leaf, i) for i, leaf in enumerate(leaves)]
    out: list[Any] = [None] * len(hosts)
    # One buffer per dtype, in order of first appearance (the same on every worker, since the
    # trees agree): fewer, larger messages than a broadcast per leaf.
    by_dtype: dict[np.dtype, list[int]] = {}
    for index, array in enumerate(hosts):
        by_dtype.setdefault(array.dtype, []).append(index)
    for dtype, indices in by_dtype.items():
        packed = np.concatenate([hosts[i].reshape(-1) for i in indices]) if len(indices) > 1 \
            else hosts[indices[0]].reshape(-1)
        received = np.asarray(group.broadcast(packed, root, options=options), dtype=dtype)
        offset = 0
        for i in indices:
            size = hosts[i].size
            out[i] = jnp.asarray(received[offset:offset + size].reshape(hosts[i].shape))
            offset += size
    return jax.tree_util.tree_unflatten(treedef, out)


def _strategy(strategy: Any, what: str) -> Any:
    if strategy is None:
        return _context.get_strategy()
    if not hasattr(strategy, "extended") or not hasattr(strategy.extended, "num_workers"):
        raise TypeError(f"{what}: strategy must be a cluster strategy, got "
                        f"{type(strategy).__name__}")
    return strategy


def _in_run(strategy: Any, what: str) -> Any:
    """The replica context when called inside ``strategy.run``, else ``None``."""
    replica = _context.get_replica_context()
    if replica is None or _context.in_default_context():
        return None
    if _context.current_frame().strategy is not strategy:
        raise ValueError(f"{what}: called inside {_context.describe(_context.get_strategy())}'s "
                         f"run with another strategy, {_context.describe(strategy)}; pass the "
                         "strategy that runs this function (or none)")
    return replica


def _group(strategy: Any, what: str) -> Any:
    """The group to use across workers, or ``None`` when there is a single worker."""
    ext = strategy.extended
    if ext.num_workers == 1:
        return None
    group = ext.collective_group
    if group is None:
        raise ValueError(
            f"{what}: {type(strategy).__name__} has {ext.num_workers} workers but no collective "
            "group (ParameterServerStrategy trains through its variables: use "
            "cluster.optimizers with cluster.Variable instead)")
    return group


def _host_array(leaf: Any, index: int) -> np.ndarray:
    try:
        array = np.asarray(leaf)  # a JAX CPU array: read without a copy where JAX allows
    except (TypeError, ValueError) as e:
        raise TypeError(f"broadcast_tree: leaf {index} is a {type(leaf).__name__}, not an "
                        "array or a number") from e
    if array.dtype.kind in "OUSV":
        raise TypeError(f"broadcast_tree: leaf {index} has dtype {array.dtype}; the leaves "
                        "must be numeric arrays")
    if array.dtype == np.float64 and not isinstance(leaf, np.ndarray | np.generic | jax.Array):
        array = array.astype(np.float32)  # a Python float: float32, as JAX (without x64) has it
    return array
