"""The processes of ``bench/coordination.py``: the coordinator's host, and client processes
that each emulate ~1000 tasks speaking the real coordination protocol.

Both run under ``multiprocessing``'s spawn context and talk to the bench over a ``Pipe``:

- :func:`coordinator_main` hosts the real :class:`CoordinationService` on a real
  :class:`TaskServer` (token interceptor, 32-thread pool, the lead's options), sends
  ``("port", port)``, then answers ``"stats"`` with :class:`CoordinatorSample` until ``"quit"``.
  Each handler is wrapped to time it (server-side service time) and count calls; a log handler
  timestamps the service's own "is lost" lines (when the coordinator declared a task lost).
- :func:`clients_main` runs one asyncio loop with one ``grpc.aio`` channel per emulated task
  (``grpc.use_local_subchannel_pool``: one TCP connection each, as real tasks have), the
  generated stubs and the token metadata. Each task waits ``U(0, ramp)`` s (tasks
  come up over time), registers (``wait_for_ready``, retried like
  :meth:`CoordinationClient.register`), then heartbeats on the real client's schedule (every
  ``join_poll`` s until the reply's ``unregistered`` is empty, then every ``interval``), each
  sleep scaled by ``U(1 - jitter, 1 + jitter)``, the first one by ``U(0, 1)`` (tasks do not start
  in step), and with ``spread`` the first one after joining too. Commands: ``("go",)``,
  ``("mark", t)``, ``("window", t0, t1)``, ``("stop", names)``, ``("detect", names, until)``,
  ``("quit",)``; see :func:`clients_main`.

Times are ``time.monotonic()`` (CLOCK_MONOTONIC: one clock for every process on the host).
"""

from __future__ import annotations

import asyncio
import logging
import os
import random
import resource
import time
from dataclasses import dataclass, field

__all__ = ["ClientWindow", "CoordinatorSample", "clients_main", "coordinator_main"]

_COMMAND_WAIT = 900.0  # s: a process whose bench stops talking for this long exits
_REGISTER_CALL = 2.0  # s: one Register attempt, as CoordinationClient.register


def _raise_nofile() -> None:
    # One socket per emulated task: 4096 connections need more than the usual soft limit of 1024.
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft < hard:
        resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))


def _proc_status(field_name: str) -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(field_name + ":"):
                return int(line.split()[1])
    return 0


def _cpu_seconds() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


# -- the coordinator -------------------------------------------------------------------------


@dataclass
class CoordinatorSample:
    """The coordinator process at ``at``: cumulative CPU seconds and calls, current RSS (KiB),
    threads and file descriptors, heartbeat service times since the last sample, and when it
    declared each task lost."""

    at: float
    cpu_s: float
    rss_kib: int
    threads: int
    fds: int
    calls: dict[str, int]
    heartbeat_service_s: list[float]
    declared_lost: dict[str, float] = field(default_factory=dict)


class _Timed:
    """Counts and times the calls of one service's handlers (list.append is atomic)."""

    def __init__(self) -> None:
        self.calls: dict[str, int] = {}
        self.heartbeat_s: list[float] = []
        self.declared: dict[str, float] = {}

    def wrap(self, handlers: dict) -> dict:
        import grpc

        wrapped = {}
        for name, handler in handlers.items():
            wrapped[name] = grpc.unary_unary_rpc_method_handler(
                self._timed(name, handler.unary_unary),
                request_deserializer=handler.request_deserializer,
                response_serializer=handler.response_serializer)
        return wrapped

    def _timed(self, name: str, behaviour):
        calls = self.calls
        sink = self.heartbeat_s if name == "Heartbeat" else None

        def call(request, context):
            start = time.perf_counter()
            try:
                return behaviour(request, context)
            finally:
                calls[name] = calls.get(name, 0) + 1  # races only lose a count, never crash
                if sink is not None:
                    sink.append(time.perf_counter() - start)

        return call

    def take_samples(self) -> list[float]:
        # In place: the wrapped handlers hold this very list.
        samples = self.heartbeat_s[:]
        del self.heartbeat_s[:len(samples)]
        return samples


class _LostLog(logging.Handler):
    """Timestamps the service's ``"%s: %s is lost: %s"`` warnings: (me, task, why)."""

    def __init__(self, declared: dict[str, float]) -> None:
        super().__init__(logging.WARNING)
        self._declared = declared

    def emit(self, record: logging.LogRecord) -> None:
        args = record.args if isinstance(record.args, tuple) else ()
        if "is lost" in record.msg and len(args) >= 2:
            self._declared.setdefault(str(args[1]), time.monotonic())


def coordinator_main(conn, me: str, tasks: list[str], digest: bytes, token: str,
                     interval: float, timeout: float) -> None:
    """Host the coordination service until told ``"quit"`` (or the bench goes away)."""
    _raise_nofile()
    from cluster.transport.auth import Token
    from cluster.transport.coordination import SERVICE, CoordinationService
    from cluster.transport.server import TaskServer

    timed = _Timed()
    logger = logging.getLogger("cluster.transport.coordination")
    logger.addHandler(_LostLog(timed.declared))
    logger.propagate = False  # 4096 warnings on stderr would only slow the process down
    server = TaskServer("127.0.0.1:0", Token(token))
    service = CoordinationService(me, tasks, digest, interval=interval, timeout=timeout)
    server.add_handlers(SERVICE, timed.wrap(service.handlers()))
    server.start()
    service.start()
    try:
        conn.send(("port", server.port))
        while conn.poll(_COMMAND_WAIT):
            command = conn.recv()
            if command == "quit":
                break
            conn.send(CoordinatorSample(
                time.monotonic(), _cpu_seconds(), _proc_status("VmRSS"),
                _proc_status("Threads"), len(os.listdir("/proc/self/fd")), dict(timed.calls),
                timed.take_samples(), dict(timed.declared)))
    except (EOFError, BrokenPipeError):
        pass
    finally:
        service.stop()
        server.stop(0.5)


# -- the emulated clients --------------------------------------------------------------------


@dataclass
class ClientWindow:
    """What one client process saw in a window: heartbeats answered and their latencies (s),
    failed calls, CPU seconds the process spent, and every task its tasks heard was lost (the
    bench flags those it did not stop: false positives)."""

    answered: int
    latencies_s: list[float]
    failures: int
    cpu_s: float
    heard_lost: list[str]


class _Task:
    """One emulated task: a channel, a registration and a heartbeat loop."""

    def __init__(self, name: str, owner: _Clients) -> None:
        import grpc

        from cluster.transport._pb import coordination_pb2_grpc

        self.name = name
        self.incarnation = random.getrandbits(64)
        self.owner = owner
        self.channel = grpc.aio.insecure_channel(owner.address, options=owner.channel_options)
        self.stub = coordination_pb2_grpc.CoordinationStub(self.channel)
        self.events_seen = 0
        self.joined = False
        self.seen: dict[str, float] = {}  # task -> when this task first heard of its loss
        self.runner: asyncio.Task | None = None

    async def register(self, until: float) -> None:
        import grpc

        from cluster.transport._pb import coordination_pb2

        o = self.owner
        request = coordination_pb2.RegisterRequest(
            task=self.name, incarnation=self.incarnation, coordinator=o.coordinator,
            cluster_digest=o.digest)
        while True:
            left = until - time.monotonic()
            try:
                await self.stub.Register(request, timeout=max(0.05, min(_REGISTER_CALL, left)),
                                         metadata=o.metadata, wait_for_ready=True)
                return
            except grpc.aio.AioRpcError as e:
                if e.code() in (grpc.StatusCode.UNAUTHENTICATED,
                                grpc.StatusCode.FAILED_PRECONDITION):
                    raise RuntimeError(
                        f"{self.name} refused: {e.code().name}: {e.details()}") from e
                if time.monotonic() >= until:
                    raise TimeoutError(f"{self.name} could not register: {e.code().name}") from e
            await asyncio.sleep(0.1)

    async def run(self, until: float) -> None:
        import grpc

        from cluster.transport._pb import coordination_pb2

        o = self.owner
        await asyncio.sleep(random.uniform(0, o.ramp))  # tasks come up over the ramp
        try:
            await self.register(until)
        except (RuntimeError, TimeoutError) as e:
            o.errors.append(str(e))
            return
        o.registered_at = max(o.registered_at, time.monotonic())
        o.registered += 1
        first = True
        while True:
            period = o.interval if self.joined else min(o.interval, o.join_poll)
            scale = random.random() if first else random.uniform(1 - o.jitter, 1 + o.jitter)
            first = False
            await asyncio.sleep(period * scale)
            request = coordination_pb2.CoordinationHeartbeatRequest(
                task=self.name, incarnation=self.incarnation, events_seen=self.events_seen)
            start = time.monotonic()
            try:
                reply = await self.stub.Heartbeat(request, timeout=max(o.interval, 0.5),
                                                  metadata=o.metadata)
            except grpc.aio.AioRpcError:
                o.failures.append(time.monotonic())
                continue
            done = time.monotonic()
            o.beats.append((done, done - start))
            self.events_seen = reply.next_event
            for event in reply.events:
                if event.task != self.name and event.task not in self.seen:
                    self.seen[event.task] = done
            if not self.joined and not reply.unregistered:
                self.joined = True
                o.joined += 1
                o.joined_at = max(o.joined_at, done)
                # Every task sees the cluster complete within one poll, so without this they
                # beat in step from then on: a burst of N calls every interval.
                first = o.spread


class _Clients:
    """One client process: its tasks, their shared settings and what they measured."""

    def __init__(self, names: list[str], address: str, coordinator: str, digest: bytes,
                 token: str, interval: float, jitter: float, join_poll: float,
                 ramp: float, spread: bool) -> None:
        from cluster.transport.auth import Token
        from cluster.transport.server import CHANNEL_OPTIONS

        self.address = address
        self.coordinator = coordinator
        self.digest = digest
        self.metadata = Token(token).metadata
        self.interval = interval
        self.jitter = jitter
        self.join_poll = join_poll
        self.ramp = ramp
        self.spread = spread
        self.channel_options = (*CHANNEL_OPTIONS, ("grpc.use_local_subchannel_pool", 1))
        self.beats: list[tuple[float, float]] = []
        self.failures: list[float] = []
        self.cpu: list[tuple[float, float]] = []
        self.registered = self.joined = 0
        self.registered_at = self.joined_at = 0.0
        self.tasks = {name: _Task(name, self) for name in names}
        self.stopped: set[str] = set()
        self.errors: list[str] = []  # registrations that failed for good

    def window(self, t0: float, t1: float, cpu_s: float) -> ClientWindow:
        lat = [dt for at, dt in self.beats if t0 <= at < t1]
        failed = sum(1 for at in self.failures if t0 <= at < t1)
        heard = sorted({t for task in self.tasks.values() for t in task.seen})
        return ClientWindow(len(lat), lat, failed, cpu_s, heard)


async def _commands(conn, clients: _Clients, join_deadline: float) -> None:
    loop = asyncio.get_running_loop()

    def recv():
        if not conn.poll(_COMMAND_WAIT):
            return ("quit",)
        return conn.recv()

    async def report_join() -> None:
        # Tell the bench when every task here registered, then when every one saw all join.
        n = len(clients.tasks)
        for attr, tag in (("registered", "registered"), ("joined", "joined")):
            while (getattr(clients, attr) < n and time.monotonic() < join_deadline
                   and not clients.errors):
                await asyncio.sleep(0.02)
            conn.send((tag, getattr(clients, attr), getattr(clients, f"{attr}_at"),
                       clients.errors[:3]))

    cpu_marks: dict[float, float] = {}
    reporter = None
    while True:
        try:
            command = await loop.run_in_executor(None, recv)
        except EOFError:
            command = ("quit",)
        kind = command[0]
        if kind == "go":
            for task in clients.tasks.values():
                task.runner = asyncio.create_task(task.run(join_deadline))
            reporter = asyncio.create_task(report_join())
        elif kind == "mark":  # CPU seconds of this process at a point the bench names
            cpu_marks[command[1]] = _cpu_seconds()
            conn.send(("mark", command[1]))
        elif kind == "window":
            _, t0, t1 = command
            cpu = cpu_marks.get(t1, 0.0) - cpu_marks.get(t0, 0.0)
            conn.send(("window", clients.window(t0, t1, cpu)))
        elif kind == "stop":  # abruptly: the heartbeat loop is cancelled mid-flight
            for name in command[1]:
                runner = clients.tasks[name].runner
                if runner is not None:
                    runner.cancel()
                clients.stopped.add(name)
            conn.send(("stopped", time.monotonic()))
        elif kind == "detect":
            _, names, until = command
            conn.send(("detected", await _detect(clients, names, until)))
        else:
            break
    if reporter is not None:
        reporter.cancel()
    runners = [t.runner for t in clients.tasks.values() if t.runner is not None]
    for runner in runners:
        runner.cancel()
    await asyncio.gather(*runners, return_exceptions=True)
    await asyncio.gather(*(t.channel.close(None) for t in clients.tasks.values()),
                         return_exceptions=True)


async def _detect(clients: _Clients, names: list[str], until: float) -> dict:
    """When the surviving tasks here heard of each of ``names``: {name: (heard, first, last)}."""
    survivors = [t for n, t in clients.tasks.items() if n not in clients.stopped]
    while time.monotonic() < until and not all(
            all(n in t.seen for n in names) for t in survivors):
        await asyncio.sleep(0.05)
    found = {}
    for name in names:
        times = [t.seen[name] for t in survivors if name in t.seen]
        found[name] = (len(times), min(times, default=None), max(times, default=None),
                       len(survivors))
    return found


def clients_main(conn, names: list[str], address: str, coordinator: str, digest: bytes,
                 token: str, interval: float, jitter: float, join_poll: float,
                 ramp: float, spread: bool, join_timeout: float) -> None:
    """Emulate ``names`` until told ``("quit",)``; sends ``("ready",)`` once the channels exist.

    After ``("go",)`` it sends ``("registered", count, last_at)`` and ``("joined", count,
    last_at)`` (every task here has seen an empty ``unregistered``), each by ``join_timeout``.
    """
    _raise_nofile()

    async def main() -> None:
        clients = _Clients(names, address, coordinator, digest, token, interval, jitter,
                           join_poll, ramp, spread)
        conn.send(("ready",))
        await _commands(conn, clients, time.monotonic() + join_timeout)

    try:
        asyncio.run(main())
    except (EOFError, BrokenPipeError):
        pass
