"""One task's process as ``clusterctl launch`` runs it: start, signal, read its output, reap.

A :class:`TaskProcess` is one slot of the cluster (``worker:1``) across the processes started
for it during an attempt (a ``mode: coordinator`` worker may be started again alone). Each
process runs in its own process group, so a signal reaches everything it started; its output
(stdout and stderr together) is read without blocking from a pipe, and its exit is seen through
a pidfd. Every line goes to ``RUN_DIR/worker-1.log``; :meth:`TaskProcess.cause` names why the
process ended (its error file, the signal that killed it, or its last line of output, native
library log lines left out: :func:`cluster.ctl._output.is_native_log_line`).

The caller owns the event loop: it registers :attr:`TaskProcess.out_fd` and
:attr:`TaskProcess.pidfd` with its selector after :meth:`TaskProcess.start`, and unregisters
them before :meth:`TaskProcess.close_output` and :meth:`TaskProcess.reap`.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
from pathlib import Path
from typing import TextIO

from cluster import exitcodes, lifecycle
from cluster.ctl._output import LineSplitter, is_native_log_line, stamp
from cluster.deadline import Deadline

__all__ = ["TaskProcess", "TaskStartError"]

_READ_SIZE = 65536
_REAP_TIMEOUT = 5.0  # seconds; only ever waited for a process that exited or was SIGKILLed


class TaskStartError(Exception):
    """A task's process could not be executed; ``str()`` is ``cannot start worker:1: <why>``
    and ``__cause__`` the ``OSError``."""

    def __init__(self, task: str, error: OSError) -> None:
        super().__init__(f"cannot start {task}: {error}")
        self.task = task


class TaskProcess:
    """The process of task ``job:index`` and what the launcher knows of it.

    ``code`` is the exit code of the last process (128 + N for signal N), None while it runs;
    ``stopped`` is True once the launcher has signalled it; ``restarts`` counts the times it was
    started again alone, and ``restart_at`` is when the next such start is due.
    """

    def __init__(self, job: str, index: int, run_dir: Path, *, timestamps: bool = False) -> None:
        self.job, self.index = job, index
        self.timestamps = timestamps  # start each log line with the time it was read
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
        self.was_suspended = False  # its process was stopped (SIGSTOP) when the launcher stopped it
        self.secondary: lifecycle.ErrorRecord | None = None  # its record: it only followed a peer

    @property
    def running(self) -> bool:
        return self.proc is not None and self.code is None

    def start(self, argv: list[str], *, cwd: Path, env: dict[str, str], header: str) -> None:
        """Start a process in a new session (its own process group), stdin closed, output piped.

        ``header`` is written to the log first. Raises :class:`TaskStartError` when ``argv``
        cannot be executed.
        """
        self.error_path.unlink(missing_ok=True)  # a stale record must not name the wrong cause
        if self.log is None:
            self.log = open(self.log_path, "a", buffering=1, encoding="utf-8")  # noqa: SIM115
        self.log.write(header + "\n")
        try:
            self.proc = subprocess.Popen(
                argv, cwd=cwd, env=env,
                stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                start_new_session=True, close_fds=True)
        except OSError as e:
            raise TaskStartError(self.name, e) from e
        self.out_fd = self.proc.stdout.fileno()
        os.set_blocking(self.out_fd, False)
        self.pidfd = os.pidfd_open(self.proc.pid)

    def read(self) -> tuple[list[str], bool]:
        """The complete lines that are ready (written to the log), and whether the output ended
        (then the partial last line is included)."""
        try:
            chunk = os.read(self.out_fd, _READ_SIZE)
        except BlockingIOError:
            return [], False
        if chunk:
            return self._logged(self.splitter.feed(chunk)), False
        return self._logged(self.splitter.flush()), True

    def drain(self) -> list[str]:
        """Everything the dead process wrote that is still unread, partial last line included
        (written to the log); the caller closes the output next."""
        lines: list[str] = []
        while True:
            try:
                chunk = os.read(self.out_fd, _READ_SIZE)
            except BlockingIOError:
                break
            if not chunk:
                break
            lines += self._logged(self.splitter.feed(chunk))
        return lines + self._logged(self.splitter.flush())

    def partial(self) -> str:
        """What a terminal shows of the line the process has started but not ended."""
        return self.splitter.partial()

    def _logged(self, lines: list[str]) -> list[str]:
        when = f"{stamp()} " if self.timestamps and lines else ""
        for line in lines:
            if self.log is not None:
                self.log.write(when + line + "\n")
            if line.strip() and not is_native_log_line(line):  # gRPC's noise is no cause
                self.last_line = line.strip()
        return lines

    def close_output(self) -> None:
        """Close the output pipe (unregistered from the caller's selector first)."""
        self.proc.stdout.close()
        self.out_fd = -1

    def reap(self) -> int:
        """Collect the exit code of a process that has exited (its pidfd is readable and was
        unregistered), then SIGKILL whatever it left behind in its process group."""
        os.close(self.pidfd)
        self.pidfd = -1
        self.code = exitcodes.normalize(self.proc.wait(timeout=_REAP_TIMEOUT))
        self.signal_group(signal.SIGKILL)
        return self.code

    def forget_process(self) -> None:
        """Make the slot ready for :meth:`start` again (after :meth:`reap` and
        :meth:`close_output`); the log, the restart count and the last line stay."""
        self.proc, self.code, self.stopped = None, None, False
        self.splitter = LineSplitter()
        self.secondary = None

    def error_record(self) -> lifecycle.ErrorRecord | None:
        """The error record the process left (``RUN_DIR/worker-1.error.json``), if any."""
        return lifecycle.read_error_file(self.error_path)

    def close(self) -> None:
        """Release the pidfd and the log; the process must have exited (or been killed)."""
        if self.proc is not None and self.code is None:
            self.code = exitcodes.normalize(self.proc.wait(timeout=_REAP_TIMEOUT))
        if self.pidfd >= 0:
            os.close(self.pidfd)
            self.pidfd = -1
        if self.log is not None:
            self.log.close()

    def suspended(self) -> bool:
        """Whether the process is stopped by a signal (SIGSTOP, SIGTSTP: state ``T``) or a
        tracer (``t``) right now; False when it cannot be told (no ``/proc``, gone)."""
        if self.proc is None:
            return False
        try:
            with open(f"/proc/{self.proc.pid}/stat", "rb") as f:
                stat = f.read()
        except OSError:
            return False
        # "pid (comm) state ...": comm may hold spaces and parentheses, so split after the last ")"
        return stat[stat.rfind(b")") + 2:][:1] in (b"T", b"t")

    def signal_group(self, signum: int) -> None:
        """Send ``signum`` to the process group; a group already gone is no error."""
        if self.proc is None:
            return
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(self.proc.pid, signum)

    def cause(self) -> str:
        """One line on why the process ended: its error record, else the signal that killed
        it, else its last line of output."""
        record = lifecycle.read_error_file(self.error_path)
        if record is not None:
            return record.summary()
        code = exitcodes.normalize(self.code or 0)
        if code > 128:
            with contextlib.suppress(ValueError):
                return f"killed by {signal.Signals(code - 128).name}"
        return self.last_line or "no output"
