"""One attempt of ``clusterctl launch``: start every task, supervise them, stop them all.

:class:`Attempt` runs one event loop (a selector over the tasks' output pipes, their pidfds and
the signal wake-up fd, against deadlines; no sleeps, no polling) until every task has exited:

- output: each line to the console prefixed ``[worker:1]`` and to the task's log; partial lines
  (progress bars) as :mod:`cluster.ctl._output` shows them; native library log lines (gRPC's
  C core, :func:`~cluster.ctl._output.is_native_log_line`) to the log only;
- a task whose error record says it only stopped because a peer failed (exit 201: its
  ``CollectiveAbortedError`` / ``PeerUnavailableError``) gets one console line, ``chief:0
  stopped: worker:1 failed``; the rest of its output (its traceback) goes to its log only;
- the first failure line names the task that failed first on its own (its error record), even
  when a task that only followed it is the first to exit;
- a task that exits on its own while the run goes on is handled alone as
  :func:`cluster.ctl.policy.on_task_exit` says (``mode: coordinator``: a worker is started
  again after ``restart_delay`` with the same ``TF_CONFIG``, a bounded number of times; an
  elastic run, :func:`cluster.ctl.policy.on_elastic_exit`: a chief or worker likewise, while
  at least ``elastic.min`` of them run, each event in ``RUN_DIR/membership.jsonl``; the
  coordination service runs in a process of its own, :mod:`cluster.ctl._service`, started
  first and stopped last);
- then :func:`cluster.ctl.policy.assess` says whether the run is over: on failure every task is
  stopped (SIGTERM to each process group, SIGKILL after ``timeouts.grace``); on success the
  servers are stopped and the trainers get the grace to finish;
- SIGINT/SIGTERM to clusterctl (through :class:`SignalPipe`) stops everything; a second signal
  kills everything.

What happens after the attempt (restart the cluster, give up) is the caller's decision, taken
from the :class:`Outcome`.
"""

from __future__ import annotations

import contextlib
import os
import selectors
import signal
import sys
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

from cluster import exitcodes, lifecycle
from cluster._stacks import DUMP_SIGNAL
from cluster.ctl import _telemetry, policy
from cluster.ctl._elastic import ENV_ELASTIC
from cluster.ctl._elastic_run import ElasticRun
from cluster.ctl._output import Console, is_native_log_line
from cluster.ctl._service import SERVICE_ARGV, cluster_only
from cluster.ctl._task_process import TaskProcess
from cluster.ctl.certs import RunTls
from cluster.ctl.spec import ClusterFile
from cluster.ctl.task_config import tf_config
from cluster.deadline import Deadline
from cluster.settings import (
    ENV_ERROR_FILE,
    ENV_GRACE_PERIOD,
    ENV_LAUNCHER_PID,
    ENV_RESTART_COUNT,
    ENV_TOKEN,
)

__all__ = ["Attempt", "Outcome", "SignalPipe"]

_START_THREADS = 16  # processes being started at once (see Attempt._start_all)
_STACK_DUMP_WAIT = 1.0  # seconds from asking tasks for their stacks to SIGTERM (timeouts.run)
_PIPE_DRAIN = 1.0  # seconds to wait for output after every task exited (an escaped grandchild)
_REPO_ROOT = Path(__file__).resolve().parents[2]  # holds the worker/ and ps/ packages


@dataclass
class Outcome:
    """How an attempt ended: its phase, every task exit in order, the signal that interrupted
    it (if any), and whether it ran past ``timeouts.run``. ``handled``: the ``order`` of each
    exit acted on alone (the task was restarted or given up on: no cause of the run's end);
    ``note``: why an elastic run failed (too few tasks left, and which are gone)."""

    phase: policy.Phase
    exits: list[policy.TaskExit]
    interrupted: int | None = None
    timed_out: bool = False
    handled: frozenset[int] = frozenset()
    note: str = ""

    def decisive(self) -> list[policy.TaskExit]:
        """The exits that decided the run: all but those :attr:`handled`."""
        return [e for e in self.exits if e.order not in self.handled]


_TRACEBACK = "Traceback (most recent call last):"  # how Python starts a printed traceback

class SignalPipe:
    """SIGINT/SIGTERM recorded and turned into a readable fd for the selector."""

    def __init__(self) -> None:
        self.received: list[int] = []
        self.read_fd, self._write_fd = os.pipe()
        for fd in (self.read_fd, self._write_fd):
            os.set_blocking(fd, False)

    @contextlib.contextmanager
    def installed(self, enabled: bool) -> Iterator[SignalPipe]:
        """Handle SIGINT/SIGTERM while inside (main thread only); no-op when not ``enabled``."""
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


class Attempt:
    """One start of the whole cluster, supervised until every task has exited.

    ``restarts`` is the number of whole-cluster restarts before this attempt (the tasks'
    ``CLUSTER_RESTART_COUNT``); ``number`` counts attempts from 1 (for the logs).
    :meth:`run` raises :class:`~cluster.ctl._task_process.TaskStartError` when a task cannot
    be executed (the tasks already started are killed first).
    """

    def __init__(self, spec: ClusterFile, console: Console, run_dir: Path, token: str,
                 addresses: dict[str, list[str]], restarts: int, signals: SignalPipe,
                 number: int, restart_delay: float, tls: RunTls | None = None,
                 timestamps: bool = False) -> None:
        self.spec, self.console, self.signals = spec, console, signals
        self.addresses = addresses
        self.tasks = [TaskProcess(job, i, run_dir, timestamps=timestamps)
                      for job, i in spec.tasks()]
        self._announced = False  # the first failure line was written
        self.exits: list[policy.TaskExit] = []
        self.phase = policy.Phase.RUNNING
        self.kill_deadline: Deadline | None = None
        self.dump_deadline: Deadline | None = None  # timeouts.run: stacks asked for, then stop
        self.wind_down: Deadline | None = None
        self.interrupted: int | None = None
        self.timed_out = False
        self._token = token
        self._restarts = restarts
        self._number = number
        self._restart_delay = restart_delay
        self._tls = tls
        self.elastic = (ElasticRun(spec, console, run_dir, addresses, timestamps=timestamps)
                        if spec.elastic is not None else None)
        self.sel = selectors.DefaultSelector()

    def _env(self, task: TaskProcess) -> dict[str, str]:
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
            **self.spec.timeouts.task_env(),  # startup, heartbeat, stall
            ENV_GRACE_PERIOD: f"{self.spec.timeouts.grace:g}",  # SIGTERM to SIGKILL, as here
            "PYTHONUNBUFFERED": "1",
        })
        if self.elastic is not None:  # the service's address; chief and workers: MIN:MAX
            env.update(self.elastic.task_env(task.job))
        if self._tls is not None:  # tls: in the cluster file: CLUSTER_TLS_CERT/_KEY/_CA
            env.update(self._tls.env(task.job, task.index))
        env.update(_telemetry.task_env(self.spec, task.log_path.parent, task.name, env))
        return env

    def _spawn(self, task: TaskProcess) -> None:
        again = (f" (restart {task.restarts} of {self.spec.restart.max_worker_restarts})"
                 if task.restarts else "")
        task.start([sys.executable, *self.spec.task_argv(task.job)], cwd=self.spec.workdir,
                   env=self._env(task),
                   header=f"=== attempt {self._number}: {task.name}{again} ===")

    def _watch(self, task: TaskProcess) -> None:
        self.sel.register(task.out_fd, selectors.EVENT_READ, ("out", task))
        self.sel.register(task.pidfd, selectors.EVENT_READ, ("exit", task))

    def _start(self, task: TaskProcess) -> None:
        self._spawn(task)
        self._watch(task)

    def _start_all(self) -> None:
        """Start every task, several at once: each start waits for its child's exec, which on
        a busy machine waits for a core; overlapping those waits made starting 128 tasks ~9x
        faster on 2 loaded cores (10 s -> 1 s). Every started task is watched even when
        another could not start (the caller then kills them all)."""
        with ThreadPoolExecutor(max_workers=min(_START_THREADS, len(self.tasks)),
                                thread_name_prefix="clusterctl-start") as pool:
            futures = [pool.submit(self._spawn, task) for task in self.tasks]
        for task in self.tasks:
            if task.running:
                self._watch(task)
        for future in futures:
            if future.exception() is not None:
                raise future.exception()

    # -- events ------------------------------------------------------------------------------

    def _show(self, task: TaskProcess, lines: list[str], partial: str = "") -> None:
        lines = [line for line in lines if not is_native_log_line(line)]  # in the log only
        if is_native_log_line(partial):
            partial = ""
        if task.secondary is None:
            # One read may carry what the task printed before it failed and the start of its
            # traceback (the worker writes its record, then prints the traceback): the lines
            # before the traceback are ordinary output and reach the console either way.
            cut = next((i for i, line in enumerate(lines) if line.startswith(_TRACEBACK)),
                       len(lines))
            for line in lines[:cut]:
                self.console.task_line(task.name, line)
            lines = lines[cut:]
        self._check_secondary(task)
        if task.secondary is not None:
            return  # in its log: the console had its one line
        for line in lines:
            self.console.task_line(task.name, line)
        self.console.task_partial(task.name, partial)

    def _read(self, task: TaskProcess) -> None:
        lines, ended = task.read()
        self._show(task, lines, "" if ended else task.partial())
        if ended:
            self._close_output(task)

    # -- failure lines -----------------------------------------------------------------------

    def _records(self) -> dict[str, lifecycle.ErrorRecord]:
        records = {t.name: t.error_record() for t in self.tasks}
        return {name: r for name, r in records.items() if r is not None}

    def _check_secondary(self, task: TaskProcess) -> None:
        """Notice that ``task`` wrote an error record saying it only followed a peer's failure:
        from then on its output goes to its log only, the console gets one line. (The worker
        writes the record before its traceback, so none of the traceback reaches the console.)
        """
        if task.secondary is not None or not task.error_path.exists():
            return
        record = task.error_record()
        if record is None or not policy.is_secondary(task.name, record.exit_code,
                                                     record.root_task):
            return
        task.secondary = record
        self._announce()
        culprit = self._culprit(task.name)
        whom = f"{culprit} failed" if culprit != task.name else record.summary()
        self.console.info(f"{task.name} stopped: {whom} (traceback in {task.log_path.name})")

    def _culprit(self, name: str) -> str:
        """The task ``name`` followed: where the blame chain of the records ends when that task
        failed on its own; else (a link of the chain has not written its record yet: a peer
        that aborted the group on the culprit's report) the task whose record of its own
        failure is the oldest; else the chain's end."""
        records = self._records()
        end = policy.blame_chain(name, {n: r.root_task for n, r in records.items()})[-1]
        own = sorted((r.time, n) for n, r in records.items()
                     if not policy.is_secondary(n, r.exit_code, r.root_task))
        if end in records and any(n == end for _, n in own):
            return end
        return own[0][1] if own else end

    def _announce(self) -> None:
        """Write the first failure line, once: the task that failed first on its own. That is
        the root cause of the exits so far (:func:`policy.root_cause`) unless it only followed
        a peer; then the task its error record blames (through the records of the others),
        which has written its own record before telling anyone, though it may not have exited
        yet."""
        if self._announced:
            return
        self._announced = True
        records = self._records()
        decisive = [e for e in self.exits if e.order not in self._handled()]
        root = policy.root_cause(decisive, self.spec.mode) if decisive else None
        start = root.task if root is not None else next(
            (n for n, r in records.items() if policy.is_secondary(n, r.exit_code, r.root_task)),
            None)
        if start is None:
            return
        culprit = self._culprit(start)
        record = records.get(culprit)
        if culprit != start and record is not None and not policy.is_secondary(
                culprit, record.exit_code, record.root_task):
            self.console.info(f"{culprit} failed: {record.summary()}", error=True)
        elif root is not None:
            first = next(t for t in self.tasks if t.name == root.task)
            self.console.info(f"{first.name} exited {exitcodes.describe(root.code)}: "
                              f"{first.cause()}", error=True)
        else:
            self._announced = False  # nothing to name yet: the first exit will

    def _restart(self, task: TaskProcess) -> None:
        """Start ``task`` again alone, as before (same TF_CONFIG, same port)."""
        task.restart_at = None
        if task.out_fd >= 0:  # what the dead process wrote last (EOF is due by now)
            self._show(task, task.drain())
            self._close_output(task)
        task.forget_process()
        self.console.info(f"starting {task.name} again (restart {task.restarts} of "
                          f"{self.spec.restart.max_worker_restarts})")
        self._start(task)
        if self.elastic is not None:
            self.elastic.record("started", task, self.tasks)

    def _close_output(self, task: TaskProcess) -> None:
        if task.out_fd < 0:
            return
        self.sel.unregister(task.out_fd)
        task.close_output()

    def _reap(self, task: TaskProcess) -> None:
        self.sel.unregister(task.pidfd)
        code = task.reap()
        self.exits.append(policy.TaskExit(task.name, code, len(self.exits), task.stopped,
                                          self._declared(task, code)))
        self._check_secondary(task)

    @staticmethod
    def _declared(task: TaskProcess, code: int) -> int | None:
        """What ``task`` recorded for its own failure before the launcher's signal ended it
        (:func:`policy.declared_code`); its record is unlinked at each start, so this process
        wrote it."""
        record = task.error_record() if task.stopped else None
        return policy.declared_code(task.name, code, task.stopped,
                                    record.exit_code if record else None,
                                    record.root_task if record else "")

    def _stop_all(self, why: str) -> None:
        running = [t for t in self.tasks if t.running and not t.stopped]
        if running:
            self.console.info(f"stopping {', '.join(t.name for t in running)} ({why})")
        for task in running:
            task.stopped = True
            task.was_suspended = task.suspended()  # why it was silent, for the root cause
            task.signal_group(signal.SIGTERM)
        if self.kill_deadline is None:
            self.kill_deadline = Deadline.after(self.spec.timeouts.grace)

    def _ask_for_stacks(self) -> None:
        """The run is over time: every running task writes its Python stacks to its log
        (``SIGUSR2``, :mod:`cluster._stacks`), then, :data:`_STACK_DUMP_WAIT` later, the tasks
        are stopped. The signal goes to the task's own process, not its group: a child that
        did not register the dump would die of it."""
        running = [t for t in self.tasks if t.running and not t.stopped]
        if running:
            self.console.info(f"the run exceeded timeouts.run = {self.spec.timeouts.run:g} s: "
                              "asking every task for its Python stacks (in its log)")
        for task in running:
            if task.proc is not None:
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.kill(task.proc.pid, DUMP_SIGNAL)
        self.dump_deadline = Deadline.after(_STACK_DUMP_WAIT if running else 0.0)

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

    def _on_exit(self, task: TaskProcess) -> None:
        """A task exited: act on it alone if the policy says so, then assess the run."""
        if self.phase is policy.Phase.RUNNING and not task.stopped:
            self._act_alone(task)
        self._assess()

    def _act_alone(self, task: TaskProcess) -> None:
        if self.elastic is not None:
            self._act_elastic(task)
            return
        limit = self.spec.restart.max_worker_restarts
        action = policy.on_task_exit(task.name, task.code, mode=self.spec.mode,
                                     restarts_done=task.restarts, max_restarts=limit)
        what = f"{task.name} exited {exitcodes.describe(task.code)}: {task.cause()}"
        if action is policy.TaskAction.RESTART:
            task.restarts += 1
            task.restart_at = Deadline.after(self._restart_delay)
            self.console.info(f"{what}; restarting it in {self._restart_delay:g} s (restart "
                              f"{task.restarts} of {limit})", error=True)
        elif action is policy.TaskAction.GIVE_UP:
            left = [t.name for t in self.tasks
                    if t.job == "worker" and (t.running or t.restart_at is not None)]
            self.console.info(f"{what}; not restarting it: restart.max_worker_restarts = {limit} "
                              f"used up; the run goes on without it (workers left: "
                              f"{', '.join(left) or 'none'})", error=True)
        elif task.code == exitcodes.EXIT_PREEMPTED and self.spec.mode == policy.COORDINATOR:
            self.console.info(f"{what}; it served until the chief's preemption checkpoint: "
                              "the chief's exit decides the run", error=True)
        elif action is policy.TaskAction.LOST:
            self._announced = True  # a lost ps is the root cause (policy.root_cause): named
            self.console.info(f"{what}; parameter servers are not restarted (their variables "
                              "are lost): the chief's exit decides the run", error=True)

    # -- elastic runs ------------------------------------------------------------------------

    def _start_service(self) -> None:
        """Start the coordination service's process (elastic runs), before any task."""
        if self.elastic is None:
            return
        service = self.elastic.service
        env = self._env(service.process)
        env["TF_CONFIG"] = cluster_only(self.addresses)
        env[ENV_ELASTIC] = str(self.spec.elastic)
        if self._tls is not None:  # the first task's certificate: it names this host too
            env.update(self._tls.env(*self.spec.tasks()[0]))
        service.start([sys.executable, *SERVICE_ARGV], env, self.spec.workdir,
                      f"=== attempt {self._number}: the coordination service on "
                      f"{service.address} ===", self.sel)

    def _on_service(self, kind: str) -> None:
        """The service wrote (its log) or exited: while the run goes on, that fails it."""
        service = self.elastic.service
        if not service.on_event(kind, self.sel) or self.phase is not policy.Phase.RUNNING:
            return
        process = service.process
        self.elastic.note = (f"the coordination service exited "
                             f"{exitcodes.describe(process.code)} ({process.cause()}; "
                             f"{process.log_path.name})")
        self.console.info(f"{self.elastic.note}: the tasks cannot coordinate without it",
                          error=True)
        self._fail_alone("the coordination service is gone")

    def _act_elastic(self, task: TaskProcess) -> None:
        """A chief or worker of an elastic run exited on its own (:class:`ElasticRun`)."""
        action = self.elastic.on_exit(task, self.exits[-1].order, self.tasks,
                                      self._restart_delay)
        if action is policy.TaskAction.BELOW_MIN:
            bounds = self.spec.elastic
            self._fail_alone(f"elastic {bounds}: fewer than {bounds.min} running")

    def _fail_alone(self, why: str) -> None:
        """Fail the attempt for a reason of the elastic side, already said on the console."""
        self._announced = True
        self.phase = policy.Phase.FAILED
        for task in self.tasks:
            task.restart_at = None
        self._stop_all(why)

    def _assess(self) -> None:
        if self.phase is not policy.Phase.RUNNING:
            return
        handled = self._handled()
        given_up = self.elastic.given_up if self.elastic is not None else set()
        codes = {e.task: e.code for e in self.exits if e.order not in handled}
        tasks = [t.name for t in self.tasks if t.name not in given_up]
        self.phase = policy.assess(codes, tasks, self.spec.mode)
        if self.phase is not policy.Phase.RUNNING:
            for task in self.tasks:
                task.restart_at = None
        coordinator = self.spec.mode == policy.COORDINATOR
        if self.phase is policy.Phase.FAILED:
            self._announce()
            by_chief = coordinator and self.exits[-1].task == "chief:0"
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
        candidates += [d for d in (self.kill_deadline, self.wind_down, self.dump_deadline)
                       if d is not None]
        candidates += [t.restart_at for t in self.tasks if t.restart_at is not None]
        timeouts = [d.timeout() for d in candidates]
        finite = [t for t in timeouts if t is not None]
        return min(finite) if finite else None

    def _check_deadlines(self, run_deadline: Deadline) -> None:
        if self.phase is policy.Phase.RUNNING and run_deadline.expired:
            self.timed_out = True
            self.phase = policy.Phase.FAILED
            self._ask_for_stacks()
        if self.dump_deadline is not None and self.dump_deadline.expired:
            self.dump_deadline = None
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

    def run(self) -> Outcome:
        """Start every task and supervise them until all have exited; never leaves one
        running, even when interrupted by an exception."""
        self.sel.register(self.signals.read_fd, selectors.EVENT_READ, ("signal", None))
        try:
            # Every process is started before any is waited on: a start costs a fork and an
            # exec, never the task's own start-up.
            began = time.monotonic()
            try:
                self._start_service()
                self._start_all()
                self._on_signal()
            except BaseException:
                self._kill_all()
                raise
            self.console.info(f"started {len(self.tasks)} task"
                              f"{'s' if len(self.tasks) > 1 else ''} in "
                              f"{time.monotonic() - began:.2f} s")
            run_deadline = Deadline.after(self.spec.timeouts.run)
            drain: Deadline | None = None
            while any(t.running or t.out_fd >= 0 or t.restart_at is not None
                      for t in self.tasks):
                if not any(t.running or t.restart_at is not None for t in self.tasks):
                    drain = drain or Deadline.after(_PIPE_DRAIN)
                    if drain.expired:
                        break
                timeout = self._deadlines(run_deadline)
                due = self.console.due()  # a pipe's partial line to write
                if due is not None:
                    timeout = due if timeout is None else min(timeout, due)
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
                    elif kind.startswith("service"):
                        self._on_service(kind)
                    else:
                        self._on_signal()
                self.console.tick()
                self._check_deadlines(run_deadline)
        finally:
            self._kill_all()
            if self.elastic is not None:
                self.elastic.service.shutdown(self.sel, self.spec.timeouts.grace)
            for task in self.tasks:
                self._close_output(task)
                task.close()
            self.sel.close()
        return Outcome(self.phase, self.exits, self.interrupted, self.timed_out,
                       frozenset(self._handled()),
                       self.elastic.note if self.elastic is not None else "")

    def _handled(self) -> set[int]:
        """The order of each exit acted on alone (elastic runs), no cause of the end."""
        return self.elastic.handled if self.elastic is not None else set()
