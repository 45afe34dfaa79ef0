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
from json.encoder import encode_basestring_ascii as _encode_string
from typing import Any

from cluster.timeline._files import LineStream

__all__ = ["Recorder", "describe", "payload_bytes"]


_DTYPE_NAMES: dict[Any, str] = {}


def describe(value: Any) -> str:
    """``"float32[1024]"``: a collective's input as the trace names it (a list, as
    ``all_reduce_many`` takes: ``"12 tensors"``; ``None``: ``""``)."""
    if value is None:
        return ""
    if isinstance(value, list | tuple):
        return f"{len(value)} tensors"
    shape, dtype = getattr(value, "shape", None), getattr(value, "dtype", None)
    if shape is not None and dtype is not None:
        name = _DTYPE_NAMES.get(dtype)
        if name is None:  # str(dtype) costs a microsecond: once per dtype
            name = _DTYPE_NAMES[dtype] = str(dtype)
        return f"{name}[{','.join(map(str, shape))}]"
    return type(value).__name__


def payload_bytes(value: Any) -> int:
    """The bytes of a collective's input (a list: their sum; a Python scalar: 8)."""
    if value is None:
        return 0
    if isinstance(value, list | tuple):
        return sum(payload_bytes(v) for v in value)
    nbytes = getattr(value, "nbytes", None)
    return int(nbytes) if nbytes is not None else 8


def _quote(text: str) -> str:
    return _encode_string(text)


def _number(value: float | None, digits: int = 6) -> str:
    return "null" if value is None else f"{value:.{digits}f}"


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
        samples = step.samples
        per = interval or duration
        rate = samples / per if samples is not None and per > 0 else None
        if self._trace is not None:
            args = f'"collective_ms":{step.collective_time * 1e3:.3f},"bytes":{step.bytes}'
            if samples is not None:
                args += f',"samples":{samples}'
            if error is not None:
                args += f',"error":{_quote(type(error).__name__)}'
            self._event(f'"step {step.number}"', "step", step.start, duration, args)
        # Formatted by hand: json.dumps of a dict costs several times more, once per step.
        line = (f'{{"step":{step.number},"start":{step.start + self._offset:.6f},'
                f'"time":{duration:.6f},"interval":{_number(interval)},'
                f'"collective_time":{step.collective_time:.6f},"collectives":{step.collectives},'
                f'"bytes":{step.bytes},"samples":{"null" if samples is None else samples},'
                f'"samples_per_s":{_number(rate, 3)}}}\n')
        if self._steps is not None:
            self._steps.add(line)

    def phase(self, name: str, start: float, args: dict[str, Any] | None = None) -> None:
        """A finished phase (``run``, ``data``, ...) that began at ``start`` (perf_counter)."""
        if self._trace is not None:
            extra = json.dumps(args, separators=(",", ":"))[1:-1] if args else ""
            self._event(_quote(name), "phase", start, time.perf_counter() - start, extra)

    def collective_started(self) -> int:
        """Returns the nesting depth of the collective that starts (0: the outermost)."""
        depth = getattr(self._local, "depth", 0)
        self._local.depth = depth + 1
        return depth

    def collective_ended(self, kind: str, seq: int, group: str, value: Any, start: float,
                         depth: int, error: BaseException | None) -> None:
        duration = time.perf_counter() - start
        self._local.depth = depth
        nbytes = payload_bytes(value)
        step = getattr(self._local, "step", None)
        if step is not None and depth == 0:  # inner calls (the hosts' leaders) are inside it
            step.collective_time += duration
            step.collectives += 1
            step.bytes += nbytes
        if self._trace is None:
            return
        what = describe(value)
        name = f"{kind} #{seq} ({what})" if what else f"{kind} #{seq}"
        args = f'"group":{_quote(group)},"bytes":{nbytes}'
        if error is not None:
            args += f',"error":{_quote(f"{type(error).__name__}: {error}"[:300])}'
        self._event(_quote(name), "collective", start, duration, args)

    # -- output ----------------------------------------------------------------------------------

    def _meta(self, name: str, args: dict[str, Any], tid: int = 0) -> str:
        return json.dumps({"name": name, "ph": "M", "pid": self._pid, "tid": tid, "args": args},
                          separators=(",", ":"))

    def _event(self, quoted_name: str, cat: str, start: float, duration: float,
               args: str) -> None:
        """One complete ("X") event; ``args``: the inside of its JSON ``args`` object."""
        assert self._trace is not None
        tid = threading.get_native_id()
        if tid not in self._threads:
            self._threads.add(tid)
            self._trace.add(self._meta("thread_name", {"name": threading.current_thread().name},
                                       tid) + ",\n")
        self._trace.add(
            f'{{"name":{quoted_name},"cat":"{cat}","ph":"X","pid":{self._pid},"tid":{tid},'
            f'"ts":{(start + self._offset) * 1e6:.1f},"dur":{duration * 1e6:.1f},'
            f'"args":{{{args}}}}},\n')

    def flush(self) -> None:
        for stream in (self._trace, self._steps):
            if stream is not None:
                stream.flush()

    def close(self) -> None:
        """Write everything and close the files (the trace becomes complete JSON)."""
        for stream in (self._trace, self._steps):
            if stream is not None:
                stream.close()
