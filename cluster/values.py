"""Distributed values: one component per local replica (``tf.distribute.DistributedValues``).

- :class:`PerReplica`: components that may differ (a batch shard, a loss, a gradient).
- :class:`Mirrored`: components known to be identical (the result of an all-reduce).

Both hold the *local* replicas' components only, in local replica order; the replicas of other
worker processes hold theirs. ``strategy.experimental_local_results(value)`` returns them.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from cluster import _nest

__all__ = ["DistributedValues", "Mirrored", "PerReplica", "regroup", "select_replica"]


class DistributedValues:
    """Base class: a tuple of per-replica components (``.values``)."""

    def __init__(self, values: Sequence[Any]) -> None:
        values = tuple(values)
        if not values:
            raise ValueError(f"{type(self).__name__} needs at least one component")
        self._values = values

    @property
    def values(self) -> tuple[Any, ...]:
        return self._values

    def __len__(self) -> int:
        return len(self._values)

    def _select(self, replica_index: int) -> Any:
        """What local replica ``replica_index`` sees of this value: its component."""
        return self._values[replica_index]

    def __repr__(self) -> str:
        inner = ",\n".join(f"  {i}: {v!r}" for i, v in enumerate(self._values))
        return f"{type(self).__name__}:{{\n{inner}\n}}"


class PerReplica(DistributedValues):
    """Components that may differ between replicas."""


class Mirrored(DistributedValues):
    """Components that are identical on every replica."""


def select_replica(replica_index: int, structure: Any) -> Any:
    """``structure`` as local replica ``replica_index`` sees it: each DistributedValues becomes
    what :meth:`DistributedValues._select` gives (its component; a distributed variable stays
    itself, as it picks its component when read); plain values pass through."""

    def pick(leaf: Any) -> Any:
        return leaf._select(replica_index) if isinstance(leaf, DistributedValues) else leaf

    return _nest.map_structure(pick, structure)


def check_component_counts(structure: Any, num_replicas: int, what: str) -> None:
    """Raise ``ValueError`` unless every DistributedValues in ``structure`` has one component per
    local replica (values from another strategy, or with another replica count, are refused)."""
    for leaf in _nest.flatten(structure):
        if isinstance(leaf, DistributedValues) and len(leaf.values) != num_replicas:
            raise ValueError(
                f"{what}: a {type(leaf).__name__} with {len(leaf.values)} components was passed "
                f"to a strategy with {num_replicas} local replicas. Distributed values must come "
                "from this strategy (its run, or experimental_distribute_dataset)"
            )


def regroup(per_replica: Sequence[Any], what: str = "values returned by the replicas") -> Any:
    """Turn one nest per replica into one nest of :class:`PerReplica` leaves (TF's ``regroup``).

    A leaf that is the very same object on every replica (a variable, the result of a merge_call)
    stays that object. One replica: its nest is returned unchanged.
    """
    if len(per_replica) == 1:
        return per_replica[0]
    first = per_replica[0]
    for other in per_replica[1:]:
        _nest.assert_same_structure(first, other, what)
    flats = [_nest.flatten(nest) for nest in per_replica]
    leaves = []
    for components in zip(*flats, strict=True):
        if all(c is components[0] for c in components[1:]):
            leaves.append(components[0])
        else:
            leaves.append(PerReplica(components))
    return _nest.pack_sequence_as(first, leaves)
