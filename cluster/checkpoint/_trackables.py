"""What a checkpoint saves: a nest of trackables flattened into named tensors, and back.

Trackables are ``cluster.Variable`` (plain or distributed), optimizers from
:mod:`cluster.optimizers` and metrics from :mod:`cluster.metrics`, in plain nests (dicts with
string keys, lists, tuples). Every tensor is named by its nest path joined with ``/``:

================================  ==============================================================
``model/0``                       a variable at ``Checkpoint(model=[w, b])``'s first position
``optimizer/iterations``          the optimizer's iteration count (int64 scalar)
``optimizer/slots/model/0/m``     a slot (``m``, ``v``, ``momentum``) of the variable
                                  ``model/0``, named by that variable's path in the checkpoint
``metric/total``                  a metric's state variable (``total``, ``count``)
``rng/bit_generator_state``       a ``numpy.random.Generator``'s bit generator state (uint64
                                  words; :mod:`cluster.checkpoint._rng`)
``rand/random_state``             a ``random.Random``'s state (uint64 words)
``save_counter``                  how many times ``Checkpoint.save`` ran (int64 scalar)
================================  ==============================================================

Distributed variables save one copy: a mirrored variable its first component, a sync-on-read
variable (metric state) its aggregate over every replica (a collective under
MultiWorkerMirroredStrategy: every worker must save). Restoring writes every local replica's
component: mirrored ones all get the value; a SUM sync-on-read variable puts the value in global
replica 0 and zeros elsewhere, so its aggregate is exactly the saved value on any replica count.
Reads do not copy: a NumPy-backed variable's entry reads its live buffer, which the writer
streams to disk before training continues (``save`` is synchronous).
Parameter-server variables save their whole logical value and their optimizer state as read
from the ps tasks (:mod:`cluster.checkpoint._ps`), also under the names above.

External trackables (e.g. ``cluster.torch.StateDict``) name their own tensors under their path
through a small protocol (:class:`cluster._protocols.ExternalTrackable`):
``_checkpoint_save(path) -> list[Entry]``,
``_checkpoint_restore(path, saved) -> list[Entry]`` (``saved``: the checkpoint's tensors under
``path/``, the prefix removed; raise ``ValueError`` for ones it cannot take) and
``_distribute_strategy`` (the strategy whose chief writes, or ``None``).
"""

from __future__ import annotations

import random
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import numpy as np

from cluster.checkpoint import _iterators, _ps, _rng
from cluster.data import DistributedIterator
from cluster.metrics import Metric, state_variables
from cluster.optimizers import Optimizer, slot_names, slot_table, slots_of
from cluster.strategies import DistributedVariable
from cluster.strategies._variables import SyncOnReadVariable
from cluster.variables import Variable, VariableAggregation, convert_for

__all__ = [
    "Entry",
    "check_nest",
    "describe_objects",
    "is_external",
    "apply_plan",
    "restore_plan",
    "save_entries",
    "variables_of",
]

SAVE_COUNTER = "save_counter"


@dataclass
class Entry:
    """One named tensor: its expected dtype and shape, how to read it and how to put it back.

    ``read`` may return a view of live state (valid until the object next changes); ``check``,
    when given, raises ``ValueError`` for a saved array ``apply`` must refuse, and runs for every
    entry before any ``apply``.
    """

    name: str
    dtype: np.dtype
    shape: tuple[int, ...]
    read: Callable[[], np.ndarray]
    apply: Callable[[np.ndarray], None]
    check: Callable[[np.ndarray], None] | None = None


def is_external(obj: Any) -> bool:
    """Whether ``obj`` is an external trackable (see the module docstring)."""
    return hasattr(obj, "_checkpoint_save") and hasattr(obj, "_checkpoint_restore")


def _walk(nest: Any, path: str) -> Iterator[tuple[str, Any]]:
    if isinstance(nest, dict):
        for key, value in nest.items():
            if not isinstance(key, str) or not key or "/" in key:
                raise ValueError(f"Checkpoint: key {key!r} at '{path or '/'}' must be a non-empty "
                                 "string without '/' (it becomes part of tensor names)")
            yield from _walk(value, f"{path}/{key}" if path else key)
    elif isinstance(nest, (list, tuple)):
        for i, value in enumerate(nest):
            yield from _walk(value, f"{path}/{i}")
    elif isinstance(nest, DistributedIterator):
        _iterators.check_iterator(path, nest)
        yield path, nest
    elif isinstance(nest, random.SystemRandom):
        raise TypeError(f"Checkpoint: {path} is a random.SystemRandom, which has no state to "
                        "save; track a random.Random or a numpy.random.Generator")
    elif isinstance(nest, (Variable, Optimizer, Metric, np.random.Generator, random.Random)) \
            or is_external(nest):
        yield path, nest
    else:
        raise TypeError(f"Checkpoint: {path} is a {type(nest).__name__}; trackables are "
                        "cluster.Variable, cluster.optimizers optimizers, cluster.metrics metrics, "
                        "distributed-dataset iterators, numpy.random.Generator, random.Random and "
                        "dicts/lists/tuples of them")


def check_nest(root: dict[str, Any]) -> list[tuple[str, Any]]:
    """``(path, trackable)`` for every leaf of ``root``; ``TypeError``/``ValueError`` on leaves
    that are not trackables and on keys that cannot be names."""
    leaves = list(_walk(root, ""))
    seen: dict[int, str] = {}
    for path, leaf in leaves:
        if id(leaf) in seen:
            raise ValueError(f"Checkpoint: the same object is tracked twice, at {seen[id(leaf)]} "
                             f"and {path}; track it once")
        seen[id(leaf)] = path
    return leaves


# -- variables ------------------------------------------------------------------------------------

def _read_variable(variable: Variable) -> Any:
    """The value to save: the live buffer (no copy; see the module docstring) or an aggregate."""
    if isinstance(variable, SyncOnReadVariable) \
            and variable.aggregation is not VariableAggregation.NONE:
        return variable.numpy()  # the aggregate, in cross-replica context
    if isinstance(variable, DistributedVariable):
        return variable.values[0]._read()
    return variable._read()


def _apply_variable(variable: Variable, array: np.ndarray) -> None:
    if not isinstance(variable, DistributedVariable):
        variable._write(convert_for(variable, array, "restore"))
        return
    components = variable.values
    if isinstance(variable, SyncOnReadVariable) and variable.aggregation is VariableAggregation.SUM:
        first_worker = variable._distribute_strategy.extended.worker_index == 0
        zeros = np.zeros_like(array)
        for i, component in enumerate(components):
            value = array if (first_worker and i == 0) else zeros
            component._write(convert_for(component, value, "restore"))
        return
    for component in components:
        component._write(convert_for(component, array, "restore"))


def _variable_entry(name: str, variable: Variable) -> Entry:
    return Entry(name, np.dtype(variable.dtype), tuple(variable.shape),
                 lambda: _read_variable(variable), lambda a: _apply_variable(variable, a))


# -- optimizers and metrics -----------------------------------------------------------------------

def _iterations_entry(name: str, optimizer: Optimizer) -> Entry:
    def apply(array: np.ndarray) -> None:
        optimizer.iterations = int(array)

    return Entry(f"{name}/iterations", np.dtype(np.int64), (),
                 lambda: np.array(optimizer.iterations, np.int64), apply)


def _slot_entry(name: str, optimizer: Optimizer, variable: Variable, slot: str) -> Entry:
    def slot_variable() -> Variable:
        return slots_of(optimizer, variable)[slot]  # restored before the first step: made

    return Entry(name, np.dtype(variable.dtype), tuple(variable.shape),
                 lambda: _read_variable(slot_variable()),
                 lambda a: _apply_variable(slot_variable(), a))


def _metric_state_name(metric: Metric, variable: Variable) -> str:
    base = variable.name.split(":")[0]
    return base[len(metric.name) + 1:] if base.startswith(metric.name + "/") else base


def save_entries(leaves: list[tuple[str, Any]]) -> list[Entry]:
    """The entries to save for ``leaves`` (from :func:`check_nest`).

    Raises ``ValueError`` when an optimizer holds slots for a variable the checkpoint does not
    track (the slot could not be named, nor restored).
    """
    var_paths = {id(v): p for p, v in leaves if isinstance(v, Variable)}
    snapshot = _ps.PsSnapshot([v for _, v in leaves if _ps.is_ps_variable(v)])
    entries: list[Entry] = []
    for path, leaf in leaves:
        if _ps.is_ps_variable(leaf):  # read with every other ps variable, in one pull
            entries.append(Entry(path, np.dtype(leaf.dtype), tuple(leaf.shape),
                                 lambda leaf=leaf: snapshot.get(leaf),
                                 lambda a, leaf=leaf: _apply_variable(leaf, a)))
        elif isinstance(leaf, Variable):
            entries.append(_variable_entry(path, leaf))
        elif is_external(leaf):
            entries.extend(leaf._checkpoint_save(path))
        elif isinstance(leaf, Optimizer):
            entries.append(_iterations_entry(path, leaf))
            by_id = {id(v): v for _, v in leaves if isinstance(v, Variable)}
            for var_id, slots in slot_table(leaf).items():
                if var_id not in var_paths:
                    names = ", ".join(s.name for s in slots.values())
                    raise ValueError(
                        f"Checkpoint: optimizer {leaf.name} at {path} has slots ({names}) for a "
                        "variable this checkpoint does not track; add the model's variables to "
                        "the Checkpoint")
                for slot in slots:
                    entries.append(_slot_entry(f"{path}/slots/{var_paths[var_id]}/{slot}", leaf,
                                               by_id[var_id], slot))
        else:
            entries.extend(_iterator_or_metric_entries(path, leaf))
    entries.extend(Entry(*fields) for fields in _ps.optimizer_save_entries(leaves))
    return entries


def _iterator_or_metric_entries(path: str, leaf: Any) -> list[Entry]:
    """A dataset iterator's position, a generator's state, or a metric's state variables: the
    same on save and restore."""
    if isinstance(leaf, DistributedIterator):
        return [Entry(*_iterators.iterator_entry_parts(path, leaf))]
    if isinstance(leaf, np.random.Generator):
        return [Entry(*_rng.rng_entry_parts(path, leaf))]
    if isinstance(leaf, random.Random):
        return [Entry(*_rng.random_entry_parts(path, leaf))]
    return [_variable_entry(f"{path}/{_metric_state_name(leaf, state)}", state)
            for state in state_variables(leaf)]


def apply_plan(plan: list[Entry], tensors: dict[str, np.ndarray],
               mismatch: Callable[[Entry, np.ndarray], str]) -> None:
    """Write ``tensors`` into the tracked objects of ``plan``, all or nothing: every array is
    checked first (the entry's own check, then its dtype and shape: ``ValueError`` with
    ``mismatch(entry, array)``), and only then is any written."""
    for entry in plan:
        array = tensors[entry.name]
        if entry.check is not None:
            entry.check(array)
        if array.dtype != entry.dtype or tuple(array.shape) != entry.shape:
            raise ValueError(mismatch(entry, array))
    for entry in plan:
        entry.apply(tensors[entry.name])


def restore_plan(leaves: list[tuple[str, Any]], tensors: dict[str, np.ndarray]) -> list[Entry]:
    """The entries to restore for ``leaves`` from a checkpoint holding ``tensors``.

    Optimizer slots are restored for every tracked variable the checkpoint has slots for (they
    are created if the optimizer has not stepped yet). Raises ``ValueError`` when a tracked object
    has no tensor in the checkpoint, or the checkpoint has tensors no tracked object takes.
    """
    names = set(tensors)
    entries: list[Entry] = [Entry(*f) for f in _ps.optimizer_restore_entries(leaves, names)]
    # Parameter-server variables keep their slots on the ps tasks (restored just above).
    variables = [(p, v) for p, v in leaves
                 if isinstance(v, Variable) and not _ps.is_ps_variable(v)]
    for path, leaf in leaves:
        if isinstance(leaf, Variable):
            entries.append(_variable_entry(path, leaf))
        elif is_external(leaf):
            prefix = f"{path}/"
            entries.extend(leaf._checkpoint_restore(path, {
                k[len(prefix):]: v for k, v in tensors.items() if k.startswith(prefix)}))
        elif isinstance(leaf, Optimizer):
            entries.append(_iterations_entry(path, leaf))
            for var_path, variable in variables:
                for slot in slot_names(leaf):
                    name = f"{path}/slots/{var_path}/{slot}"
                    if name in names:
                        entries.append(_slot_entry(name, leaf, variable, slot))
                    elif id(variable) in slot_table(leaf):
                        raise ValueError(
                            f"Checkpoint: restoring would leave optimizer slot {name} as it is "
                            "(the checkpoint has none; it was saved before the first step)")
        else:
            entries.extend(_iterator_or_metric_entries(path, leaf))
    wanted = {e.name for e in entries}
    missing = sorted(wanted - names)
    extra = sorted(names - wanted - {SAVE_COUNTER})
    if missing or extra:
        raise ValueError(
            "Checkpoint: the checkpoint does not match the tracked objects: "
            + (f"missing {missing}" if missing else "")
            + ("; " if missing and extra else "")
            + (f"not tracked here {extra}" if extra else ""))
    return entries


def variables_of(leaves: list[tuple[str, Any]]) -> list[Any]:
    """The variables among ``leaves``, the metrics' state variables and the external
    trackables (whose ``_distribute_strategy`` decides who writes, as a variable's does)."""
    found: list[Any] = []
    for _, leaf in leaves:
        if isinstance(leaf, Variable) or is_external(leaf):
            found.append(leaf)
        elif isinstance(leaf, Metric):
            found.extend(state_variables(leaf))
    return found


def describe_objects(leaves: list[tuple[str, Any]]) -> dict[str, Any]:
    """What the index records about optimizers and metrics (type, hyperparameters)."""
    objects: dict[str, Any] = {}
    for path, leaf in leaves:
        if isinstance(leaf, Optimizer):
            hyper = {k: v for k, v in vars(leaf).items()
                     if not k.startswith("_") and k not in ("name", "iterations")
                     and isinstance(v, (bool, int, float, str))}
            objects[path] = {"kind": "optimizer", "type": type(leaf).__name__, "name": leaf.name,
                             "iterations": int(leaf.iterations), "hyperparameters": hyper}
        elif isinstance(leaf, Metric):
            objects[path] = {"kind": "metric", "type": type(leaf).__name__, "name": leaf.name}
        elif isinstance(leaf, (np.random.Generator, random.Random)):
            objects[path] = _rng.describe(leaf)
    return objects
