"""Emulated pods: run the manifests ``clusterctl render`` prints, one network namespace per pod.

The Kubernetes tests' harness. :class:`EmulatedPods` takes rendered manifests (format ``k8s`` or
``tfjob``), expands them into the pods the controllers would make
(:mod:`cluster.testing._manifests`), and runs each pod's container command on a host of its own
(:class:`~cluster.testing.netns.NetnsCluster`: network, mount, PID and UTS namespaces, a private
``/dev/shm``) whose hostname is the pod's, with the environment the kubelet would give it:

- ``python`` is this interpreter (the image's is the project's environment); the container's
  ``workingDir`` is ``workdir`` (the directory the image copies there, e.g. ``examples/ps``);
- the environment is built from scratch (``env -i``): the image's variables (``PATH``,
  ``LANG``, ``HOME``, ``PYTHONUNBUFFERED=1``), ``KUBERNETES_SERVICE_*``, ``HOSTNAME``, the
  container's ``env``/``envFrom`` with Secrets and ConfigMaps the test passes, ``fieldRef``
  values (the pod IP is its host's address), ``JOB_COMPLETION_INDEX`` (Indexed Jobs) and, for a
  TFJob, ``TF_CONFIG`` exactly as the training operator builds it; plus ``env`` given to the
  harness (a test's leak-check marker).

DNS: every pod's names start unpublished; a pod's names are published ``dns_delay`` seconds
after it starts (0: just before), as a headless Service publishes a pod once it exists. A pod
can start late (``delays``), minutes apart, as when images are pulled. A test replaces a pod as
its controller would (:meth:`EmulatedPods.replace`). Not emulated: restarts on their own
(``backoffLimitPerIndex``, ``restartPolicy: ExitCode``; each pod runs once), readiness,
resources, the container's process being PID 1 of its namespace (the namespace's PID 1 is the
harness's holder), and Job-level termination of a failed Job's other pods.

Example::

    with EmulatedPods(text, workdir=REPO / "examples/quickstart",
                      secrets={"quickstart-token": {"token": "s3cret"}}) as pods:
        pods.start(delays={"quickstart-worker-1": 30.0})
        results = pods.wait(timeout=240)            # {host name: PodResult}
        assert all(r.exit_code == 0 for r in results.values())

:meth:`EmulatedPods.close` (also on leaving the ``with`` block) kills every pod and removes
every namespace. Needs root: :func:`cluster.testing.netns.unavailable` says why not.
"""

from __future__ import annotations

import os
import signal
import sys
import threading
import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path

from cluster.deadline import Deadline
from cluster.exitcodes import normalize
from cluster.testing._manifests import ManifestError, PodSpec, expand, go_json
from cluster.testing._tasks import TaskProcess, TaskProcesses, TaskTimeoutError
from cluster.testing.netns import NetnsCluster

__all__ = ["EmulatedPods", "ManifestError", "PodResult", "PodSpec", "PodsTimeoutError", "describe",
           "expand", "go_json"]

_PYTHONS = ("python", "python3")
_IMAGE_ENV = {"LANG": "C.UTF-8", "HOME": "/root", "PYTHONUNBUFFERED": "1"}
_KUBERNETES_ENV = {"KUBERNETES_SERVICE_HOST": "10.96.0.1", "KUBERNETES_SERVICE_PORT": "443"}


@dataclass(frozen=True)
class PodResult:
    """How a pod ended: ``exit_code`` as Kubernetes reports it (137 for SIGKILL), its output
    (stdout and stderr merged, as ``kubectl logs``)."""

    name: str
    task: str
    exit_code: int
    output: str


class PodsTimeoutError(TaskTimeoutError):
    """Pods still ran at the deadline (they were killed); the message names them and holds the
    end of every pod's output."""


class EmulatedPods:
    """The pods of ``manifests``; see the module docstring.

    ``pods``: ``{host name: PodSpec}`` in manifest order. ``secrets`` / ``config_maps``:
    ``{object name: {key: value}}``; ``env``: more variables for every pod; ``log_dir``: each
    pod's output is also written to ``log_dir/HOSTNAME.log``.

    Raises (constructor): :class:`ManifestError` when a pod cannot be run faithfully (a missing
    Secret key, an unemulated field), before anything starts.
    """

    def __init__(self, manifests: str, *, workdir: str | os.PathLike,
                 secrets: Mapping[str, Mapping[str, str]] | None = None,
                 config_maps: Mapping[str, Mapping[str, str]] | None = None,
                 env: Mapping[str, str] | None = None,
                 log_dir: str | os.PathLike | None = None) -> None:
        self.pods: dict[str, PodSpec] = {p.hostname: p for p in expand(manifests)}
        self.workdir = Path(workdir)
        self._secrets = secrets or {}
        self._config_maps = config_maps or {}
        self._extra_env = dict(env or {})
        self._log_dir = Path(log_dir) if log_dir is not None else None
        for pod in self.pods.values():  # refuse before starting anything
            pod.environment(pod_ip="0.0.0.0", secrets=self._secrets,
                            config_maps=self._config_maps)
        self.cluster: NetnsCluster | None = None
        self._processes = TaskProcesses()
        self._started: dict[str, TaskProcess] = {}
        self._events = {name: threading.Event() for name in self.pods}
        self._closing = threading.Event()
        self._scheduler: threading.Thread | None = None
        self._error: BaseException | None = None
        self.started_at: dict[str, float] = {}  # host name: time.monotonic() at its start

    def __enter__(self) -> EmulatedPods:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- running --------------------------------------------------------------------------------

    def start(self, *, delays: Mapping[str, float] | None = None,
              dns_delay: float | Mapping[str, float] = 0.0, timeout: float = 60.0) -> None:
        """Make the hosts (within ``timeout`` s), then start every pod: at once, or ``delays[host
        name]`` seconds from now; each pod's DNS names are published ``dns_delay`` s (one value,
        or per host name) after it starts. Returns at once; :meth:`wait` waits."""
        delays = dict(delays or {})
        unknown = set(delays) - set(self.pods) | (
            set(dns_delay) - set(self.pods) if isinstance(dns_delay, Mapping) else set())
        if unknown:
            raise ValueError(f"no such pods: {sorted(unknown)}; pods: {list(self.pods)}")
        aliases = {name: pod.dns_names for name, pod in self.pods.items()}
        self.cluster = NetnsCluster(list(self.pods), aliases=aliases,
                                    late=[n for names in aliases.values() for n in names],
                                    timeout=timeout)
        plan: list[tuple[float, int, str]] = []  # (seconds from now, 0 publish / 1 start, pod)
        for name in self.pods:
            at = delays.get(name, 0.0)
            lag = dns_delay.get(name, 0.0) if isinstance(dns_delay, Mapping) else dns_delay
            plan += [(at + lag, 0, name), (at, 1, name)]
        self._scheduler = threading.Thread(target=self._run_plan, args=(sorted(plan),),
                                           daemon=True, name="emulated pods")
        self._scheduler.start()

    def _run_plan(self, plan: list[tuple[float, int, str]]) -> None:
        t0 = time.monotonic()
        try:
            for at, action, name in plan:
                if self._closing.wait(max(0.0, t0 + at - time.monotonic())):
                    return  # closed before this pod's time: it never starts
                if action == 0:
                    for alias in self.pods[name].dns_names:
                        self.cluster.publish(alias)
                else:
                    self._start_pod(name)
        except BaseException as e:  # noqa: BLE001 - re-raised by wait()
            self._error = e
            for event in self._events.values():
                event.set()

    def _start_pod(self, name: str) -> None:
        pod, host = self.pods[name], self.cluster[name]
        env = {"PATH": f"{Path(sys.executable).parent}:/usr/local/bin:/usr/bin:/bin",
               **_IMAGE_ENV, **_KUBERNETES_ENV,
               **pod.environment(pod_ip=host.address, secrets=self._secrets,
                                 config_maps=self._config_maps),
               **self._extra_env}
        argv = pod.argv(env)
        if argv and argv[0] in _PYTHONS:
            argv[0] = sys.executable
        log = self._log_dir / f"{name}.log" if self._log_dir is not None else None
        process = self._processes.start(
            host.command(["env", "-i", *(f"{k}={v}" for k, v in env.items()), *argv],
                         cwd=self.workdir),
            name=f"pod {name}", log=log)
        self._started[name] = process
        self.started_at[name] = time.monotonic()
        self._events[name].set()

    def process(self, name: str, timeout: float = 60.0) -> TaskProcess:
        """Pod ``name``'s process once it started (waiting at most ``timeout`` s for a late
        pod). Raises ``TaskTimeoutError`` when it did not start in time."""
        if not self._events[name].wait(timeout):
            raise TaskTimeoutError(f"pod {name} did not start within {timeout} s")
        self._raise_if_failed()
        return self._started[name]

    def kill(self, name: str) -> None:
        """SIGKILL every process of pod ``name`` at once (a node lost, an OOM kill of the
        container): the kernel kills its whole PID namespace."""
        self.process(name, timeout=0)
        assert self.cluster is not None
        self.cluster[name].kill()

    def replace(self, name: str, timeout: float = 30.0) -> PodResult:
        """Delete pod ``name`` at once (SIGKILL to its whole PID namespace: a node lost, a
        ``kubectl delete --grace-period=0``) and start its replacement as its controller does
        (a Job's retry, a StatefulSet): a new pod of the same name, environment and address,
        on fresh namespaces. Returns how the deleted one ended."""
        old = self.process(name, timeout=0)
        assert self.cluster is not None
        self.cluster[name].kill()
        code, output = old.finish(timeout)
        self.cluster[name].renew(Deadline.after(timeout))
        self._start_pod(name)
        return PodResult(name, self.pods[name].task, normalize(code), output)

    def terminate(self, names: Iterable[str], grace: float = 10.0) -> dict[str, PodResult]:
        """Stop pods as ``kubectl delete`` does: SIGTERM to each one's main process, SIGKILL
        after ``grace`` s; returns how each ended."""
        names = [n for n in names if n in self._started]
        for name in names:
            main = _main_pid(self._started[name])
            if main is not None:
                try:
                    os.kill(main, signal.SIGTERM)
                except ProcessLookupError:
                    pass
        return self.wait(timeout=grace, names=names, kill_late=True)

    def wait(self, timeout: float, names: Iterable[str] | None = None, *,
             kill_late: bool = False) -> dict[str, PodResult]:
        """``{host name: PodResult}`` once each pod of ``names`` (default: all) has started and
        exited, within ``timeout`` s.

        Raises:
            PodsTimeoutError: some still ran at the deadline; every pod waited for is killed
                (with ``kill_late``, the late ones are returned as killed instead).
        """
        deadline = Deadline.after(timeout)
        wanted = list(self.pods) if names is None else list(names)
        results, late = {}, []
        for name in wanted:
            try:
                process = self.process(name, timeout=deadline.remaining())
                code, output = process.finish(timeout=deadline.remaining())
            except TaskTimeoutError:
                late.append(name)
                continue
            results[name] = PodResult(name, self.pods[name].task, normalize(code), output)
        if late and not kill_late:
            outputs = "\n".join(f"--- pod {n} ---\n{self._output(n)[-3000:]}" for n in wanted)
            raise PodsTimeoutError(f"pods still running after {timeout} s: {late}\n{outputs}")
        for name in late:
            if name in self._started:
                self._started[name].close()
                code = self._started[name].returncode
                results[name] = PodResult(name, self.pods[name].task,
                                          normalize(-9 if code is None else code),
                                          self._output(name))
        return results

    def _output(self, name: str) -> str:
        process = self._started.get(name)
        return process.output if process is not None else "(not started)"

    def _raise_if_failed(self) -> None:
        if self._error is not None:
            raise RuntimeError(f"emulated pods: starting pods failed: {self._error}") \
                from self._error

    def close(self) -> None:
        """Kill every pod, stop the ones not started yet from starting, remove the hosts.
        Idempotent."""
        self._closing.set()
        if self._scheduler is not None:
            self._scheduler.join(30)
        try:
            self._processes.stop()
        finally:
            if self.cluster is not None:
                self.cluster.close()


def _main_pid(process: TaskProcess) -> int | None:
    """The pod's main process: the child ``nsenter`` forked into the pod's namespaces."""
    try:
        children = Path(f"/proc/{process.pid}/task/{process.pid}/children").read_text().split()
    except OSError:
        return None
    return int(children[0]) if children else None


def describe(results: Mapping[str, PodResult], tail: int = 12) -> str:
    """For assertion messages: ``name (task): exit code`` of every pod, then the last ``tail``
    lines of each pod that failed (a CI log holds no pod's log file)."""
    summary = "; ".join(f"{r.name} ({r.task}): {r.exit_code}" for r in results.values())
    ends = [f"--- {r.name}, last lines:\n" + "\n".join(r.output.rstrip().splitlines()[-tail:])
            for r in results.values() if r.exit_code != 0 and tail > 0]
    return "\n".join([summary, *ends])

