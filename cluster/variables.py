"""``cluster.Variable``: a named, mutable array, like ``tf.Variable``.

Created outside any strategy it is a plain variable holding one NumPy (or CuPy) array. Created
under ``strategy.scope()`` (or inside ``strategy.run``) the constructor returns that strategy's
distributed variable instead (TensorFlow does the same through a metaclass): it asks the current
strategy's ``extended.create_variable``. The distributed variables (``MirroredVariable``,
``SyncOnReadVariable``, ``CentralVariable``) live beside the strategies that make them and are
exported by :mod:`cluster.strategies`; this module does not import them.
"""

from __future__ import annotations

import enum
from typing import Any

import numpy as np

from cluster import _context
from cluster._family import asarray_like_tf, to_array, xp_of

__all__ = [
    "Variable",
    "VariableAggregation",
    "VariableSynchronization",
    "component_variable",
    "convert_for",
    "full_name",
    "initial_array",
    "validate_options",
]


class VariableSynchronization(enum.Enum):
    """When a distributed variable's replicas are synchronised (``tf.VariableSynchronization``)."""

    AUTO = 0
    NONE = 1
    ON_WRITE = 2
    ON_READ = 3


class VariableAggregation(enum.Enum):
    """How replica-context writes to a distributed variable combine (``tf.VariableAggregation``)."""

    NONE = 0
    SUM = 1
    MEAN = 2
    ONLY_FIRST_REPLICA = 3


class _VariableMeta(type):
    # Variable(...) under a strategy returns the strategy's distributed variable, as tf.Variable
    # does; subclasses are constructed normally.
    def __call__(cls, *args: Any, **kwargs: Any) -> Any:
        if cls is Variable and _context.has_strategy():
            strategy = _context.get_strategy()
            return strategy.extended.create_variable(*args, **kwargs)
        return super().__call__(*args, **kwargs)


def _check_enum(value: Any, enum_type: type[enum.Enum], field: str) -> Any:
    if isinstance(value, enum_type):
        return value
    if isinstance(value, str) and value.upper() in enum_type.__members__:
        return enum_type[value.upper()]
    names = ", ".join(f"{enum_type.__name__}.{m}" for m in enum_type.__members__)
    raise ValueError(f"Variable: invalid {field} {value!r}; use one of {names}")


class Variable(metaclass=_VariableMeta):
    """A mutable array with a name (``tf.Variable``).

    >>> import cluster
    >>> v = cluster.Variable([1.0, 2.0], name="w")
    >>> v.assign_add([1.0, 1.0]).numpy()
    array([2., 3.], dtype=float32)
    >>> v.name, v.dtype, v.shape
    ('w:0', dtype('float32'), (2,))

    ``initial_value`` may be a value or a zero-argument callable. dtypes follow TensorFlow:
    Python floats become float32, Python ints int32, NumPy arrays keep theirs. Assignments must
    keep the shape (``ValueError`` otherwise) and are cast to the variable's dtype.
    """

    def __init__(
        self,
        initial_value: Any = None,
        trainable: bool | None = None,
        name: str | None = None,
        dtype: Any = None,
        synchronization: VariableSynchronization = VariableSynchronization.AUTO,
        aggregation: VariableAggregation = VariableAggregation.NONE,
        shape: Any = None,
    ) -> None:
        synchronization, aggregation, trainable = validate_options(
            synchronization, aggregation, trainable)
        self._value = initial_array(initial_value, dtype, shape)
        self._name = full_name(name)
        self._trainable = trainable
        self._synchronization = synchronization
        self._aggregation = aggregation

    # -- properties ------------------------------------------------------------------------------

    @property
    def name(self) -> str:
        return self._name

    @property
    def dtype(self) -> np.dtype:
        return self._value.dtype

    @property
    def shape(self) -> tuple[int, ...]:
        return tuple(self._value.shape)

    @property
    def trainable(self) -> bool:
        return self._trainable

    @property
    def synchronization(self) -> VariableSynchronization:
        return self._synchronization

    @property
    def aggregation(self) -> VariableAggregation:
        return self._aggregation

    @property
    def _distribute_strategy(self) -> Any:
        """The strategy that owns this variable; ``None`` for a plain one."""
        return None

    # -- reads -----------------------------------------------------------------------------------

    def _read(self) -> Any:
        return self._value

    def value(self) -> Any:
        """The current value (NumPy or CuPy array); a view: do not modify it in place."""
        return self._read()

    def read_value(self) -> Any:
        """A copy of the current value."""
        return self._read().copy()

    def numpy(self) -> np.ndarray:
        """The current value as a NumPy array (a copy; CuPy values are brought to the host)."""
        value = self._read()
        return value.get() if xp_of(value) is not np else value.copy()

    def __array__(self, dtype: Any = None, copy: bool | None = None) -> np.ndarray:
        value = self.numpy()
        return value if dtype is None else value.astype(dtype)

    # -- writes ----------------------------------------------------------------------------------

    def _write(self, value: Any) -> None:
        xp = xp_of(self._value)
        xp.copyto(self._value, value, casting="unsafe")

    def _convert(self, value: Any, what: str) -> Any:
        return convert_for(self, value, what)

    def assign(self, value: Any, use_locking: bool | None = None, name: str | None = None,
               read_value: bool = True) -> Any:
        """Set the value; returns the variable (``read_value=False``: None)."""
        self._write(self._convert(value, "assign"))
        return self if read_value else None

    def assign_add(self, delta: Any, use_locking: bool | None = None, name: str | None = None,
                   read_value: bool = True) -> Any:
        """Add ``delta`` in place; returns the variable (``read_value=False``: None)."""
        self._write(self._read() + self._convert(delta, "assign_add"))
        return self if read_value else None

    def assign_sub(self, delta: Any, use_locking: bool | None = None, name: str | None = None,
                   read_value: bool = True) -> Any:
        """Subtract ``delta`` in place; returns the variable (``read_value=False``: None)."""
        self._write(self._read() - self._convert(delta, "assign_sub"))
        return self if read_value else None

    # -- array protocol ----------------------------------------------------------------------------

    def __repr__(self) -> str:
        return (f"<cluster.{type(self).__name__} '{self.name}' shape={self.shape} "
                f"dtype={self.dtype}, numpy={self.numpy()!r}>")

    def __len__(self) -> int:
        return len(self._read())

    def __getitem__(self, index: Any) -> Any:
        return self._read()[index]

    def __bool__(self) -> bool:
        return bool(self._read())

    def __float__(self) -> float:
        return float(self._read())

    def __int__(self) -> int:
        return int(self._read())

    __array_priority__ = 100

    def __add__(self, other): return self._read() + _unwrap(other)
    def __radd__(self, other): return _unwrap(other) + self._read()
    def __sub__(self, other): return self._read() - _unwrap(other)
    def __rsub__(self, other): return _unwrap(other) - self._read()
    def __mul__(self, other): return self._read() * _unwrap(other)
    def __rmul__(self, other): return _unwrap(other) * self._read()
    def __truediv__(self, other): return self._read() / _unwrap(other)
    def __rtruediv__(self, other): return _unwrap(other) / self._read()
    def __matmul__(self, other): return self._read() @ _unwrap(other)
    def __rmatmul__(self, other): return _unwrap(other) @ self._read()
    def __pow__(self, other): return self._read() ** _unwrap(other)
    def __neg__(self): return -self._read()
    def __lt__(self, other): return self._read() < _unwrap(other)
    def __le__(self, other): return self._read() <= _unwrap(other)
    def __gt__(self, other): return self._read() > _unwrap(other)
    def __ge__(self, other): return self._read() >= _unwrap(other)

    @property
    def T(self) -> Any:  # noqa: N802 - NumPy's name
        return self._read().T

    __hash__ = object.__hash__


def _unwrap(value: Any) -> Any:
    return value._read() if isinstance(value, Variable) else value


def full_name(name: str | None) -> str:
    """TensorFlow's variable name for ``name``: ``"w"`` is ``"w:0"``, ``None`` is
    ``"Variable:0"``; ``ValueError`` for an empty or non-string name."""
    if name is None:
        return "Variable:0"
    if not isinstance(name, str) or not name:
        raise ValueError(f"Variable: name must be a non-empty string, got {name!r}")
    return name if ":" in name else f"{name}:0"


def validate_options(synchronization: Any, aggregation: Any, trainable: bool | None):
    """Checked ``(synchronization, aggregation, trainable)`` with TensorFlow's defaults/errors."""
    synchronization = _check_enum(synchronization, VariableSynchronization, "synchronization")
    aggregation = _check_enum(aggregation, VariableAggregation, "aggregation")
    if trainable is None:
        trainable = synchronization is not VariableSynchronization.ON_READ
    elif synchronization is VariableSynchronization.ON_READ and trainable:
        raise ValueError(
            "Variable: synchronization=ON_READ is only for non-trainable variables (metrics); "
            "pass trainable=False"
        )
    return synchronization, aggregation, bool(trainable)


def initial_array(initial_value: Any, dtype: Any, shape: Any) -> Any:
    """The initial value as an owned NumPy/CuPy array (callables are called first)."""
    if initial_value is None:
        raise ValueError("Variable: initial_value must be given (a value or a callable)")
    if callable(initial_value) and not isinstance(initial_value, Variable):
        initial_value = initial_value()
    if isinstance(initial_value, Variable):
        initial_value = initial_value.read_value()
    array, _ = to_array(initial_value)
    xp = xp_of(array)
    if xp is np:
        array = asarray_like_tf(array, dtype)
    elif dtype is not None:
        array = array.astype(np.dtype(dtype))
    array = array.copy()
    if shape is not None and tuple(shape) != tuple(array.shape):
        raise ValueError(
            f"Variable: initial value has shape {tuple(array.shape)} but shape={tuple(shape)} "
            "was given"
        )
    return array


def convert_for(variable: Any, value: Any, what: str) -> Any:
    """``value`` as an array of ``variable``'s dtype and shape (``ValueError`` naming both)."""
    value = _unwrap(value)
    array, _ = to_array(value)
    if xp_of(array) is np and xp_of(variable._read()) is not np:
        array = xp_of(variable._read()).asarray(array)
    if tuple(array.shape) != variable.shape:
        try:
            np.broadcast_shapes(tuple(array.shape), variable.shape)
            scalar_ok = array.ndim == 0
        except ValueError:
            scalar_ok = False
        if not scalar_ok:
            raise ValueError(
                f"{what} on {variable.name}: value of shape {tuple(array.shape)} does not match "
                f"the variable's shape {variable.shape}"
            )
    if array.dtype != variable.dtype:
        if not np.can_cast(array.dtype, variable.dtype, casting="same_kind") and not (
            array.dtype.kind in "iu" and variable.dtype.kind in "iuf"
        ):
            raise ValueError(
                f"{what} on {variable.name}: cannot cast a {array.dtype} value to the variable's "
                f"dtype {variable.dtype}; convert it explicitly"
            )
        array = array.astype(variable.dtype)
    return array


def component_variable(array: Any, name: str) -> Variable:
    """A plain :class:`Variable` named ``name`` holding ``array`` itself: no copy, no dtype
    inference (the value is already final). What a distributed variable's components are."""
    variable = object.__new__(Variable)
    Variable.__init__(variable, lambda: array, name=name)
    variable._value = array
    return variable
