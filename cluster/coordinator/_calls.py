"""What a coordinator sends a worker, and how the worker runs it (:class:`WorkerState`).

A :class:`Call` carries the function and its arguments (one cloudpickle ``body``) and the
per-worker resources (datasets, iterators) this worker has to create first. Arguments that are
per-worker values travel as :class:`ResourceRef` and are replaced, on the worker, by the
worker's own object. A worker runs one call at a time.
"""

from __future__ import annotations

import threading
import traceback
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, NamedTuple

import cloudpickle

from cluster import _nest
from cluster.errors import OutOfRangeError
from cluster.strategies._ps_variables import SyncSlot, collect_handles, function_scope, refresh

__all__ = ["Call", "Outcome", "ResourceRef", "ResourceSpec", "WorkerState"]


@dataclass(frozen=True)
class ResourceRef:
    """Stands for per-worker resource ``rid`` in arguments; each worker substitutes its own."""

    rid: int


@dataclass(frozen=True)
class ResourceSpec:
    """How a worker makes resource ``rid``: ``fn(*args, **kwargs)`` (args may hold refs)."""

    rid: int
    fn: Callable[..., Any]
    args: tuple = ()
    kwargs: dict = field(default_factory=dict)


@dataclass(frozen=True)
class Call:
    """One function run: ``body`` is cloudpickle of ``(fn, args, kwargs)``; ``resources`` are
    created first, in order, unless this worker already has them."""

    body: bytes
    resources: tuple[ResourceSpec, ...] = ()


class Outcome(NamedTuple):
    ok: bool
    payload: bytes  # cloudpickle of the result, or of the exception ("" if it did not pickle)
    error_type: str = ""
    error_message: str = ""
    traceback: str = ""


class WorkerState:
    """The per-worker resources of this process, and the lock that runs one call at a time."""

    def __init__(self, task: str = "") -> None:
        self.task = task
        self.resources: dict[int, Any] = {}
        self._lock = threading.Lock()

    def _resolve(self, structure: Any) -> Any:
        def swap(leaf: Any) -> Any:
            if isinstance(leaf, ResourceRef):
                if leaf.rid not in self.resources:
                    raise LookupError(f"{self.task}: per-worker resource #{leaf.rid} was never "
                                      "created on this worker")
                return self.resources[leaf.rid]
            return leaf
        return _nest.map_structure(swap, structure)

    def run(self, payload: bytes, sync: SyncSlot | None = None) -> Outcome:
        """Unpickle (the caller authenticated the sender) and run one call; never raises."""
        with self._lock:
            try:
                with collect_handles() as handles:
                    call = cloudpickle.loads(payload)
                    fn, args, kwargs = cloudpickle.loads(call.body)
                for spec in call.resources:
                    if spec.rid not in self.resources:
                        self.resources[spec.rid] = spec.fn(*self._resolve(spec.args),
                                                           **self._resolve(spec.kwargs))
                args, kwargs = self._resolve(args), self._resolve(kwargs)
                with function_scope(sync):
                    refresh(handles)  # one request per ps task per strategy
                    try:
                        result = fn(*args, **kwargs)
                    except StopIteration as e:
                        raise OutOfRangeError(
                            f"{self.task}: end of sequence: a per-worker iterator ran out "
                            "(schedule fewer steps, or repeat the dataset)") from e
                return Outcome(True, cloudpickle.dumps(result))
            except BaseException as e:  # noqa: BLE001 - every failure goes back to the caller
                return _failure(e)


def _failure(error: BaseException) -> Outcome:
    text = "".join(traceback.format_exception(error))
    try:
        payload = cloudpickle.dumps(error)
    except Exception:  # noqa: BLE001 - an exception that does not pickle travels as text
        payload = b""
    return Outcome(False, payload, type(error).__name__, str(error), text)
