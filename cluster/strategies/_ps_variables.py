"""Variables that live on parameter servers (:class:`PsVariable`, :class:`ShardedVariable`).

A handle knows where each shard is stored (``ps`` task, stored name, rows); the value lives in
the ``VariableStore`` of that task. Reads pull, writes assign, gradients are pushed (the optimizer
runs on the parameter server). A handle keeps the last value it pulled with its version and asks
only for newer ones, so an unchanged variable costs a round trip, not a transfer.

Inside a function a ClusterCoordinator runs on a worker (a :func:`function_scope`), every
variable the function carries is pulled once, together, before it runs (one request per ps
task), and reads return that snapshot until the function itself writes the variable, as a
step of TF's parameter-server training reads each variable once. Outside a function scope every
read asks the parameter server.

A handle reaches its strategy only through its :class:`PsBinding` (the strategy, its
configuration, its connections to the ps tasks, its table of handles). Handles pickle as their
:class:`VariableSpec` (never their value): a function sent to a worker carries handles that the
worker binds to its own connections (``_rebuild_variable``). The binding's ``for_config`` (a
function of :mod:`cluster.strategies.parameter_server`) travels by reference and finds this
process's binding for the configuration, so this module never imports that module, which
imports it.

The functions at the end (:func:`refresh`, :func:`pulled_values`, :func:`shards_of`,
:func:`connections_of`, :func:`strategy_of`, :func:`seed`, :func:`invalidate`) are how the
strategy, the coordinator's calls and the parameter-server checkpoints work with handles;
handles have no public methods beyond a variable's, since users hold them as variables.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np

from cluster._family import xp_of
from cluster._ps_values import AssignMode
from cluster.ps.partitioners import Shard
from cluster.variables import Variable, VariableAggregation, VariableSynchronization, convert_for

if TYPE_CHECKING:
    from cluster.strategies.parameter_server import ParameterServerStrategy

__all__ = [
    "FunctionScope",
    "PsBinding",
    "PsVariable",
    "ShardedVariable",
    "SyncSlot",
    "VariableSpec",
    "collect_handles",
    "connections_of",
    "current_scope",
    "function_scope",
    "invalidate",
    "pulled_values",
    "refresh",
    "seed",
    "shards_of",
    "strategy_of",
]


@dataclass(frozen=True)
class VariableSpec:
    """Everything a handle needs, and all it pickles to."""

    name: str  # as the user sees it ("dense/kernel:0")
    shape: tuple[int, ...]
    dtype: str
    trainable: bool
    synchronization: str
    aggregation: str
    shards: tuple[Shard, ...]


@dataclass(frozen=True, eq=False)
class PsBinding:
    """What the handles of one :class:`~cluster.ParameterServerStrategy` need of it, in this
    process: the strategy; its ``config`` (a ``StrategyConfig``); its ``connections`` (a
    ``PsConnections``) to the ps tasks; ``handle(spec)``, the strategy's one handle for a
    variable; and ``for_config(config)``, a module-level function that finds this process's
    binding for ``config`` (pickled by reference with each handle)."""

    strategy: ParameterServerStrategy
    config: Any
    connections: Any
    handle: Callable[[VariableSpec], PsVariable]
    for_config: Callable[[Any], PsBinding]


@dataclass(frozen=True)
class SyncSlot:
    """The synchronous step a function contributes to and its index among the step's
    ``num_contributors`` functions."""

    step: int
    contributor: int
    num_contributors: int


@dataclass
class FunctionScope:
    """One run of a scheduled function on a worker: reads in it share one snapshot."""

    epoch: int
    sync: SyncSlot | None = None
    pushes: int = 0


_local = threading.local()
_epochs = iter(range(1, 1 << 62))
_epoch_lock = threading.Lock()


def current_scope() -> FunctionScope | None:
    return getattr(_local, "scope", None)


@contextmanager
def function_scope(sync: SyncSlot | None = None) -> Iterator[FunctionScope]:
    """Run a scheduled function: a fresh read snapshot, and its synchronous slot if any."""
    with _epoch_lock:
        epoch = next(_epochs)
    previous, _local.scope = current_scope(), FunctionScope(epoch, sync)
    try:
        yield _local.scope
    finally:
        _local.scope = previous


@contextmanager
def collect_handles() -> Iterator[list[PsVariable]]:
    """Collect the handles unpickled in this thread meanwhile (to pull them all at once)."""
    previous, _local.loading = getattr(_local, "loading", None), []
    try:
        yield _local.loading
    finally:
        _local.loading = previous


def _note_loaded(variable: PsVariable) -> None:
    loading = getattr(_local, "loading", None)
    if loading is not None:
        loading.append(variable)


class PsVariable(Variable):
    """A variable of a :class:`~cluster.ParameterServerStrategy`, stored on a ``ps`` task.

    Reads (``numpy()``, ``value()``, arithmetic) return NumPy arrays pulled from the parameter
    server; ``assign``/``assign_add``/``assign_sub`` change the stored value (atomically per
    shard); ``optimizer.apply_gradients`` pushes gradients, applied there.
    """

    def __init__(self, binding: PsBinding, spec: VariableSpec) -> None:
        self._binding = binding
        self._strategy = binding.strategy
        self._spec = spec
        self._name = spec.name
        self._trainable = spec.trainable
        self._synchronization = VariableSynchronization[spec.synchronization]
        self._aggregation = VariableAggregation[spec.aggregation]
        self._lock = threading.Lock()
        self._versions = [0] * len(spec.shards)
        self._parts: list[np.ndarray | None] = [None] * len(spec.shards)
        self._value: np.ndarray | None = None
        self._epoch: int | None = None

    # -- identity --------------------------------------------------------------------------

    @property
    def _distribute_strategy(self) -> ParameterServerStrategy:
        return self._strategy

    @property
    def dtype(self) -> np.dtype:
        return np.dtype(self._spec.dtype)

    @property
    def shape(self) -> tuple[int, ...]:
        return self._spec.shape

    @property
    def device(self) -> str:
        """The parameter server holding the variable (its first shard)."""
        return f"/job:ps/replica:0/task:{self._spec.shards[0].ps}/device:CPU:0"

    def __reduce__(self) -> tuple:
        binding = self._binding
        return (_rebuild_variable, (binding.for_config, binding.config, self._spec))

    # -- reads -----------------------------------------------------------------------------

    def _seed(self, parts: Sequence[np.ndarray], version: int) -> None:
        """Cache values just created (version ``version``), sparing the first pull."""
        with self._lock:
            self._parts = list(parts)
            self._versions = [version] * len(parts)
            self._value = _join(self._parts)

    def _read(self) -> np.ndarray:
        scope = current_scope()
        if scope is not None and self._epoch == scope.epoch and self._value is not None:
            return self._value
        refresh([self])  # marks the snapshot with the scope's epoch
        assert self._value is not None
        return self._value

    def _accept(self, pulled: dict[str, Any]) -> None:
        with self._lock:
            changed = False
            for i, shard in enumerate(self._spec.shards):
                got = pulled.get(shard.name)
                if got is not None and got.version > self._versions[i]:
                    self._parts[i], self._versions[i] = got.value, got.version
                    changed = True
            if changed or self._value is None:
                self._value = _join(self._parts)

    def _invalidate(self) -> None:
        self._epoch = None

    # -- writes ----------------------------------------------------------------------------

    def _assign(self, mode: AssignMode, value: Any, what: str) -> None:
        array = convert_for(self, value, what)
        array = array.get() if xp_of(array) is not np else np.asarray(array)
        array = np.array(np.broadcast_to(array, self.shape), order="C")  # 0-d stays 0-d
        connections = self._binding.connections
        for shard in self._spec.shards:
            rows = array[shard.offset:shard.offset + shard.shape[0]] if shard.shape else array
            connections.assign(shard.ps, shard.name, rows, mode)
        self._invalidate()

    def assign(self, value: Any, use_locking: bool | None = None, name: str | None = None,
               read_value: bool = True) -> Any:
        self._assign(AssignMode.ASSIGN, value, "assign")
        return self if read_value else None

    def assign_add(self, delta: Any, use_locking: bool | None = None, name: str | None = None,
                   read_value: bool = True) -> Any:
        self._assign(AssignMode.ASSIGN_ADD, delta, "assign_add")
        return self if read_value else None

    def assign_sub(self, delta: Any, use_locking: bool | None = None, name: str | None = None,
                   read_value: bool = True) -> Any:
        self._assign(AssignMode.ASSIGN_SUB, delta, "assign_sub")
        return self if read_value else None

    def _write(self, value: Any) -> None:  # Variable's generic write path: a plain assign
        self._assign(AssignMode.ASSIGN, value, "assign")


class ShardedVariable(PsVariable):
    """A :class:`PsVariable` split along axis 0 over several ``ps`` tasks by the strategy's
    ``variable_partitioner`` (TF's ``ShardedVariable``); reads concatenate the shards."""

    @property
    def variables(self) -> list[PsVariable]:
        """One variable per shard, in order (each a view of its stored piece)."""
        base = self._spec.name.split(":")[0]
        out = []
        for i, shard in enumerate(self._spec.shards):
            spec = VariableSpec(f"{base}/part_{i}:0", shard.shape, self._spec.dtype,
                                self._spec.trainable, self._spec.synchronization,
                                self._spec.aggregation, (shard.alone(),))
            out.append(self._binding.handle(spec))
        return out


def _join(parts: Sequence[np.ndarray | None]) -> np.ndarray | None:
    if any(p is None for p in parts):
        return None
    return parts[0] if len(parts) == 1 else np.concatenate(parts, axis=0)


def refresh(variables: Sequence[PsVariable]) -> None:
    """Pull every shard of ``variables`` that changed, in one request per ps task and strategy
    (the strategies one after another)."""
    by_binding: dict[int, list[PsVariable]] = {}
    for variable in variables:
        by_binding.setdefault(id(variable._binding), []).append(variable)
    for group in by_binding.values():
        _refresh(group)


def _refresh(variables: list[PsVariable]) -> None:
    """:func:`refresh` for ``variables`` of one strategy."""
    requests: dict[int, list[tuple[str, int]]] = {}
    seen: set[str] = set()
    for variable in variables:
        for i, shard in enumerate(variable._spec.shards):
            if shard.name not in seen:
                seen.add(shard.name)
                requests.setdefault(shard.ps, []).append((shard.name, variable._versions[i]))
    scope = current_scope()
    # A synchronous function reads as of its step: a re-run of it reads what its first run did.
    step = scope.sync.step if scope is not None and scope.sync is not None else None
    pulled = variables[0]._binding.connections.pull(requests, step=step)
    for variable in variables:
        variable._accept(pulled)
        if scope is not None:
            variable._epoch = scope.epoch


@dataclass
class Pending:
    """Gradients of one push, grouped by ps task (``{ps: {stored name: rows}}``)."""

    by_ps: dict[int, dict[str, np.ndarray]] = field(default_factory=dict)

    def add(self, variable: PsVariable, grad: np.ndarray) -> None:
        for shard in variable._spec.shards:
            rows = grad[shard.offset:shard.offset + shard.shape[0]] if shard.shape else grad
            self.by_ps.setdefault(shard.ps, {})[shard.name] = np.require(rows, requirements="C")


def _rebuild_variable(for_config: Callable[[Any], PsBinding], config: Any,
                      spec: VariableSpec) -> PsVariable:
    """Unpickle a handle: bound to this process's strategy for ``config``."""
    variable = for_config(config).handle(spec)
    _note_loaded(variable)
    return variable


def pulled_values(variables: Sequence[PsVariable]) -> dict[int, np.ndarray]:
    """A copy of each variable's current value, by ``id``: every changed shard is pulled
    first (:func:`refresh`). Each shard is read atomically, the set of them is not."""
    refresh(variables)
    values: dict[int, np.ndarray] = {}
    for variable in variables:
        with variable._lock:
            assert variable._value is not None  # refresh pulled every shard
            values[id(variable)] = np.array(variable._value, copy=True)
    return values


def shards_of(variable: PsVariable) -> tuple[Shard, ...]:
    """Where ``variable`` is stored: its shards, in order along axis 0."""
    return variable._spec.shards


def connections_of(variable: PsVariable) -> Any:
    """The ``PsConnections`` of ``variable``'s strategy in this process."""
    return variable._binding.connections


def strategy_of(variable: PsVariable) -> ParameterServerStrategy:
    """The strategy ``variable`` belongs to (in this process)."""
    return variable._binding.strategy


def seed(variable: PsVariable, parts: Sequence[np.ndarray], version: int) -> None:
    """Cache the shard values just created (version ``version``), sparing the first pull."""
    variable._seed(parts, version)


def invalidate(variable: PsVariable) -> None:
    """Drop the function scope's snapshot of ``variable`` (it was written): the next read
    pulls."""
    variable._invalidate()
