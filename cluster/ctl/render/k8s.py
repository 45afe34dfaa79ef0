"""``clusterctl render --format k8s``: a headless Service and one Indexed Job per job.

The objects (the contract the emulated-pod harness parses; docs/guide/kubernetes.md
explains them to users):

- Service ``{run}``: headless (``clusterIP: None``), ``publishNotReadyAddresses: true`` (a pod's
  name resolves before it is ready: peers dial each other during start-up), port
  :data:`~cluster.ctl.render._manifest.PORT` named ``cluster``, selecting
  ``cluster-runtime.dev/run: {run}``.
- Job ``{run}-{job}`` per job with tasks: ``completionMode: Indexed``, ``completions`` =
  ``parallelism`` = the job's count; pods with ``subdomain: {run}``, so Kubernetes names index
  ``i`` ``{run}-{job}-{i}``, reachable as ``{run}-{job}-{i}.{run}.{namespace}.svc``.
- One container ``task``: the command ``clusterctl launch`` runs; the environment
  ``TF_CONFIG`` (the cluster, no ``task``: every pod of a Job shares its template),
  ``CLUSTER_TASK_TYPE`` (the job; the index is Kubernetes' ``JOB_COMPLETION_INDEX``), the token
  from the Secret ``{run}-token``, the timeouts, the file's ``env:``.

Failures map the file's ``restart:`` block onto each Job (:func:`failure_policy`). In an
elastic run (``elastic: {min, max}``) the chief and worker containers get
``CLUSTER_ELASTIC=MIN:MAX``, and a failed pod of theirs is replaced alone by one of the same
index, hence the same host name and task, while the other pods run on.
"""

from __future__ import annotations

import json
from typing import Any

from cluster.ctl._elastic import ELASTIC_JOBS
from cluster.ctl.policy import COORDINATOR
from cluster.ctl.render import _manifest as m
from cluster.ctl.render.api import DEFAULT_IMAGE, DEFAULT_NAMESPACE, RenderOptions
from cluster.ctl.spec import ClusterFile
from cluster.settings import ENV_STOP_WITH_COORDINATOR
from cluster.task_source import ENV_TASK_TYPE  # the pod contract's one name for it

__all__ = ["ENV_TASK_TYPE", "PERMANENT_EXIT_CODES", "cluster_tf_config", "failure_policy",
           "render"]

PERMANENT_EXIT_CODES = list(range(1, 128))  # Kubeflow's convention (cluster/exitcodes.py)


def pod_address(spec: ClusterFile, job: str, index: int, namespace: str) -> str:
    """``{run}-{job}-{index}.{run}.{namespace}.svc:2222``: the pod's name under the Service."""
    return f"{spec.name}-{job}-{index}.{spec.name}.{namespace}.svc:{m.PORT}"


def cluster_tf_config(spec: ClusterFile, namespace: str) -> str:
    """``TF_CONFIG`` without ``task``, written like :func:`cluster.ctl.task_config.tf_config`
    (compact JSON, jobs sorted, ``"environment": "cloud"``); each pod adds its own task."""
    cluster = {job.name: [pod_address(spec, job.name, i, namespace) for i in range(job.count)]
               for job in sorted(spec.jobs, key=lambda j: j.name)}
    return json.dumps({"cluster": cluster, "environment": "cloud"}, separators=(",", ":"))


def failure_policy(spec: ClusterFile, job: str) -> dict[str, Any]:
    """The Job fields that decide what a failed pod of ``job`` means, from ``restart:``.

    - Each index (task) is replaced ``backoffLimitPerIndex`` times: ``restart.max_restarts``
      (0 with ``policy: never``), the number of whole-cluster restarts under clusterctl, in
      which every task starts again once. In ``mode: coordinator`` a worker gets what
      clusterctl gives it at most: ``max_worker_restarts`` per attempt over every attempt,
      ``(max_worker_restarts + 1) x (max_restarts + 1) - 1``.
    - ``maxFailedIndexes: 0``: a task out of replacements fails its Job at once (as one
      failure fails a clusterctl run); not for coordinator workers (the run goes on without
      them).
    - ``podFailurePolicy``: exit codes 1-127 (permanent) fail the Job at once under
      ``policy: exit-code`` / ``never`` (not for coordinator workers, which clusterctl restarts
      on any failure); a pod evicted or preempted (``DisruptionTarget``) is replaced without
      using a replacement up, since its code says nothing about the task.
    - Elastic runs, chief and worker Jobs (unless ``policy: never``): each index is replaced
      like a coordinator worker's, and up to ``chief and worker tasks - min`` indexes of the
      Job may fail for good (``maxFailedIndexes``) while the others go on; fewer than ``min``
      is the runtime's to notice (the survivors fail).
    """
    whole = 0 if spec.restart.policy == "never" else spec.restart.max_restarts
    elastic = (spec.elastic is not None and job in ELASTIC_JOBS
               and spec.restart.policy != "never")
    alone = (spec.mode == COORDINATOR and job == "worker") or elastic
    rules: list[dict[str, Any]] = []
    if (not alone or elastic) and spec.restart.policy != "on-failure":
        rules.append({"action": "FailJob", "onExitCodes": {
            "containerName": "task", "operator": "In", "values": PERMANENT_EXIT_CODES}})
    rules.append({"action": "Ignore", "onPodConditions": [
        {"type": "DisruptionTarget", "status": "True"}]})
    out: dict[str, Any] = {}
    if alone:
        out["backoffLimitPerIndex"] = (spec.restart.max_worker_restarts + 1) * (whole + 1) - 1
    if elastic:
        members = sum(j.count for j in spec.jobs if j.name in ELASTIC_JOBS)
        out["maxFailedIndexes"] = min(spec.count(job), members - spec.elastic.min)
    elif not alone:
        out["backoffLimitPerIndex"] = whole
        out["maxFailedIndexes"] = 0
    out["podReplacementPolicy"] = "Failed"  # never two pods with one index (one host name)
    out["podFailurePolicy"] = {"rules": rules}
    return out


def _service(spec: ClusterFile, namespace: str) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": {"name": spec.name, "namespace": namespace, "labels": m.labels(spec)},
        "spec": {
            "clusterIP": "None",
            "publishNotReadyAddresses": True,
            "selector": m.labels(spec),
            "ports": [{"name": "cluster", "port": m.PORT, "targetPort": m.PORT,
                       "protocol": "TCP"}],
        },
    }


def _container(spec: ClusterFile, job: str, image: str, namespace: str) -> dict[str, Any]:
    env = [{"name": "TF_CONFIG", "value": cluster_tf_config(spec, namespace)},
           {"name": ENV_TASK_TYPE, "value": job}]
    if job == "ps" or (spec.mode == COORDINATOR and job == "worker"):
        # A Job completes only when its pods exit: servers stop once the chief has finished.
        env.append({"name": ENV_STOP_WITH_COORDINATOR, "value": "1"})
    env += m.runtime_env(spec, job)
    container: dict[str, Any] = {
        "name": "task",
        "image": image,
        "command": m.command(spec, job),
        "workingDir": m.working_dir(spec),
        "ports": [{"name": "cluster", "containerPort": m.PORT, "protocol": "TCP"}],
        "env": env,
    }
    resources = m.resources(spec, job)
    if resources is not None:
        container["resources"] = resources
    mounts = m.tls_volumes(spec)[1]
    if mounts:
        container["volumeMounts"] = mounts
    return container


def _job(spec: ClusterFile, job: str, count: int, image: str,
         namespace: str) -> dict[str, Any]:
    body: dict[str, Any] = {
        "completionMode": "Indexed",
        "completions": count,
        "parallelism": count,
        **failure_policy(spec, job),
    }
    deadline = m.active_deadline(spec)
    if deadline is not None:
        body["activeDeadlineSeconds"] = deadline
    body["template"] = {
        "metadata": {"labels": m.labels(spec, job)},
        "spec": {
            "subdomain": spec.name,
            "restartPolicy": "Never",
            "terminationGracePeriodSeconds": m.grace_seconds(spec),
            "containers": [_container(spec, job, image, namespace)],
        },
    }
    volumes = m.tls_volumes(spec)[0]
    if volumes:
        body["template"]["spec"]["volumes"] = volumes
    return {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": {"name": f"{spec.name}-{job}", "namespace": namespace,
                     "labels": m.labels(spec, job)},
        "spec": body,
    }


def render(spec: ClusterFile, options: RenderOptions) -> str:
    """The Service and the Jobs as multi-document YAML; :class:`RenderError` when the file
    cannot become Kubernetes objects (see :func:`_manifest.check_for_kubernetes`)."""
    image = options.image or DEFAULT_IMAGE
    namespace = options.namespace or DEFAULT_NAMESPACE
    m.check_for_kubernetes(spec, namespace, "k8s")
    documents = [_service(spec, namespace)]
    documents += [_job(spec, job.name, job.count, image, namespace) for job in spec.jobs]
    header = (f"Run {spec.name!r}: generated by `clusterctl render --format k8s`; do not edit.\n"
              "Needs " + m.secrets_needed(spec, namespace))
    return m.dump(documents, header)
