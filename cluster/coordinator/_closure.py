"""One scheduled function (:class:`Closure`): its result slot, its body, its synchronous slot."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import cloudpickle

from cluster import _nest
from cluster.coordinator.remote_values import (
    PerWorkerValues,
    RemoteValue,
    resource_ref,
    set_error,
)
from cluster.strategies._ps_variables import SyncSlot

__all__ = ["Closure"]


@dataclass(eq=False)
class Closure:
    """``fn(*args, **kwargs)`` scheduled as number ``seq``; ``value`` receives its outcome.

    ``body`` is the pickled call, made once by :meth:`prepare`; ``refs`` the per-worker values
    it uses; ``generation`` is set by the queue when the closure is handed out.
    """

    seq: int
    fn: Callable[..., Any]
    args: tuple
    kwargs: dict
    value: RemoteValue
    sync: SyncSlot | None
    body: bytes | None = None
    refs: tuple[int, ...] = ()
    generation: int = 0

    def fail(self, error: BaseException) -> None:
        set_error(self.value, error)

    def prepare(self) -> None:
        """Pickle the body (once): per-worker values become refs, RemoteValues their results
        (so this blocks until those ran, and raises their errors)."""
        if self.body is not None:
            return
        refs: list[int] = []

        def swap(leaf: Any) -> Any:
            if isinstance(leaf, PerWorkerValues):
                ref = resource_ref(leaf)
                refs.append(ref.rid)
                return ref
            if isinstance(leaf, RemoteValue):
                return leaf.fetch()
            return leaf

        args, kwargs = _nest.map_structure(swap, (self.args, self.kwargs))
        self.body = cloudpickle.dumps((self.fn, args, kwargs))
        self.refs = tuple(refs)
