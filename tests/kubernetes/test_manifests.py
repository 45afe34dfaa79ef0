"""The emulated-pod harness's reading of manifests (cluster.testing._manifests): the pods, names
and environment Kubernetes and the TFJob controller would give, checked without running them."""

from __future__ import annotations

import json

import pytest

from cluster.task_source import complete_tf_config
from cluster.testing.pods import ManifestError, PodResult, describe, expand, go_json
from tests.kubernetes._render import render

pytestmark = pytest.mark.timeout(30)

SECRETS = {"ps-token": {"token": "s3cret"}, "quickstart-token": {"token": "s3cret"}}


def pods_of(example: str, fmt: str) -> dict:
    return {p.hostname: p for p in expand(render(example, fmt, ["--epochs", "1"]))}


def test_indexed_jobs_become_one_pod_per_index_with_the_services_dns_names() -> None:
    pods = pods_of("ps", "k8s")
    assert list(pods) == ["ps-chief-0", "ps-worker-0", "ps-worker-1", "ps-ps-0", "ps-ps-1"]
    worker = pods["ps-worker-1"]
    assert worker.dns_names == ("ps-worker-1.ps.default.svc",)
    assert (worker.task, worker.command) == ("worker:1", ["python", "-m", "worker"])
    env = worker.environment(pod_ip="10.77.0.3", secrets=SECRETS)
    assert env["JOB_COMPLETION_INDEX"] == "1"
    assert env["CLUSTER_TOKEN"] == "s3cret"
    assert env["HOSTNAME"] == "ps-worker-1"
    assert list(env)[-1] == "JOB_COMPLETION_INDEX"  # appended after the container's own


def test_a_k8s_pod_environment_completes_to_its_own_task() -> None:
    env = pods_of("quickstart", "k8s")["quickstart-worker-1"].environment(
        pod_ip="10.77.0.3", secrets=SECRETS)
    source = complete_tf_config(env)
    assert source is not None
    config = json.loads(source.tf_config)
    assert config["task"] == {"type": "worker", "index": 1}
    assert config["cluster"]["worker"][1] == "quickstart-worker-1.quickstart.default.svc:2222"


def test_a_service_that_does_not_select_the_pods_gives_no_dns_names() -> None:
    selector = "selector:\n    cluster-runtime.dev/run: quickstart\n"
    text = render("quickstart", "k8s")
    assert selector in text
    text = text.replace(selector, selector.replace("quickstart", "other"))
    assert all(p.dns_names == () for p in expand(text))


def test_the_tfjob_tf_config_is_the_controllers_byte_for_byte() -> None:
    pods = pods_of("ps", "tfjob")
    assert set(pods) == {"ps-chief-0", "ps-worker-0", "ps-worker-1", "ps-ps-0", "ps-ps-1"}
    assert pods["ps-ps-1"].dns_names == ("ps-ps-1.default.svc",)
    env = pods["ps-worker-1"].environment(pod_ip="10.77.0.3", secrets=SECRETS)
    # genTFConfigJSONStr: struct fields cluster, task, environment; map keys sorted; compact.
    assert env["TF_CONFIG"] == (
        '{"cluster":{"chief":["ps-chief-0.default.svc:2222"],'
        '"ps":["ps-ps-0.default.svc:2222","ps-ps-1.default.svc:2222"],'
        '"worker":["ps-worker-0.default.svc:2222","ps-worker-1.default.svc:2222"]},'
        '"task":{"type":"worker","index":1},"environment":"cloud"}')
    assert list(env)[-1] == "TF_CONFIG"
    assert "CLUSTER_TASK_TYPE" not in env and "JOB_COMPLETION_INDEX" not in env


def test_a_tfjob_of_one_replica_gets_no_tf_config() -> None:
    text = render("quickstart", "tfjob").replace("replicas: 2", "replicas: 0")
    env = {p.hostname: p for p in expand(text)}["quickstart-chief-0"].environment(
        pod_ip="10.77.0.1", secrets=SECRETS)
    assert "TF_CONFIG" not in env  # the controller's isDistributed: one replica in all


def test_go_json_escapes_as_go_does() -> None:
    assert go_json({"a": ["<&>"], "é": 1}) == '{"a":["\\u003c\\u0026\\u003e"],"é":1}'


def test_a_missing_secret_key_is_refused_naming_the_pod() -> None:
    pod = pods_of("quickstart", "k8s")["quickstart-chief-0"]
    with pytest.raises(ManifestError, match="pod quickstart-chief-0-pod: env CLUSTER_TOKEN: "
                                            "Secret 'quickstart-token' key 'token'"):
        pod.environment(pod_ip="10.77.0.1", secrets={})


def test_field_refs_and_variable_references_resolve_as_the_kubelet_does() -> None:
    text = """
apiVersion: batch/v1
kind: Job
metadata: {name: j, namespace: ns}
spec:
  completionMode: Indexed
  completions: 2
  template:
    metadata: {labels: {app: x}}
    spec:
      containers:
      - name: c
        command: [echo, "$(POD_IP):$(PORT)", "$$(PORT)", "$(UNSET)"]
        env:
        - {name: PORT, value: "2222"}
        - {name: ADDR, value: "$(POD_IP):$(PORT)"}
        - name: POD_IP
          valueFrom: {fieldRef: {fieldPath: status.podIP}}
        - name: NS
          valueFrom: {fieldRef: {fieldPath: metadata.namespace}}
        - name: APP
          valueFrom: {fieldRef: {fieldPath: "metadata.labels['app']"}}
        - name: INDEX
          valueFrom:
            fieldRef:
              fieldPath: "metadata.annotations['batch.kubernetes.io/job-completion-index']"
"""
    pod = expand(text)[1]
    env = pod.environment(pod_ip="10.77.0.2")
    assert (env["NS"], env["APP"], env["INDEX"], env["POD_IP"]) == ("ns", "x", "1", "10.77.0.2")
    assert env["ADDR"] == "$(POD_IP):2222"  # POD_IP is defined after ADDR: left as written
    assert pod.argv(env) == ["echo", "10.77.0.2:2222", "$(PORT)", "$(UNSET)"]
    assert pod.dns_names == ()  # no subdomain


@pytest.mark.parametrize(("text", "message"), [
    ("kind: Deployment\nmetadata: {name: d}\n", "Deployment d: not emulated"),
    ("kind: Job\nmetadata: {name: j}\nspec: {template: {}}\n", "only Indexed Jobs"),
    ("kind: Service\nmetadata: {name: s}\nspec: {clusterIP: 10.0.0.1}\n", "headless"),
])
def test_objects_the_harness_cannot_run_faithfully_are_refused(text, message) -> None:
    with pytest.raises(ManifestError, match=message):
        expand(text)


def test_describe_names_every_pods_exit_and_shows_the_end_of_each_failed_ones_output() -> None:
    ok = PodResult("p-0", "chief:0", 0, "step 1\nexact\n")
    bad = PodResult("p-1", "worker:0", 1, "".join(f"line {i}\n" for i in range(30)))
    text = describe({"p-0": ok, "p-1": bad}, tail=3)
    assert text.splitlines()[0] == "p-0 (chief:0): 0; p-1 (worker:0): 1"
    assert text.splitlines()[1:] == ["--- p-1, last lines:", "line 27", "line 28", "line 29"]
