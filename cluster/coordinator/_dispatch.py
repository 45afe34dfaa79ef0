"""One dispatcher per worker: sends it closures one at a time, notices its death and its return.

A dispatcher thread alternates between two states, and waits on events in both, never polls:

- *down*: it checks the worker's health. The check waits for the worker's address to accept a
  connection (a dead worker's check ends when a new process serves there); an answer other than
  SERVING waits for the connection to that process to drop. A new incarnation means a new
  process, which has none of the per-worker resources, so they are made again on first use.
- *up*: it takes the next closure for this worker from the queue and sends it. It then waits on
  one event, set by the run's completion, by the worker's heartbeat monitor (lost or departed),
  or by :meth:`WorkerDispatcher.stop`. A run lost with its worker goes back to the queue.
"""

from __future__ import annotations

import itertools
import logging
import os
import threading
from typing import TYPE_CHECKING, Any

import cloudpickle

from cluster.coordinator._calls import Call
from cluster.coordinator._closure import Closure
from cluster.coordinator._reply_mac import verify_reply
from cluster.coordinator.remote_values import set_result
from cluster.errors import (
    ClusterError,
    PeerUnavailableError,
    PsUnavailableError,
    RemoteFunctionError,
    UnauthenticatedError,
)
from cluster.settings import ENV_FUNCTION_TIMEOUT
from cluster.transport._pb import coordinator_pb2
from cluster.transport.control import HeartbeatMonitor
from cluster.transport.names import host_of, peer_names
from cluster.transport.worker_client import PendingCall, WorkerClient

if TYPE_CHECKING:
    from cluster.coordinator._queue import ClosureQueue
    from cluster.coordinator._resources import Resources
    from cluster.settings import TaskSettings

__all__ = ["Dispatch", "WorkerDispatcher"]

log = logging.getLogger(__name__)

# Bounds one health check that waits for the worker to be reachable; another follows at once.
_CHECK_TIMEOUT = 10.0


class Dispatch:
    """What a coordinator's dispatchers share: its queue, its resources, the task's settings
    and token, the run ids, and how a function's failure is recorded."""

    def __init__(self, queue: ClosureQueue, resources: Resources, settings: TaskSettings,
                 token: Any) -> None:
        self.queue = queue
        self.resources = resources
        self.settings = settings
        self.token = token
        self.run_ids = itertools.count(1)

    def function_failed(self, closure: Closure, error: BaseException) -> None:
        """``closure`` failed with ``error``: its value raises it, and so do ``join`` and the
        next ``schedule`` (a lost parameter server fails everything, for good)."""
        closure.fail(error)
        # PsConnections types a lost parameter server as PsUnavailableError on every task.
        if isinstance(error, PsUnavailableError):
            self.queue.finished(closure)
            self.queue.fail(error, fatal=True)
        else:
            self.queue.finished(closure, error)


class WorkerDispatcher:
    """Runs the closures of ``dispatch``'s queue on worker ``index`` through ``client``."""

    def __init__(self, dispatch: Dispatch, index: int, client: WorkerClient) -> None:
        self.index = index
        self.client = client
        self.task = client.peer.task
        self.address = client.peer.address
        self._dispatch = dispatch
        self._queue = dispatch.queue
        self._settings = dispatch.settings
        self._token = dispatch.token
        self._incarnation: int | None = None
        self._created: set[int] = set()
        self._monitor: HeartbeatMonitor | None = None
        self._lost = threading.Event()  # the worker of the current connection is gone
        self._stopping = threading.Event()
        self._wake = threading.Event()  # the event the dispatcher waits on now
        self._thread = threading.Thread(target=self._main, name=f"dispatch-{self.task}",
                                        daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        """End the thread (the queue must be closed first, so ``get`` returns) and the calls."""
        self._stopping.set()
        self._wake.set()
        self._thread.join(timeout=5.0)
        if self._monitor is not None:
            self._monitor.close()
        self.client.close()

    # -- waiting -------------------------------------------------------------------------------

    def _wait(self, call: PendingCall[Any], *, lost_too: bool) -> None:
        """Until ``call`` ends, the worker is lost (with ``lost_too``), or stop."""
        wake = threading.Event()
        self._wake = wake  # before the checks below: a cause that comes later sets this one
        call.add_done_callback(wake.set)
        if self._stopping.is_set() or (lost_too and self._lost.is_set()):
            return
        wake.wait()

    def _gone(self, error: PeerUnavailableError | None) -> None:
        """Heartbeat monitor callback (its thread): the worker was lost, or shut down."""
        self._lost.set()
        self._wake.set()

    # -- liveness ------------------------------------------------------------------------------

    def _connect(self) -> bool:
        """Block until the worker serves and is watched (True), or until stop (False)."""
        while not self._stopping.is_set():
            if not peer_names.resolves(host_of(self.address)):
                self._stopping.wait(0.2)  # a pod not published yet: dial once its name resolves
                continue
            call = self.client.check(_CHECK_TIMEOUT)
            self._wait(call, lost_too=False)
            if not call.done():
                call.cancel()
                return False
            try:
                health = call.result()
            except UnauthenticatedError as e:
                self._queue.fail(UnauthenticatedError(
                    f"{self.task} ({self.address}) refused the coordinator's token "
                    "(CLUSTER_TOKEN must be the same on every task)"), fatal=True)
                log.debug("%s refused the health check: %s", self.task, e)
                return False
            except ClusterError:
                continue  # still unreachable after the check's wait: check again
            if health.status == "SERVING":
                self._serving(health.incarnation)
                return True
            # Answered, but not as a serving worker of this task: ask again once the process
            # that answered is gone (its connection drops).
            wake = threading.Event()
            self._wake = wake
            unsubscribe = self.client.on_disconnect(wake.set)
            try:
                if not self._stopping.is_set():
                    wake.wait()
            finally:
                unsubscribe()
        return False

    def _serving(self, incarnation: int) -> None:
        if incarnation != self._incarnation:
            if self._incarnation is not None:
                log.warning("%s is back (a new process): using it again", self.task)
            self._incarnation = incarnation
            self._created.clear()  # a new process has none of the per-worker resources
        if self._monitor is not None:
            self._monitor.close()
        self._lost.clear()
        self._monitor = self.client.watch(self._gone, interval=self._settings.heartbeat_interval,
                                          timeout=self._settings.heartbeat_timeout,
                                          stall_timeout=self._settings.stall_timeout)
        self._queue.set_up(self.index, True)

    def _mark_down(self, why: str) -> None:
        if self._queue.is_up(self.index):
            log.warning("%s (%s) is unavailable (%s): its function goes back to the queue",
                        self.task, self.address, why)
        self._queue.set_up(self.index, False)
        if self._monitor is not None:
            self._monitor.close()
            self._monitor = None

    # -- dispatch ------------------------------------------------------------------------------

    def _main(self) -> None:
        while not self._stopping.is_set():
            if not self._queue.is_up(self.index) and not self._connect():
                return
            closure = self._queue.get(self.index)
            if closure is None:
                return
            if self._lost.is_set():
                self._queue.requeue(closure)
                self._mark_down("heartbeat lost")
                continue
            try:
                self._execute(closure)
            except Exception as e:  # noqa: BLE001 - a bug here must fail the closure, not hang
                log.exception("%s: dispatching function #%d failed", self.task, closure.seq)
                self._dispatch.function_failed(closure, e)

    def _execute(self, closure: Closure) -> None:
        dispatch = self._dispatch
        try:
            closure.prepare()
        except BaseException as e:  # noqa: BLE001 - e.g. a RemoteValue argument that failed
            dispatch.function_failed(closure, e)
            return
        resources = dispatch.resources.missing(closure.refs, self._created)
        payload = cloudpickle.dumps(Call(closure.body, tuple(resources)))
        run_id = next(dispatch.run_ids)
        nonce = os.urandom(16)
        sync = closure.sync
        request = coordinator_pb2.RunRequest(
            run_id=run_id, payload=payload, nonce=nonce,
            sync_step=sync.step if sync else 0, contributor=sync.contributor if sync else 0,
            num_contributors=sync.num_contributors if sync else 0)
        call = self.client.run(request, timeout=dispatch.settings.function_timeout,
                               activity=f"function #{closure.seq}", setting=ENV_FUNCTION_TIMEOUT)
        self._wait(call, lost_too=True)
        if not call.done():  # the worker was lost, or the coordinator stops
            call.cancel()
            self._queue.requeue(closure)
            self._mark_down("heartbeat lost")
            return
        try:
            reply = call.result()
        except PeerUnavailableError as e:  # the run was lost with its worker: run it elsewhere
            self._queue.requeue(closure)
            self._mark_down(str(e))
            return
        except UnauthenticatedError as e:
            closure.fail(e)
            self._queue.finished(closure)
            self._queue.fail(e, fatal=True)
            return
        except ClusterError as e:  # FunctionTimeoutError, or the worker failed the call
            dispatch.function_failed(closure, e)
            return
        self._created.update(r.rid for r in resources)
        self._finish(closure, run_id, nonce, reply)

    def _finish(self, closure: Closure, run_id: int, nonce: bytes,
                reply: coordinator_pb2.RunReply) -> None:
        if not verify_reply(self._token, nonce, run_id, reply.outcome, reply.payload,
                            reply.mac):
            error = UnauthenticatedError(
                f"the reply of {self.task} ({self.address}) to function #{closure.seq} failed "
                "authentication (wrong token, or not our worker); it was not unpickled")
            closure.fail(error)
            self._queue.finished(closure)
            self._queue.fail(error, fatal=True)
            return
        if reply.outcome == coordinator_pb2.RunReply.OK:
            try:
                value = cloudpickle.loads(reply.payload)
            except Exception as e:  # noqa: BLE001 - a result the chief cannot rebuild
                self._dispatch.function_failed(closure, e)
                return
            set_result(closure.value, value)
            self._queue.finished(closure)
            return
        self._dispatch.function_failed(closure, self._remote_error(closure, reply))

    def _remote_error(self, closure: Closure,
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
