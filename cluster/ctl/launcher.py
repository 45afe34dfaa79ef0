"""``clusterctl launch``: start every task of a cluster file on this host and supervise them.

:func:`launch` takes a validated :class:`~cluster.ctl.spec.ClusterFile` (no argv) and returns a
:class:`LaunchResult`. Per attempt it chooses ports, gives each task its ``TF_CONFIG`` and the
run's ``CLUSTER_TOKEN`` (environment only: never on a command line or in a log), starts each task
as a fresh interpreter in its own process group (``python -m worker SCRIPT`` / ``python -m ps``),
and runs one event loop (a selector over the tasks' output pipes, their pidfds and the signal
wake-up fd, against deadlines; no sleeps, no polling):

- output: each line to the console prefixed ``[worker:1]`` and to ``RUN_DIR/worker-1.log``;
- fail fast: the first task to fail stops the others (SIGTERM to each process group, SIGKILL
  after ``timeouts.grace``); the policy (``cluster.ctl.policy``) then restarts the whole cluster
  or gives up; the summary names every task's exit code and the root cause;
- success: the chief exited 0 (or every worker, with no chief); the rest are stopped;
- ``mode: coordinator`` (parameter-server training): only the chief (and evaluators) run the
  entrypoint, workers run ``python -m worker`` and serve; the chief's exit ends the run (the
  others are stopped, which is no failure) and clusterctl exits with the chief's code; a worker
  that dies is restarted alone after :data:`TASK_RESTART_DELAY` (same ``TF_CONFIG``, same
  port) up to ``restart.max_worker_restarts`` times, then left down; a parameter server that
  dies is not restarted (the chief's coordinator fails, naming it);
- Ctrl-C / SIGTERM to clusterctl (``handle_signals=True``): everything is stopped, no orphans;
  tasks also stop by themselves if clusterctl dies (``CLUSTER_LAUNCHER_PID``).
"""

from __future__ import annotations

import contextlib
import json
import os
import secrets
import selectors
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import TextIO

from cluster import exitcodes, lifecycle
from cluster.ctl import policy
from cluster.ctl._output import Console, LineSplitter, use_color
from cluster.ctl.spec import ClusterFile
from cluster.ctl.task_config import assign_addresses, tf_config
from cluster.deadline import Deadline
from cluster.errors import ClusterError
from cluster.settings import (
    ENV_CONNECT_TIMEOUT,
    ENV_ERROR_FILE,
    ENV_HEARTBEAT_TIMEOUT,
    ENV_LAUNCHER_PID,
    ENV_RESTART_COUNT,
    ENV_TOKEN,
)

__all__ = ["EXIT_RUN_FAILED", "EXIT_RUN_TIMEOUT", "TASK_RESTART_DELAY", "LaunchError",
           "LaunchResult", "TaskResult", "launch"]

EXIT_RUN_FAILED = 1
EXIT_RUN_TIMEOUT = 124
PORT_RETRIES = 3
TASK_RESTART_DELAY = 1.0  # seconds before a dead worker is started again (coordinator mode)
_PIPE_DRAIN = 1.0  # seconds to wait for output after every task exited (an escaped grandchild)
_REPO_ROOT = Path(__file__).resolve().parents[2]  # holds the worker/ and ps/ packages


class LaunchError(ClusterError):
    """The launcher itself could not start the run (no port on ``host``, cannot execute)."""


@dataclass
class TaskResult:
    """How a task of the last attempt ended: its exit code (128 + N for signal N), whether
    clusterctl had stopped it, the one-line cause, its log file, and how many times clusterctl
    restarted it alone during the attempt (``mode: coordinator`` workers)."""

    task: str
    exit_code: int | None
    stopped: bool
    cause: str
    log: str
    restarts: int = 0


@dataclass
class LaunchResult:
    exit_code: int
    run_dir: Path
    attempts: int
    elapsed: float
    tasks: list[TaskResult] = field(default_factory=list)
    root_cause: str = ""
    interrupted: int | None = None

    @property
    def succeeded(self) -> bool:
        return self.exit_code == 0


class _Task:
    def __init__(self, job: str, index: int, run_dir: Path) -> None:
        self.job, self.index = job, index
        self.name = f"{job}:{index}"
        self.log_path = run_dir / f"{job}-{index}.log"
        self.error_path = run_dir / f"{job}-{index}.error.json"
        self.proc: subprocess.Popen | None = None
        self.pidfd = -1
        self.out_fd = -1
        self.splitter = LineSplitter()
        self.log: TextIO | None = None
        self.code: int | None = None
        self.stopped = False
        self.last_line = ""
        self.restarts = 0  # times started again alone (coordinator mode)
        self.restart_at: Deadline | None = None

    @property
    def running(self) -> bool:
        return self.proc is not None and self.code is None

    def signal_group(self, signum: int) -> None:
        if self.proc is None:
            return
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(self.proc.pid, signum)

    def cause(self) -> str:
        record = lifecycle.read_error_file(self.error_path)
        if record is not None:
            return record.summary()
        code = exitcodes.normalize(self.code or 0)
        if code > 128:
            with contextlib.suppress(ValueError):
                return f"killed by {signal.Signals(code - 128).name}"
        return self.last_line or "no output"


@dataclass
class _Outcome:
    phase: policy.Phase
    exits: list[policy.TaskExit]
    interrupted: int | None = None
    timed_out: bool = False


class _Signals:
    """SIGINT/SIGTERM recorded and turned into a readable fd for the selector."""

    def __init__(self) -> None:
        self.received: list[int] = []
        self.read_fd, self._write_fd = os.pipe()
        for fd in (self.read_fd, self._write_fd):
            os.set_blocking(fd, False)

    @contextlib.contextmanager
    def installed(self, enabled: bool) -> Iterator[_Signals]:
        if not enabled:
            yield self
            return
        previous = {s: signal.getsignal(s) for s in (signal.SIGINT, signal.SIGTERM)}
        old_fd = signal.set_wakeup_fd(self._write_fd)
        for s in previous:
            signal.signal(s, lambda signum, frame: self.received.append(signum))
        try:
            yield self
        finally:
            signal.set_wakeup_fd(old_fd)
            for s, handler in previous.items():
                signal.signal(s, handler)

    def drain(self) -> None:
        with contextlib.suppress(BlockingIOError):
            while os.read(self.read_fd, 512):
                pass

    def close(self) -> None:
        os.close(self.read_fd)
        os.close(self._write_fd)


class _Attempt:
    """One start of the whole cluster, supervised until every task has exited."""

    def __init__(self, spec: ClusterFile, console: Console, run_dir: Path, token: str,
                 addresses: dict[str, list[str]], restarts: int, signals: _Signals,
                 number: int) -> None:
        self.spec, self.console, self.signals = spec, console, signals
        self.addresses = addresses
        self.tasks = [_Task(job, i, run_dir) for job, i in spec.tasks()]
        self.exits: list[policy.TaskExit] = []
        self.phase = policy.Phase.RUNNING
        self.kill_deadline: Deadline | None = None
        self.wind_down: Deadline | None = None
        self.interrupted: int | None = None
        self.timed_out = False
        self._token = token
        self._restarts = restarts
        self._number = number
        self.sel = selectors.DefaultSelector()

    def _env(self, task: _Task) -> dict[str, str]:
        env = dict(os.environ)
        env.update(self.spec.env)
        pythonpath = env.get("PYTHONPATH", "")
        if (_REPO_ROOT / "worker" / "__init__.py").exists():
            env["PYTHONPATH"] = os.pathsep.join(p for p in (str(_REPO_ROOT), pythonpath) if p)
        env.update({
            "TF_CONFIG": tf_config(self.addresses, task.job, task.index),
            ENV_TOKEN: self._token,
            ENV_ERROR_FILE: str(task.error_path),
            ENV_LAUNCHER_PID: str(os.getpid()),
            ENV_RESTART_COUNT: str(self._restarts),
            ENV_CONNECT_TIMEOUT: f"{self.spec.timeouts.startup:g}",
            ENV_HEARTBEAT_TIMEOUT: f"{self.spec.timeouts.heartbeat:g}",
            "PYTHONUNBUFFERED": "1",
        })
        return env

    def _argv(self, task: _Task) -> list[str]:
        return [sys.executable, *self.spec.task_argv(task.job)]

    def _start(self, task: _Task) -> None:
        task.error_path.unlink(missing_ok=True)
        if task.log is None:
            task.log = open(task.log_path, "a", buffering=1, encoding="utf-8")  # noqa: SIM115
        again = (f" (restart {task.restarts} of {self.spec.restart.max_worker_restarts})"
                 if task.restarts else "")
        task.log.write(f"=== attempt {self._number}: {task.name}{again} ===\n")
        try:
            task.proc = subprocess.Popen(
                self._argv(task), cwd=self.spec.workdir, env=self._env(task),
                stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                start_new_session=True, close_fds=True)
        except OSError as e:
            raise LaunchError(f"cannot start {task.name}: {e}") from e
        task.out_fd = task.proc.stdout.fileno()
        os.set_blocking(task.out_fd, False)
        task.pidfd = os.pidfd_open(task.proc.pid)
        self.sel.register(task.out_fd, selectors.EVENT_READ, ("out", task))
        self.sel.register(task.pidfd, selectors.EVENT_READ, ("exit", task))

    # -- events ------------------------------------------------------------------------------

    def _emit(self, task: _Task, lines: list[str]) -> None:
        for line in lines:
            if task.log is not None:
                task.log.write(line + "\n")
            self.console.task_line(task.name, line)
            if line.strip():
                task.last_line = line.strip()

    def _read(self, task: _Task) -> None:
        try:
            chunk = os.read(task.out_fd, 65536)
        except BlockingIOError:
            return
        if chunk:
            self._emit(task, task.splitter.feed(chunk))
            return
        self._emit(task, task.splitter.flush())
        self._close_output(task)

    def _restart(self, task: _Task) -> None:
        """Start ``task`` again alone, as before (same TF_CONFIG, same port)."""
        task.restart_at = None
        while task.out_fd >= 0:  # what the dead process wrote last (EOF is due by now)
            try:
                chunk = os.read(task.out_fd, 65536)
            except BlockingIOError:
                break
            if not chunk:
                break
            self._emit(task, task.splitter.feed(chunk))
        if task.out_fd >= 0:
            self._emit(task, task.splitter.flush())
            self._close_output(task)
        task.proc, task.code, task.stopped = None, None, False
        task.splitter = LineSplitter()
        self.console.info(f"starting {task.name} again (restart {task.restarts} of "
                          f"{self.spec.restart.max_worker_restarts})")
        self._start(task)

    def _close_output(self, task: _Task) -> None:
        if task.out_fd < 0:
            return
        self.sel.unregister(task.out_fd)
        task.proc.stdout.close()
        task.out_fd = -1

    def _reap(self, task: _Task) -> None:
        self.sel.unregister(task.pidfd)
        os.close(task.pidfd)
        task.pidfd = -1
        task.code = exitcodes.normalize(task.proc.wait(timeout=5.0))  # has exited: immediate
        task.signal_group(signal.SIGKILL)  # anything it left behind in its group
        self.exits.append(policy.TaskExit(task.name, task.code, len(self.exits), task.stopped))

    def _stop_all(self, why: str) -> None:
        running = [t for t in self.tasks if t.running and not t.stopped]
        if running:
            self.console.info(f"stopping {', '.join(t.name for t in running)} ({why})")
        for task in running:
            task.stopped = True
            task.signal_group(signal.SIGTERM)
        if self.kill_deadline is None:
            self.kill_deadline = Deadline.after(self.spec.timeouts.grace)

    def _kill_all(self) -> None:
        for task in self.tasks:
            if task.running:
                task.stopped = True
                task.signal_group(signal.SIGKILL)

    def _on_signal(self) -> None:
        self.signals.drain()
        while self.signals.received:
            signum = self.signals.received.pop(0)
            if self.interrupted is None:
                self.interrupted = signum
                self.phase = policy.Phase.FAILED
                self._stop_all(f"clusterctl received {signal.Signals(signum).name}")
            else:
                self.console.info("second signal: killing every task now", error=True)
                self._kill_all()

    def _on_exit(self, task: _Task) -> None:
        """A task exited: act on it alone if the policy says so, then assess the run."""
        if self.phase is policy.Phase.RUNNING and not task.stopped:
            self._act_alone(task)
        self._assess()

    def _act_alone(self, task: _Task) -> None:
        limit = self.spec.restart.max_worker_restarts
        action = policy.on_task_exit(task.name, task.code, mode=self.spec.mode,
                                     restarts_done=task.restarts, max_restarts=limit)
        what = f"{task.name} exited {exitcodes.describe(task.code)}: {task.cause()}"
        if action is policy.TaskAction.RESTART:
            task.restarts += 1
            task.restart_at = Deadline.after(TASK_RESTART_DELAY)
            self.console.info(f"{what}; restarting it in {TASK_RESTART_DELAY:g} s (restart "
                              f"{task.restarts} of {limit})", error=True)
        elif action is policy.TaskAction.GIVE_UP:
            left = [t.name for t in self.tasks
                    if t.job == "worker" and (t.running or t.restart_at is not None)]
            self.console.info(f"{what}; not restarting it: restart.max_worker_restarts = {limit} "
                              f"used up; the run goes on without it (workers left: "
                              f"{', '.join(left) or 'none'})", error=True)
        elif action is policy.TaskAction.LOST:
            self.console.info(f"{what}; parameter servers are not restarted (their variables "
                              "are lost): the chief's exit decides the run", error=True)

    def _assess(self) -> None:
        if self.phase is not policy.Phase.RUNNING:
            return
        codes = {e.task: e.code for e in self.exits}
        self.phase = policy.assess(codes, [t.name for t in self.tasks], self.spec.mode)
        if self.phase is not policy.Phase.RUNNING:
            for task in self.tasks:
                task.restart_at = None
        coordinator = self.spec.mode == policy.COORDINATOR
        if self.phase is policy.Phase.FAILED:
            first = next(t for t in self.tasks if t.name == self.exits[-1].task)
            self.console.info(f"{first.name} exited {exitcodes.describe(first.code)}: "
                              f"{first.cause()}", error=True)
            by_chief = coordinator and first.job == "chief"
            self._stop_all("the chief's exit ends the run" if by_chief else "fail fast")
        elif self.phase is policy.Phase.SUCCEEDED and coordinator:
            self._stop_all("the chief exited 0: the run succeeded")  # servers serve forever
        elif self.phase is policy.Phase.SUCCEEDED:
            for task in self.tasks:  # servers stop now; trainers get the grace to finish
                if task.running and task.job in ("ps", "evaluator"):
                    task.stopped = True
                    task.signal_group(signal.SIGTERM)
            self.wind_down = Deadline.after(self.spec.timeouts.grace)

    def _deadlines(self, run_deadline: Deadline) -> float | None:
        candidates = [run_deadline] if self.phase is policy.Phase.RUNNING else []
        candidates += [d for d in (self.kill_deadline, self.wind_down) if d is not None]
        candidates += [t.restart_at for t in self.tasks if t.restart_at is not None]
        timeouts = [d.timeout() for d in candidates]
        finite = [t for t in timeouts if t is not None]
        return min(finite) if finite else None

    def _check_deadlines(self, run_deadline: Deadline) -> None:
        if self.phase is policy.Phase.RUNNING and run_deadline.expired:
            self.timed_out = True
            self.phase = policy.Phase.FAILED
            self._stop_all(f"the run exceeded timeouts.run = {self.spec.timeouts.run:g} s")
        for task in self.tasks:
            if task.restart_at is None:
                continue
            if self.phase is not policy.Phase.RUNNING:
                task.restart_at = None
            elif task.restart_at.expired:
                self._restart(task)
        if self.wind_down is not None and self.wind_down.expired:
            self.wind_down = None
            self._stop_all("the run succeeded")
        if self.kill_deadline is not None and self.kill_deadline.expired:
            if any(t.running for t in self.tasks):
                self.console.info(f"grace of {self.spec.timeouts.grace:g} s over: SIGKILL")
            self._kill_all()
            self.kill_deadline = None

    # -- the loop ----------------------------------------------------------------------------

    def run(self) -> _Outcome:
        self.sel.register(self.signals.read_fd, selectors.EVENT_READ, ("signal", None))
        try:
            try:
                for task in self.tasks:
                    self._start(task)
                    self._on_signal()
            except BaseException:
                self._kill_all()
                raise
            run_deadline = Deadline.after(self.spec.timeouts.run)
            drain: Deadline | None = None
            while any(t.running or t.out_fd >= 0 or t.restart_at is not None
                      for t in self.tasks):
                if not any(t.running or t.restart_at is not None for t in self.tasks):
                    drain = drain or Deadline.after(_PIPE_DRAIN)
                    if drain.expired:
                        break
                timeout = self._deadlines(run_deadline)
                if drain is not None:
                    timeout = min(timeout if timeout is not None else _PIPE_DRAIN,
                                  drain.remaining())
                for key, _ in self.sel.select(timeout):
                    kind, task = key.data
                    if kind == "out":
                        self._read(task)
                    elif kind == "exit":
                        self._reap(task)
                        self._on_exit(task)
                    else:
                        self._on_signal()
                self._check_deadlines(run_deadline)
        finally:
            self._kill_all()
            for task in self.tasks:
                if task.proc is not None and task.code is None:
                    task.code = exitcodes.normalize(task.proc.wait(timeout=5.0))
                if task.proc is not None:
                    self._close_output(task)
                if task.pidfd >= 0:
                    os.close(task.pidfd)
                if task.log is not None:
                    task.log.close()
            self.sel.close()
        return _Outcome(self.phase, self.exits, self.interrupted, self.timed_out)


def _new_run_dir(spec: ClusterFile) -> Path:
    stamp = time.strftime("%Y%m%d-%H%M%S")
    for n in range(1000):
        path = spec.log_dir / (f"{spec.name}-{stamp}" + (f"-{n}" if n else ""))
        try:
            path.mkdir(parents=True)
            return path
        except FileExistsError:
            continue
    raise LaunchError(f"cannot create a run directory under {spec.log_dir}")


def _summary(result: LaunchResult, name: str) -> str:
    verdict = "succeeded" if result.succeeded else "FAILED"
    if result.interrupted is not None:
        verdict = f"interrupted ({signal.Signals(result.interrupted).name})"
    lines = [f"run {name} {verdict} after {result.elapsed:.1f} s "
             f"({result.attempts} attempt{'s' if result.attempts > 1 else ''})"]
    width = max((len(t.task) for t in result.tasks), default=4)
    for t in result.tasks:
        code = "-" if t.exit_code is None else exitcodes.describe(t.exit_code)
        note = " (stopped by clusterctl)" if t.stopped else ""
        if t.restarts:
            note += f" (restarted {t.restarts} time{'s' if t.restarts > 1 else ''})"
        lines.append(f"  {t.task.ljust(width)}  exit {code}{note}")
    if result.root_cause:
        lines.append(f"root cause: {result.root_cause}")
    lines.append(f"logs: {result.run_dir}")
    return "\n".join(lines)


def launch(spec: ClusterFile, *, out: TextIO | None = None, color: str = "auto",
           handle_signals: bool = False, run_dir: Path | None = None) -> LaunchResult:
    """Run ``spec`` to completion on this host; see the module docstring.

    ``handle_signals`` (main thread only) makes SIGINT/SIGTERM stop the run cleanly (exit
    128 + signal). Returns a :class:`LaunchResult` whose ``exit_code`` is 0 only on success;
    writes ``summary.json`` into the run directory.

    Raises:
        LaunchError: ports cannot be chosen on ``host``, or a task cannot be executed.
    """
    out = out if out is not None else sys.stdout
    names = [f"{job}:{i}" for job, i in spec.tasks()]
    console = Console(out, color=use_color(out, color), tasks=[*names, "clusterctl"])
    run_dir = run_dir if run_dir is not None else _new_run_dir(spec)
    run_dir.mkdir(parents=True, exist_ok=True)
    token = secrets.token_urlsafe(32)
    started = time.monotonic()
    restarts, port_retries, attempts = 0, PORT_RETRIES, 0
    signals = _Signals()
    try:
        with signals.installed(handle_signals):
            while True:
                attempts += 1
                try:
                    addresses = assign_addresses(spec)
                except OSError as e:
                    raise LaunchError(str(e)) from e
                where = ", ".join(f"{job}:{i} {a}" for job, addrs in addresses.items()
                                  for i, a in enumerate(addrs))
                console.info(f"run {spec.name} attempt {attempts}: {where}; logs in {run_dir}")
                attempt = _Attempt(spec, console, run_dir, token, addresses, restarts, signals,
                                   attempts)
                outcome = attempt.run()
                root = policy.root_cause(outcome.exits, spec.mode)
                by_name = {t.name: t for t in attempt.tasks}
                result = LaunchResult(EXIT_RUN_FAILED, run_dir, attempts,
                                      time.monotonic() - started,
                                      [TaskResult(t.name, t.code, t.stopped, t.cause(),
                                                  str(t.log_path), t.restarts)
                                       for t in attempt.tasks])
                if root is not None:
                    task = by_name[root.task]
                    result.root_cause = (f"{root.task} exited {exitcodes.describe(root.code)}: "
                                         f"{task.cause()}")
                if outcome.interrupted is not None:
                    result.interrupted = outcome.interrupted
                    result.exit_code = 128 + outcome.interrupted
                    break
                if outcome.timed_out:
                    result.root_cause = (f"the run exceeded timeouts.run = "
                                         f"{spec.timeouts.run:g} s")
                    result.exit_code = EXIT_RUN_TIMEOUT
                    break
                if outcome.phase is policy.Phase.SUCCEEDED:
                    result.exit_code = 0
                    result.root_cause = ""
                    break
                decision = policy.decide(
                    root.code if root is not None else EXIT_RUN_FAILED,
                    restarts_done=restarts, max_restarts=spec.restart.max_restarts,
                    policy=spec.restart.policy,
                    ports_chosen=spec.port_base is None, port_retries_left=port_retries)
                if decision is policy.Decision.REPICK_PORTS:
                    port_retries -= 1
                    console.info(f"{result.root_cause}: choosing new ports and starting again")
                    continue
                if decision is policy.Decision.RESTART:
                    restarts += 1
                    console.info(f"{result.root_cause}: restarting the cluster (restart "
                                 f"{restarts} of {spec.restart.max_restarts})", error=True)
                    continue
                result.exit_code = policy.failed_exit_code(outcome.exits, spec.mode,
                                                           EXIT_RUN_FAILED)
                break
    finally:
        signals.close()
    console.info(_summary(result, spec.name), error=not result.succeeded)
    summary = {**asdict(result), "run_dir": str(run_dir), "name": spec.name}
    (run_dir / "summary.json").write_text(json.dumps(summary, indent=2) + "\n")
    return result
