"""``ParameterServerStrategy``: variables on ``ps`` tasks, steps on workers, one coordinator.

TF 2's single-client model: the chief's program creates the strategy and, under its scope, the
variables; they are placed round-robin over the ``ps`` tasks (split over several by a
``variable_partitioner``). A :class:`~cluster.coordinator.ClusterCoordinator` then sends step
functions to the workers; inside them reads pull from the parameter servers and
``optimizer.apply_gradients`` pushes gradients, which the parameter servers apply with the
optimizer's rule (its slots live there, next to each variable).

- Asynchronous (default, as TF): each worker's gradients are applied as they arrive.
- ``synchronous=True`` (TF1's ``SyncReplicasOptimizer``): the coordinator runs functions in rounds
  of one per worker; the parameter servers apply the *mean* of a round's gradients once, combined
  in a fixed order, so a run is deterministic and equals one process on the round's whole batch.

A strategy object pickled into a scheduled function is rebuilt on the worker as the same
strategy bound to that worker's connections (:func:`strategy_for_config`).
"""

from __future__ import annotations

import os
import threading
from dataclasses import dataclass
from typing import Any

import numpy as np

from cluster import _context
from cluster._ps_values import OptimizerSpec
from cluster.cross_device_ops import ReductionToOneDevice
from cluster.errors import TaskConfigError
from cluster.ps.connections import PsConnections, connections_for
from cluster.ps.partitioners import Partitioner, Placer
from cluster.strategies._devices import parse_devices
from cluster.strategies._ps_variables import (
    Pending,
    PsBinding,
    PsVariable,
    ShardedVariable,
    VariableSpec,
    current_scope,
    invalidate,
    seed,
    strategy_of,
)
from cluster.strategies.base import Strategy, StrategyExtended
from cluster.variables import VariableSynchronization, initial_array, validate_options

__all__ = ["ParameterServerStrategy", "strategy_for_config"]


@dataclass(frozen=True)
class StrategyConfig:
    """What a worker needs to rebuild the strategy (pickled with every function)."""

    uid: str
    ps_tasks: tuple[tuple[str, str], ...]
    worker_tasks: tuple[tuple[str, str], ...]
    synchronous: bool


class ParameterServerExtended(StrategyExtended):
    """``strategy.extended`` of a :class:`ParameterServerStrategy`."""

    def __init__(self, container: ParameterServerStrategy, config: StrategyConfig,
                 connections: PsConnections, partitioner: Partitioner | None, *,
                 coordinator: bool) -> None:
        super().__init__(container, parse_devices(["/cpu:0"], what="ParameterServerStrategy"),
                         ReductionToOneDevice())
        self._config = config
        self._connections = connections
        self._binding = PsBinding(container, config, connections, self._handle,
                                  binding_for_config)
        self._placer = Placer(len(config.ps_tasks), partitioner)  # guarded by self._lock
        self._is_coordinator = coordinator
        self._lock = threading.Lock()
        self._handles: dict[tuple[str, ...], PsVariable] = {}  # stored names -> handle
        self._names: set[str] = set()

    @property
    def is_chief(self) -> bool:
        """The coordinator (the chief) is; a worker running closures is not."""
        return self._is_coordinator

    @property
    def collective_group(self) -> None:
        """None: parameter-server training has no collectives among the workers."""
        return None

    @property
    def parameter_devices(self) -> tuple[str, ...]:
        return tuple(f"/job:ps/replica:0/task:{i}/device:CPU:0"
                     for i in range(len(self._config.ps_tasks)))

    # -- variables -----------------------------------------------------------------------------

    def _handle(self, spec: VariableSpec) -> PsVariable:
        """The one handle of this process for the variable ``spec`` describes."""
        key = tuple(shard.name for shard in spec.shards)  # a sharded whole != its part_0
        with self._lock:
            handle = self._handles.get(key)
            if handle is None:
                cls = ShardedVariable if len(spec.shards) > 1 else PsVariable
                handle = self._handles[key] = cls(self._binding, spec)
            return handle

    def _stored_name(self, name: str) -> str:
        base = name.split(":")[0]
        candidate, n = base, 0
        while candidate in self._names:
            n += 1
            candidate = f"{base}_{n}"
        self._names.add(candidate)
        return candidate

    def create_variable(self, initial_value: Any = None, trainable: bool | None = None,
                        name: str | None = None, dtype: Any = None,
                        synchronization: Any = VariableSynchronization.AUTO,
                        aggregation: Any = None, shape: Any = None, **_: Any) -> PsVariable:
        from cluster.variables import VariableAggregation, full_name

        if not self._is_coordinator:
            raise RuntimeError(
                "ParameterServerStrategy variables are created on the coordinator, under "
                "strategy.scope() in the chief's program, not inside a function scheduled on a "
                "worker; create them before scheduling")
        context = _context.get_replica_context()
        if context is not None and context.strategy is self._container:
            return context.merge_call(
                lambda strategy: strategy.extended.create_variable(
                    initial_value, trainable, name, dtype, synchronization, aggregation, shape))
        aggregation = VariableAggregation.NONE if aggregation is None else aggregation
        synchronization, aggregation, trainable = validate_options(
            synchronization, aggregation, trainable)
        value = initial_array(initial_value, dtype, shape)
        value = value.get() if not isinstance(value, np.ndarray) else value
        full = full_name(name)
        with self._lock:
            stored = self._stored_name(full)
            shards = self._placer.place(stored, value.shape, value.dtype)
        parts = []
        for shard in shards:
            part = value[shard.offset:shard.offset + shard.shape[0]] if shard.shape else value
            parts.append(np.array(part, copy=True))
            self._connections.create(shard.ps, shard.name, part, trainable=trainable)
        spec = VariableSpec(full, tuple(value.shape), value.dtype.str, trainable,
                            synchronization.name, aggregation.name, shards)
        handle = self._handle(spec)
        seed(handle, parts, version=1)
        return handle

    # -- updates -------------------------------------------------------------------------------

    def apply_gradients(self, optimizer: Any, pairs: list[tuple[Any, Any]],
                        aggregate: bool) -> int:
        """Push the gradients to the parameter servers, which apply ``optimizer``'s rule there
        next to its slots; in any context (one replica per worker, so nothing to aggregate)."""
        optimizer.iterations += 1
        self._push_gradients(optimizer, pairs)
        return optimizer.iterations

    def _push_gradients(self, optimizer: Any, pairs: list[tuple[Any, Any]]) -> None:
        """Send ``(gradient, variable)`` pairs to the parameter servers, which apply
        ``optimizer``'s rule; in a synchronous function, as its contribution to its step."""
        from cluster._family import to_array

        spec = OptimizerSpec.from_optimizer(optimizer)
        pending = Pending()
        for grad, variable in pairs:
            if not isinstance(variable, PsVariable) or strategy_of(variable) is not self._container:
                raise ValueError(
                    f"apply_gradients: variable {getattr(variable, 'name', variable)!r} was not "
                    "created under this ParameterServerStrategy's scope")
            array = to_array(grad)[0]
            array = array.get() if not isinstance(array, np.ndarray) else array
            if tuple(array.shape) != variable.shape:
                raise ValueError(f"gradient of shape {tuple(array.shape)} for variable "
                                 f"{variable.name} of shape {variable.shape}")
            pending.add(variable, np.asarray(array, dtype=variable.dtype))
        scope = current_scope()
        options: dict[str, Any] = {"optimizer": spec}
        if scope is not None and scope.sync is not None:
            if scope.pushes:
                raise RuntimeError(
                    "synchronous ParameterServerStrategy: a scheduled function may apply "
                    "gradients once (it is one contribution to its step)")
            slot = scope.sync
            options.update(step=slot.step, num_contributors=slot.num_contributors,
                           contributor=slot.contributor, wait=False)
        try:
            self._connections.push(pending.by_ps, **options)
        finally:
            if scope is not None:
                scope.pushes += 1
            for _, variable in pairs:
                invalidate(variable)


class ParameterServerStrategy(Strategy):
    """Parameter-server training, driven by a :class:`~cluster.coordinator.ClusterCoordinator`.

    ``cluster_resolver``: the cluster (``None``: ``TFConfigClusterResolver()``); it needs at
    least one ``worker`` and one ``ps`` task, and this process must be the chief (the
    coordinator). ``variable_partitioner``: e.g. ``cluster.ps.MinSizePartitioner``, applied to
    every variable created under :meth:`scope`. ``synchronous``: see the module docstring.

    Creating the strategy starts this task's server (unless ``python -m worker`` did) and waits
    until every ``ps`` task answers (``CLUSTER_CONNECT_TIMEOUT``).
    """

    def __init__(self, cluster_resolver: Any, variable_partitioner: Partitioner | None = None,
                 *, synchronous: bool = False) -> None:
        from cluster import runtime

        if variable_partitioner is not None and not callable(variable_partitioner):
            raise TypeError("variable_partitioner must be callable (shape, dtype) -> list, got "
                            f"{variable_partitioner!r}")
        resolver = _resolver(cluster_resolver)
        spec = resolver.cluster_spec().as_dict()
        if not spec:
            raise ValueError(
                "Cluster spec must be non-empty in the ClusterResolver: set TF_CONFIG, or run "
                "the program with `clusterctl launch cluster.yaml` and `mode: coordinator`")
        for job in ("ps", "worker"):
            if not spec.get(job):
                raise ValueError(f"There must be at least one {job}. ParameterServerStrategy "
                                 f"needs `{job}` tasks in the cluster (TF_CONFIG / cluster.yaml)")
        if resolver.task_type in ("worker", "ps"):
            raise TaskConfigError(
                f"ParameterServerStrategy runs on the coordinator (the chief), not on "
                f"{resolver.task_type}:{resolver.task_id}: workers and parameter servers only "
                "serve. With clusterctl set `mode: coordinator` in cluster.yaml so only the "
                "chief runs the script")
        rt = runtime.current() or runtime.start(resolver)
        ps_tasks = tuple(t for t in rt.placement.tasks() if t[0].startswith("ps:"))
        worker_tasks = tuple(t for t in rt.placement.tasks() if t[0].startswith("worker:"))
        rt.wait_for_peers(tasks=list(ps_tasks))
        config = StrategyConfig(os.urandom(8).hex(), ps_tasks, worker_tasks, bool(synchronous))
        self._cluster_resolver = resolver
        self._runtime = rt
        self._init(config, connections_for(ps_tasks, rt.token), variable_partitioner,
                   coordinator=True)

    def _init(self, config: StrategyConfig, connections: PsConnections,
              partitioner: Partitioner | None, *, coordinator: bool) -> None:
        self._config = config
        self._partitioner = partitioner
        super().__init__(ParameterServerExtended(self, config, connections, partitioner,
                                                 coordinator=coordinator))
        _register(self)

    @property
    def cluster_resolver(self) -> Any:
        return self._cluster_resolver

    @property
    def synchronous(self) -> bool:
        return self._config.synchronous

    def __reduce__(self) -> tuple:
        return (strategy_for_config, (self._config, self._partitioner))

    def distribute_datasets_from_function(self, dataset_fn: Any, options: Any = None) -> Any:
        """``dataset_fn(InputContext)`` with one input pipeline per worker: called in a
        function on worker ``i`` (``create_per_worker_dataset``), ``input_pipeline_id == i`` and
        ``num_input_pipelines`` is the number of workers, so ``dataset_fn`` can shard."""
        from cluster.data import DistributedDatasetsFromFunction

        workers = len(self._config.worker_tasks)
        rt = self._runtime
        index = rt.task_id if rt is not None and rt.task_type == "worker" else 0
        return DistributedDatasetsFromFunction(dataset_fn, num_workers=workers,
                                               worker_index=min(index, workers - 1),
                                               num_replicas_in_sync=workers,
                                               wrap=self._wrap_local)

    def __repr__(self) -> str:
        mode = "synchronous" if self.synchronous else "asynchronous"
        return (f"<cluster.ParameterServerStrategy {mode} ps={len(self._config.ps_tasks)} "
                f"workers={len(self._config.worker_tasks)}>")


def _resolver(cluster_resolver: Any) -> Any:
    if cluster_resolver is None:
        from resolver import TFConfigClusterResolver

        return TFConfigClusterResolver()
    return cluster_resolver


_registry_lock = threading.Lock()
_registry: dict[str, ParameterServerStrategy] = {}


def _register(strategy: ParameterServerStrategy) -> None:
    with _registry_lock:
        _registry.setdefault(strategy._config.uid, strategy)


def strategy_for_config(config: StrategyConfig,
                        partitioner: Partitioner | None = None) -> ParameterServerStrategy:
    """The strategy ``config`` describes in this process: the coordinator's own, or (in a worker)
    one bound to this process's connections, built on first use and then shared."""
    with _registry_lock:
        found = _registry.get(config.uid)
    if found is not None:
        return found
    from cluster import runtime
    from cluster import settings as task_settings
    from cluster.transport.auth import resolve_token
    from resolver import ClusterSpec, SimpleClusterResolver

    rt = runtime.current()
    # Outside a task process (no runtime) the token comes from this process's own settings.
    token = rt.token if rt is not None else resolve_token([a for _, a in config.ps_tasks],
                                                           task_settings.current())
    strategy = ParameterServerStrategy.__new__(ParameterServerStrategy)
    jobs: dict[str, dict[int, str]] = {}
    for task, address in (*config.ps_tasks, *config.worker_tasks):
        job, _, index = task.partition(":")
        jobs.setdefault(job, {})[int(index)] = address
    task_type, task_id = (rt.task_type, rt.task_id) if rt is not None else ("worker", 0)
    strategy._cluster_resolver = SimpleClusterResolver(ClusterSpec(jobs), task_type=task_type,
                                                       task_id=task_id)
    strategy._runtime = rt
    strategy._init(config, connections_for(config.ps_tasks, token), partitioner,
                   coordinator=False)
    with _registry_lock:
        return _registry.setdefault(config.uid, strategy)


def binding_for_config(config: StrategyConfig) -> PsBinding:
    """The handles' binding of this process's strategy for ``config`` (how a pickled variable
    finds its strategy)."""
    return strategy_for_config(config).extended._binding


def runtime_of(strategy: ParameterServerStrategy) -> Any:
    """The ``TaskRuntime`` ``strategy`` runs in (``None`` outside a task process)."""
    return strategy._runtime


def config_of(strategy: ParameterServerStrategy) -> StrategyConfig:
    """``strategy``'s configuration: its uid, its ps and worker tasks, synchronous or not (for
    the ClusterCoordinator)."""
    return strategy._config
