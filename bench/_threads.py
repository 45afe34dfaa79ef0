"""Per-thread CPU time of this process, for benchmarks that report their busiest thread.

On a machine with a free core for every busy thread, a call's wall time cannot be shorter than
the CPU time of its busiest thread; the process's total CPU time says nothing about that. So a
bench takes a :func:`snapshot` before and after the work, and :func:`busiest` of
:func:`cpu_between` the two names the thread that worked most and its CPU nanoseconds::

    before = snapshot()
    work()
    after = snapshot()
    if before is not None and after is not None:
        top = busiest(cpu_between(before, after))   # ThreadCpu(tid, name, ns) or None

Linux only: the threads are the entries of ``/proc/self/task``, and each one's CPU time is read
from its own CPU-time clock (``clock_gettime`` of the thread's clock id, the one
``pthread_getcpuclockid`` gives), which is exact to the nanosecond also for a thread that is
on a CPU at that moment. (``/proc/self/task/<tid>/schedstat`` holds the same counter, but only
as of the thread's last scheduler update: for a running thread it lags by up to a scheduler
tick, about 2 ms here, longer than a small all-reduce, and it costs about 25 times as much to
read.) Elsewhere :func:`snapshot` returns ``None``, and callers show the figure as unknown.
"""

from __future__ import annotations

import os
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import NamedTuple

__all__ = ["Snapshot", "ThreadCpu", "busiest", "cpu_between", "snapshot", "thread_name"]

TASKS = Path("/proc/self/task")


def _clock_id(tid: int) -> int:
    """The CPU-time clock of thread ``tid`` of this process (Linux's ``MAKE_THREAD_CPUCLOCK``
    with ``CPUCLOCK_SCHED``, as glibc's ``pthread_getcpuclockid`` makes it)."""
    return (~tid << 3) | 4 | 2


def _cpu_ns(tid: int) -> int | None:
    """Thread ``tid``'s CPU nanoseconds so far; ``None`` when it has ended."""
    try:
        return time.clock_gettime_ns(_clock_id(tid))
    except OSError:  # EINVAL: no such thread (any more) in this process
        return None


@dataclass(frozen=True)
class Snapshot:
    """Every thread's CPU nanoseconds at one moment (``ns``, by thread id). ``caller`` is the
    thread that took it, read once as the snapshot started (in ``ns``) and once as it ended
    (``caller_end``), so that :func:`cpu_between` leaves the snapshots' own cost out."""

    ns: dict[int, int]
    caller: int
    caller_end: int


def snapshot() -> Snapshot | None:
    """Every thread of this process and its CPU time so far; ``None`` where this is not Linux
    (or ``/proc`` is not mounted)."""
    if not sys.platform.startswith("linux"):
        return None
    caller = threading.get_native_id()
    first = _cpu_ns(caller)
    try:
        tids = [int(name) for name in os.listdir(TASKS)]
    except OSError:
        return None
    ns = {tid: cpu for tid in tids if tid != caller and (cpu := _cpu_ns(tid)) is not None}
    ns[caller] = first
    return Snapshot(ns=ns, caller=caller, caller_end=_cpu_ns(caller))


def cpu_between(before: Snapshot, after: Snapshot) -> dict[int, int]:
    """CPU nanoseconds of each thread between two snapshots, by thread id.

    A thread that started after ``before`` counts from zero (all its CPU time falls in
    between). A thread that ended before ``after`` is missing: its CPU time since ``before``
    is unknown (the kernel keeps no figure for a thread that is gone), so a bench that wants
    every thread counted keeps its threads alive across the work it measures. The thread
    that took ``before`` counts from the end of that snapshot, the one that took ``after`` up
    to its start: neither snapshot's own reading is counted.
    """
    start = dict(before.ns)
    start[before.caller] = before.caller_end
    return {tid: max(0, ns - start.get(tid, 0)) for tid, ns in after.ns.items()}


class ThreadCpu(NamedTuple):
    """One thread's CPU nanoseconds, with its id and name (:func:`thread_name`)."""

    tid: int
    name: str
    ns: int


def busiest(cpu: dict[int, int]) -> ThreadCpu | None:
    """The thread with the most CPU time in ``cpu`` (:func:`cpu_between`'s figures, or their
    sum over several intervals), named now (so call it while the threads still run);
    ``None`` when ``cpu`` is empty."""
    if not cpu:
        return None
    tid = max(cpu, key=cpu.__getitem__)
    return ThreadCpu(tid, thread_name(tid), cpu[tid])


def thread_name(tid: int) -> str:
    """The name of thread ``tid`` of this process: its Python name (``threading``) for a
    Python thread, else the kernel's (``/proc/self/task/<tid>/comm``, e.g. a C++ library's
    worker), else ``tid <tid>`` for a thread that has ended."""
    for thread in threading.enumerate():
        if thread.native_id == tid:
            return thread.name
    try:
        return (TASKS / str(tid) / "comm").read_text().strip()
    except OSError:
        return f"tid {tid}"
