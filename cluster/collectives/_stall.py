"""Stall warnings: a collective that waits too long says which one it is and whom it waits for.

Like Horovod's stall check. Every collective call of a :class:`CollectiveGroup` is *watched*
(:func:`watch`, one call site in ``CollectiveGroup._collective``): when one has run longer than
the threshold (``CLUSTER_STALL_WARNING``, :attr:`cluster.settings.TaskSettings.stall_warning`,
default 60 s), the task logs a WARNING, once per threshold period while it still waits::

    worker:0 (127.0.0.1:4001): all_reduce #1 (float32[1024]) of group 'default' has waited 60 s
    for worker:1 (127.0.0.1:4002). Did every task call it? ...

Whom it waits for is read only when a warning is due, from the stack of the waiting thread: the
frame of the wait it sits in (a transport's mailbox for a peer's message, or a shared-memory
arena for a co-located peer's progress) names the peer. So a call that does not stall pays
for one clock read and a set insertion and removal (``bench/stall.py``: ~1 µs); one thread per
process (started by the first watched call, a daemon) checks the calls in flight a few times
per threshold period.

With ``CommunicationOptions(timeout_seconds=...)`` the call fails at its deadline instead, with
:class:`~cluster.errors.CollectiveTimeoutError` naming the collective, the peer it waited for
and its input (``... (input float32[1024])``).

A peer that leaves the group cleanly (its script ended: the transport got its goodbye) while
this task waits in a collective makes the call fail with ``PeerUnavailableError: worker:1
finished its script while this task waited in all_reduce #12 (float32[4]): the tasks called
different collectives``, whatever the wait noticed first (a missing message, a dead process).
"""

from __future__ import annotations

import logging
import sys
import threading
import time
from typing import Any

from cluster.collectives.arena import Arena
from cluster.collectives.lanes import LaneThreads
from cluster.errors import CollectiveTimeoutError, PeerUnavailableError
from cluster.timeline import describe
from cluster.transport._mailbox import Mailbox

__all__ = ["DEFAULT_STALL_WARNING", "set_threshold", "threshold", "waiting_for", "watch"]

DEFAULT_STALL_WARNING = 60.0
"""Seconds a collective may wait before its task warns (Horovod's default too)."""

_log = logging.getLogger("cluster.collectives")

_lock = threading.Lock()
_threshold: float = DEFAULT_STALL_WARNING
_resolved = False
_watchdog: threading.Thread | None = None
_active: set[_Watch] = set()  # the calls in flight (set add/discard are atomic under the GIL)
_wake = threading.Event()  # set when the threshold changes: the watchdog re-reads it


def _resolve() -> float:
    """The threshold from the task's settings (its runtime's, else the environment), once."""
    global _threshold, _resolved
    with _lock:
        if not _resolved:
            from cluster import settings as task_settings  # not at import: it imports us

            runtime_module = sys.modules.get("cluster.runtime")
            rt = runtime_module.current() if runtime_module is not None else None
            settings = rt.settings if rt is not None else task_settings.current()
            _threshold = settings.stall_warning
            _resolved = True
        return _threshold


def threshold() -> float:
    """Seconds a collective waits before its task warns."""
    return _threshold if _resolved else _resolve()


def set_threshold(seconds: float) -> float:
    """Use ``seconds`` instead of what the settings say (tests, scripts); returns the old one."""
    global _threshold, _resolved
    if not 0 < seconds < float("inf"):
        raise ValueError(f"stall threshold must be a finite number of seconds > 0, got {seconds!r}")
    with _lock:
        previous = _threshold if _resolved else None
        _threshold, _resolved = seconds, True
    _wake.set()
    return DEFAULT_STALL_WARNING if previous is None else previous


class _Watch:
    """One collective call in flight (the context manager :func:`watch` returns)."""

    __slots__ = ("_call", "_due", "_group", "_start", "_thread", "_transport", "_value")

    def __init__(self, call: Any, group: str, transport: Any, value: Any) -> None:
        self._call, self._group, self._transport, self._value = call, group, transport, value

    def __enter__(self) -> None:
        self._start = time.monotonic()
        self._due = self._start + (_threshold if _resolved else _resolve())
        self._thread = threading.get_ident()
        _active.add(self)
        if _watchdog is None:
            _start_watchdog()

    def __exit__(self, kind: Any, error: BaseException | None, tb: Any) -> None:
        _active.discard(self)
        if isinstance(error, PeerUnavailableError) and error.task \
                and _departed(self._transport, error.task):
            what = describe(self._value)
            name = f"{self._call.kind} #{self._call.seq}" + (f" ({what})" if what else "")
            raise PeerUnavailableError(
                f"{error.task} finished its script while this task waited in {name}: the "
                f"tasks called different collectives (it left the group without calling this "
                f"one; {error})", task=error.task, address=error.address) from error
        if (isinstance(error, CollectiveTimeoutError) and self._value is not None
                and "(input " not in str(error)):  # an inner call (the leaders) said it
            raise CollectiveTimeoutError(f"{error} (input {describe(self._value)})") from error

    def report(self, now: float) -> str:
        """The warning: who, which collective, for how long, waiting for whom."""
        t = self._transport
        what = describe(self._value)
        name = f"{self._call.kind} #{self._call.seq}" + (f" ({what})" if what else "")
        peer = waiting_for(self._thread) or "a peer (not known: not in a transport wait now)"
        return (
            f"{t.peers[t.rank]}: {name} of group {self._group!r} has waited "
            f"{now - self._start:.1f} s for {peer}. Did every task call it? Tasks that call "
            "different collectives, or one that skipped this one, wait here for ever; "
            "CommunicationOptions(timeout_seconds=...) makes the call fail instead "
            "(this warning: CLUSTER_STALL_WARNING seconds)"
        )


def watch(call: Any, group: str, transport: Any, value: Any = None) -> _Watch:
    """``with watch(call, group, transport, value):`` around one collective call (``call.kind``,
    ``call.seq``) of ``group`` on ``value`` (named by its dtype and shape in the warning)."""
    return _Watch(call, group, transport, value)


def waiting_for(thread: int) -> str | None:
    """The peer the thread ``thread`` waits for now, from the frame of the wait it sits in
    (a mailbox's ``get`` or an arena's ``wait``; while it waits for a ring's lanes, the first
    of its lane threads' answers); ``None`` if it sits in none.

    Reads another thread's frame locals: only when a warning is due, never on the fast path.
    """
    frame = sys._current_frames().get(thread)
    while frame is not None:
        code = frame.f_code
        try:
            if code is Arena.wait.__code__:
                local = frame.f_locals
                return str(local["self"].peers[local["local_rank"]])
            if code is Mailbox.get.__code__:
                local = frame.f_locals
                return local["self"].describe_peer(local["src"])
            if code is LaneThreads.run.__code__:
                lanes = (waiting_for(i) for i in frame.f_locals["idents"] if i is not None)
                return next((peer for peer in lanes if peer is not None), None)
        except (KeyError, IndexError, AttributeError):  # the frame is mid-way: no answer
            return None
        frame = frame.f_back
    return None


def _departed(transport: Any, task: str) -> bool:
    """Whether ``task`` left ``transport``'s group cleanly (a goodbye, not a loss): asked of
    the transport, or of the one a subset transport is cut from; ``False`` where none says."""
    for _ in range(4):  # a subset of a subset at most: no loop on a strange chain
        departed = getattr(transport, "departed", None)
        if callable(departed):
            return bool(departed(task))
        transport = getattr(transport, "_parent", None)
        if transport is None:
            return False
    return False


def _start_watchdog() -> None:
    global _watchdog
    with _lock:
        if _watchdog is None:
            _watchdog = threading.Thread(target=_run, name="cluster-stall-watchdog", daemon=True)
            _watchdog.start()


def _run() -> None:
    """The watchdog: a few checks per threshold period (at most every 5 s), for ever."""
    while True:
        period = min(max(threshold() / 4, 0.05), 5.0)
        _wake.wait(period)
        _wake.clear()
        now = time.monotonic()
        try:
            active = list(_active)
        except RuntimeError:  # the set changed while being copied: next round
            continue
        for w in active:
            if now >= w._due and w in _active:
                w._due = now + threshold()
                try:
                    _log.warning(w.report(now))
                except Exception:  # a diagnostic must never take the process down
                    _log.exception("stall check failed")
