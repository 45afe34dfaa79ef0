"""The one place :mod:`cluster.elastic` talks to a strategy's elastic membership.

A strategy that can change its group offers five methods on ``strategy.extended``
(:class:`ElasticExtended`); this module calls them and nothing else does, so their names are
written here once. A strategy without them (a local strategy, parameter-server training) is
not elastic: :func:`enabled` is False and :func:`cluster.elastic.run` calls the training
function once.
"""

from __future__ import annotations

from typing import Any, Protocol

from cluster.deadline import Deadline

__all__ = ["ElasticExtended", "enabled", "joining", "pending", "regroup"]


class ElasticExtended(Protocol):
    """What an elastic strategy's ``extended`` provides.

    - ``_elastic_enabled()``: whether the group may change (an elastic launch, e.g.
      ``CLUSTER_ELASTIC=MIN:MAX``).
    - ``_elastic_pending()``: local, without a collective: this task heard that a task waits to
      join or has left.
    - ``_elastic_joining()``: this task joined a running job and is not in its group yet.
    - ``_elastic_regroup(deadline)``: blocks until a new group is formed (or raises, e.g. below
      the minimum); afterwards ``num_replicas_in_sync``, replica ids and collectives are the
      new group's.
    - ``_elastic_regroup_timeout()``: seconds a regroup may take.
    """

    def _elastic_enabled(self) -> bool: ...

    def _elastic_pending(self) -> bool: ...

    def _elastic_joining(self) -> bool: ...

    def _elastic_regroup(self, deadline: Deadline) -> None: ...

    def _elastic_regroup_timeout(self) -> float: ...


def _extended(strategy: Any) -> ElasticExtended:
    return strategy.extended


def enabled(strategy: Any) -> bool:
    """Whether ``strategy`` runs an elastic group (False for strategies that cannot)."""
    probe = getattr(strategy.extended, "_elastic_enabled", None)
    return bool(probe()) if probe is not None else False


def pending(strategy: Any) -> bool:
    """Whether this task heard of a task waiting to join or gone (local, no collective)."""
    return bool(_extended(strategy)._elastic_pending())


def joining(strategy: Any) -> bool:
    """Whether this task joined a running job and must enter its group first."""
    return bool(_extended(strategy)._elastic_joining())


def regroup(strategy: Any) -> None:
    """Form a new group, within the strategy's regroup timeout (one deadline for all of it)."""
    extended = _extended(strategy)
    extended._elastic_regroup(Deadline.after(extended._elastic_regroup_timeout()))
