"""The recorder: spans of steps, phases and collectives, turned into trace events and step records.

A :class:`Recorder` belongs to one task (one process) and writes two optional streams
(:mod:`cluster.timeline._files`): the Chrome trace and the step records. Its state per thread
(the open step, how deep in collectives) is thread-local, so in-process tests that run several
ranks in threads record each rank's steps apart.

Times: durations come from ``time.perf_counter``; trace timestamps are that clock shifted to
wall-clock microseconds (taken once per recorder), so the tracks of the tasks of one host line up
in a merged trace, and within a task they never run backwards.
"""

from __future__ import annotations

import json
import os
import threading
import time
from typing import Any

from cluster.timeline._files import LineStream

__all__ = ["Recorder", "describe"]


def describe(value: Any) -> tuple[str, int]:
    """``("float32[1024]", 4096)``: a collective's input as the trace names it, and its bytes
    (a list, as ``all_reduce_many`` takes: ``"12 tensors"`` and the sum; ``None``: ``("", 0)``)."""
    if value is None:
        return "", 0
    if isinstance(value, list | tuple):
        return f"{len(value)} tensors", sum(describe(v)[1] for v in value)
    shape, dtype = getattr(value, "shape", None), getattr(value, "dtype", None)
    if shape is not None and dtype is not None:
        return f"{dtype}[{','.join(str(d) for d in shape)}]", int(getattr(value, "nbytes", 0))
    return type(value).__name__, 8


class _Step:
    __slots__ = ("bytes", "collective_time", "collectives", "number", "samples", "start")

    def __init__(self, number: int, start: float, samples: int | None) -> None:
        self.number, self.start, self.samples = number, start, samples
        self.collective_time = 0.0
        self.collectives = 0
        self.bytes = 0


class Recorder:
    """Records one task's steps and collectives.

    ``trace``: the Chrome trace file to write (or ``None``); ``steps``: the step-record file
    (or ``None``); ``task``: the name of the task's process track (``worker:1``). Call
    :meth:`close` at exit (``cluster.timeline`` does it for the recorder it installs).
    """

    def __init__(self, task: str, *, trace: str | os.PathLike[str] | None = None,
                 steps: str | os.PathLike[str] | None = None) -> None:
        self.task = task
        self._pid = os.getpid()
        self._offset = time.time() - time.perf_counter()
        self._local = threading.local()
        self._threads: set[int] = set()
        name = self._meta("process_name", {"name": task})
        self._trace = None if trace is None else LineStream(trace, head="[\n" + name + ",\n",
                                                           tail=name + "]\n")
        header = json.dumps({"task": task, "pid": self._pid, "start": round(time.time(), 6)})
        self._steps = None if steps is None else LineStream(steps, head=header + "\n")
        self.last_step: dict[str, Any] | None = None

    # -- spans (called by the hooks in cluster.timeline) -----------------------------------------

    def in_step(self) -> bool:
        return getattr(self._local, "step", None) is not None

    def begin_step(self, samples: int | None) -> _Step:
        number = getattr(self._local, "steps", 0) + 1  # per thread: in-process ranks count apart
        self._local.steps = number
        step = _Step(number, time.perf_counter(), samples)
        self._local.step = step
        return step

    def end_step(self, step: _Step, error: BaseException | None) -> None:
        end = time.perf_counter()
        self._local.step = None
        duration = end - step.start
        previous = getattr(self._local, "previous_start", None)
        self._local.previous_start = step.start
        interval = None if previous is None else step.start - previous
        args: dict[str, Any] = {"collective_ms": round(step.collective_time * 1e3, 3),
                                "bytes": step.bytes}
        if step.samples is not None:
            args["samples"] = step.samples
        if error is not None:
            args["error"] = type(error).__name__
        self._event(f"step {step.number}", "step", step.start, duration, args)
        record: dict[str, Any] = {
            "step": step.number, "start": round(step.start + self._offset, 6),
            "time": round(duration, 6),
            "interval": None if interval is None else round(interval, 6),
            "collective_time": round(step.collective_time, 6),
            "collectives": step.collectives, "bytes": step.bytes, "samples": step.samples,
        }
        per = interval or duration
        record["samples_per_s"] = (round(step.samples / per, 3)
                                   if step.samples is not None and per > 0 else None)
        self.last_step = record
        if self._steps is not None:
            self._steps.add(json.dumps(record, separators=(",", ":")) + "\n")

    def phase(self, name: str, start: float, args: dict[str, Any] | None = None) -> None:
        """A finished phase (``run``, ``data``, ...) that began at ``start`` (perf_counter)."""
        self._event(name, "phase", start, time.perf_counter() - start, args)

    def collective_started(self) -> int:
        """Returns the nesting depth of the collective that starts (0: the outermost)."""
        depth = getattr(self._local, "depth", 0)
        self._local.depth = depth + 1
        return depth

    def collective_ended(self, kind: str, seq: int, group: str, value: Any, start: float,
                         depth: int, error: BaseException | None) -> None:
        duration = time.perf_counter() - start
        self._local.depth = depth
        what, nbytes = describe(value)
        step = getattr(self._local, "step", None)
        if step is not None and depth == 0:  # inner calls (the hosts' leaders) are inside it
            step.collective_time += duration
            step.collectives += 1
            step.bytes += nbytes
        if self._trace is None:
            return
        args: dict[str, Any] = {"group": group, "bytes": nbytes}
        if error is not None:
            args["error"] = f"{type(error).__name__}: {error}"[:300]
        self._event(f"{kind} #{seq} ({what})" if what else f"{kind} #{seq}", "collective",
                    start, duration, args)

    # -- output ----------------------------------------------------------------------------------

    def _meta(self, name: str, args: dict[str, Any], tid: int = 0) -> str:
        return json.dumps({"name": name, "ph": "M", "pid": self._pid, "tid": tid, "args": args},
                          separators=(",", ":"))

    def _event(self, name: str, cat: str, start: float, duration: float,
               args: dict[str, Any] | None) -> None:
        if self._trace is None:
            return
        tid = threading.get_native_id()
        if tid not in self._threads:
            self._threads.add(tid)
            self._trace.add(self._meta("thread_name", {"name": threading.current_thread().name},
                                       tid) + ",\n")
        event = {"name": name, "cat": cat, "ph": "X", "pid": self._pid, "tid": tid,
                 "ts": round((start + self._offset) * 1e6, 1), "dur": round(duration * 1e6, 1)}
        if args:
            event["args"] = args
        self._trace.add(json.dumps(event, separators=(",", ":")) + ",\n")

    def flush(self) -> None:
        for stream in (self._trace, self._steps):
            if stream is not None:
                stream.flush()

    def close(self) -> None:
        """Write everything and close the files (the trace becomes complete JSON)."""
        for stream in (self._trace, self._steps):
            if stream is not None:
                stream.close()
