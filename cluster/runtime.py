"""This process's task runtime: started once by the entry point (or the first strategy).

``start()`` validates the cluster strictly (``cluster._placement``), reads the task's settings
(``cluster.settings``) and starts a :class:`~cluster.task_runtime.TaskRuntime`: the task's
server on the address the cluster spec gives it, its control and collective services. The
strategies then ask for its collective transport::

    rt = cluster.runtime.current() or cluster.runtime.start()
    transport = rt.collective_transport()        # rank 0 = chief (or worker 0), then workers

The runtime is shut down when the interpreter exits (before non-daemon threads are joined).
"""

from __future__ import annotations

import atexit
import threading
from collections.abc import Callable

from cluster import settings as task_settings
from cluster._placement import resolve_placement
from cluster.errors import TaskConfigError
from cluster.settings import TaskSettings
from cluster.task_runtime import TaskRuntime
from cluster.transport.auth import resolve_token
from cluster.transport.server import ServiceHandlers
from resolver import ClusterResolver, TFConfigClusterResolver

__all__ = ["TaskRuntime", "chief_rule", "current", "is_chief", "start"]

_module_lock = threading.Lock()
_current: TaskRuntime | None = None
_atexit_registered = False


def current() -> TaskRuntime | None:
    """The runtime :func:`start` started in this process, if any (and not shut down)."""
    return _current


def chief_rule(cluster_spec: dict, task_type: str | None, task_id: int | None) -> bool:
    """TensorFlow's ``multi_worker_util.is_chief``: the chief (and an evaluator, its own
    chief) is; a cluster without a chief makes worker 0 the chief; no cluster at all, the
    process is its own chief.

    >>> chief_rule({"chief": ["c:1"], "worker": ["w:1"]}, "worker", 0)
    False
    >>> chief_rule({"worker": ["w:1", "w:2"]}, "worker", 0)
    True
    """
    if not cluster_spec or task_type in (None, "chief", "evaluator"):
        return True
    return "chief" not in cluster_spec and task_type == "worker" and task_id == 0


def is_chief(resolver: ClusterResolver | None = None) -> bool:
    """Whether this process is the cluster's chief (:func:`chief_rule`): the task this
    process's runtime runs when one is started, else ``resolver``'s (default: ``TF_CONFIG``'s).

    Cheap and local: reads the cluster spec, talks to nobody. Inside a strategy,
    ``strategy.extended.is_chief`` / ``should_checkpoint`` say the same.
    """
    rt = _current
    if rt is not None:
        spec, task_type, task_id = (rt.placement.cluster_spec.as_dict(),
                                    rt.placement.task_type, rt.placement.task_id)
    else:
        resolver = resolver if resolver is not None else TFConfigClusterResolver()
        spec = resolver.cluster_spec().as_dict()
        task_type, task_id = resolver.task_type, resolver.task_id
    return chief_rule(spec, task_type, task_id)


def start(resolver: ClusterResolver | None = None, *,
          connect_timeout: float | None = None,
          services: ServiceHandlers | None = None,
          settings: TaskSettings | None = None) -> TaskRuntime:
    """Start this process's task runtime, or return it if it already runs the same task.

    ``resolver`` defaults to ``TFConfigClusterResolver()``; ``settings`` to the process's
    settings (:func:`cluster.settings.current`: what the entry point installed, else the
    ``CLUSTER_*`` variables read once);
    ``connect_timeout`` overrides its ``connect_timeout`` (``CLUSTER_CONNECT_TIMEOUT``, default
    60 s) for peers and the collective handshake;
    ``services`` as for :class:`TaskRuntime` (ignored when the runtime already runs).

    Raises:
        TaskConfigError: the cluster or this task's place in it is invalid (the message says
            which field and how to fix it), or this process already runs another task.
        InsecureClusterError: no ``CLUSTER_TOKEN`` for a cluster beyond loopback.
        AddressInUseError: this task's address cannot be bound.
    """
    global _current, _atexit_registered
    resolver = resolver if resolver is not None else TFConfigClusterResolver()
    with _module_lock:
        if _current is not None:
            placement = resolve_placement(resolver)
            if placement.task == _current.task and placement.address == _current.address:
                return _current
            raise TaskConfigError(
                f"this process already runs {_current.task} at {_current.address}; it cannot "
                f"also be {placement.task} at {placement.address}")
        settings = settings or task_settings.current()
        if connect_timeout is not None:
            settings = settings.replace(connect_timeout=connect_timeout)
        placement = resolve_placement(resolver)
        token = resolve_token([a for _, a in placement.tasks()], settings)
        _current = TaskRuntime(placement, resolver, token, settings, services)
        _current.add_close_hook(_forget)
        if not _atexit_registered:
            # Interpreter exit first joins non-daemon threads, including gRPC's handler pool
            # whose heartbeat streams only end when the runtime shuts down: a plain atexit hook
            # would run after that join and never. threading's own exit hooks run before it
            # (newest first), so the runtime is shut down there; atexit stays as the fallback.
            _register_thread_exit(_shutdown_current)
            atexit.register(_shutdown_current)
            _atexit_registered = True
        return _current


def _forget(runtime: TaskRuntime) -> None:
    global _current
    with _module_lock:
        if _current is runtime:
            _current = None


def _register_thread_exit(hook: Callable[[], None]) -> None:
    register = getattr(threading, "_register_atexit", None)
    if register is not None:
        try:
            register(hook)
        except RuntimeError:  # already shutting down: atexit covers it
            pass


def _shutdown_current() -> None:
    runtime = _current
    if runtime is not None:
        runtime.shutdown()
