"""The coordinator's per-worker resources: what each :class:`PerWorkerValues` is made from.

A resource is ``fn(*args, **kwargs)`` run once on every worker before it first needs it (again
after the worker restarts); arguments that are per-worker values travel as
:class:`~cluster.coordinator._calls.ResourceRef`. :class:`Resources` numbers and keeps the specs
and tells a dispatcher which a worker still lacks.
"""

from __future__ import annotations

import itertools
import threading
from collections.abc import Callable
from typing import Any

import cloudpickle

from cluster import _nest
from cluster.coordinator._calls import ResourceRef, ResourceSpec
from cluster.coordinator.remote_values import PerWorkerValues, resource_ref

__all__ = ["Resources"]


class Resources:
    """The resource specs of one coordinator, by resource id (from 1); thread-safe."""

    def __init__(self) -> None:
        self._ids = itertools.count(1)
        self._specs: dict[int, ResourceSpec] = {}
        self._lock = threading.Lock()

    def add(self, fn: Callable[..., Any], args: tuple = (), kwargs: dict | None = None) -> int:
        """Record ``fn(*args, **kwargs)`` as a new resource; returns its id. Raises what
        pickling it raises (here, not on every worker)."""
        def swap(leaf: Any) -> Any:
            return resource_ref(leaf) if isinstance(leaf, PerWorkerValues) else leaf

        rid = next(self._ids)
        spec = ResourceSpec(rid, fn, _nest.map_structure(swap, tuple(args)),
                            _nest.map_structure(swap, dict(kwargs or {})))
        cloudpickle.dumps(spec)
        with self._lock:
            self._specs[rid] = spec
        return rid

    def missing(self, refs: tuple[int, ...], created: set[int]) -> list[ResourceSpec]:
        """The specs a worker that has ``created`` lacks for ``refs``, dependencies first."""
        out: list[ResourceSpec] = []
        seen: set[int] = set(created)

        def need(rid: int) -> None:
            if rid in seen:
                return
            seen.add(rid)
            with self._lock:
                spec = self._specs[rid]
            for leaf in _nest.flatten((spec.args, spec.kwargs)):
                if isinstance(leaf, ResourceRef):
                    need(leaf.rid)
            out.append(spec)

        for rid in refs:
            need(rid)
        return out
