"""Strict checks of a task's place in its cluster, applied where a process starts.

The resolver is as lenient as TensorFlow's; a process that is about to bind a port and talk to
peers is not. :func:`resolve_placement` turns a resolver into a :class:`Placement` or raises
:class:`~cluster.errors.TaskConfigError` saying what is wrong and how to fix it.
"""

from __future__ import annotations

import difflib
from dataclasses import dataclass

from cluster._address import check_address, duplicate_address
from cluster.errors import TaskConfigError
from resolver import ClusterConfigError, ClusterResolver, ClusterSpec, TFConfigClusterResolver
from resolver.tfconfig import sparse_cluster_only

__all__ = ["JOB_NAMES", "Placement", "check_address", "cluster_tasks", "collective_members",
           "resolve_placement"]

JOB_NAMES = ("chief", "worker", "ps", "evaluator")


@dataclass(frozen=True)
class Placement:
    """A validated task: its type, index, the cluster and the address it serves on."""

    task_type: str
    task_id: int
    cluster_spec: ClusterSpec
    address: str

    @property
    def task(self) -> str:
        return f"{self.task_type}:{self.task_id}"

    def tasks(self) -> list[tuple[str, str]]:
        """Every ``(task, address)`` of the cluster, jobs in :data:`JOB_NAMES` order."""
        return cluster_tasks(self.cluster_spec)


def cluster_tasks(spec: ClusterSpec) -> list[tuple[str, str]]:
    """Every ``(task, address)`` of ``spec``, jobs in :data:`JOB_NAMES` order."""
    out = []
    for job in JOB_NAMES:
        if job in spec.jobs:
            for index in spec.task_indices(job):
                out.append((f"{job}:{index}", spec.task_address(job, index)))
    return out


def collective_members(spec: ClusterSpec) -> list[tuple[str, str]]:
    """The collective group, in rank order: the chief (if any), then workers by index."""
    members = []
    for job in ("chief", "worker"):
        if job in spec.jobs:
            for index in spec.task_indices(job):
                members.append((f"{job}:{index}", spec.task_address(job, index)))
    return members


def _sparse_cluster_hint(resolver: ClusterResolver) -> str:
    if not isinstance(resolver, TFConfigClusterResolver):
        return ""
    if sparse_cluster_only():
        return (
            'TF_CONFIG has "sparseCluster" (Kubeflow\'s dynamic-worker format) and no "cluster":'
            " cluster-runtime needs the full cluster; turn off enableDynamicWorker in the TFJob so"
            ' that TF_CONFIG carries "cluster"'
        )
    return ""


def _suggest(name: str, choices: tuple[str, ...] | list[str]) -> str:
    close = difflib.get_close_matches(name, choices, n=1)
    return f' (did you mean "{close[0]}"?)' if close else ""


def resolve_placement(resolver: ClusterResolver, *, source: str = "TF_CONFIG") -> Placement:
    """Validate ``resolver`` strictly and return this task's placement.

    Checks: there is a cluster; job names are chief/worker/ps/evaluator; at most one chief;
    chief and worker indices are dense (0..n-1); every address is ``host:port``
    (:mod:`cluster._address`) and no two tasks share one; this task's
    type and index are given and name a task of the cluster.

    Raises:
        TaskConfigError: any check failed; the message names ``source`` and the bad field.
    """
    hint = _sparse_cluster_hint(resolver)
    if hint:
        raise TaskConfigError(hint)
    try:
        spec = resolver.cluster_spec()
        task_type = resolver.task_type
        task_id = resolver.task_id
    except ClusterConfigError as e:
        raise TaskConfigError(str(e)) from e
    if not spec.jobs:
        raise TaskConfigError(
            f"{source}: no cluster: set TF_CONFIG to a JSON object like "
            '{"cluster": {"worker": ["host0:2222", "host1:2222"]}, '
            '"task": {"type": "worker", "index": 0}} (clusterctl launch does this for you)'
        )
    for job in spec.jobs:
        if job not in JOB_NAMES:
            raise TaskConfigError(
                f"{source}: cluster.{job}: unknown job {job!r}{_suggest(str(job), JOB_NAMES)}; "
                f"jobs are {', '.join(JOB_NAMES)}"
            )
        indices = spec.task_indices(job)
        if job in ("chief", "worker") and indices != list(range(len(indices))):
            raise TaskConfigError(
                f"{source}: cluster.{job}: task indices must be 0..{len(indices) - 1} with no "
                f"gaps, got {indices}"
            )
        for index in indices:
            problem = check_address(spec.task_address(job, index))
            if problem:
                raise TaskConfigError(f"{source}: cluster.{job}[{index}]: {problem}")
    clash = duplicate_address((f"{job}:{i}", spec.task_address(job, i))
                              for job in spec.jobs for i in spec.task_indices(job))
    if clash is not None:  # checked before binding: the second task could never bind it
        raise TaskConfigError(f"{source}: {clash[1]} and {clash[2]} have the same address "
                              f"{clash[0]}: every task needs its own host:port")
    if "chief" in spec.jobs and spec.num_tasks("chief") > 1:
        raise TaskConfigError(
            f"{source}: cluster.chief: at most one chief, got {spec.num_tasks('chief')}"
        )
    if task_type is None or task_type == "":
        raise TaskConfigError(
            f'{source}: task.type is missing: say which task this process is, e.g. '
            f'"task": {{"type": "worker", "index": 0}}'
        )
    if task_id is None:
        raise TaskConfigError(f"{source}: task.index is missing for task type {task_type!r}")
    if task_type not in spec.jobs:
        raise TaskConfigError(
            f"{source}: task {task_type}:{task_id} is not in the cluster: no job {task_type!r}"
            f"{_suggest(task_type, spec.jobs)}; the cluster has {', '.join(spec.jobs)}"
        )
    if task_id not in spec.task_indices(task_type):
        raise TaskConfigError(
            f"{source}: task {task_type}:{task_id} is not in the cluster: job {task_type!r} has "
            f"tasks {spec.task_indices(task_type)}"
        )
    return Placement(task_type, int(task_id), spec, spec.task_address(task_type, task_id))
