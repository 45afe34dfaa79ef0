"""The trackables of an elastic state, copied out and written back in place.

Which tensors a trackable has, how to read them and how to put them back is
:mod:`cluster.checkpoint`'s (``check_nest``, ``save_entries``, ``restore_plan`` in
``cluster.checkpoint._trackables``): an elastic state names its tensors exactly as a
``Checkpoint`` with the same keyword arguments would, and takes the same trackables (variables,
distributed or not; optimizers with their slots and iterations; metrics; ``cluster.torch``
state dicts; random generators; nests of them).

What differs: a snapshot holds private host copies (a checkpoint streams live buffers to disk),
and an optimizer slot made after the snapshot (the first step makes them) is put back as zeros,
the value it is made with, so a rollback to a commit taken before the first step is exact.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from cluster._family import to_host
from cluster.checkpoint._trackables import apply_plan, check_nest, restore_plan, save_entries
from cluster.optimizers import Optimizer

__all__ = ["Tracked"]


class Tracked:
    """The trackable values of a state, by name: ``snapshot()`` copies them out, ``apply()``
    writes a snapshot back (every variable in place, so the user's references stay valid)."""

    def __init__(self, values: dict[str, Any]) -> None:
        try:
            self._leaves = check_nest(values)
        except (TypeError, ValueError) as e:
            raise type(e)(f"elastic.State: {e}".replace("Checkpoint: ", "")) from e
        self._slot_prefixes = tuple(f"{path}/slots/" for path, leaf in self._leaves
                                    if isinstance(leaf, Optimizer))

    def snapshot(self) -> dict[str, np.ndarray]:
        """Every tensor by name, as a private host copy (a collective for sync-on-read
        variables under a multi-worker strategy, which read their aggregate: every member calls
        it, as every task calls a checkpoint's ``save``)."""
        try:
            entries = save_entries(self._leaves)
        except ValueError as e:
            raise ValueError(f"elastic.State: {e}".replace("Checkpoint: ", "")) from e
        return {e.name: np.array(to_host(e.read()), copy=True) for e in entries}

    def apply(self, tensors: dict[str, np.ndarray]) -> None:
        """Write ``tensors`` (a :meth:`snapshot`, possibly another task's) into the trackables.

        All or nothing: every tensor is checked against its object (name, dtype, shape) before
        anything changes; ``ValueError`` names what does not match.
        """
        tensors = dict(tensors)
        for name, array in self._slots_made_since(tensors).items():
            tensors[name] = array
        try:
            plan = restore_plan(self._leaves, tensors)
        except ValueError as e:
            raise ValueError(f"elastic.State: {e}".replace("Checkpoint: ", "")) from e
        apply_plan(plan, tensors,
                   lambda entry, array: f"elastic.State: {entry.name} is "
                                        f"{array.dtype}{list(array.shape)} in the state to "
                                        f"restore but {entry.dtype}{list(entry.shape)} here")

    def _slots_made_since(self, tensors: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        """Zeros for the optimizer slots that exist now but not in ``tensors`` (made by a step
        after that snapshot): slots are made as zeros, so zeros put them back as they were."""
        if not self._slot_prefixes:
            return {}
        return {e.name: np.zeros(e.shape, e.dtype) for e in save_entries(self._leaves)
                if e.name not in tensors and e.name.startswith(self._slot_prefixes)}
