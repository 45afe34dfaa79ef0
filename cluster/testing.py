"""The multi-process test harness: real task processes on loopback, always reaped.

Like TensorFlow's ``multi_process_runner``, for tests and benchmarks:

- :func:`run_group` runs ``fn(transport, *args)`` on N spawned processes that form one gRPC
  group, and returns one :class:`RankOutcome` per rank;
- :class:`TaskProcess` runs one command (``python -m worker SCRIPT``, ``python -m ps``,
  ``python -m cluster.ctl.cli launch ...``) with its own environment and ``TF_CONFIG``; its
  output is captured as it comes (and copied to a log file if asked), so a test waits for a line
  with :meth:`TaskProcess.read_until` against a deadline, never by sleeping;
  :class:`TaskProcesses` reaps every process it started, however the test ends;
- :func:`processes_with`, :func:`wait_gone` and :func:`kill_and_wait` find a test's processes by
  a marker in their environment (the leak check) and wait until they are gone.

Every blocking call here takes a timeout and raises a typed error naming the task and what was
awaited (:class:`TaskTimeoutError`, :class:`TaskExitedError`, :class:`GroupTimeoutError`).

Example::

    with TaskProcesses() as tasks:
        ps = tasks.python("-m", "ps", env={"CLUSTER_TOKEN": token}, tf_config=config)
        ps.read_until("serving the variable store", timeout=30)
        ...
        ps.kill(signal.SIGTERM)
        code, output = ps.finish(timeout=30)
"""

from __future__ import annotations

import io
import json
import multiprocessing as mp
import os
import select
import signal
import subprocess
import sys
import threading
import traceback
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from multiprocessing.connection import wait as mp_wait
from pathlib import Path
from typing import Any

from cluster.ctl.ports import pick_free_ports
from cluster.deadline import Deadline

__all__ = [
    "ConsoleWatch",
    "GroupTimeoutError",
    "RankOutcome",
    "TaskExitedError",
    "TaskProcess",
    "TaskProcessError",
    "TaskProcesses",
    "TaskTimeoutError",
    "kill_and_wait",
    "loopback_cluster",
    "processes_with",
    "run_group",
    "tf_config",
    "wait_gone",
]


# -- cluster descriptions -----------------------------------------------------------------------


def tf_config(cluster: Mapping[str, Sequence[str]], task_type: str, index: int) -> str:
    """The ``TF_CONFIG`` JSON of task ``task_type:index`` in ``cluster`` (not validated: tests
    also hand tasks wrong ones)."""
    return json.dumps({"cluster": {job: list(addresses) for job, addresses in cluster.items()},
                       "task": {"type": task_type, "index": index}})


def loopback_cluster(**jobs: int) -> dict[str, list[str]]:
    """A cluster of ``jobs`` (``chief=1, worker=2``) on ports of 127.0.0.1 free right now.

    The ports are not reserved (see :mod:`cluster.ctl.ports`): a task that loses one to another
    process exits 203 (address in use).
    """
    ports = iter(pick_free_ports("127.0.0.1", sum(jobs.values())))
    return {job: [f"127.0.0.1:{next(ports)}" for _ in range(n)] for job, n in jobs.items()}


# -- task processes -----------------------------------------------------------------------------


class TaskProcessError(Exception):
    """A task process did not do what the harness waited for; the message names the task, what
    was awaited, and holds its output so far."""


class TaskTimeoutError(TaskProcessError, TimeoutError):
    """The deadline passed first (a :meth:`TaskProcess.finish` that times out has killed it)."""


class TaskExitedError(TaskProcessError):
    """The task's output ended (it exited) before the awaited text appeared."""


def _describe(argv: Sequence[str]) -> str:
    words = ["python" if argv[0] == sys.executable else argv[0], *argv[1:4]]
    return " ".join(Path(w).name if os.sep in w else w for w in words)


class TaskProcess:
    """One command as a real process, its output captured, reaped by :meth:`close`.

    ``argv`` is the whole command (:meth:`python` prepends this interpreter). The child gets this
    process's environment plus ``PYTHONUNBUFFERED=1`` (its lines arrive as printed), ``env``, and
    ``TF_CONFIG`` if ``tf_config`` is given. Stdin is ``/dev/null``. Stdout and stderr are read
    by threads as they come: merged into one stream, or kept apart with ``merge_stderr=False``;
    with ``log``, everything is also appended to that file. With ``new_session`` (the default)
    the task leads its own process group, so :meth:`close` kills whatever it started too.

    ``name`` names the task in errors (``worker:1``); by default the command's first words.
    Use it as a context manager, or through :class:`TaskProcesses`, so it is always reaped.
    """

    def __init__(self, argv: Sequence[str | os.PathLike], *, name: str = "",
                 env: Mapping[str, str] | None = None, tf_config: str | None = None,
                 cwd: str | os.PathLike | None = None, log: str | os.PathLike | None = None,
                 merge_stderr: bool = True, new_session: bool = True) -> None:
        self.argv = [os.fspath(a) for a in argv]
        self.name = name or _describe(self.argv)
        self.new_session = new_session
        full_env = {**os.environ, "PYTHONUNBUFFERED": "1", **(env or {})}
        if tf_config is not None:
            full_env["TF_CONFIG"] = tf_config
        self._cond = threading.Condition()
        self._out, self._err = bytearray(), bytearray()
        self._log = open(log, "ab") if log is not None else None  # the drains close it
        try:
            self._proc = subprocess.Popen(
                self.argv, env=full_env, cwd=cwd, stdin=subprocess.DEVNULL,
                stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT if merge_stderr else subprocess.PIPE,
                start_new_session=new_session)
        except BaseException:
            if self._log is not None:
                self._log.close()
            raise
        streams = [(self._proc.stdout, self._out)]
        if not merge_stderr:
            streams.append((self._proc.stderr, self._err))
        self._open = len(streams)  # streams not at end-of-file yet; guarded by _cond
        self._closed = False
        self._drains = [threading.Thread(target=self._drain, args=(stream, buffer), daemon=True,
                                         name=f"output of {self.name}")
                        for stream, buffer in streams]
        for thread in self._drains:
            thread.start()

    @classmethod
    def python(cls, *args: str | os.PathLike, **kwargs: Any) -> TaskProcess:
        """``python ARGS...`` with this interpreter (``TaskProcess.python("-m", "worker", s)``)."""
        return cls([sys.executable, *args], **kwargs)

    def _drain(self, stream: io.BufferedReader, buffer: bytearray) -> None:
        fd = stream.fileno()
        while True:
            try:
                chunk = os.read(fd, 65536)
            except OSError:
                chunk = b""
            with self._cond:
                if chunk:
                    buffer += chunk
                    if self._log is not None:
                        self._log.write(chunk)
                        self._log.flush()
                else:
                    self._open -= 1
                    if self._open == 0 and self._log is not None:
                        self._log.close()
                self._cond.notify_all()
            if not chunk:
                return

    # -- what it did ----------------------------------------------------------------------------

    @property
    def pid(self) -> int:
        return self._proc.pid

    @property
    def returncode(self) -> int | None:
        """The exit code (``-N`` for signal N) once it exited, else ``None``; never blocks."""
        return self._proc.poll()

    @property
    def stdout(self) -> str:
        """Its stdout so far (with stderr merged in, unless ``merge_stderr=False``)."""
        with self._cond:
            return self._out.decode(errors="replace")

    @property
    def output(self) -> str:
        """Everything it printed so far: :attr:`stdout`, then stderr if kept apart."""
        with self._cond:
            return (self._out + self._err).decode(errors="replace")

    def _output_ended(self, deadline: Deadline) -> bool:
        with self._cond:
            return self._cond.wait_for(lambda: self._open == 0, deadline.timeout())

    # -- waiting --------------------------------------------------------------------------------

    def read_until(self, text: str, timeout: float = 20.0, *, count: int = 1) -> str:
        """Its :attr:`stdout` once ``text`` appeared ``count`` times in it (counted from the
        start), waiting at most ``timeout`` s.

        Raises:
            TaskTimeoutError: not seen within ``timeout`` s (the task keeps running).
            TaskExitedError: its stdout ended first.
        """
        needle = text.encode()
        with self._cond:
            seen = self._cond.wait_for(
                lambda: self._out.count(needle) >= count or self._open == 0, timeout)
            if self._out.count(needle) >= count:
                return self._out.decode(errors="replace")
            what = f"{text!r}" if count == 1 else f"{text!r} {count} times"
            output = self._out.decode(errors="replace")
        if seen:
            raise TaskExitedError(f"{self.name}: output ended before {what}:\n{output}")
        raise TaskTimeoutError(f"{self.name}: no {what} within {timeout} s:\n{output}")

    def wait(self, timeout: float = 30.0) -> int:
        """Its exit code once it exited, waiting at most ``timeout`` s (then also for the rest of
        its output, within the same deadline).

        Raises:
            TaskTimeoutError: still running after ``timeout`` s (it keeps running).
        """
        deadline = Deadline.after(timeout)
        try:
            code = self._proc.wait(deadline.timeout())
        except subprocess.TimeoutExpired:
            raise TaskTimeoutError(f"{self.name}: still running after {timeout} s:\n"
                                   f"{self.output}") from None
        self._output_ended(deadline)
        return code

    def finish(self, timeout: float = 30.0) -> tuple[int, str]:
        """``(exit code, all its output)`` once it exited and its output ended, within
        ``timeout`` s.

        Raises:
            TaskTimeoutError: not done within ``timeout`` s; it was killed first (with its
                process group) and the message holds its output.
        """
        deadline = Deadline.after(timeout)
        try:
            code = self._proc.wait(deadline.timeout())
        except subprocess.TimeoutExpired:
            self.close()
            raise TaskTimeoutError(f"{self.name}: still running after {timeout} s; killed:\n"
                                   f"{self.output}") from None
        if not self._output_ended(deadline):
            self.close()
            raise TaskTimeoutError(f"{self.name}: exited {code} but its output stayed open for "
                                   f"{timeout} s (a process it started holds it); killed:\n"
                                   f"{self.output}")
        return code, self.output

    # -- stopping -------------------------------------------------------------------------------

    def kill(self, sig: int = signal.SIGKILL, *, group: bool = False) -> None:
        """Send ``sig`` to the task (``group=True``: to its whole process group). Does nothing
        once it was reaped, so a reused pid is never signalled."""
        if self._proc.poll() is not None:
            return
        if group and self.new_session:
            try:
                os.killpg(self._proc.pid, sig)
            except ProcessLookupError:
                pass
        else:
            self._proc.send_signal(sig)

    def close(self, timeout: float = 10.0) -> None:
        """Reap it: SIGKILL its process group if it still runs, wait for it and for its output
        to end. Idempotent; what has been printed stays readable.

        Raises:
            TaskTimeoutError: not gone ``timeout`` s after SIGKILL (stuck in the kernel).
        """
        if self._closed:
            return
        deadline = Deadline.after(timeout)
        self.kill(signal.SIGKILL, group=True)
        try:
            self._proc.wait(deadline.timeout())
        except subprocess.TimeoutExpired:
            raise TaskTimeoutError(f"{self.name}: still alive {timeout} s after SIGKILL") from None
        self._closed = True
        for thread in self._drains:
            thread.join(deadline.timeout())
        for stream in (self._proc.stdout, self._proc.stderr):
            # A drain still blocked (a child outside the group holds the pipe) keeps its fd.
            if stream is not None and not any(t.is_alive() for t in self._drains):
                stream.close()

    def __enter__(self) -> TaskProcess:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"<TaskProcess {self.name} pid={self.pid} returncode={self.returncode}>"


class TaskProcesses:
    """Starts :class:`TaskProcess` es and reaps every one of them in :meth:`stop` (also on leaving
    a ``with`` block). Safe to use from several threads."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._started: list[TaskProcess] = []

    def start(self, argv: Sequence[str | os.PathLike], **kwargs: Any) -> TaskProcess:
        """``TaskProcess(argv, **kwargs)``, reaped with the others."""
        task = TaskProcess(argv, **kwargs)
        with self._lock:
            self._started.append(task)
        return task

    def python(self, *args: str | os.PathLike, **kwargs: Any) -> TaskProcess:
        """``TaskProcess.python(*args, **kwargs)``, reaped with the others."""
        return self.start([sys.executable, *args], **kwargs)

    def stop(self, grace: float = 0.0) -> None:
        """Stop them all: with ``grace``, SIGTERM every live task and give them ``grace`` s
        together to exit; then SIGKILL what is left and reap everything.

        Raises:
            TaskTimeoutError: a task survived SIGKILL (the others are still reaped).
        """
        with self._lock:
            tasks, self._started = self._started, []
        if grace > 0:
            deadline = Deadline.after(grace)
            for task in tasks:
                task.kill(signal.SIGTERM)
            for task in tasks:
                try:
                    task.wait(deadline.remaining())
                except TaskTimeoutError:
                    pass  # SIGKILLed below
        errors = []
        for task in tasks:
            try:
                task.close()
            except TaskTimeoutError as e:
                errors.append(e)
        if errors:
            raise errors[0]

    def __enter__(self) -> TaskProcesses:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


# -- leak checks and watching ---------------------------------------------------------------------


def processes_with(*needles: str) -> list[int]:
    """Pids of live processes whose environment holds every one of ``needles`` (a test's marker,
    and say its ``TF_CONFIG`` task). Only processes whose ``/proc/PID/environ`` is readable
    (ours) are seen; zombies have an empty environment and do not count."""
    wanted = [n.encode() for n in needles]
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/environ", "rb") as f:
                environ = f.read()
        except OSError:
            continue
        if all(n in environ for n in wanted):
            found.append(int(entry))
    return found


def wait_gone(pids: Iterable[int], timeout: float) -> list[int]:
    """The pids of ``pids`` still alive after at most ``timeout`` s (waits on pidfds, without
    polling; any process, not only children)."""
    fds = {}
    for pid in pids:
        try:
            fds[os.pidfd_open(pid)] = pid
        except ProcessLookupError:
            continue
    try:
        deadline = Deadline.after(timeout)
        pending = set(fds)
        while pending:
            ready, _, _ = select.select(list(pending), [], [], deadline.remaining())
            if not ready:
                break
            pending -= set(ready)
        return [fds[fd] for fd in pending]
    finally:
        for fd in fds:
            os.close(fd)


def kill_and_wait(pid: int, timeout: float, sig: int = signal.SIGKILL) -> bool:
    """Send ``sig`` to ``pid`` (any process, not only a child) and wait at most ``timeout`` s for
    it to be gone; ``True`` if it is. Signals through a pidfd opened first, so a pid reused in
    between is never signalled; a process already gone counts as gone."""
    try:
        pidfd = os.pidfd_open(pid)
    except ProcessLookupError:
        return True
    try:
        signal.pidfd_send_signal(pidfd, sig)
        return bool(select.select([pidfd], [], [], timeout)[0])
    except ProcessLookupError:
        return True
    finally:
        os.close(pidfd)


class ConsoleWatch(io.StringIO):
    """A console stream (``launcher.launch(out=...)``) whose :attr:`event` is set once ``text``
    was written, for a thread that acts at that moment."""

    def __init__(self, text: str) -> None:
        super().__init__()
        self.text, self.event = text, threading.Event()

    def write(self, s: str) -> int:
        written = super().write(s)
        if not self.event.is_set() and self.text in self.getvalue():
            self.event.set()
        return written


# -- a function on N ranks ------------------------------------------------------------------------


@dataclass
class RankOutcome:
    """What one rank's process did: a result, an error (type, message, traceback) or a death."""

    rank: int
    exitcode: int | None = None
    result: Any = None
    error_type: str = ""
    error: str = ""
    traceback: str = ""
    elapsed: float | None = None

    @property
    def ok(self) -> bool:
        return self.exitcode == 0 and not self.error_type


class GroupTimeoutError(TimeoutError):
    """Some rank neither finished nor died before the deadline; all were killed."""


def _child(rank: int, fn: Callable, args: tuple, conn, env: dict[str, str],
           options: dict[str, Any]) -> None:
    os.environ.update(env)  # a process entry point: fn may read the environment too
    import time

    from cluster.settings import TaskSettings
    from cluster.transport.api import PeerInfo
    from cluster.transport.auth import Token
    from cluster.transport.endpoint import CollectiveEndpoint
    from cluster.transport.network import NetworkTransport
    from cluster.transport.server import TaskServer

    settings = TaskSettings.from_env()
    token = Token(settings.token)
    task = f"worker:{rank}"
    server = TaskServer("127.0.0.1:0", token)
    endpoint = CollectiveEndpoint.install(server, task, heartbeat_interval=options["hb_interval"])
    server.start()
    conn.send(server.port)
    ports = conn.recv()
    peers = [PeerInfo(r, f"worker:{r}", f"127.0.0.1:{p}") for r, p in enumerate(ports)]
    transport = NetworkTransport(endpoint, rank, peers, token,
                              heartbeat_timeout=options["hb_timeout"],
                              data_plane=settings.data_plane)
    start = time.monotonic()
    try:
        transport.connect(Deadline.after(options["connect_timeout"]))
        result = fn(transport, *args)
        conn.send(("ok", result, time.monotonic() - start))
    except BaseException as e:  # report everything to the parent, then exit non-zero
        conn.send(("error", (type(e).__name__, str(e), traceback.format_exc()),
                   time.monotonic() - start))
        transport.close()
        server.stop(0)
        os._exit(1)
    transport.close()
    server.stop(0.5)


def run_group(
    fn: Callable,
    world_size: int,
    *,
    args: tuple = (),
    timeout: float = 60.0,
    env: dict[str, str] | None = None,
    heartbeat_interval: float = 1.0,
    heartbeat_timeout: float = 5.0,
    connect_timeout: float = 30.0,
) -> list[RankOutcome]:
    """Run ``fn(transport, *args)`` on ``world_size`` processes; one outcome per rank.

    One fresh interpreter per rank (``spawn``), each with its own task server on
    ``127.0.0.1:0``; the parent collects the bound ports and hands every child the full peer
    list. ``fn`` must be a module-level function (it is pickled by reference).

    Raises :class:`GroupTimeoutError` (after killing every child) if any rank is still running
    at ``timeout``. Never leaves a child process behind.
    """
    ctx = mp.get_context("spawn")
    deadline = Deadline.after(timeout)
    options = {"hb_interval": heartbeat_interval, "hb_timeout": heartbeat_timeout,
               "connect_timeout": connect_timeout}
    procs, conns = [], []
    outcomes = [RankOutcome(rank=r) for r in range(world_size)]
    try:
        for rank in range(world_size):
            parent_end, child_end = ctx.Pipe()
            proc = ctx.Process(target=_child, name=f"worker:{rank}",
                               args=(rank, fn, args, child_end, env or {}, options))
            proc.start()
            child_end.close()
            procs.append(proc)
            conns.append(parent_end)
        ports = []
        for rank, conn in enumerate(conns):
            if not conn.poll(deadline.timeout()):
                raise GroupTimeoutError(f"worker:{rank} did not start its server in time")
            ports.append(conn.recv())
        for conn in conns:
            conn.send(ports)
        waiting = {conn: rank for rank, conn in enumerate(conns)}
        sentinels = {proc.sentinel: rank for rank, proc in enumerate(procs)}
        while waiting:
            ready = mp_wait([*waiting, *[p.sentinel for p in procs if p.is_alive()]],
                            timeout=deadline.timeout())
            if not ready:
                names = ", ".join(f"worker:{r}" for r in sorted(waiting.values()))
                raise GroupTimeoutError(f"{names} still running after {timeout} s; killed")
            for item in ready:
                if item in waiting:
                    rank = waiting.pop(item)
                    try:
                        status, payload, elapsed = item.recv()
                    except EOFError:
                        continue  # died without reporting: its exit code tells
                    outcomes[rank].elapsed = elapsed
                    if status == "ok":
                        outcomes[rank].result = payload
                    else:
                        (outcomes[rank].error_type, outcomes[rank].error,
                         outcomes[rank].traceback) = payload
                elif item in sentinels:
                    rank = sentinels[item]
                    conn = conns[rank]
                    if conn in waiting and not conn.poll(0):
                        waiting.pop(conn)  # died before reporting
        for proc in procs:
            proc.join(max(deadline.remaining(), 5.0))
    finally:
        for proc in procs:
            if proc.is_alive():
                proc.kill()
            proc.join(5.0)
        for rank, proc in enumerate(procs):
            outcomes[rank].exitcode = proc.exitcode
        for conn in conns:
            conn.close()
    return outcomes
