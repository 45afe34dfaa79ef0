"""``ClusterCoordinator``: schedule functions on the workers of a ParameterServerStrategy.

The chief's program schedules functions; they queue in a :class:`~._queue.ClosureQueue`, and one
:class:`~._dispatch.WorkerDispatcher` per worker task sends them, one at a time, to its worker
(``Worker.Run`` through :class:`~cluster.transport.worker_client.WorkerClient`), which runs them
(``cluster.coordinator._calls``) and answers with the result. Nothing here polls: waiters wake
on the queue's condition, on a call's completion or on a heartbeat monitor's report.

Fault tolerance, as TF promises and a little more:

- A worker that dies (its heartbeat stream breaks, its connection drops, it stops answering for
  ``heartbeat_timeout`` s) has the function it was running put back at the front of the queue;
  other workers take it. Its dispatcher waits until the task serves again (a new process with a
  new incarnation), re-creates its per-worker datasets there, and uses it again.
- A parameter server that dies is fatal: its variables are lost. Heartbeats notice within
  seconds and every waiting call (``join``, ``fetch``, ``schedule``) raises
  :class:`~cluster.errors.PsUnavailableError` naming the task.
- A function that raises cancels the functions still queued; ``join``/``schedule``/``done``
  raise that error once (the coordinator is usable again afterwards, as in TF).
- When no worker has served for ``connect_timeout`` seconds while work waits, the queued work
  fails with :class:`~cluster.errors.PeerUnavailableError` naming the workers, so nothing hangs.

Synchronous strategies run functions in rounds of one per worker (round ``r`` = functions
``r*N .. r*N+N-1`` in schedule order, contributor = position in the round); round ``r+1``
starts when every function of round ``r`` has finished, so each step reads the previous step's
update. Contributor ``c`` runs on worker ``c`` (so per-worker iterators feed the same steps in
every run) unless that worker is down; a function of a dead worker is re-run elsewhere with the
same step and contributor.
"""

from __future__ import annotations

import itertools
import logging
import threading
from collections.abc import Callable
from typing import Any

from cluster import _nest
from cluster.coordinator._closure import Closure
from cluster.coordinator._dispatch import Dispatch, WorkerDispatcher
from cluster.coordinator._queue import ClosureQueue
from cluster.coordinator._resources import Resources
from cluster.coordinator.remote_values import PerWorkerDataset, PerWorkerValues, RemoteValue
from cluster.errors import PeerUnavailableError, PsUnavailableError
from cluster.strategies._ps_variables import SyncSlot
from cluster.strategies.parameter_server import (
    ParameterServerStrategy,
    config_of,
    runtime_of,
)
from cluster.transport.api import PeerInfo
from cluster.transport.ps_client import PsWatch
from cluster.transport.worker_client import WorkerClient

__all__ = ["ClusterCoordinator"]

log = logging.getLogger(__name__)


class ClusterCoordinator:
    """Schedules functions on the workers of ``strategy`` (TF's ``ClusterCoordinator``).

    On the chief of a launched ``mode: coordinator`` cluster (not a doctest: it needs the
    cluster)::

        coordinator = ClusterCoordinator(strategy)
        iterator = iter(coordinator.create_per_worker_dataset(dataset_fn))
        for _ in range(steps):
            loss = coordinator.schedule(step_fn, args=(iterator,))
        coordinator.join(); loss.fetch()

    ``strategy`` must be a :class:`~cluster.ParameterServerStrategy`; one coordinator exists per
    strategy (constructing another returns it). See the module docstring for failure handling.
    Functions and their arguments are pickled with cloudpickle (functions defined in the chief's
    script travel by value; imported modules must be importable on the workers).
    """

    def __new__(cls, strategy: Any) -> ClusterCoordinator:
        existing = getattr(strategy, "_cluster_coordinator", None)
        if existing is not None:
            return existing
        return super().__new__(cls)

    def __init__(self, strategy: Any) -> None:
        if getattr(self, "_strategy", None) is not None:
            return
        if not isinstance(strategy, ParameterServerStrategy):
            raise ValueError("Only cluster.ParameterServerStrategy is supported to work with "
                             f"ClusterCoordinator, got {type(strategy).__name__}")
        if not strategy.extended.is_chief:
            raise RuntimeError("ClusterCoordinator runs on the coordinator (the chief), not "
                               "inside a scheduled function")
        rt = runtime_of(strategy)
        self._strategy = strategy
        self._runtime = rt
        workers = config_of(strategy).worker_tasks
        self._num_workers = len(workers)
        self._queue = ClosureQueue(strategy.synchronous, self._num_workers)
        self._seq = itertools.count()
        self._resources = Resources()
        dispatch = Dispatch(self._queue, self._resources, rt.settings, rt.token)
        self._workers = [
            WorkerDispatcher(dispatch, i, WorkerClient(task, address, rt.token, me=rt.task))
            for i, (task, address) in enumerate(workers)]
        self._ps_watch = self._watch_parameter_servers()
        self._watchdog = threading.Thread(target=self._watch_workers, name="coordinator-watch",
                                          daemon=True)
        self._closed = threading.Event()
        for worker in self._workers:
            worker.start()
        self._watchdog.start()
        strategy._cluster_coordinator = self
        _register_exit(self)

    @property
    def strategy(self) -> ParameterServerStrategy:
        return self._strategy

    # -- scheduling ----------------------------------------------------------------------------

    def schedule(self, fn: Callable[..., Any], args: Any = None,
                 kwargs: Any = None) -> RemoteValue:
        """Queue ``fn(*args, **kwargs)`` to run on some worker; returns its :class:`RemoteValue`
        at once. Raises the error of an earlier function, if one failed since the last call."""
        if not callable(fn):
            raise TypeError(f"schedule: fn must be callable, got {type(fn).__name__}")
        args = tuple(args or ())
        kwargs = dict(kwargs or {})
        self._queue.raise_error()
        seq = next(self._seq)
        sync = None
        if self._strategy.synchronous:
            n = self._num_workers
            sync = SyncSlot(step=seq // n, contributor=seq % n, num_contributors=n)
        closure = Closure(seq, fn, args, kwargs, RemoteValue(wait=self._queue.wait), sync)
        leaves = _nest.flatten((args, kwargs))
        if not any(isinstance(leaf, RemoteValue) for leaf in leaves):
            closure.prepare()  # pickling errors surface here, in the caller
        self._queue.put(closure)
        return closure.value

    def join(self) -> None:
        """Block until every scheduled function ran; raise the first error if one failed."""
        self._queue.join()
        if self._strategy.synchronous:
            self._warn_partial_round()

    def done(self) -> bool:
        """True when nothing is queued or running (raises like :meth:`join`)."""
        return self._queue.idle()

    def fetch(self, val: Any) -> Any:
        """``val`` with every :class:`RemoteValue` in it replaced by its result (blocking)."""
        return _nest.map_structure(
            lambda leaf: leaf.fetch() if isinstance(leaf, RemoteValue) else leaf, val)

    def _warn_partial_round(self) -> None:
        scheduled = next(self._seq)
        self._seq = itertools.count(scheduled)
        if scheduled % self._num_workers:
            log.warning(
                "synchronous training: %d functions were scheduled, not a multiple of the %d "
                "workers; the gradients of the last %d never completed a step and were not "
                "applied", scheduled, self._num_workers, scheduled % self._num_workers)

    # -- per-worker values -----------------------------------------------------------------------

    def create_per_worker_dataset(self, dataset_fn: Callable[[], Any]) -> PerWorkerDataset:
        """``dataset_fn()`` on every worker (lazily, and again on a worker that restarts);
        ``iter()`` of the result gives one iterator per worker to pass to :meth:`schedule`.
        Inside ``dataset_fn``, ``strategy.distribute_datasets_from_function`` passes each
        worker its own ``InputContext`` (``input_pipeline_id`` = worker index)."""
        if not callable(dataset_fn):
            raise TypeError("create_per_worker_dataset: dataset_fn must be a callable that "
                            f"returns an iterable, got {type(dataset_fn).__name__}")
        return PerWorkerDataset(self._resources,
                                self._resources.add(_make_dataset, (dataset_fn,)))

    def _create_per_worker_resources(self, fn: Callable[..., Any], args: Any = None,
                                     kwargs: Any = None) -> PerWorkerValues:
        """``fn(*args, **kwargs)`` once on every worker, as TF's private method of this name."""
        return PerWorkerValues(self._resources,
                               self._resources.add(fn, tuple(args or ()), kwargs))

    # -- failures ------------------------------------------------------------------------------

    def _watch_parameter_servers(self) -> PsWatch:
        settings = self._runtime.settings
        peers = [PeerInfo(i, task, address)
                 for i, (task, address) in enumerate(config_of(self._strategy).ps_tasks)]

        def gone(peer: PeerInfo, error: PeerUnavailableError | None) -> None:
            why = str(error) if error is not None else f"{peer} shut down"
            self._queue.fail(PsUnavailableError(
                f"parameter server {peer.task} ({peer.address}) is gone: {why}; its variables "
                "are lost, so training stops (restart the job, from a checkpoint if any)",
                task=peer.task, address=peer.address), fatal=True)

        return PsWatch(peers, self._runtime.token, me=self._runtime.task, on_gone=gone,
                       interval=settings.heartbeat_interval, timeout=settings.heartbeat_timeout)

    def _watch_workers(self) -> None:
        """Fail the queued work when no worker has served for ``connect_timeout`` seconds."""
        budget = self._runtime.settings.connect_timeout
        while (down := self._queue.wait_starved(budget)) is not None:
            listed = ", ".join(f"{self._workers[i].task} ({self._workers[i].address})"
                               for i in down)
            first = self._workers[down[0]]
            self._queue.fail(PeerUnavailableError(
                f"no worker has served for {budget:g} s while functions wait: {listed}",
                task=first.task, address=first.address))

    def _close(self) -> None:
        if self._closed.is_set():
            return
        self._closed.set()
        self._queue.close()
        self._ps_watch.close()
        for worker in self._workers:
            worker.stop()


def _make_dataset(dataset_fn: Callable[[], Any]) -> Any:
    dataset = dataset_fn()
    if not hasattr(dataset, "__iter__"):
        raise TypeError(f"dataset_fn must return an iterable, got {type(dataset).__name__}")
    return dataset


_exit_lock = threading.Lock()
_live: list[ClusterCoordinator] = []


def _register_exit(coordinator: ClusterCoordinator) -> None:
    """Stop the dispatchers before the interpreter joins threads (see cluster.runtime)."""
    with _exit_lock:
        first = not _live
        _live.append(coordinator)
    if first:
        register = getattr(threading, "_register_atexit", None)
        if register is not None:
            try:
                register(_close_all)
            except RuntimeError:
                pass


def _close_all() -> None:
    with _exit_lock:
        live = list(_live)
        _live.clear()
    for coordinator in live:
        coordinator._close()
