"""``ClusterCoordinator``: schedule functions on the workers of a ParameterServerStrategy.

The chief's program schedules functions; they queue here, and one dispatcher thread per worker
task sends them, one at a time, to its worker (``Worker.Run``, ``proto/coordinator.proto``),
which runs them (``cluster.coordinator._calls``) and answers with the result.

Fault tolerance, as TF promises and a little more:

- A worker that dies (its heartbeat stream breaks, its connection drops, it stops answering for
  ``heartbeat_timeout`` s) has the function it was running put back at the front of the queue;
  other workers take it. Its dispatcher polls until the task serves again (a new process with a
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

import collections
import itertools
import logging
import os
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import cloudpickle
import grpc

from cluster import _nest
from cluster.coordinator._calls import Call, ResourceRef, ResourceSpec
from cluster.coordinator._wire import SERVICE, verify_reply
from cluster.coordinator.values import PerWorkerDataset, PerWorkerValues, RemoteValue
from cluster.errors import (
    ClusterError,
    FunctionCancelledError,
    FunctionTimeoutError,
    PeerUnavailableError,
    PsUnavailableError,
    RemoteFunctionError,
    UnauthenticatedError,
)
from cluster.settings import ENV_FUNCTION_TIMEOUT
from cluster.strategies._ps_variables import SyncSlot
from cluster.strategies.parameter_server import ParameterServerStrategy
from cluster.transport._pb import control_pb2, coordinator_pb2
from cluster.transport.api import PeerInfo
from cluster.transport.control import SERVICE as CONTROL_SERVICE
from cluster.transport.control import HeartbeatMonitor
from cluster.transport.server import CHANNEL_OPTIONS

__all__ = ["ClusterCoordinator"]

log = logging.getLogger(__name__)

_POLL = 0.2  # seconds between checks of a worker that is down, and of heartbeat silence
_WORKER_FAILURES = {grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.CANCELLED}


@dataclass(eq=False)
class _Closure:
    """One scheduled function: its result slot, pickled body (made once) and sync slot."""

    seq: int
    fn: Callable[..., Any]
    args: tuple
    kwargs: dict
    value: RemoteValue
    sync: SyncSlot | None
    body: bytes | None = None
    refs: tuple[int, ...] = ()
    generation: int = 0

    @property
    def round(self) -> int:
        return self.sync.step if self.sync is not None else 0

    def prepare(self) -> None:
        """Pickle the body (once): per-worker values become refs, RemoteValues their results."""
        if self.body is not None:
            return
        refs: list[int] = []

        def swap(leaf: Any) -> Any:
            if isinstance(leaf, PerWorkerValues):
                refs.append(leaf._rid)
                return leaf._ref()
            if isinstance(leaf, RemoteValue):
                return leaf.fetch()
            return leaf

        args, kwargs = _nest.map_structure(swap, (self.args, self.kwargs))
        self.body = cloudpickle.dumps((self.fn, args, kwargs))
        self.refs = tuple(refs)


class _Queue:
    """Closures waiting for a worker, the count in flight, the first error, sync rounds."""

    def __init__(self, synchronous: bool) -> None:
        self._synchronous = synchronous
        self._cond = threading.Condition()
        self._items: collections.deque[_Closure] = collections.deque()
        self._inflight = 0
        self._per_round: collections.Counter[int] = collections.Counter()
        self._error: BaseException | None = None  # raised once by join/schedule/done
        self._fatal: BaseException | None = None  # raised by every call from then on
        self._generation = 0  # +1 each time an error is raised to the caller
        self._closing = False

    def put(self, closure: _Closure) -> None:
        with self._cond:
            self._raise_error()
            self._items.append(closure)
            self._per_round[closure.round] += 1
            self._cond.notify_all()

    def _eligible(self, worker: int, is_up: Callable[[int], bool]) -> _Closure | None:
        if not self._items or self._error is not None or self._fatal is not None:
            return None
        if not self._synchronous:
            return self._items[0]
        current = min(self._per_round)
        # Contributor c of a round runs on worker c, so each worker's iterator feeds the same
        # steps in every run (reproducible); it runs elsewhere only while worker c is down.
        fallback = None
        for closure in self._items:
            if closure.round != current:
                break  # the previous round is still running
            contributor = closure.sync.contributor
            if contributor == worker:
                return closure
            if fallback is None and not is_up(contributor):
                fallback = closure
        return fallback

    def get(self, worker: int = 0,
            is_up: Callable[[int], bool] = lambda _: True) -> _Closure | None:
        """The next closure for dispatcher ``worker`` (``None`` when closing); blocks until
        there is one. ``is_up(i)``: whether worker ``i`` serves (synchronous pinning)."""
        with self._cond:
            while not self._closing:
                closure = self._eligible(worker, is_up)
                if closure is not None:
                    break
                # Woken by every change of the queue; the timeout re-checks is_up().
                self._cond.wait(_POLL if self._synchronous else None)
            else:
                return None
            self._items.remove(closure)
            self._inflight += 1
            closure.generation = self._generation
            return closure

    def requeue(self, closure: _Closure) -> None:
        """Put a closure whose worker died back in front, to run elsewhere."""
        with self._cond:
            self._inflight -= 1
            if self._error is not None or self._fatal is not None:
                self._finish(closure)
                closure.value._fail(FunctionCancelledError(
                    "not run: an earlier function failed"))
            else:
                self._items.appendleft(closure)
            self._cond.notify_all()

    def _finish(self, closure: _Closure) -> None:
        self._per_round[closure.round] -= 1
        if not self._per_round[closure.round]:
            del self._per_round[closure.round]

    def finished(self, closure: _Closure, error: BaseException | None = None) -> None:
        with self._cond:
            self._inflight -= 1
            self._finish(closure)
            # An error already raised to the caller ends its generation: failures of functions
            # dispatched before that are its echoes, not news.
            if error is not None and closure.generation == self._generation:
                self._set_error(error)
            self._cond.notify_all()

    def _set_error(self, error: BaseException, fatal: bool = False) -> None:
        if fatal and self._fatal is None:
            self._fatal = error
        elif not fatal and self._error is None and self._fatal is None:
            self._error = error
        while self._items:
            closure = self._items.popleft()
            self._finish(closure)
            closure.value._fail(error if fatal else FunctionCancelledError(
                f"not run: an earlier function failed: {type(error).__name__}: {error}"))
        self._cond.notify_all()

    def fail(self, error: BaseException, fatal: bool = False) -> None:
        with self._cond:
            self._set_error(error, fatal)

    def _raise_error(self) -> None:
        if self._fatal is not None:
            raise self._fatal
        error, self._error = self._error, None
        if error is not None:
            self._generation += 1
            raise error

    def raise_error(self) -> None:
        with self._cond:
            self._raise_error()

    def idle(self) -> bool:
        with self._cond:
            self._raise_error()
            return not self._items and not self._inflight

    def pending(self) -> bool:
        with self._cond:
            return bool(self._items) and self._error is None and self._fatal is None

    def join(self) -> None:
        """Until nothing is queued or running; after a function's error, until the functions
        already running ended too (the queued ones were cancelled), then raise it."""
        with self._cond:
            while (self._items or self._inflight) and self._fatal is None:
                self._cond.wait()
            self._raise_error()

    def wait(self, event: threading.Event) -> None:
        """Wait for ``event``; raise the fatal error meanwhile (a RemoteValue's fetch)."""
        with self._cond:
            while not event.is_set() and self._fatal is None:
                self._cond.wait(0.5)
            if not event.is_set() and self._fatal is not None:
                raise self._fatal

    def close(self) -> None:
        with self._cond:
            self._closing = True
            self._cond.notify_all()


class ClusterCoordinator:
    """Schedules functions on the workers of ``strategy`` (TF's ``ClusterCoordinator``).

    >>> coordinator = ClusterCoordinator(strategy)       # doctest: +SKIP
    >>> iterator = iter(coordinator.create_per_worker_dataset(dataset_fn))
    >>> for _ in range(steps):
    ...     loss = coordinator.schedule(step_fn, args=(iterator,))
    >>> coordinator.join(); loss.fetch()

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
        if not strategy.extended._is_coordinator:
            raise RuntimeError("ClusterCoordinator runs on the coordinator (the chief), not "
                               "inside a scheduled function")
        rt = strategy._runtime
        self._strategy = strategy
        self._runtime = rt
        self._timeout = rt.settings.function_timeout
        self._queue = _Queue(strategy.synchronous)
        self._seq = itertools.count()
        self._run_ids = itertools.count(1)
        self._rids = itertools.count(1)
        self._resources: dict[int, ResourceSpec] = {}
        self._resource_lock = threading.Lock()
        workers = strategy._config.worker_tasks
        self._num_workers = len(workers)
        self._workers = [_WorkerDispatcher(self, i, task, address)
                         for i, (task, address) in enumerate(workers)]
        self._ps_monitor = self._watch_parameter_servers()
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
        closure = _Closure(seq, fn, args, kwargs, RemoteValue(), sync)
        leaves = _nest.flatten((args, kwargs))
        if not any(isinstance(leaf, RemoteValue) for leaf in leaves):
            closure.prepare()  # pickling errors surface here, in the caller
        closure.value._wait = self._queue.wait
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

    def _add_resource(self, fn: Callable[..., Any], args: tuple = (),
                      kwargs: dict | None = None) -> int:
        def swap(leaf: Any) -> Any:
            return leaf._ref() if isinstance(leaf, PerWorkerValues) else leaf

        rid = next(self._rids)
        spec = ResourceSpec(rid, fn, _nest.map_structure(swap, tuple(args)),
                            _nest.map_structure(swap, dict(kwargs or {})))
        cloudpickle.dumps(spec)  # fail here, not on every worker, if it cannot travel
        with self._resource_lock:
            self._resources[rid] = spec
        return rid

    def create_per_worker_dataset(self, dataset_fn: Callable[[], Any]) -> PerWorkerDataset:
        """``dataset_fn()`` on every worker (lazily, and again on a worker that restarts);
        ``iter()`` of the result gives one iterator per worker to pass to :meth:`schedule`.
        Inside ``dataset_fn``, ``strategy.distribute_datasets_from_function`` passes each
        worker its own ``InputContext`` (``input_pipeline_id`` = worker index)."""
        if not callable(dataset_fn):
            raise TypeError("create_per_worker_dataset: dataset_fn must be a callable that "
                            f"returns an iterable, got {type(dataset_fn).__name__}")
        return PerWorkerDataset(self, self._add_resource(_make_dataset, (dataset_fn,)))

    def _create_per_worker_resources(self, fn: Callable[..., Any], args: Any = None,
                                     kwargs: Any = None) -> PerWorkerValues:
        """``fn(*args, **kwargs)`` once on every worker, as TF's private method of this name."""
        return PerWorkerValues(self, self._add_resource(fn, tuple(args or ()), kwargs))

    def _resources_for(self, refs: tuple[int, ...], created: set[int]) -> list[ResourceSpec]:
        """The specs a worker lacks for ``refs``, dependencies first."""
        out: list[ResourceSpec] = []
        seen: set[int] = set(created)

        def need(rid: int) -> None:
            if rid in seen:
                return
            seen.add(rid)
            with self._resource_lock:
                spec = self._resources[rid]
            for leaf in _nest.flatten((spec.args, spec.kwargs)):
                if isinstance(leaf, ResourceRef):
                    need(leaf.rid)
            out.append(spec)

        for rid in refs:
            need(rid)
        return out

    # -- failures ------------------------------------------------------------------------------

    def _watch_parameter_servers(self) -> HeartbeatMonitor:
        settings = self._runtime.settings
        me = PeerInfo(-1, self._runtime.task, self._runtime.address)
        peers = [PeerInfo(i, task, address)
                 for i, (task, address) in enumerate(self._strategy._config.ps_tasks)]
        channels = {p.rank: grpc.insecure_channel(p.address, options=CHANNEL_OPTIONS)
                    for p in peers}
        self._ps_channels = channels

        def lost(peer: PeerInfo, error: PeerUnavailableError | None) -> None:
            why = str(error) if error is not None else f"{peer} shut down"
            self._queue.fail(PsUnavailableError(
                f"parameter server {peer.task} ({peer.address}) is gone: {why}; its variables "
                "are lost, so training stops (restart the job, from a checkpoint if any)",
                task=peer.task, address=peer.address), fatal=True)

        monitor = HeartbeatMonitor(me, peers, channels, self._runtime.token,
                                   on_lost=lost, on_departed=lambda p: lost(p, None),
                                   interval=settings.heartbeat_interval,
                                   timeout=settings.heartbeat_timeout)
        monitor.start()
        return monitor

    def _watch_workers(self) -> None:
        budget = self._runtime.settings.connect_timeout
        while not self._closed.wait(0.5):
            if not self._queue.pending():
                continue
            down = [w for w in self._workers if not w.up]
            if len(down) < len(self._workers):
                continue
            since = min(w.down_since for w in down)
            if time.monotonic() - since > budget:
                listed = ", ".join(f"{w.task} ({w.address})" for w in down)
                self._queue.fail(PeerUnavailableError(
                    f"no worker has served for {budget:g} s while functions wait: {listed}",
                    task=down[0].task, address=down[0].address))

    def _function_failed(self, closure: _Closure, worker: _WorkerDispatcher,
                         error: BaseException) -> None:
        closure.value._fail(error)
        # PsConnections types a lost parameter server as PsUnavailableError on every task.
        if isinstance(error, PsUnavailableError):
            self._queue.finished(closure)
            self._queue.fail(error, fatal=True)
        else:
            self._queue.finished(closure, error)

    def _is_up(self, index: int) -> bool:
        return self._workers[index].up

    def _close(self) -> None:
        if self._closed.is_set():
            return
        self._closed.set()
        self._queue.close()
        self._ps_monitor.close()
        for worker in self._workers:
            worker.stop()
        for channel in self._ps_channels.values():
            channel.close()


def _make_dataset(dataset_fn: Callable[[], Any]) -> Any:
    dataset = dataset_fn()
    if not hasattr(dataset, "__iter__"):
        raise TypeError(f"dataset_fn must return an iterable, got {type(dataset).__name__}")
    return dataset




class _WorkerDispatcher:
    """Sends closures to one worker task, one at a time; notices its death and its return."""

    def __init__(self, coordinator: ClusterCoordinator, index: int, task: str,
                 address: str) -> None:
        self.index = index
        self.task = task
        self.address = address
        self.up = False
        self.down_since = time.monotonic()
        self._coordinator = coordinator
        self._token = coordinator._runtime.token
        self._me = coordinator._runtime.task
        self._channel = grpc.insecure_channel(address, options=CHANNEL_OPTIONS)
        self._run = self._channel.unary_unary(
            f"/{SERVICE}/Run", request_serializer=coordinator_pb2.RunRequest.SerializeToString,
            response_deserializer=coordinator_pb2.RunReply.FromString)
        self._check = self._channel.unary_unary(
            f"/{CONTROL_SERVICE}/Check",
            request_serializer=control_pb2.HealthCheckRequest.SerializeToString,
            response_deserializer=control_pb2.HealthCheckResponse.FromString)
        self._heartbeat = self._channel.unary_stream(
            f"/{CONTROL_SERVICE}/Heartbeat",
            request_serializer=control_pb2.HeartbeatRequest.SerializeToString,
            response_deserializer=control_pb2.HeartbeatResponse.FromString)
        self._incarnation: int | None = None
        self._created: set[int] = set()
        self._stream: Any = None
        self._last_beat = 0.0
        self._lost = threading.Event()
        self._stopping = threading.Event()
        self._thread = threading.Thread(target=self._main, name=f"dispatch-{task}", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stopping.set()
        if self._stream is not None:
            self._stream.cancel()
        self._thread.join(timeout=5.0)
        self._channel.close()

    # -- liveness ------------------------------------------------------------------------------

    def _connect(self) -> bool:
        """True once the worker serves and its heartbeat stream is open."""
        try:
            reply = self._check(control_pb2.HealthCheckRequest(expected_task=self.task),
                                timeout=1.0, metadata=self._token.metadata)
        except grpc.RpcError as e:
            if e.code() == grpc.StatusCode.UNAUTHENTICATED:
                self._coordinator._queue.fail(UnauthenticatedError(
                    f"{self.task} ({self.address}) refused the coordinator's token "
                    "(CLUSTER_TOKEN must be the same on every task)"), fatal=True)
            self._stopping.wait(_POLL)
            return False
        if reply.status != control_pb2.HealthCheckResponse.SERVING:
            self._stopping.wait(_POLL)
            return False
        if reply.incarnation != self._incarnation:
            if self._incarnation is not None:
                log.warning("%s is back (a new process): using it again", self.task)
            self._incarnation = reply.incarnation
            self._created.clear()  # a new process has none of the per-worker resources
        self._lost.clear()
        self._last_beat = time.monotonic()
        self._stream = self._heartbeat(control_pb2.HeartbeatRequest(task=self._me),
                                       metadata=self._token.metadata)
        threading.Thread(target=self._read_beats, args=(self._stream,),
                         name=f"beats-{self.task}", daemon=True).start()
        self.up = True
        return True

    def _read_beats(self, stream: Any) -> None:
        try:
            for _ in stream:
                self._last_beat = time.monotonic()
        except grpc.RpcError:
            pass
        self._lost.set()

    def _is_lost(self) -> bool:
        silent = time.monotonic() - self._last_beat
        return self._lost.is_set() or silent > self._coordinator._runtime.settings.heartbeat_timeout

    def _mark_down(self, why: str) -> None:
        if self.up:
            log.warning("%s (%s) is unavailable (%s): its function goes back to the queue",
                        self.task, self.address, why)
        self.up = False
        self.down_since = time.monotonic()
        if self._stream is not None:
            self._stream.cancel()
            self._stream = None

    # -- dispatch ------------------------------------------------------------------------------

    def _main(self) -> None:
        queue = self._coordinator._queue
        while not self._stopping.is_set():
            if not self.up and not self._connect():
                continue
            closure = queue.get(self.index, self._coordinator._is_up)
            if closure is None:
                return
            if self._is_lost():
                queue.requeue(closure)
                self._mark_down("heartbeat lost")
                continue
            try:
                self._execute(closure)
            except Exception as e:  # noqa: BLE001 - a bug here must fail the closure, not hang
                log.exception("%s: dispatching function #%d failed", self.task, closure.seq)
                self._coordinator._function_failed(closure, self, e)

    def _execute(self, closure: _Closure) -> None:
        queue = self._coordinator._queue
        try:
            closure.prepare()
        except BaseException as e:  # noqa: BLE001 - e.g. a RemoteValue argument that failed
            self._coordinator._function_failed(closure, self, e)
            return
        resources = self._coordinator._resources_for(closure.refs, self._created)
        payload = cloudpickle.dumps(Call(closure.body, tuple(resources)))
        run_id = next(self._coordinator._run_ids)
        nonce = os.urandom(16)
        sync = closure.sync
        request = coordinator_pb2.RunRequest(
            run_id=run_id, payload=payload, nonce=nonce,
            sync_step=sync.step if sync else 0, contributor=sync.contributor if sync else 0,
            num_contributors=sync.num_contributors if sync else 0)
        future = self._run.future(request, timeout=self._coordinator._timeout,
                                  metadata=self._token.metadata)
        done = threading.Event()
        future.add_done_callback(lambda _: done.set())
        while not done.wait(_POLL):
            if self._is_lost() or self._stopping.is_set():
                future.cancel()
                queue.requeue(closure)
                self._mark_down("heartbeat lost")
                return
        try:
            reply = future.result()
        except grpc.RpcError as e:
            code = e.code()
            if code in _WORKER_FAILURES:
                queue.requeue(closure)
                self._mark_down(f"{code.name}: {e.details()}")
            elif code == grpc.StatusCode.DEADLINE_EXCEEDED:
                self._coordinator._function_failed(closure, self, FunctionTimeoutError(
                    f"function #{closure.seq} ran on {self.task} for more than "
                    f"{self._coordinator._timeout:g} s ({ENV_FUNCTION_TIMEOUT})"))
            elif code == grpc.StatusCode.UNAUTHENTICATED:
                error = UnauthenticatedError(f"{self.task} ({self.address}) refused the "
                                             "coordinator's token")
                closure.value._fail(error)
                queue.finished(closure)
                queue.fail(error, fatal=True)
            else:
                self._coordinator._function_failed(closure, self, ClusterError(
                    f"{self.task} failed to run function #{closure.seq}: {code.name}: "
                    f"{e.details()}"))
            return
        self._created.update(r.rid for r in resources)
        self._finish(closure, run_id, nonce, reply)

    def _finish(self, closure: _Closure, run_id: int, nonce: bytes,
                reply: coordinator_pb2.RunReply) -> None:
        queue = self._coordinator._queue
        if not verify_reply(self._token, nonce, run_id, reply.outcome, reply.payload, reply.mac):
            error = UnauthenticatedError(
                f"the reply of {self.task} ({self.address}) to function #{closure.seq} failed "
                "authentication (wrong token, or not our worker); it was not unpickled")
            closure.value._fail(error)
            queue.finished(closure)
            queue.fail(error, fatal=True)
            return
        if reply.outcome == coordinator_pb2.RunReply.OK:
            try:
                value = cloudpickle.loads(reply.payload)
            except Exception as e:  # noqa: BLE001 - a result the chief cannot rebuild
                self._coordinator._function_failed(closure, self, e)
                return
            closure.value._set(value)
            queue.finished(closure)
            return
        self._coordinator._function_failed(closure, self, self._remote_error(closure, reply))

    def _remote_error(self, closure: _Closure,
                      reply: coordinator_pb2.RunReply) -> BaseException:
        error: BaseException | None = None
        if reply.payload:
            try:
                error = cloudpickle.loads(reply.payload)
            except Exception:  # noqa: BLE001 - rebuilt below from the readable fields
                error = None
        if not isinstance(error, BaseException):
            error = RemoteFunctionError(
                f"function #{closure.seq} failed on {self.task}: {reply.error_type}: "
                f"{reply.error_message}", task=self.task, error_type=reply.error_type,
                traceback=reply.traceback)
        error.add_note(f"raised on {self.task} by function #{closure.seq}; the worker's "
                       f"traceback:\n{reply.traceback}")
        return error


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
