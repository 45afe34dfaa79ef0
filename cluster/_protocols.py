"""The cross-module protocols whose member names are private on purpose.

A few contracts between modules are spelled with private names because the objects that carry
them are user-facing and mirror TensorFlow or Keras: a ``cluster.Variable`` has ``tf.Variable``'s
public surface and no more, an optimizer has Keras', and the checkpoint hooks follow TF's
``Trackable``, whose hooks are private too. Each such contract is declared here, once, with what
implementers and callers may rely on; ``tests/test_private_names.py`` lets any module use the
names these classes declare, and no other private name of another module.

This module imports nothing from the package at run time, so every layer (the context, the
variables, the strategies, the checkpoints) can name these types.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    import numpy as np

    from cluster._ps_values import OptimizerSpec
    from cluster.checkpoint._trackables import Entry
    from cluster.strategies.base import Strategy

__all__ = ["ElasticExtended", "ExternalTrackable", "RawVariable", "StrategyDrivenOptimizer"]


class RawVariable(Protocol):
    """The raw-array side of every variable (``cluster.Variable``, its distributed and
    parameter-server variants, their components).

    Implemented by :mod:`cluster.variables`, :mod:`cluster.strategies._variables` and
    :mod:`cluster.strategies._ps_variables`; used by the optimizers (in-place updates), the
    strategies' ``extended`` (reductions, updates) and the checkpoints (saving without a copy).
    """

    @property
    def _distribute_strategy(self) -> Strategy | None:
        """The strategy the variable was created under (``None``: a plain variable). TF's
        attribute name, which code written for ``tf.distribute`` may read."""

    def _read(self) -> Any:
        """The value as an array (NumPy or CuPy). A plain variable (or a component) gives its
        live buffer, not a copy: an in-place update of it updates the variable, which is how
        the optimizers apply their rules. A distributed variable gives the current replica's
        component's (in cross-replica context the first; a sync-on-read variable there its
        aggregate, a new array); a parameter-server variable its pulled value."""

    def _write(self, value: Any) -> None:
        """Copy ``value`` (of the variable's shape) into the variable: in place for a plain
        variable or a component (cast to its dtype), an assign on the parameter servers for a
        parameter-server variable. Distributed variables refuse it: write their components."""


class ExternalTrackable(Protocol):
    """An object :class:`cluster.checkpoint.Checkpoint` saves by asking it (e.g.
    ``cluster.torch.StateDict``), recognised by having both hooks.

    Tensor names are the object's path in the checkpoint's nest, ``/``, then a name of its own.
    """

    @property
    def _distribute_strategy(self) -> Strategy | None:
        """The strategy whose chief writes the checkpoint (``None``: every task writes its own),
        as for a variable."""

    def _checkpoint_save(self, path: str) -> list[Entry]:
        """The entries to save, named ``path/...``; their ``read`` may return live state."""

    def _checkpoint_restore(self, path: str, saved: dict[str, np.ndarray]) -> list[Entry]:
        """The entries to restore from ``saved`` (the checkpoint's tensors under ``path/``, the
        prefix removed); ``ValueError`` for a tensor it cannot take. Nothing changes until the
        checkpoint applies every entry of every object."""


class StrategyDrivenOptimizer(Protocol):
    """What a strategy calls back on an optimizer (:class:`cluster.optimizers.Optimizer`) from
    below it: the strategies and the parameter-server values cannot import the optimizers, which
    import them.
    """

    def _apply_in_replica_context(self, pairs: Sequence[tuple[Any, Any]],
                                  aggregate: bool) -> int:
        """Apply one update to ``(gradient, variable)`` pairs in the current replica context,
        summing the gradients over every replica first when ``aggregate``; the new iteration
        count. ``RuntimeError`` in cross-replica context."""

    def _update_rule(self) -> OptimizerSpec:
        """The optimizer's rule as a parameter server applies it; ``TypeError`` when it has
        none."""


class ElasticExtended(Protocol):
    """What ``cluster.elastic`` asks of a strategy's ``extended`` (every strategy's answers
    ``_elastic_enabled``; an elastic ``MultiWorkerMirroredStrategy``'s,
    :mod:`cluster.strategies._elastic`, answers all of them). ``strategy.extended`` mirrors
    TF's ``StrategyExtended``, so these stay private-looking.
    """

    def _elastic_enabled(self) -> bool:
        """Whether the group can re-form (``CLUSTER_ELASTIC``)."""
        ...

    def _elastic_pending(self) -> bool:
        """Local, no collective: this task heard that a task waits to join, or left."""
        ...

    def _elastic_joining(self) -> bool:
        """This task started while the group was running and is not in it yet."""
        ...

    def _elastic_regroup(self, deadline: Any) -> None:
        """Block until the next generation of the group formed, by ``deadline`` (a
        :class:`~cluster.deadline.Deadline`); afterwards ``num_replicas_in_sync``, replica ids
        and collectives are the new group's. Raises ``ElasticGroupError`` when the run cannot
        go on (fewer than the minimum left, naming who is gone)."""
        ...

    def _elastic_regroup_timeout(self) -> float:
        """Seconds a regroup may take."""
        ...
