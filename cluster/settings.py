"""Every ``CLUSTER_*`` setting of a task, read from the environment once, at the edge.

The process entry points (``python -m worker``, ``python -m ps`` through
:func:`cluster.lifecycle.start_runtime`, the processes :mod:`cluster.testing` spawns) call
:meth:`TaskSettings.from_env` once at start and :func:`install` the result as the process's
settings; everything below them receives the frozen result (or the part it needs) as an
argument, or asks :func:`current`, and never reads ``os.environ`` itself
(``tests/test_layers.py`` checks this). Bad values raise :class:`~cluster.errors.TaskConfigError`
naming the variable, the value and what would be accepted::

    settings = TaskSettings.from_env()                 # os.environ
    settings = TaskSettings.from_env({"CLUSTER_DATA_PLANE": "grpc"})
    settings = TaskSettings(connect_timeout=5.0)       # tests: no environment at all

docs/guide/environment.md's table lists the same variables; ``ENV_VARS`` is the list.
"""

from __future__ import annotations

import dataclasses
import os
import threading
from collections.abc import Mapping
from dataclasses import dataclass, field

from cluster.collectives.options import CollectiveSettings
from cluster.errors import TaskConfigError

__all__ = [
    "DATA_PLANES",
    "DEVICE_MODES",
    "ENV_ALLOW_INSECURE",
    "ENV_STOP_WITH_COORDINATOR",
    "ENV_CONNECT_TIMEOUT",
    "ENV_DATA_PLANE",
    "ENV_DEVICES",
    "ENV_ELASTIC",
    "ENV_COORDINATION_SERVICE",
    "ENV_ERROR_FILE",
    "ENV_FUNCTION_TIMEOUT",
    "ENV_GRACE_PERIOD",
    "ENV_HEARTBEAT_INTERVAL",
    "ENV_HEARTBEAT_TIMEOUT",
    "ENV_LAUNCHER_PID",
    "ENV_RESTART_COUNT",
    "ENV_TLS_CA",
    "ENV_TLS_CERT",
    "ENV_TLS_KEY",
    "ENV_STALL_TIMEOUT",
    "ENV_STALL_WARNING",
    "ENV_STEPS",
    "ENV_TIMELINE",
    "ENV_TOKEN",
    "ENV_VARS",
    "TaskSettings",
    "current",
    "install",
    "parse_elastic",
    "parse_seconds",
]

ENV_CONNECT_TIMEOUT = "CLUSTER_CONNECT_TIMEOUT"
ENV_HEARTBEAT_INTERVAL = "CLUSTER_HEARTBEAT_INTERVAL"
ENV_HEARTBEAT_TIMEOUT = "CLUSTER_HEARTBEAT_TIMEOUT"
ENV_STALL_TIMEOUT = "CLUSTER_STALL_TIMEOUT"
ENV_FUNCTION_TIMEOUT = "CLUSTER_FUNCTION_TIMEOUT"
ENV_DATA_PLANE = "CLUSTER_DATA_PLANE"
ENV_TOKEN = "CLUSTER_TOKEN"
ENV_ALLOW_INSECURE = "CLUSTER_ALLOW_INSECURE"
ENV_STOP_WITH_COORDINATOR = "CLUSTER_STOP_WITH_COORDINATOR"
ENV_LAUNCHER_PID = "CLUSTER_LAUNCHER_PID"
ENV_ERROR_FILE = "CLUSTER_ERROR_FILE"
ENV_RESTART_COUNT = "CLUSTER_RESTART_COUNT"
ENV_GRACE_PERIOD = "CLUSTER_GRACE_PERIOD"
ENV_TLS_CERT = "CLUSTER_TLS_CERT"
ENV_TLS_KEY = "CLUSTER_TLS_KEY"
ENV_TLS_CA = "CLUSTER_TLS_CA"
_TLS_VARS = (ENV_TLS_CERT, ENV_TLS_KEY, ENV_TLS_CA)
ENV_TIMELINE = "CLUSTER_TIMELINE"  # cluster.timeline: this task's Chrome trace
ENV_STEPS = "CLUSTER_STEPS"  # cluster.timeline: this task's step records
ENV_STALL_WARNING = "CLUSTER_STALL_WARNING"  # cluster.collectives._stall
ENV_DEVICES = "CLUSTER_DEVICES"  # cluster.strategies._devices.choose_task_device
ENV_ELASTIC = "CLUSTER_ELASTIC"  # MIN:MAX: cluster.elastic; set by clusterctl --elastic
# host:port of the coordination service in its own process (python -m coordination_service)
ENV_COORDINATION_SERVICE = "CLUSTER_COORDINATION_SERVICE"
ENV_CUDA_VISIBLE = "CUDA_VISIBLE_DEVICES"  # read for the device choice's log line only

DATA_PLANES = ("tcp", "grpc")
DEVICE_MODES = ("cpu", "gpu")

# Seconds-valued settings: (field, variable).
_SECONDS = (
    ("connect_timeout", ENV_CONNECT_TIMEOUT),
    ("heartbeat_interval", ENV_HEARTBEAT_INTERVAL),
    ("heartbeat_timeout", ENV_HEARTBEAT_TIMEOUT),
    ("stall_timeout", ENV_STALL_TIMEOUT),
    ("function_timeout", ENV_FUNCTION_TIMEOUT),
    ("stall_warning", ENV_STALL_WARNING),
)


def parse_seconds(name: str, text: str) -> float:
    """``text`` as a finite number of seconds > 0; :class:`TaskConfigError` naming ``name``
    otherwise (``inf`` is refused: an infinite heartbeat timeout would switch off failure
    detection, an infinite connect timeout would wait forever for a peer that never comes)."""
    try:
        value = float(text)
    except ValueError:
        value = float("nan")
    if not 0 < value < float("inf"):  # also rejects nan
        raise TaskConfigError(f"{name}: expected a finite number of seconds > 0, got {text!r}")
    return value


def parse_elastic(text: str) -> tuple[int, int]:
    """``CLUSTER_ELASTIC``'s ``MIN:MAX`` (1 <= MIN <= MAX); :class:`TaskConfigError` naming the
    variable and the fix otherwise."""
    low, sep, high = text.partition(":")
    if sep and low.strip().isdigit() and high.strip().isdigit():
        bounds = int(low), int(high)
        if 1 <= bounds[0] <= bounds[1]:
            return bounds
    raise TaskConfigError(f"{ENV_ELASTIC}={text!r}: expected MIN:MAX with 1 <= MIN <= MAX "
                          "(the bounds of the elastic group's size, e.g. 2:4)")


def _parse_grace(text: str) -> float:
    """``CLUSTER_GRACE_PERIOD``: seconds >= 0 (0 is a grace period too: SIGKILL at once)."""
    try:
        value = float(text)
    except ValueError:
        value = float("nan")
    if not 0 <= value < float("inf"):  # also rejects nan
        raise TaskConfigError(f"{ENV_GRACE_PERIOD}: expected a number of seconds >= 0, "
                              f"got {text!r}")
    return value


@dataclass(frozen=True)
class TaskSettings:
    """The settings of one task; defaults are what a task gets with no ``CLUSTER_*`` variable.

    Timeouts (seconds): ``connect_timeout`` bounds waiting for peers (health checks, the
    collective handshake); a peer silent for ``heartbeat_timeout`` (heartbeats are sent every
    ``heartbeat_interval``) is lost when its address does not answer a TCP connect either (it
    died, or it is cut off), and otherwise reported as stalled (alive but busy: a long call
    holding the GIL, a stop) and lost only once it has been silent for ``stall_timeout``
    (at least ``heartbeat_timeout``); everything a stopping task still sends (failure reports,
    aborts, goodbyes) shares one deadline of ``report_timeout``, so an unreachable peer delays
    its exit by at most that; a function a :class:`~cluster.coordinator.ClusterCoordinator` runs
    on a worker may take ``function_timeout``; a collective that has waited ``stall_warning``
    makes its task log which collective it is in and whom it waits for, once per that period
    (:mod:`cluster.collectives._stall`).

    The heartbeat defaults (0.5 s / 3 s, and 0.5 s for the probe of a silent peer's address) make
    a silent partition stop every task within about 4 s, while a task busy for a minute (an
    import, a long C call) is only reported as stalled; docs/guide/across-hosts.md has the
    figures and the trade-off.

    Others: ``data_plane`` carries collective tensors (``tcp`` or ``grpc``); ``collectives``
    forces the collective path or algorithm; ``token`` is ``CLUSTER_TOKEN`` (never shown by
    ``repr``), ``allow_insecure`` is ``CLUSTER_ALLOW_INSECURE=1``; ``launcher_pid`` is the
    launcher a task stops with; ``error_file`` is where a failed task leaves its error record;
    ``restart_count`` is the attempt number the launcher gives (0 on the first);
    ``grace_period`` is the launcher's time from SIGTERM to SIGKILL (``timeouts.grace``; ``None``
    when no launcher said), which a preemption save must fit in;
    ``devices`` (``CLUSTER_DEVICES``: ``cpu`` or ``gpu``) is where
    ``MultiWorkerMirroredStrategy()`` without devices puts the task's replica: ``cpu`` (NumPy in,
    NumPy out, even where CuPy sees GPUs) or ``gpu`` (the GPU of the task's local rank,
    :func:`cluster.strategies._devices.choose_task_device`); ``cuda_visible_devices`` is
    ``CUDA_VISIBLE_DEVICES`` as given (``None`` when unset), which that choice names in its log
    line (CuPy numbers only the GPUs it leaves);
    ``tls_files`` is ``(cert, key, ca)``, the paths of ``CLUSTER_TLS_CERT``/``_KEY``/``_CA``
    (all three or none; :class:`cluster.transport.tls.TlsConfig` reads the files);
    ``stop_with_coordinator`` (``CLUSTER_STOP_WITH_COORDINATOR=1``) makes a task that only
    serves (a parameter server, a worker of ``mode: coordinator``) exit 0 once the coordinator's
    task (the chief) has finished cleanly, for launchers that do not stop servers themselves
    (Kubernetes Jobs); ``clusterctl`` stops them and leaves it off.
    """

    connect_timeout: float = 60.0
    heartbeat_interval: float = 0.5
    heartbeat_timeout: float = 3.0
    stall_timeout: float = 60.0
    report_timeout: float = 0.5
    function_timeout: float = 3600.0
    stall_warning: float = 60.0
    data_plane: str = "tcp"
    collectives: CollectiveSettings = field(default_factory=CollectiveSettings)
    token: str | None = field(default=None, repr=False)
    allow_insecure: bool = False
    stop_with_coordinator: bool = False
    launcher_pid: int | None = None
    error_file: str | None = None
    restart_count: int = 0
    grace_period: float | None = None
    tls_files: tuple[str, str, str] | None = None
    timeline: str | None = None  # CLUSTER_TIMELINE, CLUSTER_STEPS: see cluster.timeline
    steps_file: str | None = None
    devices: str = "cpu"
    cuda_visible_devices: str | None = None
    elastic: tuple[int, int] | None = None  # CLUSTER_ELASTIC: (min, max) replicas
    coordination_service: str | None = None  # CLUSTER_COORDINATION_SERVICE: its host:port

    def __post_init__(self) -> None:
        for name in ("connect_timeout", "heartbeat_interval", "heartbeat_timeout",
                     "stall_timeout", "report_timeout", "function_timeout", "stall_warning"):
            if not 0 < getattr(self, name) < float("inf"):
                raise ValueError(f"{name} must be a finite number of seconds > 0, got "
                                 f"{getattr(self, name)!r}")
        if self.grace_period is not None and not self.grace_period >= 0:
            raise ValueError(f"grace_period must be >= 0 seconds, got {self.grace_period!r}")
        if self.data_plane not in DATA_PLANES:
            raise ValueError(f"data_plane must be one of {', '.join(DATA_PLANES)}, "
                             f"got {self.data_plane!r}")
        if self.devices not in DEVICE_MODES:
            raise ValueError(f"devices must be one of {', '.join(DEVICE_MODES)}, "
                             f"got {self.devices!r}")

    def replace(self, **changes) -> TaskSettings:
        """A copy with ``changes`` applied (validated again)."""
        return dataclasses.replace(self, **changes)

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None) -> TaskSettings:
        """The defaults overridden by the ``CLUSTER_*`` variables of ``environ`` (default
        ``os.environ``). Unset or empty variables keep their default.

        Raises:
            TaskConfigError: a variable has a bad value; the message names it and the fix.
        """
        env = os.environ if environ is None else environ
        values: dict[str, object] = {}
        for name, var in _SECONDS:
            text = env.get(var, "").strip()
            if text:
                values[name] = parse_seconds(var, text)
        plane = env.get(ENV_DATA_PLANE, "").strip().lower()
        if plane:
            if plane not in DATA_PLANES:
                raise TaskConfigError(f"{ENV_DATA_PLANE}={plane!r} is not one of: "
                                      f"{', '.join(DATA_PLANES)}")
            values["data_plane"] = plane
        try:
            values["collectives"] = CollectiveSettings.from_env(env)
        except ValueError as e:
            raise TaskConfigError(str(e)) from None
        values["token"] = env.get(ENV_TOKEN) or None
        insecure = env.get(ENV_ALLOW_INSECURE, "").strip()
        if insecure not in ("", "0", "1"):
            raise TaskConfigError(f"{ENV_ALLOW_INSECURE}={insecure!r}: expected 1 (run without "
                                  "authentication) or 0/unset")
        values["allow_insecure"] = insecure == "1"
        stop = env.get(ENV_STOP_WITH_COORDINATOR, "").strip()
        if stop not in ("", "0", "1"):
            raise TaskConfigError(f"{ENV_STOP_WITH_COORDINATOR}={stop!r}: expected 1 (servers "
                                  "exit when the chief has finished) or 0/unset")
        values["stop_with_coordinator"] = stop == "1"
        pid = env.get(ENV_LAUNCHER_PID, "").strip()
        values["launcher_pid"] = int(pid) if pid.isdigit() else None
        values["error_file"] = env.get(ENV_ERROR_FILE) or None
        count = env.get(ENV_RESTART_COUNT, "").strip()
        values["restart_count"] = int(count) if count.isdigit() else 0
        grace = env.get(ENV_GRACE_PERIOD, "").strip()
        if grace:
            values["grace_period"] = _parse_grace(grace)
        tls = tuple(env.get(var, "").strip() for var in _TLS_VARS)
        if any(tls) and not all(tls):
            missing = ", ".join(v for v, path in zip(_TLS_VARS, tls, strict=True) if not path)
            raise TaskConfigError(f"TLS needs all of {', '.join(_TLS_VARS)}; {missing} unset "
                                  "(`clusterctl certs DIR FILE` makes the files)")
        values["tls_files"] = tls if all(tls) else None
        values["timeline"] = env.get(ENV_TIMELINE) or None
        values["steps_file"] = env.get(ENV_STEPS) or None
        devices = env.get(ENV_DEVICES, "").strip().lower()
        if devices:
            if devices not in DEVICE_MODES:
                raise TaskConfigError(
                    f"{ENV_DEVICES}={devices!r} is not one of: {', '.join(DEVICE_MODES)} (cpu: "
                    "one CPU replica per task, the default; gpu: the GPU of the task's local "
                    "rank)")
            values["devices"] = devices
        values["cuda_visible_devices"] = env.get(ENV_CUDA_VISIBLE)
        elastic = env.get(ENV_ELASTIC, "").strip()
        if elastic:
            values["elastic"] = parse_elastic(elastic)
        service = env.get(ENV_COORDINATION_SERVICE, "").strip()
        if service:
            host, sep, port = service.rpartition(":")
            if not (sep and host and port.isdigit() and 0 < int(port) < 65536):
                raise TaskConfigError(f"{ENV_COORDINATION_SERVICE}={service!r}: expected the "
                                      "service's host:port, e.g. 10.0.0.5:2223")
            values["coordination_service"] = service
        return cls(**values)


_installed: TaskSettings | None = None
_installed_lock = threading.Lock()


def install(settings: TaskSettings | None) -> TaskSettings | None:
    """Make ``settings`` this process's settings (what :func:`current` returns); returns the
    previous ones. A process entry point calls it once at start, before any library code asks::

        settings.install(TaskSettings.from_env())

    ``None`` forgets them, so that the next :func:`current` reads the environment again (tests
    that change ``CLUSTER_*`` variables in-process).
    """
    global _installed
    if settings is not None and not isinstance(settings, TaskSettings):
        raise TypeError(f"install takes a TaskSettings (or None), got {settings!r}")
    with _installed_lock:
        previous, _installed = _installed, settings
    return previous


def current() -> TaskSettings:
    """This process's settings: the library's one way to them below the entry points.

    Contract: what an entry point passed to :func:`install`. When none did (user code run as
    plain ``python train.py``, or a library imported by another program), the first call reads
    the environment once (:meth:`TaskSettings.from_env`) and installs that, so every later
    call, on any thread, returns the same object; later changes to ``os.environ`` are not seen.
    A running task runtime's own settings (``cluster.runtime.current().settings``) are the
    ones it was started with; the library prefers them where one runs.

    Raises:
        TaskConfigError: no settings were installed and a ``CLUSTER_*`` variable has a bad
            value (nothing is installed then: the next call reads the environment again).
    """
    global _installed
    found = _installed
    if found is not None:
        return found
    with _installed_lock:
        if _installed is None:
            _installed = TaskSettings.from_env()
        return _installed


# (variable, default, meaning): docs/guide/environment.md's table is checked against this list.
ENV_VARS = (
    ("TF_CONFIG", "unset",
     "The cluster and this task (Kubeflow's TFJob format); read by `resolver`."),
    ("CLUSTER_TASK_TYPE", "unset",
     "With a `TF_CONFIG` that has no task: this task's job (Kubernetes pods)."),
    ("CLUSTER_TASK_INDEX", "unset",
     "With `CLUSTER_TASK_TYPE`: the index (else Kubernetes' `JOB_COMPLETION_INDEX`)."),
    ("CLUSTER_SLURM_JOBS", "all workers",
     "Under `srun` with no `TF_CONFIG`: the jobs, e.g. `chief:1,worker:2,ps:1`."),
    ("CLUSTER_SLURM_PORT_BASE", "8888", "Under `srun`: the first task port on each node."),
    (ENV_TOKEN, "unset", "The cluster's shared secret, sent with every RPC."),
    (ENV_ALLOW_INSECURE, "0", "1 runs a non-loopback cluster without a token."),
    (ENV_TLS_CERT, "unset", "This task's certificate (PEM): with `_KEY` and `_CA`, mutual TLS "
     "on every connection (docs/guide/across-hosts.md)."),
    (ENV_TLS_KEY, "unset", "The private key of `CLUSTER_TLS_CERT` (PEM)."),
    (ENV_TLS_CA, "unset", "The cluster's CA certificate (PEM): peers must present a certificate "
     "it signed."),
    (ENV_STOP_WITH_COORDINATOR, "0",
     "1: a task that only serves exits 0 once the chief has finished (Kubernetes Jobs)."),
    (ENV_CONNECT_TIMEOUT, "60", "Seconds a task waits for its peers."),
    (ENV_HEARTBEAT_INTERVAL, "0.5", "Seconds between heartbeats (stretched beyond 500 tasks)."),
    (ENV_HEARTBEAT_TIMEOUT, "3", "Seconds of silence after which a peer whose address does not "
     "answer a TCP connect (dead, or cut off) is lost (see docs/guide/across-hosts.md)."),
    (ENV_STALL_TIMEOUT, "60", "Seconds of silence after which a peer whose host still answers "
     "(alive but busy: a long call holding the GIL, a stop) is lost; it is reported as stalled "
     "before. Never less than `CLUSTER_HEARTBEAT_TIMEOUT`."),
    (ENV_FUNCTION_TIMEOUT, "3600", "Seconds a coordinator's function may run on a worker."),
    (ENV_STALL_WARNING, "60", "Seconds a collective waits before its task logs which one it is "
     "in and which peer it waits for (again each period)."),
    (ENV_DATA_PLANE, "tcp", "`tcp` or `grpc`: how collective tensors travel."),
    (ENV_DEVICES, "cpu", "Where `MultiWorkerMirroredStrategy()` puts a task's replica: `cpu` "
     "(NumPy in, NumPy out, even with GPUs) or `gpu` (local rank r takes GPU r of those "
     "`CUDA_VISIBLE_DEVICES` leaves; see docs/guide/strategies.md)."),
    (ENV_ELASTIC, "unset", "`MIN:MAX`: an elastic run (docs/guide/elastic.md): a lost worker "
     "leaves the group, which trains on with at least MIN tasks; set by `clusterctl launch "
     "--elastic`."),
    (ENV_COORDINATION_SERVICE, "unset", "`host:port` of the coordination service run in its "
     "own process (`python -m coordination_service`) instead of by the chief, so that an "
     "elastic job outlives its chief; set by `clusterctl launch --elastic`."),
    ("CLUSTER_COLLECTIVE_PATH", "auto", "`network` keeps co-located ranks off shared memory."),
    ("CLUSTER_COLLECTIVE_ALGORITHM", "auto", "`ring`, `doubling` or `tree` forces the all-reduce."),
    ("CLUSTER_RING_LANES", "auto",
     "`1` or `2` forces the network ring's lanes (two: the data in halves round the ring in "
     "opposite directions, each on a thread of its own); `auto` takes two on one host where "
     "each rank has cores to spare, see [Collectives](../design/collectives.md)."),
    (ENV_LAUNCHER_PID, "unset", "Set by clusterctl: the task stops when that process exits."),
    (ENV_ERROR_FILE, "unset", "Set by clusterctl: where a failed task writes its error record."),
    (ENV_RESTART_COUNT, "0", "Set by clusterctl: the attempt number, 0 on the first."),
    (ENV_GRACE_PERIOD, "unset", "Set by clusterctl and the renders: seconds from SIGTERM to "
     "SIGKILL (`timeouts.grace`); `PreemptionCheckpointHandler` checks its save against it."),
    (ENV_TIMELINE, "unset", "Write this task's Chrome trace (steps, collectives) to this file; "
     "to clusterctl: merge every task's into it (docs/guide/watching.md)."),
    (ENV_STEPS, "unset", "Set by clusterctl: where this task writes its per-step records."),
    ("CLUSTER_RUN_DIR", "unset", "Set by clusterctl: the run directory (the examples write "
     "their curves there)."),
)
