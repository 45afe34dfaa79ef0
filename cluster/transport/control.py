"""The ``Control`` service: health checks, heartbeats, failure reports and shutdown of a task.

This is how a task learns within seconds that a peer is gone, and how it tells its peers that it
failed (:mod:`~cluster.transport.control_client` is the caller's side of the unary methods).

Server side, :class:`ControlService` answers ``Check`` and streams a ``HeartbeatResponse`` every
``interval`` seconds to each peer that watches it. Client side, :class:`HeartbeatMonitor` keeps
one such stream open per peer and reports a peer as lost when its stream breaks (the process died,
its port closed), or when nothing arrived for ``timeout`` seconds and its address does not answer
a TCP connect either (the network drops packets: :mod:`~cluster.transport._reachable`); a silent
peer whose host answers is alive but busy (a long call holding the GIL, a stop): it is reported as
stalled and lost only after ``stall_timeout`` seconds of silence. A peer that shuts down cleanly
is reported as departed instead.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections.abc import Callable, Mapping

import grpc

from cluster.deadline import Deadline
from cluster.errors import PeerUnavailableError
from cluster.transport._grpc_errors import is_cancelled, status_name
from cluster.transport._pb import control_pb2
from cluster.transport._reachable import answering
from cluster.transport.api import PeerInfo
from cluster.transport.auth import Token
from cluster.transport.membership import REPROBE_PERIOD

__all__ = ["SERVICE", "ControlService", "HeartbeatMonitor"]

log = logging.getLogger(__name__)

SERVICE = "cluster_runtime.v1.Control"


class ControlService:
    """The ``Control`` service of one task: health, heartbeats, failure reports, shutdown."""

    def __init__(self, task: str, *, interval: float = 1.0) -> None:
        self.task = task
        self.interval = interval
        self.incarnation = int.from_bytes(os.urandom(8), "little")
        self._stopping = threading.Event()
        self.on_failure_report: Callable[[control_pb2.FailureReport], None] | None = None
        self.on_shutdown: Callable[[str], None] | None = None

    def handlers(self) -> dict[str, grpc.RpcMethodHandler]:
        return {
            "Check": grpc.unary_unary_rpc_method_handler(
                self._check,
                request_deserializer=control_pb2.HealthCheckRequest.FromString,
                response_serializer=control_pb2.HealthCheckResponse.SerializeToString,
            ),
            "Heartbeat": grpc.unary_stream_rpc_method_handler(
                self._heartbeat,
                request_deserializer=control_pb2.HeartbeatRequest.FromString,
                response_serializer=control_pb2.HeartbeatResponse.SerializeToString,
            ),
            "ReportFailure": grpc.unary_unary_rpc_method_handler(
                self._report_failure,
                request_deserializer=control_pb2.FailureReport.FromString,
                response_serializer=control_pb2.FailureAck.SerializeToString,
            ),
            "Shutdown": grpc.unary_unary_rpc_method_handler(
                self._shutdown,
                request_deserializer=control_pb2.ShutdownRequest.FromString,
                response_serializer=control_pb2.ShutdownReply.SerializeToString,
            ),
        }

    def stop(self) -> None:
        """End every heartbeat stream cleanly, so watchers see a departure, not a death."""
        self._stopping.set()

    def _check(self, request, context):
        status = control_pb2.HealthCheckResponse.SERVING
        if request.expected_task and request.expected_task != self.task:
            status = control_pb2.HealthCheckResponse.WRONG_TASK
        elif self._stopping.is_set():
            status = control_pb2.HealthCheckResponse.NOT_SERVING
        return control_pb2.HealthCheckResponse(
            status=status, task=self.task, incarnation=self.incarnation
        )

    def _heartbeat(self, request, context):
        beat = control_pb2.HeartbeatResponse(task=self.task, incarnation=self.incarnation)
        while context.is_active() and not self._stopping.is_set():
            yield beat
            self._stopping.wait(self.interval)

    def _report_failure(self, request, context):
        if self.on_failure_report is not None:
            self.on_failure_report(request)
        return control_pb2.FailureAck()

    def _shutdown(self, request, context):
        if self.on_shutdown is not None:
            self.on_shutdown(request.reason)
        return control_pb2.ShutdownReply()


class HeartbeatMonitor:
    """Watches peers' heartbeat streams; calls ``on_lost(peer, error)`` or ``on_departed(peer)``.

    Each callback fires at most once per peer. A peer silent for ``timeout`` seconds is probed
    (``probe``, a TCP connect to its address): one that does not answer is declared lost, at
    most ``timeout + interval`` seconds plus the probe's timeout after it went silent; one that
    answers is stalled (a warning names it) until it has been silent for ``stall_timeout``
    (``None``: lost after ``timeout`` whatever its host says). A watch thread that was itself
    stalled (this process held the GIL) restarts every peer's silence.
    """

    def __init__(
        self,
        me: PeerInfo,
        peers: list[PeerInfo],
        channels: dict[int, grpc.Channel],
        token: Token,
        *,
        on_lost: Callable[[PeerInfo, PeerUnavailableError], None],
        on_departed: Callable[[PeerInfo], None],
        interval: float = 1.0,
        timeout: float = 5.0,
        stall_timeout: float | None = 60.0,
        probe: Callable[[Mapping[str, str]], set[str]] = answering,
    ) -> None:
        self._me = me
        self._on_lost = on_lost
        self._on_departed = on_departed
        self._interval = interval
        self._timeout = timeout
        self._stall_timeout = None if stall_timeout is None else max(stall_timeout, timeout)
        self._probe = probe
        self._answered: dict[int, float] = {}  # silent peers whose host answered: when
        self._closing = threading.Event()
        self._lock = threading.Lock()
        self._last_seen: dict[int, float] = {}
        self._calls: dict[int, grpc.Future] = {}
        self._reported: set[int] = set()
        self._threads: list[threading.Thread] = []
        request = control_pb2.HeartbeatRequest(task=me.task)
        now = time.monotonic()
        for peer in peers:
            method = channels[peer.rank].unary_stream(
                f"/{SERVICE}/Heartbeat",
                request_serializer=control_pb2.HeartbeatRequest.SerializeToString,
                response_deserializer=control_pb2.HeartbeatResponse.FromString,
            )
            self._last_seen[peer.rank] = now
            self._calls[peer.rank] = method(request, metadata=token.metadata)
            thread = threading.Thread(
                target=self._read, args=(peer,), name=f"heartbeat-{peer.task}", daemon=True
            )
            self._threads.append(thread)
        self._watchdog = threading.Thread(target=self._watch, args=(peers,), name="heartbeat-watch",
                                          daemon=True)

    def start(self) -> None:
        for thread in self._threads:
            thread.start()
        self._watchdog.start()

    def close(self, deadline: Deadline | None = None) -> None:
        """Stop watching: cancel every stream, and wait for the threads until ``deadline``
        (default 2 s from now) at most."""
        deadline = deadline or Deadline.after(2.0)
        self._closing.set()
        for call in self._calls.values():
            call.cancel()
        for thread in [*self._threads, self._watchdog]:
            if thread.is_alive() and thread is not threading.current_thread():
                thread.join(deadline.timeout())

    def _report(self, peer: PeerInfo, error: PeerUnavailableError | None) -> None:
        with self._lock:
            if peer.rank in self._reported or self._closing.is_set():
                return
            self._reported.add(peer.rank)
        if error is None:
            self._on_departed(peer)
        else:
            self._on_lost(peer, error)

    def _read(self, peer: PeerInfo) -> None:
        call = self._calls[peer.rank]
        try:
            for _ in call:
                self._last_seen[peer.rank] = time.monotonic()
                if self._answered.pop(peer.rank, None) is not None:
                    log.warning("%s: %s answers again after its stall", self._me.task, peer)
        except grpc.RpcError as e:
            if self._closing.is_set() or is_cancelled(e):
                return
            self._report(peer, PeerUnavailableError(
                f"{peer} is unavailable: heartbeat stream broke ({status_name(e)}: {e.details()})",
                task=peer.task, address=peer.address))
            return
        self._report(peer, None)

    def _watch(self, peers: list[PeerInfo]) -> None:
        last = time.monotonic()
        while not self._closing.wait(self._interval / 2):
            now = time.monotonic()
            if now - last > self._timeout:
                # This thread was stalled (the process held the GIL): the silence is our own.
                for rank in self._last_seen:
                    self._last_seen[rank] = max(self._last_seen[rank], now)
            last = now
            self._judge(peers, now)

    def _judge(self, peers: list[PeerInfo], now: float) -> None:
        with self._lock:
            reported = set(self._reported)
        silent = {p.rank: now - self._last_seen[p.rank] for p in peers
                  if now - self._last_seen[p.rank] > self._timeout and p.rank not in reported}
        if not silent:
            return
        stall = self._stall_timeout
        answered: set[str] = set()
        if stall is not None:
            # A stalled peer is probed again at most once a second (each probe lands in its
            # listen backlog until it accepts again).
            due = {str(p.rank): p.address for p in peers if p.rank in silent
                   and now - self._answered.get(p.rank, -1e9) >= REPROBE_PERIOD}
            answered = self._probe(due) if due else set()
        for peer in peers:
            quiet = silent.get(peer.rank)
            if quiet is None:
                continue
            why = f"no heartbeat for {quiet:.1f} s"
            if stall is not None:
                if quiet <= stall and str(peer.rank) in answered:
                    if peer.rank not in self._answered:
                        log.warning(
                            "%s: %s is stalled: no heartbeat for %.1f s, but its host answers "
                            "(alive but busy: a long call holding the GIL, or stopped); it is "
                            "lost after %g s of silence (CLUSTER_STALL_TIMEOUT)",
                            self._me.task, peer, quiet, stall)
                    self._answered[peer.rank] = now
                    continue
                if quiet <= stall and now - self._answered.get(peer.rank, -1e9) < REPROBE_PERIOD:
                    continue  # not probed this round: its last answer stands
                why += (f": stalled (its host answers) beyond {stall:g} s" if quiet > stall
                        else " and its address does not answer")
            self._report(peer, PeerUnavailableError(f"{peer} is unavailable: {why}",
                                                    task=peer.task, address=peer.address))
            self._calls[peer.rank].cancel()
