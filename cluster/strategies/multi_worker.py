"""``MultiWorkerMirroredStrategy``: synchronous replicas across worker processes.

Each task (chief and workers) holds one replica: on the CPU by default, on the GPU of its local
rank with ``CLUSTER_DEVICES=gpu`` (:func:`~cluster.strategies._devices.choose_task_device`), or
on the devices a caller names; values are
reduced hierarchically (inside the task, then the ring across tasks, then to every local replica)
by :class:`~cluster.cross_device_ops.CollectiveAllReduce`. Ranks follow TensorFlow's order: the
chief first, then the workers by index. Variables' initial values are broadcast from rank 0, so
every replica starts identical even from random initialisers.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from cluster import runtime, settings
from cluster._placement import collective_members
from cluster.collectives.options import CollectiveSettings, CommunicationOptions
from cluster.strategies._devices import (
    choose_task_device,
    gpu_count,
    local_rank_of,
    log_choice,
    parse_devices,
)
from cluster.strategies._elastic import ElasticExtended, collective_ops
from cluster.strategies.base import Strategy, StrategyExtended
from cluster.transport.api import Transport
from cluster.transport.inproc import InProcessHub
from resolver import ClusterSpec, SimpleClusterResolver, TFConfigClusterResolver

if TYPE_CHECKING:
    from cluster.task_runtime import TaskRuntime

__all__ = ["COLLECTIVE_JOBS", "MultiWorkerMirroredStrategy"]

COLLECTIVE_JOBS = ("chief", "worker")
"""The jobs whose tasks take part in the all-reduce, in rank order."""


class MultiWorkerMirroredStrategy(Strategy):
    """Synchronous data parallelism over the chief and workers of ``TF_CONFIG``.

    ``cluster_resolver`` defaults to ``TFConfigClusterResolver()``; without a cluster in
    ``TF_CONFIG`` (or on an evaluator) the strategy is local to this process, as in TF.
    ``communication_options``: a :class:`~cluster.CommunicationOptions` (``bytes_per_pack``,
    ``timeout_seconds``, ``implementation``). Creating the strategy starts this task's server if
    ``python -m worker`` has not, and waits for every peer.
    """

    def __init__(self, cluster_resolver: Any = None,
                 communication_options: CommunicationOptions | None = None) -> None:
        self._init(cluster_resolver, communication_options, None, None)

    @classmethod
    def _from_local_devices(cls, devices: Sequence[str], cluster_resolver: Any = None,
                            communication_options: CommunicationOptions | None = None
                            ) -> MultiWorkerMirroredStrategy:
        """Several local replicas per task (e.g. ``["/cpu:0", "/cpu:1"]``), as TF's private
        constructor of the same name; tests use it for N tasks x k CPU replicas."""
        strategy = cls.__new__(cls)
        strategy._init(cluster_resolver, communication_options, devices, None)
        return strategy

    @classmethod
    def _from_transport(cls, transport: Transport, cluster_resolver: Any = None,
                        communication_options: CommunicationOptions | None = None,
                        devices: Sequence[str] | None = None) -> MultiWorkerMirroredStrategy:
        """A strategy over an already connected transport (rank = ``transport.rank``)."""
        strategy = cls.__new__(cls)
        strategy._init(cluster_resolver, communication_options, devices, transport)
        return strategy

    def _init(self, cluster_resolver: Any, options: CommunicationOptions | None,
              devices: Sequence[str] | None, transport: Transport | None) -> None:
        options = CommunicationOptions() if options is None else options
        if not isinstance(options, CommunicationOptions):
            raise TypeError(
                f"communication_options must be a cluster.CommunicationOptions, got {options!r}"
            )
        elastic = None
        if transport is None:
            cluster_resolver, transport, elastic = _connect(cluster_resolver)
        elif cluster_resolver is None:
            cluster_resolver = _resolver_for(transport)
        self._cluster_resolver = cluster_resolver
        if elastic is not None:
            super().__init__(_elastic_extended(self, elastic, transport, devices, options))
            return
        parsed = parse_devices(_task_devices(transport) if devices is None else devices,
                               what="MultiWorkerMirroredStrategy devices")
        ops = collective_ops(transport, options, _collective_settings())
        super().__init__(StrategyExtended(self, parsed, ops, num_workers=ops.group.world_size,
                                          worker_index=ops.group.rank, options=options))

    @property
    def cluster_resolver(self) -> Any:
        """The resolver this strategy was built from (``.task_type``, ``.task_id``)."""
        return self._cluster_resolver


def _task_devices(transport: Transport) -> list[str]:
    """This task's one replica when the user named no device: ``CLUSTER_DEVICES`` decides
    (:func:`choose_task_device`), by the task's local rank among the tasks of its host; the
    choice is logged once."""
    return _device_at([p.address for p in transport.peers], transport.rank,
                      str(transport.peers[transport.rank]))


def _device_at(addresses: list[str], rank: int, me: str) -> list[str]:
    rt = runtime.current()
    task = rt.settings if rt is not None else settings.current()
    local_rank, local_size = local_rank_of(addresses, rank)
    choice = choose_task_device(task.devices, local_rank, local_size, gpu_count(),
                                task.cuda_visible_devices)
    log_choice(choice.describe(f"MultiWorkerMirroredStrategy ({me})"))
    return [choice.device]


def _collective_settings() -> CollectiveSettings | None:
    """The task's collective settings (``CLUSTER_COLLECTIVE_*``), when this process is a task."""
    rt = runtime.current()
    return rt.settings.collectives if rt is not None else None


def _local_transport() -> Transport:
    return InProcessHub(1).transports[0]


def _connect(resolver: Any) -> tuple[Any, Transport | None, TaskRuntime | None]:
    """The resolver, the connected collective transport of this task (or a local one), and
    the task runtime when the cluster is elastic (then the transport is None for a task that
    joins a running group)."""
    if resolver is None:
        resolver = TFConfigClusterResolver()
    spec = resolver.cluster_spec().as_dict()
    members = [job for job in COLLECTIVE_JOBS if spec.get(job)]
    if not members or resolver.task_type not in COLLECTIVE_JOBS:
        return resolver, _local_transport(), None
    task_runtime = runtime.current() or runtime.start(resolver)
    if task_runtime.elastic is not None:
        return resolver, task_runtime.elastic_transport(), task_runtime
    return resolver, task_runtime.collective_transport(), None


def _elastic_extended(strategy: MultiWorkerMirroredStrategy, task_runtime: TaskRuntime,
                      transport: Transport | None, devices: Sequence[str] | None,
                      options: CommunicationOptions) -> ElasticExtended:
    """The strategy's ``extended`` in an elastic cluster: one replica per task (the group's
    size changes; a task's replicas do not), on the device ``CLUSTER_DEVICES`` gives it."""
    if devices is not None and len(devices) != 1:
        raise ValueError("an elastic MultiWorkerMirroredStrategy has one replica per task; "
                         f"got devices={list(devices)!r}")
    settings = task_runtime.settings
    if devices is None:  # by the cluster as configured: a task keeps its device when it regroups
        configured = collective_members(task_runtime.cluster_spec)
        names = [t for t, _ in configured]
        devices = _device_at([a for _, a in configured], names.index(task_runtime.task),
                             f"{task_runtime.task} at {task_runtime.address}")
    return ElasticExtended(
        strategy, parse_devices(devices, what="MultiWorkerMirroredStrategy devices"), transport,
        elastic=task_runtime.elastic,
        make_ops=lambda t: collective_ops(t, options, settings.collectives),
        local_transport=_local_transport, regroup_timeout=settings.connect_timeout,
        options=options)


def _resolver_for(transport: Transport) -> Any:
    jobs: dict[str, dict[int, str]] = {}
    for peer in transport.peers:
        job, _, index = peer.task.partition(":")
        jobs.setdefault(job or "worker", {})[int(index or 0)] = peer.address or "localhost:0"
    me = transport.peers[transport.rank].task.partition(":")
    return SimpleClusterResolver(ClusterSpec(jobs), task_type=me[0], task_id=int(me[2] or 0))
