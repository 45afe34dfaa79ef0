"""``cluster.timeline``: per-step records and a Chrome trace of every step and collective.

Off unless a task is told where to write (``clusterctl launch`` always asks for step records,
and for a trace with ``timeline: true`` or ``CLUSTER_TIMELINE``):

- ``CLUSTER_STEPS=FILE``: one JSON line per step (:func:`~cluster.timeline.load_steps`): step
  number, start (Unix time), ``time`` (the step's own seconds), ``interval`` (seconds since the
  previous step began), ``collective_time``, ``collectives``, ``bytes`` (the collectives'
  payload: what the caller reduced, gathered or broadcast, not what the algorithm sent),
  ``samples`` and ``samples_per_s`` (per ``interval``, else ``time``);
- ``CLUSTER_TIMELINE=FILE``: a Chrome trace (Perfetto, ``chrome://tracing``) with one track
  per thread: ``step 12`` spans and, nested in them, phases (``run``) and collectives
  (``all_reduce #118 (float32[1024])``, with the group and bytes as arguments).

A step is each ``strategy.run`` call, or, when the script marks its own steps, each
``with cluster.timeline.step(samples=64):`` block (a ``strategy.run`` inside it is then a phase
``run``). Samples of an automatic step are the leading dimension of the first array among
``strategy.run``'s arguments (summed over local replicas); pass ``samples`` to be exact.

The settings are read once, at the first step or collective of the process
(:class:`~cluster.settings.TaskSettings`, the task's runtime's when it has one); the recorder
is closed at exit. Cost: when off, one global read per step and per collective; when on, see
``bench/timeline.py`` (docs/guide/watching.md).
"""

from __future__ import annotations

import atexit
import sys
import threading
import time
from collections.abc import Sequence
from typing import Any

from cluster.timeline._files import load_steps, load_trace, merge_traces
from cluster.timeline._recorder import Recorder, describe

__all__ = ["Recorder", "collective", "describe", "install", "load_steps", "load_trace",
           "merge_traces", "phase", "recorder", "run_step", "step"]

_recorder: Recorder | None = None
_resolved = False
_lock = threading.Lock()


class _Off:
    """The span of everything while the timeline is off: nothing to do (one shared object)."""

    __slots__ = ()

    def __enter__(self) -> None:
        return None

    def __exit__(self, *exc: object) -> None:
        return None


_OFF = _Off()


def _resolve() -> Recorder | None:
    """The process's recorder, made from its settings on first use."""
    global _recorder, _resolved
    with _lock:
        if _resolved:
            return _recorder
        from cluster import settings as task_settings  # not at import: it imports collectives

        runtime_module = sys.modules.get("cluster.runtime")  # loaded whenever a runtime runs
        rt = runtime_module.current() if runtime_module is not None else None
        settings = rt.settings if rt is not None else task_settings.current()
        if settings.timeline or settings.steps_file:
            _recorder = Recorder(rt.task if rt is not None else "local",
                                 trace=settings.timeline, steps=settings.steps_file)
            atexit.register(_recorder.close)
        _resolved = True
        return _recorder


def recorder() -> Recorder | None:
    """This process's recorder, or ``None`` when the timeline is off."""
    return _recorder if _resolved else _resolve()


def install(new: Recorder | None) -> Recorder | None:
    """Make ``new`` this process's recorder instead of what the settings say (tests, or a
    script that wants its own files); ``None`` turns the timeline off. Returns the previous
    one, which the caller closes if it is done with it."""
    global _recorder, _resolved
    with _lock:
        previous, _recorder, _resolved = _recorder, new, True
    return previous


# -- spans ---------------------------------------------------------------------------------------

class _CollectiveSpan:
    __slots__ = ("_call", "_depth", "_group", "_rec", "_start", "_value")

    def __init__(self, rec: Recorder, call: Any, group: str, value: Any) -> None:
        self._rec, self._call, self._group, self._value = rec, call, group, value

    def __enter__(self) -> None:
        self._depth = self._rec.collective_started()
        self._start = time.perf_counter()

    def __exit__(self, kind: Any, error: BaseException | None, tb: Any) -> None:
        call = self._call
        self._rec.collective_ended(call.kind, call.seq, self._group, self._value, self._start,
                                   self._depth, error)


def collective(call: Any, group: str, value: Any = None) -> Any:
    """The span of one collective call (``call.kind``, ``call.seq``) of ``group`` on ``value``
    (an array, a list of them, or ``None``): the hook of ``CollectiveGroup``."""
    rec = _recorder if _resolved else _resolve()
    return _OFF if rec is None else _CollectiveSpan(rec, call, group, value)


class _StepSpan:
    __slots__ = ("_rec", "_samples", "_step")

    def __init__(self, rec: Recorder, samples: int | None) -> None:
        self._rec, self._samples = rec, samples

    def __enter__(self) -> None:
        self._step = self._rec.begin_step(self._samples)

    def __exit__(self, kind: Any, error: BaseException | None, tb: Any) -> None:
        self._rec.end_step(self._step, error)


class _PhaseSpan:
    __slots__ = ("_args", "_name", "_rec", "_start")

    def __init__(self, rec: Recorder, name: str, args: dict[str, Any] | None = None) -> None:
        self._rec, self._name, self._args = rec, name, args

    def __enter__(self) -> None:
        self._start = time.perf_counter()

    def __exit__(self, *exc: object) -> None:
        self._rec.phase(self._name, self._start, self._args)


def step(samples: int | None = None) -> Any:
    """``with cluster.timeline.step(samples=64): ...``: one training step of this task, with
    the ``samples`` it processed (for samples/s). Steps do not nest; a ``strategy.run`` inside
    is a phase of it. Does nothing while the timeline is off."""
    if samples is not None and (isinstance(samples, bool) or not isinstance(samples, int)
                                or samples < 0):
        raise ValueError(f"cluster.timeline.step: samples must be an int >= 0, got {samples!r}")
    rec = _recorder if _resolved else _resolve()
    if rec is None:
        return _OFF
    if rec.in_step():
        raise RuntimeError("cluster.timeline.step: a step is already open on this thread; "
                           "steps do not nest (use cluster.timeline.phase inside one)")
    return _StepSpan(rec, samples)


def phase(name: str) -> Any:
    """``with cluster.timeline.phase("data"): ...``: a named span on this thread's track
    (inside a step or not). Does nothing while the timeline is off."""
    rec = _recorder if _resolved else _resolve()
    return _OFF if rec is None else _PhaseSpan(rec, str(name))


def run_step(args: Sequence[Any]) -> Any:
    """The span of one ``strategy.run(fn, args)``: a step of its own, or the phase ``run`` of
    the step the script opened. The hook of ``Strategy.run``."""
    rec = _recorder if _resolved else _resolve()
    if rec is None:
        return _OFF
    if rec.in_step():
        return _PhaseSpan(rec, "run")
    return _StepSpan(rec, _samples_of(args))


def _samples_of(args: Sequence[Any]) -> int | None:
    """The leading dimension of the first array-like argument, summed over its local
    components (a ``PerReplica``'s ``values``); ``None`` when no argument has one."""
    for arg in args:
        shape = getattr(arg, "shape", None)
        if shape:  # an array of rank >= 1 (the common case, checked first: once per step)
            return int(shape[0])
        parts = getattr(arg, "values", None)
        if isinstance(parts, tuple | list) and parts:
            total = 0
            for part in parts:
                shape = getattr(part, "shape", None)
                if not shape:
                    break
                total += shape[0]
            else:
                return int(total)
    return None
