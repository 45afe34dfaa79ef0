"""Where a task process learns which task it is, before anything else runs.

The runtime, the strategies and user code all read one contract: a complete ``TF_CONFIG``
(cluster and task). Launchers other than ``clusterctl`` do not always write one, so the entry
points (``python -m worker``, ``python -m ps``) complete it here, once, and export it:

1. ``TF_CONFIG`` with a ``task``: used as it is. If Slurm is present too, ``TF_CONFIG`` wins and a
   note says so.
2. ``TF_CONFIG`` with a cluster and no ``task``, plus ``CLUSTER_TASK_TYPE``: the index comes from
   ``CLUSTER_TASK_INDEX``, else ``JOB_COMPLETION_INDEX`` (set by Kubernetes in every pod of an
   Indexed Job). This is how the pods of ``clusterctl render --format k8s`` learn their task:
   every pod of a job has the same template, only the index differs.
3. No ``TF_CONFIG`` inside a Slurm job step (``SLURM_PROCID`` and ``SLURM_STEP_NODELIST`` set):
   the cluster comes from :class:`resolver.SlurmClusterResolver`, with the jobs of
   ``CLUSTER_SLURM_JOBS`` (``chief:1,worker:2,ps:1``; every task a worker when unset, as in TF) and
   ports from ``CLUSTER_SLURM_PORT_BASE`` (TF's 8888 when unset). Ranks map to tasks in TF's order
   (jobs sorted by name, then nodes sorted by name, then local rank); a task that Slurm placed
   elsewhere (``srun -m cyclic``) is refused, naming the fix.
4. Anything else: nothing to complete; the runtime reports what is missing.

The result is a :class:`TaskSource`: the full ``TF_CONFIG`` text and where it came from. Only the
Slurm branch has a side effect (the resolver narrows ``CUDA_VISIBLE_DEVICES`` to this task's GPUs,
as TF's does), and it reads the Slurm variables from ``os.environ``: entry points pass
``os.environ`` itself.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from dataclasses import dataclass

from cluster.errors import TaskConfigError

__all__ = [
    "ENV_SLURM_JOBS",
    "ENV_SLURM_PORT_BASE",
    "ENV_TASK_INDEX",
    "ENV_TASK_TYPE",
    "TaskSource",
    "complete_tf_config",
    "parse_slurm_jobs",
]

ENV_TASK_TYPE = "CLUSTER_TASK_TYPE"
ENV_TASK_INDEX = "CLUSTER_TASK_INDEX"
ENV_SLURM_JOBS = "CLUSTER_SLURM_JOBS"
ENV_SLURM_PORT_BASE = "CLUSTER_SLURM_PORT_BASE"
K8S_INDEX = "JOB_COMPLETION_INDEX"
SLURM_PORT_BASE = 8888  # TF's SlurmClusterResolver default

_JOB_ENTRY = re.compile(r"\s*([A-Za-z_][A-Za-z0-9_]*)\s*:\s*([0-9]+)\s*\Z")


@dataclass(frozen=True)
class TaskSource:
    """The complete ``TF_CONFIG`` of this task and how it was found.

    ``tf_config`` is the JSON text to export; ``source`` says where the task came from (for the
    log line and error messages); ``note`` is a line worth logging, or ``""``.
    """

    tf_config: str
    source: str
    task: str
    note: str = ""


def parse_slurm_jobs(text: str) -> dict[str, int]:
    """``"chief:1,worker:2,ps:1"`` -> ``{"chief": 1, "worker": 2, "ps": 1}`` (order kept).

    Raises:
        TaskConfigError: an entry is not ``name:count``, or a job appears twice.
    """
    jobs: dict[str, int] = {}
    for entry in text.split(","):
        if not entry.strip():
            continue
        match = _JOB_ENTRY.match(entry)
        if match is None:
            raise TaskConfigError(
                f"{ENV_SLURM_JOBS}={text!r}: entry {entry.strip()!r} is not JOB:COUNT; "
                "expected e.g. chief:1,worker:2,ps:1")
        name, count = match.group(1), int(match.group(2))
        if name in jobs:
            raise TaskConfigError(f"{ENV_SLURM_JOBS}={text!r}: job {name!r} is given twice")
        jobs[name] = count
    if not jobs:
        raise TaskConfigError(f"{ENV_SLURM_JOBS}={text!r} names no job; expected e.g. "
                              "chief:1,worker:2,ps:1, or leave it unset for all workers")
    return jobs


def complete_tf_config(environ: Mapping[str, str]) -> TaskSource | None:
    """This task's complete ``TF_CONFIG``, or ``None`` when there is nothing to complete (see the
    module docstring for the rules, in order).

    Raises:
        TaskConfigError: the variables name a task but cannot give a valid one (an index that is
            not a number, Slurm variables that do not add up); the message names the variable.
    """
    text = environ.get("TF_CONFIG", "").strip()
    in_slurm = bool(environ.get("SLURM_PROCID")) and bool(environ.get("SLURM_STEP_NODELIST"))
    if text:
        return _from_tf_config(text, environ, in_slurm)
    if in_slurm:
        return _from_slurm(environ)
    return None


def _from_tf_config(text: str, environ: Mapping[str, str], in_slurm: bool) -> TaskSource | None:
    try:
        doc = json.loads(text)
    except (ValueError, RecursionError):  # RecursionError: absurdly deep nesting
        return None  # the resolver reports malformed JSON with its own message
    if not isinstance(doc, dict):
        return None
    task = doc.get("task")
    has_task = isinstance(task, dict) and bool(task.get("type"))
    note = ("TF_CONFIG and a Slurm job step are both present: TF_CONFIG wins, the Slurm "
            "allocation is not used to build the cluster") if in_slurm else ""
    if has_task:
        if not note:
            return None
        return TaskSource(text, "TF_CONFIG", f"{task['type']}:{task.get('index', 0)}", note)
    task_type = environ.get(ENV_TASK_TYPE, "").strip()
    if not task_type:
        return None  # resolve_placement says that task.type is missing
    index_var, index_text = ENV_TASK_INDEX, environ.get(ENV_TASK_INDEX, "").strip()
    if not index_text:
        index_var, index_text = K8S_INDEX, environ.get(K8S_INDEX, "").strip()
    if not index_text:
        raise TaskConfigError(
            f"{ENV_TASK_TYPE}={task_type} names this task's job but neither {ENV_TASK_INDEX} nor "
            f"{K8S_INDEX} (set by Kubernetes in Indexed Job pods) gives its index")
    if not index_text.isdigit():
        raise TaskConfigError(f"{index_var}={index_text!r}: the task index must be an integer "
                              ">= 0")
    doc["task"] = {"type": task_type, "index": int(index_text)}
    source = f"TF_CONFIG cluster, {ENV_TASK_TYPE} and {index_var}"
    return TaskSource(json.dumps(doc, separators=(",", ":")), source,
                      f"{task_type}:{int(index_text)}", note)


def _from_slurm(environ: Mapping[str, str]) -> TaskSource:
    from resolver import SlurmClusterResolver  # only on this path

    jobs_text = environ.get(ENV_SLURM_JOBS, "").strip()
    jobs = parse_slurm_jobs(jobs_text) if jobs_text else None
    port_text = environ.get(ENV_SLURM_PORT_BASE, "").strip()
    if port_text and not (port_text.isdigit() and 1 <= int(port_text) <= 65535):
        raise TaskConfigError(f"{ENV_SLURM_PORT_BASE}={port_text!r}: expected a port, 1-65535")
    port_base = int(port_text) if port_text else SLURM_PORT_BASE
    try:
        resolver = SlurmClusterResolver(jobs=jobs, port_base=port_base)
        spec = resolver.cluster_spec()
    except (RuntimeError, ValueError) as e:
        hint = f" (set {ENV_SLURM_JOBS} to jobs adding up to the step's task count)" \
            if "Requested" in str(e) else ""
        raise TaskConfigError(f"Slurm: {e}{hint}") from e
    task_type, task_id = resolver.task_type, resolver.task_id
    if task_type is None or task_id is None:
        raise TaskConfigError(f"Slurm: SLURM_PROCID={environ.get('SLURM_PROCID')} is not a task "
                              f"of jobs {jobs or 'worker (all)'}")
    _check_placement(environ, spec.as_dict()[task_type][task_id], port_base)
    doc = {"cluster": spec.as_dict(), "task": {"type": task_type, "index": task_id}}
    step = f"job {environ.get('SLURM_JOB_ID', '?')}, step {environ.get('SLURM_STEP_ID', '?')}"
    return TaskSource(json.dumps(doc, separators=(",", ":")), f"Slurm ({step})",
                      f"{task_type}:{task_id}")


def _check_placement(environ: Mapping[str, str], address: str, port_base: int) -> None:
    """The resolver deals ranks to nodes in block order over the node names sorted as strings;
    Slurm places them by its ``--distribution`` over its node order. Where the two disagree
    (``srun -m cyclic``, nodes ``node9``/``node10``) this task would bind another node's
    address: say so now, naming the fix, instead of failing to bind."""
    node = environ.get("SLURMD_NODENAME", "").strip()
    local = environ.get("SLURM_LOCALID", "").strip()
    host, _, port = address.rpartition(":")
    where = f"node {node}" if node else "this node"
    if (node and host != node) or (local.isdigit() and int(port) - port_base != int(local)):
        raise TaskConfigError(
            f"Slurm: rank {environ.get('SLURM_PROCID')} runs on {where} as local task "
            f"{local or '?'}, but TF's rank order (block over the node names sorted) gives it "
            f"{address}; run srun with --distribution=block and name nodes so that they sort "
            "in Slurm's order (zero-padded numbers)")
