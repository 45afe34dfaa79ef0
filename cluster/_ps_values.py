"""The parameter server's value types: below its store, its client and the optimizers.

:mod:`cluster.ps.store` (the server's state machine), :mod:`cluster.transport.ps_client` (the
client) and :mod:`cluster.optimizers` all speak them, so none of the latter two imports the
server's store. :mod:`cluster.ps` re-exports them as its public surface.

- :class:`AssignMode`: how an assign combines the value (numbers match ``proto/ps.proto``).
- :class:`OptimizerSpec`: the update rule (Keras' SGD or Adam) a server applies to pushes.
- :class:`Pulled`: one variable a pull returns, with its version.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass
from typing import Any, NamedTuple

import numpy as np

from cluster._update_rules import check_rate

__all__ = ["AssignMode", "OptimizerSpec", "Pulled"]


class AssignMode(enum.IntEnum):
    """How :meth:`cluster.ps.store.VariableStore.assign` combines the value (numbers match
    ``proto/ps.proto``)."""

    ASSIGN = 0
    ASSIGN_ADD = 1
    ASSIGN_SUB = 2


@dataclass(frozen=True)
class OptimizerSpec:
    """The optimizer a parameter server applies to pushed gradients: Keras' SGD or Adam.

    Build with :meth:`sgd`, :meth:`adam` or :meth:`from_optimizer`; validated at construction.
    Adam's step count ``t`` is per variable: the number of optimizer updates applied to it, which
    equals Keras' ``optimizer.iterations`` when every step updates every variable.
    """

    rule: str  # "sgd" or "adam"
    learning_rate: float
    momentum: float = 0.0
    nesterov: bool = False
    beta_1: float = 0.9
    beta_2: float = 0.999
    epsilon: float = 1e-07

    def __post_init__(self) -> None:
        if self.rule not in ("sgd", "adam"):
            raise ValueError(f"optimizer rule must be 'sgd' or 'adam', got {self.rule!r}")
        check_rate("learning_rate", self.learning_rate)
        check_rate("momentum", self.momentum, high=1.0)
        check_rate("beta_1", self.beta_1, high=1.0)
        check_rate("beta_2", self.beta_2, high=1.0)
        check_rate("epsilon", self.epsilon)

    @classmethod
    def sgd(cls, learning_rate: float = 0.01, momentum: float = 0.0,
            nesterov: bool = False) -> OptimizerSpec:
        return cls("sgd", float(learning_rate), momentum=float(momentum),
                   nesterov=bool(nesterov))

    @classmethod
    def adam(cls, learning_rate: float = 0.001, beta_1: float = 0.9, beta_2: float = 0.999,
             epsilon: float = 1e-07) -> OptimizerSpec:
        return cls("adam", float(learning_rate), beta_1=float(beta_1), beta_2=float(beta_2),
                   epsilon=float(epsilon))

    @classmethod
    def from_optimizer(cls, optimizer: Any) -> OptimizerSpec:
        """The spec of a :class:`cluster.optimizers.SGD` or ``Adam`` (same hyper-parameters):
        each optimizer describes its own rule (``_update_rule``), so the store never imports
        the optimizers. Raises ``TypeError`` for an optimizer without one."""
        try:
            spec = optimizer._update_rule()
        except AttributeError:
            spec = None
        if not isinstance(spec, OptimizerSpec):
            raise TypeError(f"no parameter-server rule for optimizer {type(optimizer).__name__}")
        return spec

    @property
    def slot_names(self) -> tuple[str, ...]:
        if self.rule == "adam":
            return ("m", "v")
        return ("momentum",) if self.momentum else ()


class Pulled(NamedTuple):
    """One variable returned by :meth:`cluster.ps.store.VariableStore.pull`: ``value`` is a
    private copy."""

    name: str
    version: int
    value: np.ndarray
