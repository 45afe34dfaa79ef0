"""``clusterctl launch``: start every task of a cluster file on this host and supervise them.

:func:`launch` takes a validated :class:`~cluster.ctl.spec.ClusterFile` (no argv) and returns a
:class:`LaunchResult`. Per attempt it chooses ports, gives each task its ``TF_CONFIG`` and the
run's ``CLUSTER_TOKEN`` (environment only: never on a command line or in a log), starts each task
as a fresh interpreter in its own process group (``python -m worker SCRIPT`` / ``python -m ps``)
and supervises the attempt (:mod:`cluster.ctl._attempt`; one task's process is
:mod:`cluster.ctl._task_process`):

- output: each line to the console prefixed ``[worker:1]`` and to ``RUN_DIR/worker-1.log``;
  progress bars live (:mod:`cluster.ctl._output`); ``show`` limits the console to some tasks;
  a task that only stopped because a peer failed gets one console line (its traceback is in
  its log);
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
- ``elastic: {min, max}`` (``--elastic MIN:MAX``): the coordination service runs in a process
  of its own (``python -m coordination_service``, :mod:`cluster.ctl._service`), so the chief
  may die too; every chief and worker gets ``CLUSTER_ELASTIC=MIN:MAX``; one that dies (a
  signal, or a failure ``restart.policy`` retries) is restarted alone after
  :data:`TASK_RESTART_DELAY` (same ``TF_CONFIG``, port and environment) up to
  ``restart.max_worker_restarts`` times, while the others keep running;
  when fewer than ``min`` run the run fails as any other, the root cause naming who is gone;
  each restart and loss is one console line and one event in ``RUN_DIR/membership.jsonl``
  (``clusterctl status`` lists them);
- Ctrl-C / SIGTERM to clusterctl (``handle_signals=True``): everything is stopped, no orphans,
  and the run is reported as interrupted; tasks also stop by themselves if clusterctl dies
  (``CLUSTER_LAUNCHER_PID``);
- ports: a task that cannot bind a port clusterctl chose (exit 203) makes it choose again (up
  to :data:`PORT_RETRIES` times); a fixed address (listed, or from ``port_base``) that is taken
  on this host is refused before anything starts (exit 2), and never "chosen again".
"""

from __future__ import annotations

import json
import secrets
import signal
import sys
import time
from collections.abc import Collection
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import TextIO

from cluster import exitcodes, lifecycle
from cluster.ctl import _telemetry, policy
from cluster.ctl._attempt import Attempt, Outcome, SignalPipe
from cluster.ctl._output import Console, use_color
from cluster.ctl._task_process import TaskStartError
from cluster.ctl.certs import prepare_run
from cluster.ctl.ports import ensure_fd_limit, taken_addresses
from cluster.ctl.spec import ClusterFile
from cluster.ctl.task_config import assign_addresses
from cluster.errors import ClusterError

__all__ = ["EXIT_RUN_FAILED", "EXIT_RUN_TIMEOUT", "TASK_RESTART_DELAY", "LaunchError",
           "LaunchResult", "LaunchSetupError", "TaskResult", "launch"]

EXIT_RUN_FAILED = 1
EXIT_RUN_TIMEOUT = 124
PORT_RETRIES = 3
TASK_RESTART_DELAY = 1.0  # seconds before a dead worker is started again (coordinator, elastic)
_FDS_PER_TASK = 3  # the launcher's output pipe, pidfd and log file of each task
_LISTED_ADDRESSES = 16  # beyond this many tasks the start line abridges the addresses


class LaunchError(ClusterError):
    """The launcher itself could not start the run (no port on ``host``, cannot execute)."""


class LaunchSetupError(LaunchError):
    """The run could not be set up, so nothing was started and no run directory is left:
    ``host`` cannot be bound, the run directory cannot be made, too few file descriptors.
    ``clusterctl`` exits 2 (like a bad cluster file)."""


@dataclass
class TaskResult:
    """How a task of the last attempt ended: its exit code (128 + N for signal N), whether
    clusterctl had stopped it, the one-line cause of an exit other than 0 (``""`` for a task
    that succeeded: a success has no cause), its log file, how many times clusterctl restarted
    it alone during the attempt (``mode: coordinator`` workers), and the last line it wrote
    that was not blank (whatever its exit code)."""

    task: str
    exit_code: int | None
    stopped: bool
    cause: str
    log: str
    restarts: int = 0
    followed: str = ""  # the task whose failure it only followed (its error record says so)
    last_line: str = ""


@dataclass
class LaunchResult:
    """The outcome of :func:`launch`: ``exit_code`` (0 only on success; clusterctl's exit
    code), the run directory, how many attempts ran, seconds elapsed, each task of the last
    attempt, the root cause of a failure, and the signal that interrupted the run."""

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


def _new_run_dir(spec: ClusterFile) -> Path:
    stamp = time.strftime("%Y%m%d-%H%M%S")
    for n in range(1000):
        path = spec.log_dir / (f"{spec.name}-{stamp}" + (f"-{n}" if n else ""))
        try:
            path.mkdir(parents=True)
            return path
        except FileExistsError:
            continue
        except OSError as e:
            raise LaunchSetupError(f"log_dir {spec.log_dir}: cannot create the run directory "
                                   f"{path}: {e.strerror or e}; point log_dir at a writable "
                                   "directory (or give --run-dir)") from e
    raise LaunchSetupError(f"cannot create a run directory under {spec.log_dir}")


def _make_run_dir(spec: ClusterFile, run_dir: Path | None) -> Path:
    """The run directory: ``run_dir`` (made if missing) or a new one under ``log_dir``."""
    if run_dir is None:
        return _new_run_dir(spec)
    try:
        run_dir.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise LaunchSetupError(f"--run-dir {run_dir}: cannot create it: {e.strerror or e}") from e
    return run_dir


def _first_addresses(spec: ClusterFile) -> dict[str, list[str]]:
    """The first attempt's addresses, chosen before anything else exists, so a ``host`` that
    cannot be bound leaves nothing behind."""
    try:
        return assign_addresses(spec)
    except OSError as e:
        raise LaunchSetupError(f"host {spec.host}: {e.strerror or e}: set `host:` in "
                               f"{spec.path.name} to an address of this machine (default "
                               "127.0.0.1)") from e


def _port_chosen(spec: ClusterFile, task: str) -> bool:
    """Whether clusterctl chose ``task``'s port (a counted job without ``port_base``): only
    then can choosing again help when the port is taken."""
    job = task.split(":", 1)[0]
    return spec.port_base is None and any(j.name == job and j.addresses is None
                                          for j in spec.jobs)


def _check_fixed_addresses(spec: ClusterFile, addresses: dict[str, list[str]]) -> None:
    """Refuse to start when a fixed address (listed in the file, or from ``port_base``) is
    already taken on this host: choosing again cannot help, and the task would only exit 203."""
    fixed = {f"{job}:{i}": address for job, listed in addresses.items()
             for i, address in enumerate(listed) if not _port_chosen(spec, f"{job}:{i}")}
    taken = taken_addresses(fixed)
    if taken:
        where = ", ".join(f"{task} {fixed[task]}" for task in taken)
        raise LaunchSetupError(f"the fixed address of {where} is taken on this host (another "
                               "process listens there): stop it, change the address, or give "
                               "the job a count without port_base to have clusterctl choose "
                               "free ports")


def _where(addresses: dict[str, list[str]]) -> str:
    """Every task's address for the start line; a large cluster's are abridged (every
    ``TF_CONFIG`` is still in each task's environment, ``clusterctl render`` prints them)."""
    pairs = [f"{job}:{i} {a}" for job, addrs in addresses.items() for i, a in enumerate(addrs)]
    if len(pairs) <= _LISTED_ADDRESSES:
        return ", ".join(pairs)
    return f"{len(pairs)} tasks, {', '.join(pairs[:3])}, ..., {pairs[-1]}"


def _summary(result: LaunchResult, name: str) -> str:
    verdict = "succeeded" if result.succeeded else "FAILED"
    if result.interrupted is not None:
        verdict = f"interrupted ({signal.Signals(result.interrupted).name})"
    lines = [f"run {name} {verdict} after {result.elapsed:.1f} s "
             f"({result.attempts} attempt{'s' if result.attempts > 1 else ''})"]
    width = max((len(t.task) for t in result.tasks), default=4)
    root = result.root_cause.split(" ", 1)[0]
    for t in result.tasks:
        code = "-" if t.exit_code is None else exitcodes.describe(t.exit_code)
        if t.task == root and result.interrupted is None:
            note = " (root cause)"
        elif t.followed:
            note = f" (stopped: {t.followed} failed)"
        else:
            note = " (stopped by clusterctl)" if t.stopped else ""
        if t.restarts:
            note += f" (restarted {t.restarts} time{'s' if t.restarts > 1 else ''})"
        lines.append(f"  {t.task.ljust(width)}  exit {code}{note}")
    if result.root_cause:
        lines.append(f"root cause: {result.root_cause}")
    lines.append(f"logs: {result.run_dir}")
    return "\n".join(lines)


def launch(spec: ClusterFile, *, out: TextIO | None = None, color: str = "auto",
           handle_signals: bool = False, run_dir: Path | None = None,
           timestamps: bool = False, show: Collection[str] | None = None) -> LaunchResult:
    """Run ``spec`` to completion on this host; see the module docstring.

    ``color`` is ``always``, ``never`` or ``auto`` (colour when ``out`` is a terminal).
    ``timestamps`` starts console and log lines with the time; ``show`` (task names) limits
    the console to those tasks (the logs get every task).
    ``handle_signals`` (main thread only) makes SIGINT/SIGTERM stop the run cleanly (exit
    128 + signal). Returns a :class:`LaunchResult` whose ``exit_code`` is 0 only on success;
    writes ``summary.json`` into the run directory.

    Raises:
        LaunchSetupError: nothing could be started (no port on ``host``, no run directory,
            too few file descriptors); no run directory is left behind.
        LaunchError: a task cannot be executed (the others are stopped first).
    """
    out = out if out is not None else sys.stdout
    names = [f"{job}:{i}" for job, i in spec.tasks()]
    console = Console(out, color=use_color(out, color), tasks=[*names, "clusterctl"],
                      show=None if show is None else {*show, "clusterctl"},
                      timestamps=timestamps)
    try:  # per task: its output pipe, its pidfd, its log (the ports are checked when chosen)
        ensure_fd_limit(_FDS_PER_TASK * len(names), f"supervising {len(names)} tasks")
    except OSError as e:
        raise LaunchSetupError(str(e)) from e
    first = _first_addresses(spec)
    _check_fixed_addresses(spec, first)
    run_dir = _make_run_dir(spec, run_dir)
    token = secrets.token_urlsafe(32)
    try:
        tls = prepare_run(spec, run_dir)  # tls: auto makes the certificates here, once per run
    except OSError as e:
        raise LaunchSetupError(f"cannot write the run's TLS certificates in {run_dir}: "
                               f"{e.strerror or e}") from e
    started = time.monotonic()
    restarts, port_retries, attempts = 0, PORT_RETRIES, 0
    signals = SignalPipe()
    _telemetry.started(run_dir, console.info)  # the default of `clusterctl status`
    try:
        with signals.installed(handle_signals):
            while True:
                attempts += 1
                try:
                    addresses = first if attempts == 1 else assign_addresses(spec)
                except OSError as e:
                    raise LaunchError(str(e)) from e
                where = _where(addresses)
                console.info(f"run {spec.name} attempt {attempts}: {where}; logs in {run_dir}")
                attempt = Attempt(spec, console, run_dir, token, addresses, restarts, signals,
                                  attempts, restart_delay=TASK_RESTART_DELAY, tls=tls,
                                  timestamps=timestamps)
                try:
                    outcome = attempt.run()
                except TaskStartError as e:
                    raise LaunchError(str(e)) from e.__cause__
                root = policy.root_cause(outcome.decisive(), spec.mode)
                result = _result(spec, attempt, outcome, root, run_dir, attempts,
                                 time.monotonic() - started)
                if (outcome.interrupted is not None or outcome.timed_out
                        or outcome.phase is policy.Phase.SUCCEEDED):
                    break
                decision = policy.decide(
                    root.verdict if root is not None else EXIT_RUN_FAILED,
                    restarts_done=restarts, max_restarts=spec.restart.max_restarts,
                    policy=spec.restart.policy,
                    ports_chosen=root is not None and _port_chosen(spec, root.task),
                    port_retries_left=port_retries)
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
                if root is not None and root.code == exitcodes.EXIT_ADDRESS_IN_USE:
                    console.info(f"{root.task}'s address is fixed by {spec.path.name} and was "
                                 "taken: free that port, or give the job a count to have "
                                 "clusterctl choose free ports", error=True)
                break
    finally:
        signals.close()
    _telemetry.finish(spec, run_dir, console.info)  # the merged timeline, if asked for
    console.info(_summary(result, spec.name), error=not result.succeeded)
    summary = {**asdict(result), "run_dir": str(run_dir), "name": spec.name}
    (run_dir / "summary.json").write_text(json.dumps(summary, indent=2) + "\n")
    return result


def _unresponsive(attempt: Attempt, outcome: Outcome, root: policy.TaskExit) -> str:
    """The root cause when the first failure only followed a peer that stopped answering
    (``policy.unresponsive``): ``worker:1 unresponsive (...): chief:0 reported ...``; ``""``
    when that is not the case. The survivors' error records say whom they lost."""
    records = {t.name: lifecycle.read_error_file(t.error_path) for t in attempt.tasks}
    blames = {name: r.root_task for name, r in records.items() if r is not None and r.root_task}
    found = policy.unresponsive(root, outcome.exits, blames)
    if found is None:
        return ""
    culprit, witness = found
    task = next((t for t in attempt.tasks if t.name == culprit), None)
    if task is None:  # a record naming no task of this cluster
        return ""
    if task.was_suspended:
        how = "its process was suspended, e.g. by SIGSTOP"
    elif task.code is not None:
        how = f"it exited only when clusterctl stopped it: {exitcodes.describe(task.code)}"
    else:
        how = "it never exited"
    record = records[witness]
    seen = record.summary() if record is not None else "nothing"
    return f"{culprit} unresponsive ({how}): {witness} reported {seen}"


def _failed_by_itself(record: lifecycle.ErrorRecord | None) -> bool:
    """Whether ``record`` is a task's own failure (not one that followed a peer's)."""
    return record is not None and not policy.is_secondary(record.task, record.exit_code,
                                                          record.root_task)


def _result(spec: ClusterFile, attempt: Attempt, outcome: Outcome,
            root: policy.TaskExit | None, run_dir: Path, attempts: int,
            elapsed: float) -> LaunchResult:
    """The result of the run if it ends with this attempt: exit code 0 (succeeded),
    128 + signal (interrupted), :data:`EXIT_RUN_TIMEOUT`, else :data:`EXIT_RUN_FAILED` with the
    root cause named (the caller may still restart, or refine the code)."""
    records = {t.name: lifecycle.read_error_file(t.error_path) for t in attempt.tasks}
    blames = {name: r.root_task for name, r in records.items() if r is not None}
    followed = {name: policy.blame_chain(name, blames)[-1] for name, r in records.items()
                if r is not None and policy.is_secondary(name, r.exit_code, r.root_task)}
    result = LaunchResult(EXIT_RUN_FAILED, run_dir, attempts, elapsed,
                          [TaskResult(t.name, t.code, t.stopped,
                                      "" if t.code == 0 else t.cause(), str(t.log_path),
                                      t.restarts, followed.get(t.name, ""), t.last_line)
                           for t in attempt.tasks])
    if root is not None:
        culprit = followed.get(root.task, root.task)
        if culprit != root.task and _failed_by_itself(records.get(culprit)):
            root = next((e for e in reversed(outcome.exits) if e.task == culprit), root)
        task = next(t for t in attempt.tasks if t.name == root.task)
        result.root_cause = (_unresponsive(attempt, outcome, root)
                             or f"{root.task} {root.ended()}: {task.cause()}")
        if outcome.note and root.stopped:  # the elastic side failed it, not this task
            result.root_cause = outcome.note
        elif outcome.note:  # an elastic run with too few tasks left: who is gone
            result.root_cause += f"; {outcome.note}"
    elif outcome.note:  # the coordination service of an elastic run died first
        result.root_cause = outcome.note
    if outcome.interrupted is not None:
        result.interrupted = outcome.interrupted
        result.exit_code = 128 + outcome.interrupted
        if not any(e.code != 0 and not e.stopped for e in outcome.exits):
            # Every task ended because clusterctl stopped it: none of them is a root cause.
            name = signal.Signals(outcome.interrupted).name
            how = " (Ctrl-C)" if outcome.interrupted == signal.SIGINT else ""
            result.root_cause = (f"interrupted: clusterctl received {name}{how} and stopped "
                                 "every task")
    elif outcome.timed_out:
        result.root_cause = f"the run exceeded timeouts.run = {spec.timeouts.run:g} s"
        result.exit_code = EXIT_RUN_TIMEOUT
    elif outcome.phase is policy.Phase.SUCCEEDED:
        result.exit_code = 0
        result.root_cause = ""
    return result
