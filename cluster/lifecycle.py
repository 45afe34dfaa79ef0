"""Process-level plumbing shared by the task entry points (``python -m worker``, ``python -m ps``).

Signals become exceptions in the main thread (so ``finally`` blocks run), a task stops when the
launcher that started it dies (no orphans even after ``kill -9`` of ``clusterctl``), and a failing
task leaves a small JSON error file for its launcher (``CLUSTER_ERROR_FILE``, like torch elastic's
error file) naming the exception, so the launcher's summary states the root cause exactly.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import select
import signal
import sys
import threading
import time
from collections.abc import MutableMapping
from dataclasses import dataclass
from typing import Any, NoReturn

from cluster import exitcodes
from cluster import settings as task_settings
from cluster.errors import AddressInUseError, ClusterError
from cluster.settings import ENV_ERROR_FILE, TaskSettings
from cluster.task_source import complete_tf_config

__all__ = [
    "ErrorRecord",
    "Terminated",
    "absorb_termination",
    "exit_with",
    "install_termination_handlers",
    "read_error_file",
    "setup_logging",
    "start_runtime",
    "termination_behind",
    "watch_launcher",
    "write_error_file",
]

log = logging.getLogger(__name__)


class Terminated(BaseException):
    """SIGTERM (or SIGINT) arrived; raised in the main thread so the program unwinds cleanly.

    A ``BaseException`` like ``KeyboardInterrupt``: ``except Exception`` in user code does not
    swallow it. ``exit_code`` is 128 + the signal number.
    """

    def __init__(self, signum: int) -> None:
        super().__init__(f"received {signal.Signals(signum).name}")
        self.signum = signum
        self.exit_code = 128 + signum


def termination_behind(error: BaseException) -> Terminated | None:
    """The :class:`Terminated` that ``error`` was raised while handling, if any.

    A signal handler raises wherever the main thread happens to be. Landing inside
    ``threading.Condition.wait`` (between giving the lock back and taking it again), it makes
    the ``with`` block's exit raise ``RuntimeError: cannot release un-acquired lock`` with the
    ``Terminated`` as its context: still a termination, not the script's own failure.
    """
    seen: set[int] = set()
    while error is not None and id(error) not in seen:
        if isinstance(error, Terminated):
            return error
        seen.add(id(error))
        error = error.__cause__ or error.__context__
    return None


def install_termination_handlers(signums: tuple[int, ...] = (signal.SIGTERM,)) -> None:
    """Make each of ``signums`` raise :class:`Terminated` in the main thread (once; a second
    signal while unwinding is ignored so cleanup can finish)."""
    fired = threading.Event()

    def handler(signum, frame):
        if fired.is_set():
            return
        fired.set()
        raise Terminated(signum)

    for signum in signums:
        signal.signal(signum, handler)


def absorb_termination(signums: tuple[int, ...] = (signal.SIGTERM, signal.SIGINT)) -> None:
    """From now on, each of ``signums`` is noted in the log, not raised: the task is already
    shutting down (a path bounded by its own deadlines). The launcher's fail-fast SIGTERM often
    reaches a task that is exiting on its own; raised out of a ``finally`` it would print a
    traceback and replace the task's real exit code."""

    def note(signum, frame):
        log.info("%s during shutdown: already shutting down", signal.Signals(signum).name)

    for signum in signums:
        signal.signal(signum, note)


def exit_with(code: int) -> NoReturn:
    """Exit the process with ``code``, which a SIGTERM or SIGINT arriving during the
    interpreter's teardown can no longer change: both are ignored from here on. (The teardown
    puts back the default action of every signal with a Python handler before it collects
    garbage and destroys modules, so the launcher's fail-fast SIGTERM, racing a task already
    on its way out with its own code, would otherwise kill it: a recorded exit 1 would read
    143.) The launcher's SIGKILL after its grace still bounds a teardown that hangs."""
    for signum in (signal.SIGTERM, signal.SIGINT):
        signal.signal(signum, signal.SIG_IGN)
    sys.exit(code)


def setup_logging() -> None:
    """Log records of the runtime to stderr (the launcher prefixes each line with the task)."""
    if not logging.getLogger().handlers:
        logging.basicConfig(level=logging.WARNING, stream=sys.stderr,
                            format="%(levelname)s %(name)s: %(message)s")


def watch_launcher(pid: int | None) -> None:
    """If ``pid`` (``settings.launcher_pid``, ``CLUSTER_LAUNCHER_PID``) is given, SIGTERM this
    process when that launcher exits.

    Waits on a pidfd in a daemon thread (Linux); elsewhere, or if the launcher is already gone
    when called, it acts at once or not at all as the platform allows.
    """
    if pid is None or not hasattr(os, "pidfd_open"):
        return
    try:
        fd = os.pidfd_open(pid)
    except ProcessLookupError:
        log.error("launcher (pid %d) is gone: stopping", pid)
        os.kill(os.getpid(), signal.SIGTERM)
        return
    except OSError:
        return

    def wait() -> None:
        select.select([fd], [], [])  # readable once the launcher has exited
        os.kill(os.getpid(), signal.SIGTERM)
        with contextlib.suppress(OSError):  # our output went to the launcher: may be closed
            print(f"launcher (pid {pid}) exited: stopping this task", file=sys.stderr,
                  flush=True)

    threading.Thread(target=wait, name="watch-launcher", daemon=True).start()


@dataclass(frozen=True)
class ErrorRecord:
    """What a failed task says about itself: the root cause a launcher reports."""

    task: str
    error_type: str
    message: str
    exit_code: int
    root_task: str = ""  # another task, when this one only stopped because of it
    traceback: str = ""
    time: float = 0.0

    def summary(self) -> str:
        text = f"{self.error_type}: {self.message}" if self.error_type else self.message
        return text if len(text) <= 500 else text[:497] + "..."


def write_error_file(record: ErrorRecord, path: str | None) -> None:
    """Write ``record`` as JSON to ``path`` (``settings.error_file``, ``CLUSTER_ERROR_FILE``) if
    given; never raises."""
    if not path:
        return
    data = {**record.__dict__, "time": record.time or time.time()}
    try:
        tmp = f"{path}.tmp"
        with open(tmp, "w") as f:
            json.dump(data, f)
        os.replace(tmp, path)
    except OSError as e:
        log.warning("cannot write error file %s: %s", path, e)


def report_startup_failure(program: str, exc: BaseException, code: int,
                           error_file: str | None) -> int:
    """A task could not start: say why on stderr, leave the reason for the launcher in
    ``error_file``, return ``code`` (the process's exit code)."""
    print(f"{program}: error: {exc}", file=sys.stderr, flush=True)
    write_error_file(ErrorRecord(task=getattr(exc, "task", ""), error_type=type(exc).__name__,
                                 message=str(exc), exit_code=code), error_file)
    return code


def start_runtime(program: str, environ: MutableMapping[str, str], services: Any = None) -> Any:
    """Read the task's settings from ``environ``, install them as the process's settings
    (:func:`cluster.settings.install`) and start its runtime (``cluster.runtime``); the process
    entry points' shared start-up.

    First the task's identity is completed (:mod:`cluster.task_source`: a ``TF_CONFIG`` without
    a task plus ``CLUSTER_TASK_TYPE``/``JOB_COMPLETION_INDEX`` on Kubernetes, or the cluster of
    a Slurm step) and exported as ``environ["TF_CONFIG"]``, so that the runtime, the strategies
    and the user's script all read one complete ``TF_CONFIG``.

    Returns the :class:`~cluster.runtime.TaskRuntime`, or an ``int`` exit code when the task
    cannot start: the reason is then on stderr and in the error file (bad settings, cluster or
    token: ``EXIT_USAGE``; address taken: ``EXIT_ADDRESS_IN_USE``; a signal: 128 + signum).
    """
    from cluster import runtime  # the runtime imports grpc: not needed to report bad settings

    try:
        settings = TaskSettings.from_env(environ)
    except ClusterError as e:
        return report_startup_failure(program, e, exitcodes.EXIT_USAGE,
                                      environ.get(ENV_ERROR_FILE) or None)
    task_settings.install(settings)
    try:
        found = complete_tf_config(environ)
    except ClusterError as e:
        return report_startup_failure(program, e, exitcodes.EXIT_USAGE, settings.error_file)
    if found is not None:
        environ["TF_CONFIG"] = found.tf_config
        if found.note:
            log.warning("%s", found.note)
        log.info("%s is %s (from %s)", program, found.task, found.source)
    try:
        return runtime.start(services=services, settings=settings)
    except AddressInUseError as e:
        return report_startup_failure(program, e, exitcodes.EXIT_ADDRESS_IN_USE,
                                      settings.error_file)
    except (ClusterError, ValueError) as e:
        return report_startup_failure(program, e, exitcodes.EXIT_USAGE, settings.error_file)
    except Terminated as e:
        return e.exit_code


def read_error_file(path: str | os.PathLike) -> ErrorRecord | None:
    """The record a task wrote, or ``None`` when there is none (or it is unreadable)."""
    try:
        with open(path) as f:
            data = json.load(f)
        return ErrorRecord(**{k: data[k] for k in ErrorRecord.__dataclass_fields__ if k in data})
    except (OSError, ValueError, TypeError):
        return None
