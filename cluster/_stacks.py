"""Python stacks on demand: ``SIGUSR2`` makes a task write every thread's stack to its stderr.

``clusterctl`` sends it to each task before it stops a run that exceeded ``timeouts.run``
(``cluster.ctl._attempt``), so the log of a hung run shows where every task was waiting. The
dump is :mod:`faulthandler`'s: written from the signal handler in C, so it works while the
main thread is blocked in a lock, a socket or a futex, where a Python-level handler would never
run.
"""

from __future__ import annotations

import faulthandler
import signal
import sys

__all__ = ["DUMP_SIGNAL", "enable_stack_dumps"]

DUMP_SIGNAL = signal.SIGUSR2
"""The signal that makes a task dump its stacks (not SIGUSR1: scripts and libraries use it)."""


def enable_stack_dumps() -> None:
    """Make :data:`DUMP_SIGNAL` write all threads' Python stacks to stderr (the task's log),
    and nothing else: the task keeps running. Idempotent; a process without a usable stderr
    (``None`` or no file descriptor) is left as it is."""
    stream = sys.stderr
    try:
        if stream is None or stream.fileno() < 0:
            return
    except (AttributeError, OSError, ValueError):  # replaced by an object without a descriptor
        return
    faulthandler.register(DUMP_SIGNAL, file=stream, all_threads=True, chain=False)
