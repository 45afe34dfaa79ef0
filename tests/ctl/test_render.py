"""clusterctl render --format k8s|tfjob: the manifests are valid Kubernetes (strict schemas of
1.29 and the newest bundled version), follow the pod contract, map exit codes and restart:
like clusterctl, never hold the token, and bad combinations exit 2. No process is started."""

from __future__ import annotations

import json
import textwrap
from pathlib import Path

import kubernetes_validate
import pytest
import yaml

from cluster import exitcodes
from cluster._placement import resolve_placement
from cluster.ctl.cli import main
from cluster.ctl.render import RenderError, RenderOptions, k8s, render, tfjob
from cluster.ctl.spec import load_cluster_file, parse_cluster_file
from cluster.ctl.task_config import tf_config
from resolver import TFConfigClusterResolver

pytestmark = pytest.mark.timeout(60)

REPO = Path(__file__).resolve().parents[2]
EXAMPLES = [REPO / "examples" / name / "cluster.yaml" for name in ("quickstart", "ps")]
VERSIONS = ("1.29", kubernetes_validate.latest_version())

RICH = textwrap.dedent("""\
    name: rich-run
    module: pkg.train
    args: ["--steps", 5]
    workdir: src
    env: {OMP_NUM_THREADS: "1", DATA: /data}
    cluster: {chief: 1, worker: 3, ps: 1, evaluator: 1}
    restart: {max_restarts: 2, policy: on-failure}
    timeouts: {startup: 120, heartbeat: 10, run: 3600}
    resources:
      worker: {cpu: 500m, memory: 4Gi, nvidia.com/gpu: 1}
      ps: {cpu: 2, ephemeral-storage: 1G}
    """)


def write(tmp_path: Path, text: str, name: str = "cluster.yaml") -> Path:
    (tmp_path / "src").mkdir(exist_ok=True)
    (tmp_path / "train.py").write_text("print('hi')\n")
    path = tmp_path / name
    path.write_text(text)
    return path


def documents(path: Path, fmt: str, **options: str) -> list[dict]:
    text = render(load_cluster_file(path), fmt, RenderOptions(**options))
    return list(yaml.safe_load_all(text))


def containers(doc: dict) -> list[tuple[str, dict]]:
    """``(job, container)`` of every pod template in a Job or TFJob document."""
    if doc["kind"] == "Job":
        template = doc["spec"]["template"]
        return [(template["metadata"]["labels"]["cluster-runtime.dev/job"], c)
                for c in template["spec"]["containers"]]
    if doc["kind"] == "TFJob":
        return [(rtype.lower(), c) for rtype, r in doc["spec"]["tfReplicaSpecs"].items()
                for c in r["template"]["spec"]["containers"]]
    return []


@pytest.fixture(params=["quickstart", "ps", "rich"])
def cluster_file(request, tmp_path) -> Path:
    if request.param == "rich":
        return write(tmp_path, RICH)
    return REPO / "examples" / request.param / "cluster.yaml"


# -- valid Kubernetes -------------------------------------------------------------------------


@pytest.mark.parametrize("version", VERSIONS)
def test_every_k8s_document_passes_strict_schema_validation(cluster_file, version) -> None:
    docs = documents(cluster_file, "k8s", image="registry.example/train:1", namespace="ml")
    assert [d["kind"] for d in docs][:1] == ["Service"] and len(docs) >= 2
    for doc in docs:
        kubernetes_validate.validate(doc, version, strict=True)


@pytest.mark.parametrize("version", VERSIONS)
def test_every_tfjob_pod_template_passes_strict_schema_validation(tmp_path, version) -> None:
    # The TFJob is a custom resource (no schema here): its pod templates are core objects.
    rich = write(tmp_path, RICH)
    for path in [*EXAMPLES, rich]:
        (doc,) = documents(path, "tfjob")
        for rtype, replica in doc["spec"]["tfReplicaSpecs"].items():
            kubernetes_validate.validate(
                {"apiVersion": "v1", "kind": "PodTemplate",
                 "metadata": {"name": f"{doc['metadata']['name']}-{rtype.lower()}"},
                 "template": replica["template"]}, version, strict=True)


def test_strict_validation_catches_a_misspelt_field() -> None:
    doc = documents(EXAMPLES[0], "k8s")[1]
    doc["spec"]["template"]["spec"]["subDomain"] = doc["spec"]["template"]["spec"].pop("subdomain")
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(doc, VERSIONS[0], strict=True)


# -- the pod contract -------------------------------------------------------------------------


def test_k8s_objects_follow_the_pod_contract() -> None:
    spec = load_cluster_file(EXAMPLES[1])  # examples/ps: coordinator mode, chief/worker/ps
    service, *jobs = documents(EXAMPLES[1], "k8s", namespace="ml")
    assert service["metadata"]["name"] == "ps"
    assert service["spec"]["clusterIP"] == "None"
    assert service["spec"]["publishNotReadyAddresses"] is True
    assert service["spec"]["selector"] == {"cluster-runtime.dev/run": "ps"}
    assert service["spec"]["ports"][0]["name"] == "cluster"
    assert service["spec"]["ports"][0]["port"] == 2222
    assert [j["metadata"]["name"] for j in jobs] == ["ps-chief", "ps-worker", "ps-ps"]
    commands = {"chief": ["python", "-m", "worker", "train.py", "--epochs", "20"],
                "worker": ["python", "-m", "worker"], "ps": ["python", "-m", "ps"]}
    for job in jobs:
        name = job["metadata"]["name"].removeprefix("ps-")
        body, pod = job["spec"], job["spec"]["template"]["spec"]
        assert body["completionMode"] == "Indexed"
        assert body["completions"] == body["parallelism"] == spec.count(name)
        assert pod["subdomain"] == "ps" and pod["restartPolicy"] == "Never"
        assert pod["terminationGracePeriodSeconds"] == 10  # timeouts.grace
        assert job["spec"]["template"]["metadata"]["labels"] == {
            "cluster-runtime.dev/run": "ps", "cluster-runtime.dev/job": name}
        (container,) = pod["containers"]
        assert container["name"] == "task"
        assert container["ports"] == [{"name": "cluster", "containerPort": 2222,
                                       "protocol": "TCP"}]
        assert container["command"] == commands[name]
        assert container["workingDir"] == "/workspace"
        env = container["env"]
        # examples/ps is mode: coordinator: its ps and workers only serve.
        serves = ["CLUSTER_STOP_WITH_COORDINATOR"] if name in ("ps", "worker") else []
        assert [e["name"] for e in env] == ["TF_CONFIG", "CLUSTER_TASK_TYPE", *serves,
                                            "CLUSTER_TOKEN", "CLUSTER_CONNECT_TIMEOUT",
                                            "CLUSTER_HEARTBEAT_TIMEOUT", "CLUSTER_GRACE_PERIOD",
                                            "OMP_NUM_THREADS"]
        assert env[1]["value"] == name
        # timeouts.grace reaches the tasks as the pod's terminationGracePeriodSeconds
        assert [e.get("value") for e in env[-4:]] == ["60", "3", "10", "1"]
        assert all(e["value"] == "1" for e in env if e["name"] == "CLUSTER_STOP_WITH_COORDINATOR")


@pytest.mark.parametrize("fmt", ["k8s", "tfjob"])
def test_every_pod_gets_the_stall_timeout_the_file_gives(tmp_path, fmt) -> None:
    path = write(tmp_path, RICH.replace("heartbeat: 10,", "heartbeat: 10, stall: 300,"))
    pods = [c for doc in documents(path, fmt) for _, c in containers(doc)]
    assert len(pods) >= 4  # chief, worker, ps, evaluator
    for container in pods:
        env = {e["name"]: e.get("value") for e in container["env"]}
        assert (env["CLUSTER_HEARTBEAT_TIMEOUT"], env["CLUSTER_STALL_TIMEOUT"]) == ("10", "300")
    # Not given: the pods keep the tasks' default (nothing rendered for it)
    for container in (c for doc in documents(write(tmp_path, RICH), fmt)
                      for _, c in containers(doc)):
        assert "CLUSTER_STALL_TIMEOUT" not in {e["name"] for e in container["env"]}


def test_each_pods_tf_config_is_what_clusterctl_would_give_it_at_its_dns_name() -> None:
    spec = load_cluster_file(EXAMPLES[1])
    _, *jobs = documents(EXAMPLES[1], "k8s", namespace="ml")
    addresses = {job.name: [f"ps-{job.name}-{i}.ps.ml.svc:2222" for i in range(job.count)]
                 for job in spec.jobs}
    for job in jobs:
        ((name, container),) = containers(job)
        shared = container["env"][0]["value"]
        assert json.loads(shared) == {"cluster": addresses, "environment": "cloud"}
        for index in range(spec.count(name)):
            # What task_source does: add the task from CLUSTER_TASK_TYPE + JOB_COMPLETION_INDEX.
            doc = json.loads(shared)
            full = {"cluster": doc["cluster"], "task": {"type": name, "index": index},
                    "environment": doc["environment"]}
            assert json.dumps(full, separators=(",", ":")) == tf_config(addresses, name, index)


def test_script_and_module_are_named_relative_to_the_working_dir(tmp_path) -> None:
    (tmp_path / "src").mkdir()
    (tmp_path / "src" / "train.py").write_text("")
    path = tmp_path / "cluster.yaml"
    path.write_text("name: demo\nentrypoint: src/train.py\nworkdir: src\nargs: [-v]\n"
                    "cluster: {worker: 1}\n")
    ((_, container),) = containers(documents(path, "k8s")[1])
    assert container["command"] == ["python", "-m", "worker", "train.py", "-v"]
    assert container["workingDir"] == "/workspace/src"
    ((_, container),) = containers(documents(write(tmp_path, RICH), "k8s")[2])  # rich-run-worker
    assert container["command"] == ["python", "-m", "worker", "-m", "pkg.train", "--steps", "5"]
    assert container["workingDir"] == "/workspace/src"


def test_resources_become_requests_and_limits(tmp_path) -> None:
    path = write(tmp_path, RICH)
    for fmt in ("k8s", "tfjob"):
        found = {job: c.get("resources") for doc in documents(path, fmt)
                 for job, c in containers(doc)}
        gpu = {"cpu": "500m", "memory": "4Gi", "nvidia.com/gpu": "1"}
        assert found["worker"] == {"requests": gpu, "limits": gpu}
        assert found["ps"]["limits"] == {"cpu": "2", "ephemeral-storage": "1G"}
        assert found["chief"] is None


@pytest.mark.parametrize("fmt", ["k8s", "tfjob"])
def test_the_token_is_never_a_literal(tmp_path, fmt) -> None:
    path = write(tmp_path, RICH)
    for cluster_file in [*EXAMPLES, path]:
        spec = load_cluster_file(cluster_file)
        docs = documents(cluster_file, fmt)
        seen = 0
        for doc in docs:
            for _, container in containers(doc):
                (token,) = [e for e in container["env"] if e["name"] == "CLUSTER_TOKEN"]
                assert "value" not in token
                assert token["valueFrom"] == {"secretKeyRef": {"name": f"{spec.name}-token",
                                                               "key": "token"}}
                seen += 1
        assert seen == len(spec.jobs)
        assert not any(d["kind"] == "Secret" for d in docs)


def test_output_is_deterministic_and_follows_the_options() -> None:
    spec = load_cluster_file(EXAMPLES[0])
    for fmt in ("k8s", "tfjob"):
        first = render(spec, fmt, RenderOptions(image="a/b:1", namespace="team"))
        assert first == render(spec, fmt, RenderOptions(image="a/b:1", namespace="team"))
        assert "image: a/b:1" in first and "namespace: team" in first
        assert "&id" not in first and "*id" not in first  # no YAML aliases
    default = render(spec, "k8s")
    assert "image: cluster-runtime:latest" in default and "namespace: default" in default
    assert ".quickstart.default.svc:2222" in default


# -- exit codes and restart: ------------------------------------------------------------------


def test_every_runtime_exit_code_is_on_the_side_kubeflow_expects() -> None:
    permanent = set(k8s.PERMANENT_EXIT_CODES)
    assert permanent == {code for code in range(1, 256) if not exitcodes.is_retryable(code)}
    assert {exitcodes.EXIT_FAILURE, exitcodes.EXIT_USAGE} <= permanent
    retryable = {exitcodes.EXIT_PEER_FAILED, exitcodes.EXIT_PEERS_NOT_READY,
                 exitcodes.EXIT_ADDRESS_IN_USE, 128 + 9, 128 + 15}
    assert not retryable & permanent


POLICIES = [
    # (cluster-file lines, job) -> (backoffLimitPerIndex, maxFailedIndexes, permanent fails Job)
    ("", "worker", 0, 0, True),
    ("restart: {max_restarts: 3}\n", "worker", 3, 0, True),
    ("restart: {max_restarts: 3, policy: never}\n", "chief", 0, 0, True),
    ("restart: {max_restarts: 2, policy: on-failure}\n", "worker", 2, 0, False),
    ("mode: coordinator\n", "worker", 3, None, False),
    ("mode: coordinator\nrestart: {max_restarts: 1, max_worker_restarts: 2}\n", "worker",
     5, None, False),
    ("mode: coordinator\nrestart: {max_restarts: 1, max_worker_restarts: 2}\n", "ps", 1, 0, True),
    ("mode: coordinator\nrestart: {max_restarts: 1}\n", "chief", 1, 0, True),
]


@pytest.mark.parametrize(("lines", "job", "per_index", "max_failed", "fails_job"), POLICIES)
def test_failure_policy_maps_restart_block(tmp_path, lines, job, per_index, max_failed,
                                           fails_job) -> None:
    path = write(tmp_path, "entrypoint: train.py\ncluster: {chief: 1, worker: 2, ps: 1}\n" + lines)
    policy = k8s.failure_policy(parse_cluster_file(path.read_text(), path), job)
    assert policy["backoffLimitPerIndex"] == per_index
    assert policy.get("maxFailedIndexes") == max_failed
    assert policy["podReplacementPolicy"] == "Failed"
    actions = {rule["action"]: rule for rule in policy["podFailurePolicy"]["rules"]}
    assert ("FailJob" in actions) == fails_job
    if fails_job:
        assert actions["FailJob"]["onExitCodes"]["values"] == list(range(1, 128))
        assert actions["FailJob"]["onExitCodes"]["containerName"] == "task"
    assert actions["Ignore"]["onPodConditions"] == [{"type": "DisruptionTarget",
                                                     "status": "True"}]


def test_timeouts_run_bounds_every_attempt_together(tmp_path) -> None:
    job = documents(write(tmp_path, RICH), "k8s")[1]
    assert job["spec"]["activeDeadlineSeconds"] == 3600 * 3  # run x (max_restarts + 1)
    assert "activeDeadlineSeconds" not in documents(EXAMPLES[0], "k8s")[1]["spec"]


# -- TFJob: what the training operator's controller reads --------------------------------------


@pytest.mark.parametrize("path", EXAMPLES, ids=["quickstart", "ps"])
def test_tfjob_has_what_the_controller_reads(path) -> None:
    spec = load_cluster_file(path)
    (doc,) = documents(path, "tfjob", image="img:1", namespace="ml")
    assert doc["apiVersion"] == "kubeflow.org/v1" and doc["kind"] == "TFJob"
    assert doc["metadata"] == {"name": spec.name, "namespace": "ml",
                               "labels": {"cluster-runtime.dev/run": spec.name}}
    body = doc["spec"]
    assert set(body) <= {"runPolicy", "successPolicy", "tfReplicaSpecs", "enableDynamicWorker"}
    assert body["runPolicy"]["cleanPodPolicy"] in ("All", "Running", "None")
    assert body.get("successPolicy", "") in ("", "AllWorkers")
    replicas = body["tfReplicaSpecs"]
    k8s_commands = {job: c["command"] for d in documents(path, "k8s") for job, c in containers(d)}
    assert {r: v["replicas"] for r, v in replicas.items()} == {
        tfjob.REPLICA_TYPES[job.name]: job.count for job in spec.jobs}
    for rtype, replica in replicas.items():
        assert set(replica) == {"replicas", "restartPolicy", "template"}
        assert replica["restartPolicy"] == "ExitCode"
        (container,) = replica["template"]["spec"]["containers"]
        assert container["name"] == "tensorflow" and container["image"] == "img:1"
        assert {"name": "tfjob-port", "containerPort": 2222, "protocol": "TCP"} in \
            container["ports"]
        names = [e["name"] for e in container["env"]]
        assert "TF_CONFIG" not in names and "CLUSTER_TASK_TYPE" not in names
        assert container["command"] == k8s_commands[rtype.lower()]


@pytest.mark.parametrize("path", EXAMPLES, ids=["quickstart", "ps"])
def test_the_controllers_tf_config_places_every_task(path, monkeypatch) -> None:
    # TF_CONFIG as the controller builds it: every replica type but Evaluator, lower-cased,
    # {name}-{type}-{index}.{namespace}.svc:{tfjob-port}; the runtime must accept each task.
    spec = load_cluster_file(path)
    (doc,) = documents(path, "tfjob", namespace="ml")
    cluster = {}
    for rtype, replica in doc["spec"]["tfReplicaSpecs"].items():
        (port,) = [p["containerPort"] for p in replica["template"]["spec"]["containers"][0]
                   ["ports"] if p["name"] == "tfjob-port"]
        rt = rtype.lower()
        cluster[rt] = [f"{spec.name}-{rt}-{i}.ml.svc:{port}" for i in range(replica["replicas"])]
        assert cluster[rt] == [tfjob.controller_address(spec, rt, i, "ml")
                               for i in range(replica["replicas"])]
    for job, index in spec.tasks():
        monkeypatch.setenv("TF_CONFIG", json.dumps({
            "cluster": cluster, "task": {"type": job, "index": index}, "environment": "cloud"}))
        placement = resolve_placement(TFConfigClusterResolver())
        assert placement.address == f"{spec.name}-{job}-{index}.ml.svc:2222"


def test_tfjob_without_chief_succeeds_when_all_workers_do(tmp_path) -> None:
    path = write(tmp_path, "name: w\nentrypoint: train.py\ncluster: {worker: 2}\n")
    (doc,) = documents(path, "tfjob")
    assert doc["spec"]["successPolicy"] == "AllWorkers"
    assert "successPolicy" not in documents(EXAMPLES[0], "tfjob")[0]["spec"]


# -- bad input: exit 2 ------------------------------------------------------------------------

BAD_RENDER = [
    # (cluster file, argv after FILE, expected message)
    (None, ["--format", "k8s", "--task", "worker:0"], "--task does not apply to --format k8s"),
    (None, ["--format", "tfjob", "--task", "chief:0"], "--task does not apply to --format tfjob"),
    (None, ["--image", "x:1"], "--image does not apply to --format tf-config"),
    (None, ["--namespace", "ml"], "--namespace does not apply to --format tf-config"),
    (None, ["--format", "k8s", "--namespace", "My_NS"], "is not a valid namespace"),
    ("name: My_Run\nentrypoint: train.py\ncluster: {worker: 1}\n", ["--format", "k8s"],
     "cannot name Kubernetes objects"),
    (f"name: {'a' * 60}\nentrypoint: train.py\ncluster: {{worker: 1}}\n", ["--format", "tfjob"],
     "at most 63 characters"),
    ("name: d\nentrypoint: train.py\ncluster: {worker: [\"h:1\"]}\n", ["--format", "k8s"],
     "cluster.worker lists addresses"),
    ("name: d\nentrypoint: ../train.py\ncluster: {worker: 1}\n", ["--format", "k8s"],
     "is outside"),
]


@pytest.mark.parametrize(("text", "argv", "message"), BAD_RENDER)
def test_bad_render_exits_2_with_a_clear_message(tmp_path, capsys, text, argv, message) -> None:
    sub = tmp_path / "run"
    sub.mkdir()
    (tmp_path / "train.py").write_text("")
    path = write(sub, text or "name: d\nentrypoint: train.py\ncluster: {worker: 1}\n")
    assert main(["render", str(path), *argv]) == 2
    captured = capsys.readouterr()
    assert message in captured.err and captured.err.startswith("clusterctl: render: ")
    assert captured.out == ""


def test_unknown_format_is_a_usage_error(capsys) -> None:
    with pytest.raises(SystemExit) as info:
        main(["render", str(EXAMPLES[0]), "--format", "helm"])
    assert info.value.code == 2
    assert "invalid choice: 'helm'" in capsys.readouterr().err
    with pytest.raises(RenderError, match="unknown format"):
        render(load_cluster_file(EXAMPLES[0]), "helm")


def test_cli_prints_the_manifests(capsys) -> None:
    assert main(["render", str(EXAMPLES[1]), "--format", "k8s", "--image", "IMG"]) == 0
    out = capsys.readouterr().out
    assert out.startswith("# Run 'ps': generated by `clusterctl render --format k8s`")
    assert [d["kind"] for d in yaml.safe_load_all(out)] == ["Service", "Job", "Job", "Job"]
    assert main(["render", str(EXAMPLES[1]), "--format", "tfjob", "--image", "IMG"]) == 0
    assert [d["kind"] for d in yaml.safe_load_all(capsys.readouterr().out)] == ["TFJob"]


def test_a_tfjob_carries_evaluators_as_an_evaluator_replica(tmp_path) -> None:
    (doc,) = documents(write(tmp_path, RICH), "tfjob")
    replicas = doc["spec"]["tfReplicaSpecs"]
    assert replicas["Evaluator"]["replicas"] == 1
    assert replicas["Evaluator"]["restartPolicy"] == "ExitCode"
