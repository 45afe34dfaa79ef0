"""The one place :mod:`cluster.elastic` talks to a strategy's elastic membership.

A strategy that can change its group offers five methods on ``strategy.extended``
(:class:`cluster._protocols.ElasticExtended`); this module calls them and nothing else in
:mod:`cluster.elastic` does, so their names are written here once. On a strategy that is not
elastic (a local strategy, parameter-server training) :func:`enabled` is False and
:func:`cluster.elastic.run` calls the training function once.
"""

from __future__ import annotations

from typing import Any

from cluster._protocols import ElasticExtended
from cluster.deadline import Deadline

__all__ = ["enabled", "joining", "pending", "regroup"]


def _extended(strategy: Any) -> ElasticExtended:
    return strategy.extended


def enabled(strategy: Any) -> bool:
    """Whether ``strategy`` runs an elastic group (every strategy answers; only an elastic
    ``MultiWorkerMirroredStrategy`` says yes)."""
    return bool(_extended(strategy)._elastic_enabled())


def pending(strategy: Any) -> bool:
    """Whether this task heard of a task waiting to join or gone (local, no collective)."""
    return bool(_extended(strategy)._elastic_pending())


def joining(strategy: Any) -> bool:
    """Whether this task joined a running job and must enter its group first."""
    return bool(_extended(strategy)._elastic_joining())


def regroup(strategy: Any) -> None:
    """Form a new group, within the strategy's regroup timeout (one deadline for all of it).

    Raises ``cluster.errors.ElasticGroupError`` when the run cannot go on (fewer tasks than
    the minimum are left, naming who is gone)."""
    extended = _extended(strategy)
    extended._elastic_regroup(Deadline.after(extended._elastic_regroup_timeout()))
