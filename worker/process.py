"""``python -m worker [SCRIPT | -m MODULE] [ARGS...]``: run a script as chief, worker, evaluator.

Steps: validate ``TF_CONFIG`` strictly and start this task's server (``cluster.runtime.start``),
wait until every peer answers a health check (``CLUSTER_CONNECT_TIMEOUT``, default 60 s), then
run the script exactly like ``python SCRIPT ARGS`` (``__main__``, ``sys.argv``, ``sys.path[0]``)
and exit with its code. With no script, serve until a Shutdown RPC, SIGTERM or SIGINT: run the
functions a ClusterCoordinator on the chief sends (``worker.servicer``); a SIGTERM while the
coordinator runs is a preemption notice: tell the cluster, serve on (up to
``CLUSTER_GRACE_PERIOD``) until the coordinator has saved and left, exit 204
(:mod:`cluster._serving`).

- SIGTERM unwinds the script (``finally`` blocks run) and exits 143; while a
  ``cluster.checkpoint.PreemptionCheckpointHandler`` is active it only flags a preemption: the
  tasks save at the next ``run`` call and exit 204 (``EXIT_PREEMPTED``), not reported as a failure
  to the peers.
- An uncaught exception prints its traceback, tells every peer (their collectives fail naming
  this task and the exception) and exits 1. A task that stops because of another task's failure
  exits 201 (``cluster.exitcodes``), so launchers name the right root cause.
- When a peer reports a failure and the script has not failed within 2 s on its own (it is not in
  a collective), :class:`~cluster.errors.PeerFailedError` is raised in it.
"""

from __future__ import annotations

import os
import runpy
import signal
import sys
import threading
import traceback
from dataclasses import dataclass

from cluster import _serving, exitcodes, lifecycle, runtime
from cluster._stacks import enable_stack_dumps
from cluster.errors import (
    ClusterError,
    CollectiveAbortedError,
    PeerFailedError,
    PeersNotReadyError,
    PeerUnavailableError,
)
from worker.servicer import SERVICE, WorkerService

__all__ = ["Command", "main", "parse_args", "run"]

USAGE = """\
usage: python -m worker [SCRIPT | -m MODULE] [ARGS...]

Run SCRIPT (or MODULE) as the task TF_CONFIG names (chief, worker or evaluator), with the
task's gRPC server up; exit with the script's exit code. With no script, serve until shut down.

environment:
  TF_CONFIG                 the cluster and this task (required)
  CLUSTER_TOKEN             the cluster's shared secret (clusterctl sets it)
  CLUSTER_CONNECT_TIMEOUT   seconds to wait for peers (default 60)
"""

PEER_FAILURE_GRACE = 2.0  # seconds a script gets to fail on its own after a peer's report
WORKER_JOBS = ("chief", "worker", "evaluator")


class UsageError(Exception):
    """Bad command line; the message says what to do."""


@dataclass(frozen=True)
class Command:
    script: str | None = None
    module: str | None = None
    args: tuple[str, ...] = ()

    @property
    def serve(self) -> bool:
        return self.script is None and self.module is None


def parse_args(argv: list[str]) -> Command:
    """``[SCRIPT | -m MODULE] [ARGS...]`` as Python itself parses them (``-mMODULE`` too)."""
    if not argv:
        return Command()
    first = argv[0]
    if first == "-m":
        if len(argv) < 2:
            raise UsageError("-m needs a module name")
        return Command(module=argv[1], args=tuple(argv[2:]))
    if first.startswith("-m"):
        return Command(module=first[2:], args=tuple(argv[1:]))
    if first.startswith("-"):
        raise UsageError(f"unknown option {first!r}")
    if not os.path.isfile(first):
        raise UsageError(f"can't open file {os.path.abspath(first)!r}: no such file")
    return Command(script=first, args=tuple(argv[1:]))


def _fail(message: str) -> None:
    print(f"worker: error: {message}", file=sys.stderr, flush=True)



def main(argv: list[str] | None = None) -> None:
    lifecycle.exit_with(run(sys.argv[1:] if argv is None else argv))


def run(argv: list[str]) -> int:
    """Everything ``python -m worker`` does; returns the exit code."""
    if argv[:1] in (["-h"], ["--help"]):
        print(USAGE, end="")
        return exitcodes.EXIT_OK
    try:
        command = parse_args(argv)
    except UsageError as e:
        _fail(f"{e}\n{USAGE}")
        return exitcodes.EXIT_USAGE
    lifecycle.setup_logging()
    enable_stack_dumps()  # SIGUSR2: clusterctl asks for the stacks before it stops a hung run
    lifecycle.install_termination_handlers(
        _serving.SERVING_SIGNALS if command.serve else (signal.SIGTERM,))
    service = WorkerService() if command.serve else None
    rt = lifecycle.start_runtime(
        "worker", os.environ, services={SERVICE: service.handlers()} if service else None)
    if isinstance(rt, int):
        return rt
    try:
        if rt.task_type not in WORKER_JOBS:
            _fail(f"TF_CONFIG makes this task {rt.task}: run it with `python -m ps`, not "
                  "`python -m worker`")
            return exitcodes.EXIT_USAGE
        lifecycle.watch_launcher(rt.settings.launcher_pid)
        if service is not None:
            service.bind(rt.task, rt.token)
            return _serve(rt)
        try:
            rt.wait_for_peers()
        except PeerFailedError as e:
            _fail(str(e))
            return _record(rt, e, exitcodes.EXIT_PEER_FAILED)
        except PeersNotReadyError as e:
            _fail(str(e))
            return _record(rt, e, exitcodes.EXIT_PEERS_NOT_READY)
        except ClusterError as e:
            _fail(str(e))
            return _record(rt, e, exitcodes.EXIT_USAGE)
        if rt.peer_failure is not None:  # reported before the script could start
            _fail(f"{rt.task}: not starting the script: {rt.peer_failure}")
            return _record(rt, rt.peer_failure, exitcodes.EXIT_PEER_FAILED)
        return _run_script(rt, command)
    except lifecycle.Terminated as e:
        return e.exit_code
    except KeyboardInterrupt:
        return 128 + signal.SIGINT
    finally:
        lifecycle.absorb_termination()  # the exit code is decided: a late signal must not undo it
        rt.shutdown()


def _serve(rt: runtime.TaskRuntime) -> int:
    try:
        try:
            rt.join()  # the coordination service: the chief waits for every task to register
        except PeersNotReadyError as e:
            _fail(str(e))
            return exitcodes.EXIT_PEERS_NOT_READY
        except ClusterError as e:
            _fail(str(e))
            return exitcodes.EXIT_USAGE
        return _serving.serve(rt)
    except lifecycle.Terminated as e:  # before it served: nothing to keep serving for
        print(f"{rt.task}: shutting down ({e})", file=sys.stderr, flush=True)
    return exitcodes.EXIT_OK


class ScriptExited(Exception):
    """The script called ``sys.exit`` with a non-zero code."""


def _record(rt: runtime.TaskRuntime, exc: BaseException, code: int) -> int:
    root = ""
    if code == exitcodes.EXIT_PEER_FAILED:
        root = rt.peer_failure.task if rt.peer_failure is not None else getattr(exc, "task", "")
    lifecycle.write_error_file(lifecycle.ErrorRecord(
        task=rt.task, error_type=type(exc).__name__, message=str(exc), exit_code=code,
        root_task=root or "", traceback=traceback.format_exc()), rt.settings.error_file)
    return code


class _PeerFailureInterrupt:
    """Raises the peer's failure in the main thread if the script does not fail by itself."""

    def __init__(self, rt: runtime.TaskRuntime) -> None:
        self._done = threading.Event()
        self._main = threading.main_thread().ident
        self._armed: PeerFailedError | None = None
        signal.signal(signal.SIGUSR1, self._raise)
        rt.add_failure_listener(self._on_failure)

    def _on_failure(self, error: PeerFailedError) -> None:
        threading.Thread(target=self._later, args=(error,), daemon=True).start()

    def _later(self, error: PeerFailedError) -> None:
        if self._done.wait(PEER_FAILURE_GRACE):
            return
        self._armed = error
        signal.pthread_kill(self._main, signal.SIGUSR1)

    def _raise(self, signum, frame) -> None:
        error, self._armed = self._armed, None
        if error is not None and not self._done.is_set():
            raise PeerFailedError(f"stopping: {error}", task=error.task,
                                  error_type=error.error_type,
                                  error_message=error.error_message,
                                  exit_code=error.exit_code)

    def disarm(self) -> None:
        self._done.set()


def _is_secondary(rt: runtime.TaskRuntime, exc: BaseException) -> bool:
    """True when ``exc`` only reflects another task's failure (that task is the root cause)."""
    if rt.peer_failure is not None or isinstance(exc, (PeerFailedError, PeerUnavailableError)):
        return True
    return isinstance(exc, CollectiveAbortedError) and bool(exc.task) and exc.task != rt.task


def _run_script(rt: runtime.TaskRuntime, command: Command) -> int:
    interrupt = _PeerFailureInterrupt(rt)
    if command.module is not None:
        sys.argv = [command.module, *command.args]  # run_module puts the file path in argv[0]
        sys.path.insert(0, os.getcwd())
    else:
        sys.argv = [command.script, *command.args]
        sys.path.insert(0, os.path.dirname(os.path.abspath(command.script)))
    try:
        if command.module is not None:
            runpy.run_module(command.module, run_name="__main__", alter_sys=True)
        else:
            runpy.run_path(command.script, run_name="__main__")
        return exitcodes.EXIT_OK
    except SystemExit as e:
        code = _exit_code(e.code)
        if code != exitcodes.EXIT_OK:
            error = ScriptExited(f"{command.script or command.module} exited with code {code}")
            # A preempted task's peers agreed on the save and exit by themselves: a failure
            # report would abort their last collectives and turn their 204 into 201.
            if code != exitcodes.EXIT_PREEMPTED:
                rt.report_failure(error, code)
            _record(rt, error, code)
        return code
    except lifecycle.Terminated as e:
        interrupt.disarm()
        print(f"{rt.task}: {e}: stopped", file=sys.stderr, flush=True)
        return e.exit_code
    except KeyboardInterrupt:
        return 128 + signal.SIGINT
    except BaseException as e:  # the script's uncaught exception: report, then exit non-zero
        interrupt.disarm()
        terminated = lifecycle.termination_behind(e)
        if terminated is not None:  # the signal broke a lock on its way: still a termination
            print(f"{rt.task}: {terminated}: stopped", file=sys.stderr, flush=True)
            return terminated.exit_code
        code = exitcodes.EXIT_PEER_FAILED if _is_secondary(rt, e) else exitcodes.EXIT_FAILURE
        # The record first: the launcher reads it even if we are killed meanwhile, and a
        # launcher that finds a "peer failed" record keeps the traceback below off its console.
        _record(rt, e, code)
        traceback.print_exc()
        if code == exitcodes.EXIT_PEER_FAILED:
            print(f"{rt.task}: stopping because of another task: {rt.peer_failure or e}",
                  file=sys.stderr, flush=True)
        # The report is bounded (report_timeout); a launcher's SIGTERM must not cut it short
        # and turn this task's own failure into a 143 that hides the root cause.
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        rt.report_failure(e, code)
        return code
    finally:
        interrupt.disarm()
        sys.stdout.flush()
        sys.stderr.flush()


def _exit_code(code: object) -> int:
    """``sys.exit(x)`` as the interpreter maps it: None -> 0, int -> itself, else print -> 1."""
    if code is None:
        return 0
    if isinstance(code, int):
        return code & 0xFF
    print(code, file=sys.stderr)
    return 1
