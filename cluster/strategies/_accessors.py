"""Who this process is in its strategy: rank, world size, local replicas, chief, and the
collective group, as public read-only properties of ``strategy.extended``.

TensorFlow's names where TensorFlow has them (``should_checkpoint``, ``should_save_summary``,
``should_init``, ``worker_devices``); the others (``worker_index``, ``num_workers``,
``num_local_replicas``, ``is_chief``, ``collective_group``) are ours, because TF only has them
privately or through ``strategy.cluster_resolver``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from cluster.collectives.group import CollectiveGroup
    from cluster.cross_device_ops import CrossDeviceOps

__all__ = ["WorkerInfo", "shared_tensor_error"]


class WorkerInfo:
    """Mixed into ``StrategyExtended``; reads what the strategy was built with.

    Ranks: the synchronous workers are numbered as the collective group numbers them, the chief
    first (when there is one), then the workers by index. So ``worker_index == 0`` is exactly
    TensorFlow's chief rule (``multi_worker_util.is_chief``: the chief, else worker 0 when the
    cluster has no chief), and a process outside any cluster (local strategies, an evaluator,
    the coordinator of a ``ParameterServerStrategy``) is its own chief.
    """

    _worker_index: int
    _num_workers: int
    _local_count: int
    _cross_device_ops: CrossDeviceOps
    _single_group: CollectiveGroup | None = None

    @property
    def worker_index(self) -> int:
        """This process's rank among the strategy's workers (0 .. ``num_workers - 1``)."""
        return self._worker_index

    @property
    def num_workers(self) -> int:
        """Processes (tasks) that take part in each synchronous step (the world size)."""
        return self._num_workers

    @property
    def num_local_replicas(self) -> int:
        """Replicas in this process (``len(worker_devices)``); ``num_replicas_in_sync`` is
        ``num_workers * num_local_replicas``."""
        return self._local_count

    @property
    def is_chief(self) -> bool:
        """True on the task that writes checkpoints and summaries (TF's rule, see the class)."""
        return self._worker_index == 0

    @property
    def should_checkpoint(self) -> bool:
        """TF's name: whether this worker should write checkpoints (the chief)."""
        return self.is_chief

    @property
    def should_save_summary(self) -> bool:
        """TF's name: whether this worker should write summaries (the chief)."""
        return self.is_chief

    @property
    def should_init(self) -> bool:
        """TF's name: whether this worker initializes variables (every worker does here; the
        strategies broadcast the chief's initial values)."""
        return True

    @property
    def collective_group(self) -> CollectiveGroup | None:
        """The :class:`~cluster.collectives.CollectiveGroup` with one rank per worker, for
        collectives outside ``strategy.run`` (e.g. ``all_reduce_async`` from an autograd hook,
        then ``wait()``): ``MultiWorkerMirroredStrategy``'s own group (its calls keep one order
        with the strategy's), or a one-rank group for a single-replica local strategy.
        ``None`` where the replicas are threads of one process (``MirroredStrategy`` with
        several devices: use ``get_replica_context().all_reduce``) or there are no collectives
        (``ParameterServerStrategy``)."""
        group = getattr(self._cross_device_ops, "group", None)
        if group is not None:
            return group
        if self._num_workers != 1 or self._local_count != 1:
            return None
        if self._single_group is None:
            from cluster.collectives.group import CollectiveGroup  # only when asked for
            from cluster.transport.inproc import InProcessHub

            self._single_group = CollectiveGroup(InProcessHub(1).transports[0], "local")
        return self._single_group


def shared_tensor_error(what: str, value: object, count: int) -> ValueError:
    """The error for one tensor object that every replica thread passed: short (never the
    tensor's contents), and says what to do."""
    shape = tuple(getattr(value, "shape", ()))
    dtype = getattr(value, "dtype", "?")
    kind = f"{type(value).__module__.split('.')[0]}.{type(value).__name__}"
    return ValueError(
        f"{what}: all {count} replicas passed the same {kind} object (shape {list(shape)}, "
        f"{dtype}), so they share one model: its parameters and .grad are written by every "
        "replica thread at once. Give each replica its own copy of the model (e.g. "
        "models[get_replica_context().replica_id_in_sync_group], made with copy.deepcopy), or "
        "run one replica per process (MultiWorkerMirroredStrategy)"
    )
