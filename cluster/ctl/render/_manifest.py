"""What the Kubernetes formats (``k8s``, ``tfjob``) share: names, the container's command,
working directory, environment and resources, and the YAML writer.

The image holds the cluster file's directory at :data:`CODE_DIR` (``deploy/Dockerfile`` copies
it there), so the entrypoint and ``workdir`` must lie inside that directory; ``workdir``
becomes the container's ``workingDir`` and the script is named relative to it, exactly as
``clusterctl launch`` names it relative to its working directory. Every task listens on
:data:`PORT`; ``host`` and ``port_base`` do not apply.
"""

from __future__ import annotations

import re
from pathlib import Path, PurePosixPath
from typing import Any

import yaml

from cluster.ctl._elastic import ELASTIC_JOBS, ENV_ELASTIC
from cluster.ctl.render.api import RenderError, grace_seconds
from cluster.ctl.spec import ClusterFile
from cluster.settings import (
    ENV_GRACE_PERIOD,
    ENV_TLS_CA,
    ENV_TLS_CERT,
    ENV_TLS_KEY,
    ENV_TOKEN,
)

__all__ = [
    "CODE_DIR",
    "LABEL_JOB",
    "LABEL_RUN",
    "PORT",
    "TLS_DIR",
    "TOKEN_KEY",
    "active_deadline",
    "check_for_kubernetes",
    "command",
    "dump",
    "grace_seconds",
    "labels",
    "resources",
    "runtime_env",
    "secrets_needed",
    "tls_secret",
    "tls_volumes",
    "token_secret",
    "working_dir",
]

PORT = 2222
CODE_DIR = PurePosixPath("/workspace")
LABEL_RUN = "cluster-runtime.dev/run"
LABEL_JOB = "cluster-runtime.dev/job"
TOKEN_KEY = "token"
TLS_DIR = PurePosixPath("/etc/cluster-runtime/tls")  # the tls Secret's mount in every pod
_DNS_LABEL = re.compile(r"^[a-z]([-a-z0-9]*[a-z0-9])?$")  # RFC 1035 label: Service/TFJob names
_MAX_LABEL = 63


def token_secret(spec: ClusterFile) -> str:
    """The Secret holding the run's ``CLUSTER_TOKEN`` (key :data:`TOKEN_KEY`)."""
    return f"{spec.name}-token"


def tls_secret(spec: ClusterFile) -> str:
    """The Secret holding the run's certificates under ``tls:`` (keys ``ca.pem``, ``pod.pem``,
    ``pod.key``: what ``clusterctl certs DIR FILE`` writes)."""
    return f"{spec.name}-tls"


def tls_volumes(spec: ClusterFile) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """``(volumes, volumeMounts)`` for a pod of ``spec``: the :func:`tls_secret` read-only at
    :data:`TLS_DIR` under ``tls:``, nothing without."""
    if spec.tls is None:
        return [], []
    return ([{"name": "tls", "secret": {"secretName": tls_secret(spec)}}],
            [{"name": "tls", "mountPath": str(TLS_DIR), "readOnly": True}])


def secrets_needed(spec: ClusterFile, namespace: str) -> str:
    """The header's words after "Needs ...": the Secrets the objects need (docs/guide/kubernetes.md,
    docs/guide/across-hosts.md)."""
    text = (f"the Secret {token_secret(spec)} (key {TOKEN_KEY!r}) in namespace "
            f"{namespace}: see docs/guide/kubernetes.md.")
    if spec.tls is not None:
        text += (f"\nAnd the Secret {tls_secret(spec)}: `clusterctl certs DIR "
                 f"{spec.path.name} --namespace {namespace}`, then `kubectl create secret "
                 f"generic {tls_secret(spec)} --from-file=DIR/ca.pem --from-file=DIR/pod.pem "
                 f"--from-file=DIR/pod.key -n {namespace}` (docs/guide/across-hosts.md).")
    return text


def labels(spec: ClusterFile, job: str | None = None) -> dict[str, str]:
    out = {LABEL_RUN: spec.name}
    if job is not None:
        out[LABEL_JOB] = job
    return out


def check_for_kubernetes(spec: ClusterFile, namespace: str, fmt: str) -> None:
    """Raise :class:`RenderError` when ``spec`` cannot become Kubernetes objects: a run name
    that is no DNS label (or too long for its pods' host names), a namespace that is none,
    jobs given as address lists, code outside the cluster file's directory."""
    longest = max((f"{spec.name}-{job.name}-{job.count - 1}" for job in spec.jobs), key=len)
    if not _DNS_LABEL.match(spec.name) or len(longest) > _MAX_LABEL:
        raise RenderError(
            f"run name {spec.name!r} cannot name Kubernetes objects: it must be lowercase "
            f"letters, digits and '-', start with a letter, and leave room for pod host names "
            f"such as {longest!r} (at most {_MAX_LABEL} characters); set `name:` in "
            f"{spec.path.name}")
    if not _DNS_LABEL.match(namespace) or len(namespace) > _MAX_LABEL:
        raise RenderError(f"--namespace {namespace!r} is not a valid namespace (lowercase "
                          "letters, digits and '-', at most 63 characters)")
    for job in spec.jobs:
        if job.addresses is not None:
            raise RenderError(
                f"cluster.{job.name} lists addresses, but with --format {fmt} every task's "
                f"address is its pod's DNS name on port {PORT}: give a task count instead")
    _inside_code_dir(spec, spec.workdir, "workdir")
    if spec.entrypoint is not None:
        _inside_code_dir(spec, spec.entrypoint, "entrypoint")


def _inside_code_dir(spec: ClusterFile, path: Path, key: str) -> PurePosixPath:
    base = spec.path.parent
    try:
        relative = path.resolve().relative_to(base)
    except ValueError:
        raise RenderError(f"{key} {path} is outside {base}: the image holds that directory "
                          f"at {CODE_DIR} (deploy/Dockerfile), so the code must be inside "
                          "it") from None
    return CODE_DIR.joinpath(*relative.parts)


def working_dir(spec: ClusterFile) -> str:
    """The container's ``workingDir``: the file's ``workdir`` inside the image."""
    return str(_inside_code_dir(spec, spec.workdir, "workdir"))


def command(spec: ClusterFile, job: str) -> list[str]:
    """What a ``job`` task runs: ``python`` and :meth:`ClusterFile.task_argv`, with the script
    named relative to :func:`working_dir` (``python -m worker train.py --epochs 10``)."""
    argv = list(spec.task_argv(job))
    if spec.runs_entrypoint(job) and spec.entrypoint is not None:
        script = _inside_code_dir(spec, spec.entrypoint, "entrypoint")
        argv[2] = str(script.relative_to(working_dir(spec))) \
            if script.is_relative_to(working_dir(spec)) else str(script)
    return ["python", *argv]


def runtime_env(spec: ClusterFile, job: str | None = None) -> list[dict[str, Any]]:
    """The environment after ``TF_CONFIG`` (and ``CLUSTER_TASK_TYPE``), in this order: the
    token from the run's Secret (never a literal), the timeouts ``clusterctl launch`` passes
    (``timeouts.startup``, ``timeouts.heartbeat``, ``timeouts.stall`` where given, and the
    grace period as the pods get it,
    :func:`grace_seconds`), for a chief or worker ``job`` of an elastic run
    ``CLUSTER_ELASTIC=MIN:MAX``, under ``tls:`` the certificate's paths in the tls Secret's
    mount, then the file's ``env:``."""
    env: list[dict[str, Any]] = [
        {"name": ENV_TOKEN, "valueFrom": {"secretKeyRef": {
            "name": token_secret(spec), "key": TOKEN_KEY}}},
        *({"name": name, "value": value} for name, value in spec.timeouts.task_env().items()),
        {"name": ENV_GRACE_PERIOD, "value": str(grace_seconds(spec))},
    ]
    if spec.elastic is not None and job in ELASTIC_JOBS:
        env.append({"name": ENV_ELASTIC, "value": str(spec.elastic)})
    if spec.tls is not None:  # the pods' shared certificate, from the tls Secret
        env += [{"name": var, "value": str(TLS_DIR / name)} for var, name in (
            (ENV_TLS_CERT, "pod.pem"), (ENV_TLS_KEY, "pod.key"), (ENV_TLS_CA, "ca.pem"))]
    env += [{"name": name, "value": value} for name, value in spec.env.items()]
    return env


def resources(spec: ClusterFile, job: str) -> dict[str, dict[str, str]] | None:
    """The file's ``resources.<job>`` as both requests and limits (Guaranteed QoS: a training
    task is neither throttled below nor evicted before what it asked for; GPUs need
    requests == limits anyway); ``None`` when the file gives none for ``job``."""
    wanted = spec.resources.get(job)
    if not wanted:
        return None
    return {"requests": dict(wanted), "limits": dict(wanted)}


def active_deadline(spec: ClusterFile) -> int | None:
    """``activeDeadlineSeconds`` from ``timeouts.run``: the longest a ``clusterctl launch`` of
    this file may take, every attempt included (``run`` x (``max_restarts`` + 1)), since
    Kubernetes bounds the whole Job, not each attempt."""
    if spec.timeouts.run is None:
        return None
    total = spec.timeouts.run * (spec.restart.max_restarts + 1)
    return max(1, int(-(-total // 1)))  # whole seconds, rounded up


class _Dumper(yaml.SafeDumper):
    """Block style, except lists of scalars in flow style (``command: [python, -m, ps]``); no
    anchors (objects shared between documents are written out each time)."""

    def ignore_aliases(self, data: Any) -> bool:
        return True


def _represent_list(dumper: yaml.SafeDumper, data: list) -> yaml.Node:
    flow = bool(data) and all(isinstance(x, (str, int, float, bool)) for x in data)
    return dumper.represent_sequence("tag:yaml.org,2002:seq", data, flow_style=flow)


_Dumper.add_representer(list, _represent_list)


def dump(documents: list[dict[str, Any]], header: str) -> str:
    """Multi-document YAML: ``header`` as ``#`` comments, then each document after ``---``;
    keys in the order the documents were built (deterministic), never sorted."""
    comments = "".join(f"# {line}\n" if line else "#\n" for line in header.splitlines())
    return comments + yaml.dump_all(documents, Dumper=_Dumper, sort_keys=False,
                                    explicit_start=True, default_flow_style=False, width=100)
