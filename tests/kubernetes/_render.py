"""The manifests the emulated-pod tests run: ``clusterctl render`` output for an example.

Until ``cluster/ctl/render`` lands on this branch, :func:`render` builds them by hand, following
the pod contract of the render brief (Service ``{run}``, one Indexed Job ``{run}-{job}`` per
job, container ``task``; TFJob ``{run}`` with containers ``tensorflow``, port ``tfjob-port``).
"""

from __future__ import annotations

import json

import yaml

__all__ = ["EXAMPLES", "render"]

PORT = 2222
# name: (jobs, coordinator mode, env)
EXAMPLES = {
    "quickstart": ({"chief": 1, "worker": 2}, False),
    "ps": ({"chief": 1, "worker": 2, "ps": 2}, True),
}
_TFJOB_TYPES = {"chief": "Chief", "worker": "Worker", "ps": "PS", "evaluator": "Evaluator"}


def _command(job: str, coordinator: bool, args: list[str]) -> list[str]:
    if job == "ps":
        return ["python", "-m", "ps"]
    if coordinator and job == "worker":
        return ["python", "-m", "worker"]
    return ["python", "-m", "worker", "train.py", *args]


def _env(run: str) -> list[dict]:
    return [{"name": "CLUSTER_TOKEN",
             "valueFrom": {"secretKeyRef": {"name": f"{run}-token", "key": "token"}}},
            {"name": "CLUSTER_CONNECT_TIMEOUT", "value": "60"},
            {"name": "CLUSTER_HEARTBEAT_TIMEOUT", "value": "5"},
            {"name": "OMP_NUM_THREADS", "value": "1"}]


def render(example: str, fmt: str, args: list[str], namespace: str = "default") -> str:
    """The ``fmt`` (``k8s`` or ``tfjob``) manifests of ``examples/EXAMPLE`` with ``args`` for
    the entry point."""
    jobs, coordinator = EXAMPLES[example]
    run = example
    docs: list[dict] = []
    if fmt == "k8s":
        cluster = {job: [f"{run}-{job}-{i}.{run}.{namespace}.svc:{PORT}" for i in range(n)]
                   for job, n in sorted(jobs.items())}
        tf_config = json.dumps({"cluster": cluster, "environment": "cloud"},
                               separators=(",", ":"))
        docs.append({"apiVersion": "v1", "kind": "Service",
                     "metadata": {"name": run, "namespace": namespace},
                     "spec": {"clusterIP": "None", "publishNotReadyAddresses": True,
                              "selector": {"cluster-runtime.dev/run": run},
                              "ports": [{"name": "cluster", "port": PORT}]}})
        for job, n in jobs.items():
            labels = {"cluster-runtime.dev/run": run, "cluster-runtime.dev/job": job}
            env = [{"name": "TF_CONFIG", "value": tf_config},
                   {"name": "CLUSTER_TASK_TYPE", "value": job}, *_env(run)]
            docs.append({
                "apiVersion": "batch/v1", "kind": "Job",
                "metadata": {"name": f"{run}-{job}", "namespace": namespace, "labels": labels},
                "spec": {"completionMode": "Indexed", "completions": n, "parallelism": n,
                         "template": {"metadata": {"labels": labels}, "spec": {
                             "subdomain": run, "restartPolicy": "Never",
                             "containers": [{"name": "task", "image": "img",
                                             "command": _command(job, coordinator, args),
                                             "workingDir": "/workspace",
                                             "ports": [{"name": "cluster",
                                                        "containerPort": PORT}],
                                             "env": env}]}}}})
    elif fmt == "tfjob":
        specs = {}
        for job, n in jobs.items():
            labels = {"cluster-runtime.dev/run": run, "cluster-runtime.dev/job": job}
            specs[_TFJOB_TYPES[job]] = {
                "replicas": n, "restartPolicy": "ExitCode",
                "template": {"metadata": {"labels": labels}, "spec": {"containers": [{
                    "name": "tensorflow", "image": "img",
                    "command": _command(job, coordinator, args), "workingDir": "/workspace",
                    "ports": [{"name": "tfjob-port", "containerPort": PORT}],
                    "env": _env(run)}]}}}
        docs.append({"apiVersion": "kubeflow.org/v1", "kind": "TFJob",
                     "metadata": {"name": run, "namespace": namespace},
                     "spec": {"runPolicy": {"cleanPodPolicy": "Running"},
                              "tfReplicaSpecs": specs}})
    else:
        raise ValueError(fmt)
    return yaml.safe_dump_all(docs, sort_keys=False)
