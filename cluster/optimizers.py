"""``cluster.optimizers``: SGD and Adam with Keras' update rules, strategy-aware.

``apply_gradients(grads_and_vars)`` called in a replica context (inside ``strategy.run``) sums
the gradients over every replica of every worker, fused into ``bytes_per_pack`` packs in one
collective, and applies the same update to every replica's copy of each variable, as Keras does
under a ``tf.distribute`` strategy. Scale the loss by the *global* batch size yourself (as with
Keras custom loops) so the summed gradient is the global mean.

Slots (momentum, Adam's moments) are variables of the same strategy, created on first use.
Under ``ParameterServerStrategy`` the gradients are pushed to the parameter servers instead,
which apply the same rule there, next to the slots they keep.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

import numpy as np

from cluster import _context
from cluster._family import family_of, is_cupy, xp_of
from cluster._ps_values import OptimizerSpec
from cluster._update_rules import adam_update, sgd_update
from cluster._update_rules import check_rate as _check_rate
from cluster.collectives.epilogue import AddScaled
from cluster.strategies import DistributedVariable
from cluster.values import Mirrored
from cluster.variables import Variable

__all__ = ["SGD", "Adam", "Optimizer"]


class Optimizer:
    """Base class: gradient aggregation across replicas and slot bookkeeping."""

    def __init__(self, learning_rate: float, name: str) -> None:
        self.learning_rate = _check_rate("learning_rate", learning_rate)
        self.name = name
        self.iterations = 0
        self._slots: dict[int, dict[str, Variable]] = {}
        self._strategy: Any = None

    def apply_gradients(self, grads_and_vars: Iterable[tuple[Any, Variable]],
                        name: str | None = None,
                        experimental_aggregate_gradients: bool = True) -> int:
        """Apply one update; returns the new iteration count.

        In replica context the gradients are summed across replicas first (unless
        ``experimental_aggregate_gradients=False``, for gradients you already all-reduced).
        Pairs whose gradient is ``None`` are skipped, as Keras does.
        """
        pairs = [(g, v) for g, v in grads_and_vars if g is not None]
        for _, variable in pairs:
            if not isinstance(variable, Variable):
                raise TypeError(f"apply_gradients: expected (gradient, Variable) pairs, got "
                                f"{type(variable).__name__} as a variable")
        if not pairs:
            raise ValueError("apply_gradients: no gradients provided for any variable")
        owner = pairs[0][1]._distribute_strategy
        if owner is None:  # a plain variable: no strategy decides, apply in this context
            return self._apply_in_replica_context(pairs, experimental_aggregate_gradients)
        # The variables' strategy decides where the update happens (here, or on the parameter
        # servers for ParameterServerStrategy's variables).
        return owner.extended.apply_gradients(self, pairs, experimental_aggregate_gradients)

    def _apply_in_replica_context(self, pairs: list[tuple[Any, Variable]],
                                  aggregate: bool) -> int:
        """One update, run once for all replicas of the current replica context (merge_call);
        ``RuntimeError`` in cross-replica context."""
        context = _context.get_replica_context()
        if context is None:
            raise RuntimeError(
                "apply_gradients() cannot be called in cross-replica context; call it inside "
                "strategy.run(step_fn)"
            )
        return context.merge_call(self._distributed_apply, args=(pairs, aggregate))

    def _distributed_apply(self, strategy: Any, pairs: list, aggregate: bool) -> int:
        self._check_strategy(strategy, [v for _, v in pairs])
        fused = self._fused_update()
        if aggregate and not _context.is_default(strategy) and fused is not None \
                and strategy.extended.reduce_and_update(pairs, fused):
            self.iterations += 1  # the update ran inside the reduction, once per element
            return self.iterations
        grads = [g for g, _ in pairs]
        if aggregate and not _context.is_default(strategy):
            grads = strategy.extended.batch_reduce_to("SUM", [(g, v) for g, v in pairs])
        self.iterations += 1
        for grad, variable in zip(grads, (v for _, v in pairs), strict=True):
            slots = self._slots_for(strategy, variable)
            strategy.extended.update(variable, self._update_component,
                                     args=(grad, slots), group=False)
        return self.iterations

    def _check_strategy(self, strategy: Any, variables: list[Variable]) -> None:
        for variable in variables:
            owner = variable._distribute_strategy
            if owner is not None and owner is not strategy:
                raise ValueError(
                    f"{self.name}: variable {variable.name} was created under the scope of "
                    f"{_context.describe(owner)} but is updated under "
                    f"{_context.describe(strategy)}; create the variables under the same "
                    "strategy's scope that runs the step"
                )
            if owner is None and not _context.is_default(strategy) \
                    and strategy.num_replicas_in_sync > 1:
                raise ValueError(
                    f"{self.name}: variable {variable.name} was created outside "
                    f"{_context.describe(strategy)}'s scope; create it under strategy.scope()"
                )
        if self._strategy is None:
            self._strategy = strategy
        elif self._strategy is not strategy:
            raise ValueError(
                f"{self.name} was first used under {_context.describe(self._strategy)} and now "
                f"under {_context.describe(strategy)}; create one optimizer per strategy"
            )

    def _slots_for(self, strategy: Any, variable: Variable) -> dict[str, Any]:
        slots = self._slots.get(id(variable))
        if slots is None:
            slots = {}
            for slot in self._slot_names():
                slots[slot] = self._make_slot(strategy, variable, slot)
            self._slots[id(variable)] = slots
        if isinstance(variable, DistributedVariable):
            # Per component: update() passes the i-th component of each Mirrored value.
            return {k: (Mirrored(s.values) if isinstance(s, DistributedVariable) else s)
                    for k, s in slots.items()}
        return slots

    def _make_slot(self, strategy: Any, variable: Variable, slot: str) -> Variable:
        zeros = xp_of(variable.value()).zeros(variable.shape, variable.dtype)
        name = f"{variable.name.split(':')[0]}/{slot}"
        if _context.is_default(strategy) or not isinstance(variable, DistributedVariable):
            return Variable(zeros, trainable=False, name=name)
        with strategy.scope():
            # Zeros are the same everywhere: no broadcast needed.
            return strategy.extended.create_variable(zeros, trainable=False, name=name,
                                                     broadcast=False)

    def get_slot(self, variable: Variable, slot_name: str) -> Variable:
        """The slot ``slot_name`` of ``variable`` (``KeyError`` before the first update)."""
        return self._slots[id(variable)][slot_name]

    def _slot_names(self) -> tuple[str, ...]:
        return ()

    def _fused_update(self) -> Callable[[np.ndarray, np.ndarray], None] | None:
        """The update as an elementwise rule on one flat part of a variable and its summed
        gradient, with no slots, that a reduction may fuse (see
        :mod:`cluster.collectives.epilogue`); ``None`` when this optimizer has none."""
        return None

    def _update_rule(self) -> OptimizerSpec:
        """This optimizer's rule as a parameter server applies it (``TypeError`` if none)."""
        raise TypeError(f"no parameter-server rule for optimizer {type(self).__name__}")

    def _update_component(self, variable: Variable, grad: Any, slots: dict[str, Any]) -> None:
        raise NotImplementedError


def _grad_array(variable: Variable, grad: Any) -> Any:
    """``grad`` as an array on ``variable``'s device, of its dtype (``ValueError`` for another
    shape). Under a strategy it is already the ops' result on that device; outside one, the
    user's value, whose family is decided here."""
    array, family = family_of(grad)
    value = variable._read()
    if is_cupy(value) and not family.on_gpu:
        with value.device:
            array = xp_of(value).asarray(array)
    if tuple(array.shape) != tuple(value.shape):
        raise ValueError(f"gradient of shape {tuple(array.shape)} for variable {variable.name} "
                         f"of shape {tuple(value.shape)}")
    return array.astype(value.dtype, copy=False)


class SGD(Optimizer):
    """Gradient descent with optional (Nesterov) momentum, Keras' rule:

    ``m = momentum * m - lr * g``; ``w += m`` (Nesterov: ``w += momentum * m - lr * g``);
    without momentum ``w -= lr * g``.
    """

    def __init__(self, learning_rate: float = 0.01, momentum: float = 0.0,
                 nesterov: bool = False, name: str = "SGD") -> None:
        super().__init__(learning_rate, name)
        self.momentum = _check_rate("momentum", momentum, high=1.0)
        self.nesterov = bool(nesterov)

    def _slot_names(self) -> tuple[str, ...]:
        return ("momentum",) if self.momentum else ()

    def _fused_update(self) -> Callable[[np.ndarray, np.ndarray], None] | None:
        if self.momentum:
            return None  # a slot per element: every rank must update its own copy
        return AddScaled(-self.learning_rate)  # Keras' w -= lr * g, bitwise

    def _update_rule(self) -> OptimizerSpec:
        return OptimizerSpec.sgd(self.learning_rate, self.momentum, self.nesterov)

    def _update_component(self, variable: Variable, grad: Any, slots: dict[str, Any]) -> None:
        value = variable._read()
        grad = _grad_array(variable, grad)
        m = slots["momentum"]._read() if self.momentum else None
        sgd_update(value, grad, m, learning_rate=self.learning_rate, momentum=self.momentum,
                   nesterov=self.nesterov)


class Adam(Optimizer):
    """Adam, Keras' rule (``epsilon`` added to ``sqrt(v)``, bias correction folded into the rate):

    ``m += (g - m) * (1 - beta_1)``; ``v += (g^2 - v) * (1 - beta_2)``;
    ``w -= lr * sqrt(1 - beta_2^t) / (1 - beta_1^t) * m / (sqrt(v) + epsilon)``.
    """

    def __init__(self, learning_rate: float = 0.001, beta_1: float = 0.9, beta_2: float = 0.999,
                 epsilon: float = 1e-07, name: str = "Adam") -> None:
        super().__init__(learning_rate, name)
        self.beta_1 = _check_rate("beta_1", beta_1, high=1.0)
        self.beta_2 = _check_rate("beta_2", beta_2, high=1.0)
        self.epsilon = _check_rate("epsilon", epsilon)

    def _slot_names(self) -> tuple[str, ...]:
        return ("m", "v")

    def _update_rule(self) -> OptimizerSpec:
        return OptimizerSpec.adam(self.learning_rate, self.beta_1, self.beta_2, self.epsilon)

    def _update_component(self, variable: Variable, grad: Any, slots: dict[str, Any]) -> None:
        value = variable._read()
        grad = _grad_array(variable, grad)
        adam_update(value, grad, slots["m"]._read(), slots["v"]._read(),
                    learning_rate=self.learning_rate, beta_1=self.beta_1, beta_2=self.beta_2,
                    epsilon=self.epsilon, iteration=self.iterations, xp=xp_of(value))


# Checkpoints read and create an optimizer's slots through these (not exported): the slot table
# and the subclasses' slot names stay private to this module.


def slot_names(optimizer: Optimizer) -> tuple[str, ...]:
    """The names of the slots ``optimizer`` keeps per variable (``()``: none)."""
    return optimizer._slot_names()


def slot_table(optimizer: Optimizer) -> dict[int, dict[str, Variable]]:
    """``optimizer``'s slots made so far, by ``id`` of their variable (read it, do not change
    it)."""
    return optimizer._slots


def slots_of(optimizer: Optimizer, variable: Variable) -> dict[str, Variable]:
    """``variable``'s slots in ``optimizer`` by name, made (zeros, under the variable's strategy,
    else the current one) when it has none yet, e.g. on a restore before the first step."""
    if id(variable) not in optimizer._slots:
        strategy = variable._distribute_strategy or _context.get_strategy()
        optimizer._slots_for(strategy, variable)
    return optimizer._slots[id(variable)]
