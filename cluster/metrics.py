"""``cluster.metrics``: Mean, Sum and Accuracy, whose state is sync-on-read.

Created under a strategy's scope, a metric's state variables are sync-on-read with SUM
aggregation: ``update_state`` inside ``strategy.run`` touches only that replica's copy, and
``result()`` in cross-replica context sums every replica of every worker (one collective, so in
a multi-worker job every worker must call it), exactly as Keras metrics behave under
``tf.distribute``.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from cluster._family import to_array, xp_of
from cluster.variables import Variable, VariableAggregation, VariableSynchronization

__all__ = ["Accuracy", "Mean", "Metric", "Sum"]


def _host(value: Any) -> np.ndarray:
    array, _ = to_array(value)
    return array.get() if xp_of(array) is not np else np.asarray(array)


class Metric:
    """Base class: state variables, ``reset_state``, ``result``."""

    def __init__(self, name: str, dtype: Any = "float32") -> None:
        self.name = name
        self.dtype = np.dtype(dtype)
        self._state: list[Variable] = []

    def _add_state(self, name: str) -> Variable:
        variable = Variable(np.zeros((), self.dtype), name=f"{self.name}/{name}",
                            trainable=False,
                            synchronization=VariableSynchronization.ON_READ,
                            aggregation=VariableAggregation.SUM)
        self._state.append(variable)
        return variable

    def reset_state(self) -> None:
        """Zero every state variable (on every replica)."""
        for variable in self._state:
            variable.assign(np.zeros((), self.dtype))

    def update_state(self, *args: Any, **kwargs: Any) -> None:
        raise NotImplementedError

    def result(self) -> np.ndarray:
        raise NotImplementedError

    def __call__(self, *args: Any, **kwargs: Any) -> np.ndarray:
        self.update_state(*args, **kwargs)
        return self.result()


class Sum(Metric):
    """The (weighted) sum of every value seen."""

    def __init__(self, name: str = "sum", dtype: Any = "float32") -> None:
        super().__init__(name, dtype)
        self.total = self._add_state("total")

    def update_state(self, values: Any, sample_weight: Any = None) -> None:
        values = _host(values).astype(self.dtype)
        if sample_weight is not None:
            values = values * np.broadcast_to(_host(sample_weight).astype(self.dtype),
                                              values.shape)
        self.total.assign_add(values.sum(dtype=self.dtype))

    def result(self) -> np.ndarray:
        return np.asarray(_host(self.total.value()), self.dtype)[()]


class Mean(Metric):
    """The (weighted) mean of every value seen: total / count."""

    def __init__(self, name: str = "mean", dtype: Any = "float32") -> None:
        super().__init__(name, dtype)
        self.total = self._add_state("total")
        self.count = self._add_state("count")

    def update_state(self, values: Any, sample_weight: Any = None) -> None:
        values = _host(values).astype(self.dtype)
        if sample_weight is None:
            weights = np.ones_like(values)
        else:
            weights = np.broadcast_to(_host(sample_weight).astype(self.dtype), values.shape)
        self.total.assign_add((values * weights).sum(dtype=self.dtype))
        self.count.assign_add(weights.sum(dtype=self.dtype))

    def result(self) -> np.ndarray:
        total = _host(self.total.value())
        count = _host(self.count.value())
        # Keras' divide_no_nan: an empty metric reads 0.
        return (total / count if count else np.zeros((), self.dtype)).astype(self.dtype)[()]


class Accuracy(Mean):
    """How often predictions equal labels (``keras.metrics.Accuracy``: exact equality)."""

    def __init__(self, name: str = "accuracy", dtype: Any = "float32") -> None:
        super().__init__(name, dtype)

    def update_state(self, y_true: Any, y_pred: Any, sample_weight: Any = None) -> None:
        y_true, y_pred = _host(y_true), _host(y_pred)
        if y_true.shape != y_pred.shape:
            raise ValueError(f"{self.name}: y_true has shape {y_true.shape} but y_pred has "
                             f"{y_pred.shape}; pass predicted labels (e.g. argmax), not scores")
        super().update_state((y_true == y_pred).astype(self.dtype), sample_weight)


def state_variables(metric: Metric) -> list[Variable]:
    """``metric``'s state variables, in the order it made them (for the checkpoints; not
    exported)."""
    return list(metric._state)
