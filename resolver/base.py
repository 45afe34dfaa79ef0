"""``ClusterResolver`` and the two resolvers built from other objects: Simple and Union.

Mirrors ``tf.distribute.cluster_resolver.{ClusterResolver, SimpleClusterResolver, UnionResolver}``
(class name ``UnionClusterResolver``). TensorFlow behaviours worth knowing:

* ``format_master_url`` prefixes ``rpc_layer + "://"`` only for a truthy ``rpc_layer``.
* ``SimpleClusterResolver.master(rpc_layer="")`` falls back to the resolver's own ``rpc_layer``
  (it uses ``rpc_layer or self.rpc_layer``), unlike ``TFConfigClusterResolver.master``.
* ``UnionClusterResolver`` takes ``task_type``/``task_id``/``rpc_layer`` from its first resolver
  unless overridden, and the override test is truthiness: ``task_id=0`` does **not** override.
* Union merging: jobs that are lists in every resolver are *concatenated* (no conflict check);
  as soon as one side is sparse (a dict after ``as_dict()``), the job is merged as
  ``{index: address}`` and an index present twice raises ``KeyError``.
* ``num_accelerators`` returns a ``defaultdict(int)``; ``SimpleClusterResolver`` returns exactly
  the mapping it was given, or ``{}``.

``ClusterResolver`` additionally offers an ``rpc_layer`` attribute (``None`` unless set), so that
any resolver can be the first argument of a union; TF's base class lacks it.
"""

from __future__ import annotations

import abc
from collections import defaultdict
from collections.abc import Mapping
from typing import Any

from resolver._devices import local_accelerators, local_gpu_count
from resolver.cluster_spec import ClusterSpec

__all__ = [
    "ClusterResolver",
    "SimpleClusterResolver",
    "UnionClusterResolver",
    "format_master_url",
    "local_accelerators",
    "local_gpu_count",
]


def format_master_url(master: Any, rpc_layer: str | None = None) -> Any:
    """``"grpc://host:port"`` for a truthy ``rpc_layer``, else ``master`` unchanged."""
    if rpc_layer:
        return f"{rpc_layer}://{master}"
    return master


class ClusterResolver(abc.ABC):
    """Finds a task's cluster (a ``ClusterSpec``) and the task's own ``(task_type, task_id)``.

    Subclasses implement ``cluster_spec()`` and ``master()``. ``task_type``, ``task_id`` and
    ``rpc_layer`` are read/write attributes that default to ``None``; ``environment`` is ``""``.
    """

    @abc.abstractmethod
    def cluster_spec(self) -> ClusterSpec:
        """The current cluster as a ``ClusterSpec`` (may be re-read on every call)."""
        raise NotImplementedError()

    @abc.abstractmethod
    def master(
        self,
        task_type: str | None = None,
        task_id: int | None = None,
        rpc_layer: str | None = None,
    ) -> str:
        """Address of a task (by default this task), optionally prefixed ``rpc_layer://``."""
        raise NotImplementedError()

    def num_accelerators(
        self,
        task_type: str | None = None,
        task_id: int | None = None,
        config_proto: Any = None,
    ) -> dict[str, int]:
        """Accelerators per device type of a task, e.g. ``{"GPU": 2}``; ``{}`` when none.

        Like TF, ``master(task_type, task_id)`` is called first, so its errors propagate. TF counts
        the devices its runtime sees, which without a cluster connection are this process's own,
        and keeps those named after the requested task. Here likewise: the local GPUs (see
        ``local_gpu_count``) are counted when no task is named or the named task is this
        resolver's own task; any other task reports ``{}``. ``config_proto`` is ignored.
        """
        del config_proto  # TF passes it to a Session; there is none here.
        self.master(task_type, task_id)
        if task_type is not None and task_id is not None:
            if (task_type, task_id) != (self.task_type, self.task_id):
                return defaultdict(int)
        return local_accelerators()

    @property
    def environment(self) -> str:
        """Where the cluster runs (TF uses ``"google"`` for some managed environments)."""
        return ""

    @property
    def task_type(self) -> str | None:
        return getattr(self, "_task_type", None)

    @task_type.setter
    def task_type(self, task_type: str | None) -> None:
        self._task_type = task_type

    @property
    def task_id(self) -> int | None:
        return getattr(self, "_task_id", None)

    @task_id.setter
    def task_id(self, task_id: int | None) -> None:
        self._task_id = task_id

    @property
    def rpc_layer(self) -> str | None:
        return getattr(self, "_rpc_layer", None)

    @rpc_layer.setter
    def rpc_layer(self, rpc_layer: str | None) -> None:
        self._rpc_layer = rpc_layer


class SimpleClusterResolver(ClusterResolver):
    """A resolver holding a fixed ``ClusterSpec`` and task identity, like TF's.

    ``master()`` returns the address of ``(task_type, task_id)`` when both arguments are given,
    otherwise the ``master`` passed to the constructor; either is prefixed with
    ``rpc_layer or self.rpc_layer``.

    Raises:
        TypeError: ``cluster_spec`` is not a ``ClusterSpec``, or ``master`` is not a ``str``.
    """

    def __init__(
        self,
        cluster_spec: ClusterSpec,
        master: str = "",
        task_type: str | None = None,
        task_id: int | None = None,
        environment: str = "",
        num_accelerators: Mapping[str, int] | None = None,
        rpc_layer: str | None = None,
    ) -> None:
        self._task_type = task_type
        self._task_id = task_id
        self._environment = environment
        self._num_accelerators = num_accelerators
        self._rpc_layer = rpc_layer
        if not isinstance(cluster_spec, ClusterSpec):
            raise TypeError(
                f"cluster_spec must be a ClusterSpec, got {type(cluster_spec).__name__}"
            )
        self._cluster_spec = cluster_spec
        if not isinstance(master, str):
            raise TypeError(f"master must be a str, got {type(master).__name__}")
        self._master = master

    def cluster_spec(self) -> ClusterSpec:
        return self._cluster_spec

    def master(
        self,
        task_type: str | None = None,
        task_id: int | None = None,
        rpc_layer: str | None = None,
    ) -> str:
        """See the class docstring; ``ValueError`` for an unknown job or task."""
        if task_type is not None and task_id is not None:
            address = self._cluster_spec.task_address(task_type, task_id)
        else:
            address = self._master
        return format_master_url(address, rpc_layer=rpc_layer or self._rpc_layer)

    @property
    def environment(self) -> str:
        return self._environment

    def num_accelerators(
        self,
        task_type: str | None = None,
        task_id: int | None = None,
        config_proto: Any = None,
    ) -> Mapping[str, int]:
        """The ``num_accelerators`` given to the constructor (the same object), or ``{}``."""
        del task_type, task_id, config_proto  # TF ignores them too: the answer is fixed.
        if self._num_accelerators is None:
            return {}
        return self._num_accelerators


class UnionClusterResolver(ClusterResolver):
    """Merges the cluster specs of several resolvers; TF exports it as ``UnionResolver``.

    ``UnionClusterResolver(*resolvers, task_type=None, task_id=None, rpc_layer=None)``. The
    first resolver answers ``master()`` (when no task is named), ``environment`` and
    ``num_accelerators``, and supplies ``task_type``/``task_id``/``rpc_layer`` unless the keyword
    given here is truthy.

    Raises:
        ValueError: an unknown keyword argument, or no resolver at all.
        TypeError: an argument that is not a ``ClusterResolver``.
    """

    def __init__(self, *args: ClusterResolver, **kwargs: Any) -> None:
        self._rpc_layer = kwargs.pop("rpc_layer", None)
        self._task_type = kwargs.pop("task_type", None)
        self._task_id = kwargs.pop("task_id", None)
        if kwargs:
            raise ValueError(f"Unexpected kwargs provided {kwargs!r}")
        if not args:
            raise ValueError("At least one ClusterResolver is required.")
        for resolver in args:
            if not isinstance(resolver, ClusterResolver):
                raise TypeError(
                    f"every argument must be a ClusterResolver, got {type(resolver).__name__}"
                )
        self._cluster_resolvers = args

    def cluster_spec(self) -> ClusterSpec:
        """The union of every resolver's spec (each one's ``cluster_spec()`` is called anew).

        Raises:
            KeyError: a sparse-merged job has the same task index in two resolvers.
        """
        specs = [resolver.cluster_spec().as_dict() for resolver in self._cluster_resolvers]
        # A job stays a list (and is concatenated) only if it is a list everywhere it appears.
        merged: dict[Any, list[Any] | dict[int, Any]] = {}
        for spec in specs:
            for job_name, tasks in spec.items():
                if job_name not in merged or isinstance(tasks, dict):
                    merged[job_name] = [] if isinstance(tasks, list) else {}
        for spec in specs:
            for job_name, tasks in spec.items():
                target = merged[job_name]
                if isinstance(target, list):
                    target.extend(tasks)
                    continue
                incoming = dict(enumerate(tasks)) if isinstance(tasks, list) else dict(tasks)
                duplicates = incoming.keys() & target.keys()
                if duplicates:
                    raise KeyError(
                        f"job {job_name!r}: task indices {sorted(duplicates)!r} are defined by "
                        "more than one resolver"
                    )
                target.update(incoming)
        return ClusterSpec(merged)

    def master(
        self,
        task_type: str | None = None,
        task_id: int | None = None,
        rpc_layer: str | None = None,
    ) -> str:
        """The named task's address in the merged spec, else the first resolver's ``master()``.

        Only ``rpc_layer`` is passed on to the first resolver, so its own task identity decides.
        """
        if task_type is not None and task_id is not None:
            address = self.cluster_spec().task_address(task_type, task_id)
            return format_master_url(address, rpc_layer or self._rpc_layer)
        return self._cluster_resolvers[0].master(rpc_layer=rpc_layer)

    @property
    def task_type(self) -> str | None:
        return self._task_type or self._cluster_resolvers[0].task_type

    @task_type.setter
    def task_type(self, task_type: str | None) -> None:
        self._task_type = task_type

    @property
    def task_id(self) -> int | None:
        # Truthiness, as in TF: an override of 0 yields the first resolver's task_id.
        return self._task_id or self._cluster_resolvers[0].task_id

    @task_id.setter
    def task_id(self, task_id: int | None) -> None:
        self._task_id = task_id

    @property
    def rpc_layer(self) -> str | None:
        return self._rpc_layer or self._cluster_resolvers[0].rpc_layer

    @rpc_layer.setter
    def rpc_layer(self, rpc_layer: str | None) -> None:
        self._rpc_layer = rpc_layer

    @property
    def environment(self) -> str:
        return self._cluster_resolvers[0].environment

    def num_accelerators(
        self,
        task_type: str | None = None,
        task_id: int | None = None,
        config_proto: Any = None,
    ) -> Mapping[str, int]:
        return self._cluster_resolvers[0].num_accelerators(task_type, task_id, config_proto)
