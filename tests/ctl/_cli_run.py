"""Run ``clusterctl`` as a real command (``python -m cluster.ctl.cli``) for the tests of
tests/ctl: bounded, its output read, its process group killed if a test leaves it running."""

from __future__ import annotations

import contextlib
import os
import re
import select
import signal
import subprocess
import sys
import time
from pathlib import Path

from tests.conftest import REPO

__all__ = ["CLI", "Reader", "env_with", "interrupted_launch", "run_cli", "started"]

CLI = [sys.executable, "-m", "cluster.ctl.cli"]


def env_with(marker: str, **extra: str) -> dict[str, str]:
    """The environment for a clusterctl run: ours, the leak-check marker (the tasks inherit
    it), no colour choice from the caller's terminal, one BLAS thread per task."""
    env = {**os.environ, "CLUSTER_TEST_MARKER": marker, "OMP_NUM_THREADS": "1",
           "PYTHONPATH": str(REPO)}
    env.pop("NO_COLOR", None)
    env.update(extra)
    return env


def run_cli(args: list[str], *, cwd: Path, env: dict[str, str] | None = None,
            timeout: float = 120) -> subprocess.CompletedProcess[str]:
    """``clusterctl ARGS`` to completion (stdout and stderr apart); the code of this tree,
    not whatever ``cluster`` the interpreter would find from ``cwd``."""
    env = env if env is not None else {**os.environ, "PYTHONPATH": str(REPO)}
    return subprocess.run([*CLI, *args], cwd=cwd, env=env, capture_output=True, text=True,
                          timeout=timeout, stdin=subprocess.DEVNULL)


class Reader:
    """Reads a file descriptor (a pty master or a pipe) without blocking past a deadline,
    keeping everything read in :attr:`data`."""

    def __init__(self, fd: int) -> None:
        self.fd = fd
        self.data = b""

    def until(self, needle: bytes | re.Pattern[bytes], timeout: float) -> bool:
        """Read until ``needle`` (bytes, or a pattern to search for) has arrived (True), or
        ``timeout`` s passed or the output ended (whether it arrived)."""
        def found() -> bool:
            if isinstance(needle, bytes):
                return needle in self.data
            return needle.search(self.data) is not None

        deadline = time.monotonic() + timeout
        while not found():
            left = deadline - time.monotonic()
            if left <= 0 or not self._read(left):
                return found()
        return True

    def rest(self, timeout: float) -> bytes:
        """Read until the output ends (or ``timeout`` s); returns everything read."""
        deadline = time.monotonic() + timeout
        while (left := deadline - time.monotonic()) > 0 and self._read(left):
            pass
        return self.data

    def _read(self, timeout: float) -> bool:
        ready, _, _ = select.select([self.fd], [], [], timeout)
        if not ready:
            return False
        try:
            chunk = os.read(self.fd, 65536)
        except OSError:  # a pty master reads EIO once the other side is closed
            return False
        self.data += chunk
        return bool(chunk)


@contextlib.contextmanager
def started(args: list[str], *, cwd: Path, env: dict[str, str], stdout: int):
    """``clusterctl ARGS`` running with its output on ``stdout`` (a pty slave or a pipe's
    write end); SIGKILLed (its group) and reaped when the block is left."""
    proc = subprocess.Popen([*CLI, *args], cwd=cwd, env=env, stdin=subprocess.DEVNULL,
                            stdout=stdout, stderr=subprocess.STDOUT, start_new_session=True)
    try:
        yield proc
    finally:
        if proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(timeout=30)


def interrupted_launch(script: Path, *, cwd: Path, env: dict[str, str]) -> str:
    """The console of ``clusterctl launch -n 2 SCRIPT`` interrupted, as a terminal's Ctrl-C
    does, once both tasks printed ``running``; asserts it exits 128 + SIGINT."""
    read_fd, write_fd = os.pipe()
    args = ["launch", "-n", "2", str(script), "--color", "never"]
    with started(args, cwd=cwd, env=env, stdout=write_fd) as proc:
        os.close(write_fd)
        out = Reader(read_fd)
        try:
            for task in (rb"\[chief:0\]\s+running", rb"\[worker:0\]\s+running"):
                assert out.until(re.compile(task), 90), out.data.decode()[-2000:]
            proc.send_signal(signal.SIGINT)
            out.rest(90)
        finally:
            os.close(read_fd)
        assert proc.wait(timeout=60) == 128 + signal.SIGINT
    return out.data.decode()
