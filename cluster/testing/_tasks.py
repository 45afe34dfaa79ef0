"""One command as a real process with its output captured against deadlines, always reaped:
:class:`TaskProcess`, and :class:`TaskProcesses` that reaps every one it started."""

from __future__ import annotations

import io
import os
import signal
import subprocess
import sys
import threading
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from cluster.deadline import Deadline

__all__ = ["TaskExitedError", "TaskProcess", "TaskProcessError", "TaskProcesses",
           "TaskTimeoutError"]


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
    with ``log``, everything is also appended to that file (the two streams interleaved by the
    chunks read from them). With ``new_session`` (the default) the task leads its own process
    group, so :meth:`close` kills whatever it started too.

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
        """Reap it: SIGKILL its process group if it still runs or its output is still open (a
        process it started holds it), wait for it and for its output to end. Idempotent; what
        has been printed stays readable.

        Raises:
            TaskTimeoutError: not gone ``timeout`` s after SIGKILL (stuck in the kernel).
        """
        if self._closed:
            return
        deadline = Deadline.after(timeout)
        alive = self._proc.poll() is None
        if self.new_session and (alive or self._open):
            # Also after the leader was reaped: while the group has members its id stays theirs.
            try:
                os.killpg(self._proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        elif alive:
            self._proc.send_signal(signal.SIGKILL)
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
